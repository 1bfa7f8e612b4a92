"""mxoid's benchmarks: ``python benchmarks/run.py [SUITE] [options]``.

Suites (``benchmarks/suites/``; ``python benchmarks/run.py SUITE --help``):

  contest   mxoid beside the other ways of training a workload (--workload symbol, gluon
            or buckets), in turns, round by round; their parameters checked against the
            reference's. Its workloads also run by their own names:
  loop      (the default) contest --workload symbol: mxoid beside a hand-written loop,
            Module.fit, FeedForward and Gluon
  micro     hook dispatch, and what each everyday extension adds to a batch
  updaters  MXNet's stock updater against mxoid's FusedUpdater, per step
  head      TrainingMonitoring's metric head: MXNet's operators against the fused one
  prefetch  training on a slow iterator, with and without Prefetch
  evaluate  Evaluate against Module.score
  sweep     host time per step against the number of parameter arrays
  startup   a short run from scratch in fresh processes: MainLoop against Module
  gluon     contest --workload gluon: a Gluon HybridBlock, beside Gluon's hand loop and
            Estimator
  buckets   contest --workload buckets: an LSTM over buckets, beside BucketingModule.fit
            and a hand loop; memory
  scaling   weak scaling of MXNet's parameter server under ``mxoid launch``, on loopback
  serving   MXNet float32, MXNet int8 and onnxruntime on the exported model: latency,
            throughput and accuracy of an MLP, LeNet and a ResNet-20
  precision mixed_precision='bfloat16' against float32: speed and accuracy (LeNet,
            ResNet-20, the model zoo's ResNet-18)

Every suite has ``--quick``, ``--check`` (correctness only, tiny; exit status 1 when a
check fails, speed never changes it) and ``--json PATH`` (default ``results/SUITE.json``).
"""

import importlib
import os
import sys

from harness import env

SUITES = ("contest", "micro", "updaters", "head", "prefetch", "evaluate", "sweep", "startup")
SUITES += ("scaling", "serving", "precision")
ALIASES = {"loop": "symbol", "gluon": "gluon", "buckets": "buckets"}  # contest's workloads


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    name = argv.pop(0) if argv[:1] and argv[0] in SUITES + tuple(ALIASES) else "loop"
    if name in ALIASES:
        name, argv = "contest", ["--workload", ALIASES[name], *argv]
    env.apply_thread_settings()  # before MXNet is imported, by the suite
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if env.ROOT not in sys.path:  # this checkout's mxoid, unless PYTHONPATH names another
        sys.path.insert(1 + len(paths), env.ROOT)
    return importlib.import_module(f"suites.{name}").main(argv)


if __name__ == "__main__":
    sys.exit(main())
