"""Weak scaling of MXNet's parameter server (ps-lite) under ``mxoid launch``, on loopback.

For 1, 2 and 4 workers and 1 and 2 servers, each worker trains the same
network on its own batch of fixed size (weak scaling: the global batch grows
with the workers) with ``dist_sync`` and the optimizer on the servers, as
``MainLoop`` does by default. Each step is timed in three parts:

- compute: forward and backward, waited for;
- barrier: a ps-lite barrier, i.e. waiting for the slowest worker (on a
  shared 2-core machine, mostly waiting for the CPU);
- push/pull: every gradient pushed and every weight pulled, waited for (the
  servers sum the pushes of all workers and run the optimizer in between).

Bytes per step are counted from the arrays: each worker pushes and pulls
every parameter once; ps-lite puts an array of fewer than
``MXNET_KVSTORE_BIGARRAY_BOUND`` (1e6) elements whole on server
``(key * 9973) % servers`` and splits bigger ones evenly over all servers
(``src/kvstore/kvstore_dist.h``, ``EncodeDefaultKey``)::

    python benchmarks/run.py scaling --check     # 1 and 2 workers, MLP, a few steps
    python benchmarks/run.py scaling --quick     # MLP, 1 and 2 workers, 1 and 2 servers
    python benchmarks/run.py scaling             # results/scaling.json (about 3 minutes)
    python benchmarks/run.py scaling --models messages --workers 1 2 --servers 1
    python benchmarks/run.py scaling --project   # the projection to 8-64 hosts
    python benchmarks/run.py scaling --quick --saves 5   # and the cost of a save

('messages' is a network of 66 arrays of at most 10 floats: its push/pull time over
132 messages per step is ps-lite's cost per message.) ``python
benchmarks/suites/scaling.py`` with the same options (``--out PATH`` for ``--json``)
still runs it alone, as docs/scaling.md shows.

Results: a Markdown table on stdout (docs/scaling.md reads it), the JSON report of
every suite (:class:`harness.report.Run`; ``results/scaling.json``, ``-quick``,
``-check``). ``--check`` fails (exit status 1) on a failed job or implausible numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run alone: the harness beside it, as run.py has it
    sys.path.insert(1, str(ROOT / "benchmarks"))
from harness import env, report  # noqa: E402 (after the path of a script run alone)

BIGARRAY_BOUND = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))
PARTS = ("compute", "barrier", "pushpull")


# ------------------------------------------------------------------------------ networks
def network(name: str):
    """The symbol and the data shape (without the batch) of 'mlp', 'lenet' or 'messages'."""
    import mxnet as mx

    data = mx.sym.Variable("data")
    if name == "messages":  # 66 arrays of 1 to 10 floats: what ps-lite costs per message
        net = data
        for layer in range(32):
            net = mx.sym.FullyConnected(net, num_hidden=1, name=f"tiny{layer}")
        net = mx.sym.FullyConnected(net, num_hidden=10, name="out")
        return mx.sym.SoftmaxOutput(net, name="softmax"), (1,)
    if name == "mlp":  # 1.86 M parameters; fc2_weight (1024 x 1024) is over the bound: split
        net = mx.sym.FullyConnected(data, num_hidden=1024, name="fc1")
        net = mx.sym.Activation(net, act_type="relu")
        net = mx.sym.FullyConnected(net, num_hidden=1024, name="fc2")
        net = mx.sym.Activation(net, act_type="relu")
        net = mx.sym.FullyConnected(net, num_hidden=10, name="fc3")
        return mx.sym.SoftmaxOutput(net, name="softmax"), (784,)
    net = data  # LeNet-5 as in MXNet's examples: 431 k parameters, none over the bound
    for filters in (20, 50):
        net = mx.sym.Convolution(net, kernel=(5, 5), num_filter=filters)
        net = mx.sym.Activation(net, act_type="tanh")
        net = mx.sym.Pooling(net, pool_type="max", kernel=(2, 2), stride=(2, 2))
    net = mx.sym.Activation(mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=500), "tanh")
    net = mx.sym.FullyConnected(net, num_hidden=10)
    return mx.sym.SoftmaxOutput(net, name="softmax"), (1, 28, 28)


def placement(sizes, servers, bound=None):
    """Per server: the bytes one worker pushes there per step, and the array parts it holds.

    ps-lite's rule (``EncodeDefaultKey``): an array under the bound goes whole to server
    ``(key * 9973) % servers``; a bigger one is split evenly over all servers.
    """
    bound = BIGARRAY_BOUND if bound is None else bound
    shares, parts = [0] * servers, [0] * servers
    for key, size in enumerate(sizes):
        if size < bound:
            shares[(key * 9973) % servers] += 4 * size
            parts[(key * 9973) % servers] += 1
        else:
            for server in range(servers):
                shares[server] += 4 * (size // servers + (server < size % servers))
                parts[server] += 1
    return shares, parts


def server_bytes(sizes, servers):
    """Bytes each server receives from one worker per step (4-byte floats)."""
    return placement(sizes, servers)[0]


def model_sizes(name):
    """The parameter array sizes, in kvstore key order, of 'mlp', 'lenet' or 'resnet50'."""
    import mxnet as mx
    import numpy as np

    if name == "resnet50":  # built, not downloaded: only the shapes
        symbol = mx.gluon.model_zoo.vision.resnet50_v1()(mx.sym.var("data"))
        shape = (3, 224, 224)
    else:
        symbol, shape = network(name)
    shapes = symbol.infer_shape(data=(1, *shape))[0]
    skip = ("data", "softmax_label")
    return [int(np.prod(s)) for n, s in zip(symbol.list_arguments(), shapes) if n not in skip]


def project(args):
    """Communication time per step on H hosts (a worker and a server on each), as Markdown.

    Per step each worker pushes and pulls every array once. The busiest host's link
    carries its worker's traffic, M (1 - 1/H) each way, and its server's, (H - 1) times
    that server's share s of one worker's push: wire = (M (1 - 1/H) + (H - 1) s) / link.
    The busiest server's software: its array parts x the time per part (the update, the
    round trips) + W s / ps-lite's throughput (both measured on loopback, this machine).
    The step's communication is at least the larger of the two.
    """
    lines = [
        "| model | MB | bound | hosts | busiest server share | wire 10G ms | wire 25G ms "
        "| software ms (this machine) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in args.models:
        sizes = model_sizes(name)
        model = 4 * sum(sizes)
        for bound in (1_000_000, args.bound):
            for hosts in (8, 16, 32, 64):
                shares, parts = placement(sizes, hosts, bound)
                busiest = max(range(hosts), key=lambda j: shares[j])
                share = shares[busiest]
                volume = model * (1 - 1 / hosts) + (hosts - 1) * share
                wire = [1e3 * volume / (gbits * 1e9 / 8) for gbits in (10, 25)]
                software = 1e3 * (
                    max(parts) * args.key_seconds + hosts * share / args.bytes_per_second
                )
                lines.append(
                    f"| {name} | {model / 1e6:.1f} | {bound:g} | {hosts} "
                    f"| {share / model * hosts:.1f} x even | {wire[0]:.1f} | {wire[1]:.1f} "
                    f"| {software:.0f} |"
                )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- a worker
def worker(args) -> None:
    """One worker: time ``args.steps`` steps after ``args.warmup``; write rank<r>.json."""
    import mxnet as mx
    import numpy as np

    kv = mx.kv.create("dist_sync")
    symbol, shape = network(args.model)
    exe = symbol.simple_bind(mx.cpu(), data=(args.batch, *shape), grad_req="write")
    names = [n for n in symbol.list_arguments() if n not in ("data", "softmax_label")]
    rng = np.random.RandomState(0)
    for name in names:
        exe.arg_dict[name][:] = rng.uniform(-0.05, 0.05, exe.arg_dict[name].shape)
    exe.arg_dict["data"][:] = np.random.RandomState(kv.rank).rand(args.batch, *shape)
    exe.arg_dict["softmax_label"][:] = np.random.RandomState(kv.rank).randint(0, 10, args.batch)
    for key, name in enumerate(names):
        kv.init(key, exe.arg_dict[name])
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, rescale_grad=1.0 / args.batch))
    for key, name in enumerate(names):
        kv.pull(key, out=exe.arg_dict[name])
    mx.nd.waitall()
    steps = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        exe.forward(is_train=True)
        exe.backward()
        mx.nd.waitall()
        computed = time.perf_counter()
        kv._barrier()
        met = time.perf_counter()
        for key, name in enumerate(names):
            kv.push(key, exe.grad_dict[name], priority=-key)
            kv.pull(key, out=exe.arg_dict[name], priority=-key)
        mx.nd.waitall()
        done = time.perf_counter()
        if step >= args.warmup:
            steps.append([computed - start, met - computed, done - met])
    sizes = [int(np.prod(exe.arg_dict[name].shape)) for name in names]
    saves = time_saves(kv, exe, names, args) if args.saves else None
    with open(os.path.join(args.out, f"rank{kv.rank}.json"), "w") as out:
        json.dump({"steps": steps, "sizes": sizes, "saves": saves}, out)


def time_saves(kv, exe, names, args):
    """Rank 0's checkpoint saves, timed without and with the servers' optimizer states.

    After the timed steps the servers get Adam (two states per parameter) and take one
    step; rank 0 then writes ``args.saves`` checkpoints of each kind, alternately, as
    mxoid's Checkpoint does (:func:`mxoid.checkpoint.format.write_checkpoint`; with the
    states: ``servers-optimizer.states``, fetched through the command channel).
    """
    import mxnet as mx

    from mxoid.checkpoint.format import SERVER_STATES, write_checkpoint
    from mxoid.main_loop.server_optimizer import write_server_states

    if kv.rank == 0:
        kv.set_optimizer(mx.optimizer.Adam(learning_rate=1e-3, rescale_grad=1.0 / args.batch))
    kv._barrier()
    for key, name in enumerate(names):
        kv.push(key, exe.grad_dict[name], priority=-key)
        kv.pull(key, out=exe.arg_dict[name], priority=-key)
    mx.nd.waitall()
    found = None
    if kv.rank == 0:
        symbol, _ = network(args.model)
        params = {name: exe.arg_dict[name] for name in names}
        with_states = {SERVER_STATES: lambda path: write_server_states(kv, path)}
        found = {"without": [], "with": []}
        with tempfile.TemporaryDirectory() as folder:
            for save in range(2 * args.saves):
                kind, extra = ("with", with_states) if save % 2 else ("without", {})
                path = os.path.join(folder, f"checkpoint-{save}")
                state = {"status": {"epochs_done": 0, "iterations_done": save}}
                start = time.perf_counter()
                write_checkpoint(path, symbol, params, {}, state, None, extra_files=extra)
                found[kind].append(time.perf_counter() - start)
                found[f"{kind}_bytes"] = sum(f.stat().st_size for f in Path(path).iterdir())
            found["states_bytes"] = os.path.getsize(os.path.join(path, SERVER_STATES))
    kv._barrier()
    return found


# ------------------------------------------------------------------------------ the suite
def run_cell(model, workers, servers, args, folder):
    """Launch one job; return its medians per part and its bytes."""
    from mxoid.distributed.launch import launch

    out = Path(folder) / f"{model}-{workers}w-{servers}s"
    out.mkdir()
    command = [sys.executable, __file__, "--worker", "--model", model, "--out", str(out)]
    command += ["--batch", str(args.batch), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--saves", str(args.saves)]
    with open(out / "launch.log", "wb") as log:
        status = launch(command, workers, servers, timeout=600, stdout=log, stderr=log)
    if status != 0:
        raise RuntimeError(
            f"{model} {workers}w {servers}s failed:\n{(out / 'launch.log').read_text()}"
        )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(workers)]
    sizes = ranks[0]["sizes"]
    # A step's parts: the median over steps of the slowest worker's part.
    steps = list(zip(*[r["steps"] for r in ranks]))
    cell = {
        part: statistics.median(max(s[i] for s in step) for step in steps)
        for i, part in enumerate(PARTS)
    }
    cell["step"] = statistics.median(max(sum(s) for s in step) for step in steps)
    model_bytes = 4 * sum(sizes)
    cell.update(
        model=model,
        workers=workers,
        servers=servers,
        params=sum(sizes),
        bytes_per_worker=2 * model_bytes,  # pushed + pulled
        bytes_per_server=[2 * workers * b for b in server_bytes(sizes, servers)],
        samples_per_s=workers * args.batch / cell["step"],
    )
    saves = ranks[0]["saves"]
    if saves:
        cell["save"] = {kind: statistics.median(saves[kind]) for kind in ("without", "with")}
        cell["save"].update({k: saves[k] for k in ("without_bytes", "with_bytes", "states_bytes")})
    return cell


def save_table(cells):
    """Rank 0's checkpoint save, without and with the servers' Adam states, as Markdown."""
    lines = [
        "| model | workers | servers | save ms | with server states ms | checkpoint MB "
        "| with server states MB | of which server states MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if "save" in c:
            s = c["save"]
            lines.append(
                f"| {c['model']} | {c['workers']} | {c['servers']} | {1e3 * s['without']:.1f} "
                f"| {1e3 * s['with']:.1f} | {s['without_bytes'] / 1e6:.2f} "
                f"| {s['with_bytes'] / 1e6:.2f} | {s['states_bytes'] / 1e6:.2f} |"
            )
    return "\n".join(lines)


def table(cells):
    lines = [
        "| model | workers | servers | step ms | compute | barrier | push/pull | samples/s "
        "| MB/step per worker | MB/step per server |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        per_server = "/".join(f"{b / 1e6:.1f}" for b in c["bytes_per_server"])
        lines.append(
            f"| {c['model']} | {c['workers']} | {c['servers']} | {1e3 * c['step']:.1f} "
            f"| {1e3 * c['compute']:.1f} | {1e3 * c['barrier']:.1f} | {1e3 * c['pushpull']:.1f} "
            f"| {c['samples_per_s']:.0f} | {c['bytes_per_worker'] / 1e6:.1f} | {per_server} |"
        )
    return "\n".join(lines)


# (models, workers, servers, timed steps, warm-up steps) of each mode
MODES = {
    "full": (["mlp", "lenet"], [1, 2, 4], [1, 2], 30, 5),
    "quick": (["mlp"], [1, 2], [1, 2], 10, 2),
    "check": (["mlp"], [1, 2], [1], 4, 1),
}


def _parser() -> argparse.ArgumentParser:
    parser = report.parser(__doc__, "scaling")
    add = parser.add_argument
    add("--models", nargs="+", help="of mlp, lenet, messages (the mode's: mlp, and lenet)")
    add("--workers", nargs="+", type=int, help="numbers of workers (the mode's: 1 2 4)")
    add("--servers", nargs="+", type=int, help="numbers of servers (the mode's: 1 2)")
    add("--batch", type=int, default=64, help="per worker (default 64)")
    add("--steps", type=int, help="timed steps (the mode's: 30)")
    add("--warmup", type=int, help="steps before them (the mode's: 5)")
    add("--out", dest="json", help=argparse.SUPPRESS)  # --json's name when run alone
    add("--saves", type=int, default=0, help=SAVES_HELP)
    add("--project", action="store_true", help="print the projection to 8-64 hosts instead")
    add("--bound", type=float, default=1e5, help="the bound to project beside 1e6")
    add("--key-seconds", type=float, default=0.7e-3, help=KEY_SECONDS_HELP)
    add("--bytes-per-second", type=float, default=0.29e9, help=BYTES_PER_SECOND_HELP)
    return parser


SAVES_HELP = "rank 0's checkpoint saves timed after the steps, without and with the servers' states"
KEY_SECONDS_HELP = "a server's time per array part per step (default: 'messages' 1w1s, here)"
BYTES_PER_SECOND_HELP = "a server's bytes pushed (and pulled back) per second (default: mlp 1w1s)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # one worker of a job (run_cell)
        worker_parser = argparse.ArgumentParser()
        for name in ("--model", "--out"):
            worker_parser.add_argument(name)
        for name in ("--batch", "--steps", "--warmup", "--saves"):
            worker_parser.add_argument(name, type=int)
        worker(worker_parser.parse_args(argv[1:]))
        return 0
    args = _parser().parse_args(argv)
    run = report.Run("scaling", args, argv)
    models, workers, servers, steps, warmup = MODES[run.mode]
    args.models, args.workers = args.models or models, args.workers or workers
    args.servers, args.steps = args.servers or servers, args.steps or steps
    args.warmup = warmup if args.warmup is None else args.warmup
    if args.project:
        args.models = [m for m in args.models if m != "messages"] + ["resnet50"]
        print(project(args))
        return 0
    os.environ.update(env.worker_env(str(ROOT)))  # the thread settings; this mxoid first
    cells, failures = [], []
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models:
            for count in args.servers:
                for workers_ in args.workers:
                    try:
                        cells.append(run_cell(model, workers_, count, args, folder))
                    except RuntimeError as error:
                        failures.append(str(error))
                    print(f"# {model} {workers_}w {count}s done", file=sys.stderr, flush=True)
    print(table(cells))
    if args.saves:
        print("\n" + save_table(cells))
    print(f"\n{os.cpu_count()} CPUs, {run.mode} run, batch {args.batch} per worker")
    bad = [c for c in cells if not (c["step"] > 0 and c["bytes_per_worker"] > 0)]
    failures += [f"implausible results: {c}" for c in bad]
    settings = dict(models=args.models, workers=args.workers, servers=args.servers)
    settings.update(batch=args.batch, steps=args.steps, warmup=args.warmup)
    settings["bigarray_bound"], settings["saves"] = BIGARRAY_BOUND, args.saves
    return run.finish(failures, settings, cells, own_load=False)  # its workers would count


if __name__ == "__main__":
    sys.exit(main())
