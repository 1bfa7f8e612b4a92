"""One measurement of the startup suite, in a fresh Python: ``python startup_worker.py SPEC``.

Times ``import mxnet``, ``import mxoid``, then building the contender (``MainLoop(...)``
with the everyday extensions, or ``Module`` with ``bind``, ``init_params`` and
``init_optimizer``) and its first epoch (``loop.run()``, or ``Module.fit``), each ended
by ``mx.nd.waitall()``; writes them (wall-clock seconds, and the process's CPU seconds
of the last two), and the trained parameters, into SPEC's folder.
"""

import json
import os
import sys
import time

started = time.perf_counter()
import mxnet as mx  # noqa: E402

imported_mxnet = time.perf_counter()
from mxoid import FinishAfter, MainLoop  # noqa: E402  (mxoid imports its parts lazily)

imported_mxoid = time.perf_counter()
import numpy as np  # noqa: E402
from harness import workload  # noqa: E402


def model(spec: dict):
    """``(symbol, X, y, initial parameters)`` of the spec's model, fixed seeds."""
    rows = spec["batches"] * spec["batch_size"]
    if spec["model"] == "resnet20":
        from suites.sweep import initial

        symbol = workload.cifar_resnet(3)
        rng = np.random.RandomState(workload.DATA_SEED)
        X = rng.uniform(-1, 1, (rows, 3, 32, 32)).astype("float32")
        y = rng.randint(0, 10, rows).astype("float32")
        return symbol, X, y, initial(symbol, (3, 32, 32), spec["batch_size"])
    X, y = workload.make_data(spec["model"], rows)
    return workload.build_symbol(spec["model"]), X, y, workload.initial_params(spec["model"])


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    folder = os.path.dirname(spec_path)
    symbol, X, y, init = model(spec)
    contexts = [mx.cpu(i) for i in range(spec["contexts"])]
    iterator = mx.io.NDArrayIter(X, y, spec["batch_size"], label_name="softmax_label")
    arg_params = {k: mx.nd.array(v) for k, v in init.items() if k in symbol.list_arguments()}
    optimizer = {"learning_rate": 0.05, "momentum": 0.9, "rescale_grad": 1.0 / spec["batch_size"]}
    mx.nd.waitall()
    begin, begin_cpu = time.perf_counter(), time.process_time()
    if spec["contender"] == "module":
        module = mx.mod.Module(symbol, context=contexts)
        module.bind(iterator.provide_data, iterator.provide_label)
        module.init_params(arg_params=arg_params, allow_missing=True)
        module.init_optimizer(optimizer="sgd", optimizer_params=optimizer)
        mx.nd.waitall()
        built, built_cpu = time.perf_counter(), time.process_time()
        module.fit(
            iterator,
            num_epoch=1,
            eval_metric="acc",
            batch_end_callback=mx.callback.Speedometer(spec["batch_size"], 50),
        )
        arg, aux = module.get_params()
    else:
        everyday, _ = workload.everyday_extensions(folder)
        if spec["contender"] == "mxoid bare":
            everyday = {}
        loop = MainLoop(
            symbol,
            iterator,
            contexts=contexts,
            arg_params=arg_params,
            optimizer="sgd",
            optimizer_params=optimizer,
            extensions=[make() for make in everyday.values()] + [FinishAfter(after_n_epochs=1)],
        )
        mx.nd.waitall()
        built, built_cpu = time.perf_counter(), time.process_time()
        loop.run()
        arg, aux = loop.manager.get_params()
    mx.nd.waitall()
    done, done_cpu = time.perf_counter(), time.process_time()
    np.savez(
        os.path.join(folder, "params.npz"), **{k: v.asnumpy() for k, v in {**arg, **aux}.items()}
    )
    seconds = {
        "import_mxnet": imported_mxnet - started,
        "import_mxoid": imported_mxoid - imported_mxnet,
        "construct": built - begin,
        "first_epoch": done - built,
        "construct_cpu": built_cpu - begin_cpu,  # the process's, every thread's
        "first_epoch_cpu": done_cpu - built_cpu,
    }
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump({"seconds": seconds, "cpu_seconds": time.process_time()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
