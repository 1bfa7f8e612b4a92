"""What every suite shares at its ends: the command line, Markdown tables, the JSON report."""

import argparse
import importlib.metadata
import json
import os
import time
from typing import Any, List, Sequence, Tuple

from harness import env


def parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options of every suite, ``--quick``, ``--check`` and ``--json`` (add your own)."""
    parser = argparse.ArgumentParser(prog=f"run.py {name}", description=doc.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="short: a minute or two")
    group.add_argument("--check", action="store_true", help="correctness only, tiny")
    where = f"results/{name}.json; results/{name}-quick.json or -check.json with --quick, --check"
    parser.add_argument("--json", metavar="PATH", help=f"where to write the results ({where})")
    return parser


def markdown_table(header, rows: List[List[str]], align: str = "") -> str:
    """A Markdown table, its columns padded to their width; ``header``: names, or one
    string of names separated by '|'; ``align``: 'l' or 'r' for each column."""
    header = header.split("|") if isinstance(header, str) else list(header)
    align = align.ljust(len(header), "l")
    rows = [[str(c) for c in row] + [""] * (len(header) - len(row)) for row in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    widths = [max(w, 3) for w in widths]

    def line(cells) -> str:
        padded = [(c.rjust if a == "r" else c.ljust)(w) for c, w, a in zip(cells, widths, align)]
        return "| " + " | ".join(padded) + " |"

    rule = "|".join("-" * (w + 1) + (":" if a == "r" else "-") for w, a in zip(widths, align))
    return "\n".join([line(header), f"|{rule}|"] + [line(r) for r in rows])


def table_of(columns: Sequence[Tuple[str, str]], entries: Sequence[dict], align: str = "") -> str:
    """A Markdown table of ``entries``: a column per ``(header, format)``, the format
    filled from each entry (``str.format(**entry)``, e.g. ``'{stock[us_per_step]:.1f}'``)."""
    rows = [[text.format(**entry) for _, text in columns] for entry in entries]
    return markdown_table([header for header, _ in columns], rows, align)


def print_report(args: argparse.Namespace, markdown) -> bool:
    """``--report JSON``: the Markdown of a results file (``markdown(data)``), written to
    ``--markdown`` or printed; return whether the suite was asked for that only."""
    if not getattr(args, "report", None):
        return False
    with open(args.report) as f:
        text = markdown(json.load(f))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return True


def mxoid_root(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The checkout the workers import (``--mxoid``), refused when it holds no mxoid."""
    root = os.path.abspath(args.mxoid)
    if not os.path.isfile(os.path.join(root, "mxoid", "__init__.py")):
        parser.error(f"--mxoid {args.mxoid}: no mxoid/__init__.py there")
    return root


class Run:
    """One run of a suite: its mode, command, start, and other processes' load meanwhile."""

    def __init__(self, name: str, args: argparse.Namespace, argv: Sequence[str]) -> None:
        self.name, self.args = name, args
        self.mode = "check" if args.check else "quick" if args.quick else "full"
        self.command = " ".join(["benchmarks/run.py", name, *argv])
        self.date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.started = time.perf_counter()
        self.load = env.OtherLoad()

    def write(self, fields: dict, mxoid_root: str = env.ROOT, own_load: bool = True) -> dict:
        """Write the JSON report, the run's description and ``fields``; return it.
        ``own_load``: with the load of other processes (unless they are its workers)."""
        report = {"suite": self.name, "mode": self.mode, "command": self.command}
        report.update(date=self.date, seconds=time.perf_counter() - self.started)
        report.update(
            machine=env.machine_info(mxoid_root), mxnet=importlib.metadata.version("mxnet")
        )
        report["thread_settings"] = env.THREAD_SETTINGS
        if own_load:
            report["other_load_cores"] = load = self.load.cores()
            print(
                f"other processes kept {load:.2f} of {os.cpu_count()} cores busy meanwhile "
                "(above about 0.1 the figures are disturbed)"
            )
        report.update(fields)
        name = self.name if self.mode == "full" else f"{self.name}-{self.mode}"
        path = self.args.json or os.path.join(env.RESULTS, f"{name}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"results written to {path}")
        return report

    def finish(self, failures: List[str], settings: Any, results: Any, **fields: Any) -> int:
        """Write the report (``settings``, ``results``, ``fields`` and the correctness
        check); print the failures; return the exit status: 1 when a check failed."""
        correctness = {"checked": True, "ok": not failures, "failures": failures}
        correctness.update(fields.pop("correctness", {}))
        own_load = fields.pop("own_load", True)  # False: the suite's workers would count
        fields.update(settings=settings, results=results, correctness=correctness)
        self.write(fields, own_load=own_load)
        print("Correctness: " + ("FAILED" if failures else "ok"))
        for failure in failures:
            print(f"  - {failure}")
        return 1 if failures else 0
