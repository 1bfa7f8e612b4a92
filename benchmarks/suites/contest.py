"""The contest suite: mxoid against the other ways of training a workload, in turns.

A workload (``--workload``, :mod:`suites.workloads`) is what is trained and by whom:
``symbol`` (an MLP and LeNet: a hand-written loop, Module.fit, FeedForward, a Gluon
loop; ``run.py loop``), ``gluon`` (a Gluon HybridBlock: Gluon's hand loop and its
Estimator; ``run.py gluon``) or ``buckets`` (an LSTM over buckets: a hand loop and
BucketingModule.fit; ``run.py buckets``), each beside mxoid bare and with the everyday
extensions. The contenders train on the same data from the same parameters with the
same optimizer math, a cell's in turns in one worker process (:mod:`harness.contest`),
then each alone for its peak memory where the mode has that pass; those computing what
the reference computes must end with its parameters. The workload's own passes follow
(the micro suite, the validation against the estimator, the memory over buckets), then
its targets. Exit status 1: a worker failed, non-finite parameters, not the
reference's where due, or a workload's own check failed; speed never changes it.
"""

import argparse
import importlib
import signal
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import List, Optional, Sequence

from harness import contest, env, report, targets
from harness.processes import Launcher

WORKLOADS = ("symbol", "gluon", "buckets")
CHECK_NOTE = "(--check runs two workers at once on tiny epochs: the speed columns mean nothing)"


def workload_of(name: str):
    """The module of a workload (:mod:`suites.workloads`)."""
    return importlib.import_module(f"suites.workloads.{name}")


def _parser(workload) -> argparse.ArgumentParser:
    parser = report.parser(__doc__, workload.NAME)
    parser.prog = "run.py contest"
    parser.add_argument("--workload", choices=WORKLOADS, default="symbol", help="what is trained")
    names = workload.ALL_CONTENDERS + getattr(workload, "EXTRA_CONTENDERS", ())
    options = getattr(workload, "OPTIONS", ())
    contest.add_options(parser, names, workload.CELLS_HELP, options)
    return parser


def configure(parser, args, workload, mode: str, mxoid_root: str) -> dict:
    """The run's plan (see :func:`harness.contest.run`): the mode's rounds, processes and
    memory pass, its cells and their samples, the contenders (the reference first: the
    ratios and the parameters are taken against it), as the command line changes them;
    then the workload's ``configure(plan, args, mode)``, if it has one."""
    config = {k: v for k, v in workload.MODES[mode].items() if k != "micro"}
    config.update(cells=workload.CELLS[mode], memory_epochs=config.pop("memory"), notes=[])
    names = args.contenders.split(",") if args.contenders else list(workload.ALL_CONTENDERS)
    known = workload.ALL_CONTENDERS + getattr(workload, "EXTRA_CONTENDERS", ())
    if set(names) - set(known):
        parser.error(f"unknown contenders {sorted(set(names) - set(known))}")
    if hasattr(workload, "contenders"):  # the workload's choice: left out by mode or checkout
        names, config["notes"] = workload.contenders(names, mode, mxoid_root, args.contenders)
    reference = workload.CONTEST.reference
    config["contenders"] = [reference] + [name for name in names if name != reference]
    try:
        config["cells"] = workload.parse_cells(args.cells) if args.cells else config["cells"]
    except ValueError as error:
        parser.error(str(error))
    config["samples"] = {cell: workload.samples(mode, cell) for cell in config["cells"]}
    if hasattr(workload, "configure"):
        workload.configure(config, args, mode)
    return contest.apply_options(config, args)


def describe_machine(machine: dict, mxnet: str = "") -> str:
    """The CPUs, Python (and MXNet), and the mxoid measured."""
    changes = " with uncommitted changes" if machine["mxoid_uncommitted_changes"] else ""
    where = f"{machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}"
    return f"{where}{mxnet and f', MXNet {mxnet}'}, mxoid {machine['mxoid_commit']}{changes}"


def markdown(data: dict, workload) -> str:
    """A report as Markdown: the run, one table of every cell, the workload's own
    tables (``tables(data)``), its targets and comparisons."""
    head = f"Run of {data['date']}: `python {data['command']}` ({data['seconds'] / 60:.0f} min), "
    head += describe_machine(data["machine"], data.get("mxnet") or "1.9.1") + ".\n"
    parts = [head, contest.table(data["results"], workload.CONTEST)]
    parts += workload.tables(data) if hasattr(workload, "tables") else []
    if data.get("targets"):
        parts.append(targets.table(data["targets"]))
    return "\n".join(parts) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--workload", choices=WORKLOADS, default="symbol")
    workload = workload_of(pick.parse_known_args(argv)[0].workload)
    parser = _parser(workload)
    args = parser.parse_args(argv)
    if report.print_report(args, lambda data: markdown(data, workload)):
        return 0
    mxoid_root = report.mxoid_root(parser, args)
    run = report.Run(workload.NAME, args, argv)
    run.command = " ".join(["benchmarks/run.py", "contest", *argv])
    plan = configure(parser, args, workload, run.mode, mxoid_root)
    environment, machine = env.worker_env(mxoid_root), env.machine_info(mxoid_root)
    environment.update(plan.pop("worker_env", {}))
    print(f"contest, {args.workload} workload, {run.mode}: {describe_machine(machine)}", flush=True)
    for note in plan["notes"]:
        print(f"note: {note}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # KeyboardInterrupt: clean up
    with tempfile.TemporaryDirectory(prefix=f"mxoid-bench-{workload.NAME}-") as root:
        launcher, timeout = Launcher(environment), args.worker_timeout
        rows, check, processes = contest.run(
            workload.CONTEST, plan, launcher, root, args.quiet, timeout
        )
        passes = SimpleNamespace(plan=plan, args=args, mode=run.mode, launcher=launcher)
        passes.__dict__.update(root=root, environment=environment, rows=rows, check=check)
        fields, more = workload.passes(passes) if hasattr(workload, "passes") else ({}, 0)
    check["ok"] = not check["failures"]
    key = workload.CONTEST.key
    check.update(rtol=contest.RTOL, atol=contest.ATOL, reference=workload.CONTEST.reference)
    check[f"equal_to_{key}_expected_for"] = list(workload.CONTEST.equal_to_hand)
    check.update(getattr(workload, "CHECK_FIELDS", {}))
    if hasattr(workload, "run_targets"):  # the workload's, from its own passes too
        found = workload.run_targets(rows, fields, run.mode)
    else:
        found = workload.targets(rows) if run.mode != "check" else []
    settings = dict(plan, design="interleaved", warmup_epochs=1, timed_epochs=plan["timed"])
    settings["samples"] = {workload.CONTEST.describe(c): n for c, n in plan["samples"].items()}
    settings.update(memory_pass=bool(plan["memory_epochs"]), **getattr(workload, "SETTINGS", {}))
    shown = ("MXNET_", "OMP_") + tuple(env.WORKER_ENV)  # the settings the workers ran with
    worker_env = {k: v for k, v in environment.items() if k.startswith(shown)}
    fields.update(worker_env=worker_env, settings=settings, results=rows, correctness=check)
    fields["targets"] = found
    _print(workload, fields, run.mode)
    print(f"\n{processes + more} worker processes in {time.perf_counter() - run.started:.0f} s")
    data = run.write(fields, mxoid_root, own_load=False)  # its workers would count
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(data, workload))
        print(f"Markdown written to {args.markdown}")
    return 0 if check["ok"] else 1


def _print(workload, fields: dict, mode: str) -> None:
    check: dict = fields["correctness"]
    print(contest.table(fields["results"], workload.CONTEST))
    for part in workload.tables(fields) if hasattr(workload, "tables") else []:
        print(part)
    if mode == "check":
        print(CHECK_NOTE)
    verdict = workload.verdict(check) if hasattr(workload, "verdict") else workload.VERDICT
    lines: List[str] = [f"  - {failure}" for failure in check["failures"]]
    print("\nCorrectness: " + (verdict if check["ok"] else "FAILED"), *lines, sep="\n")
    if fields["targets"]:
        print(targets.table(fields["targets"]))
