"""The order in which ``pytest -n`` hands the tests out, so that the run ends on short tests.

pytest-xdist gives each worker the next test (or group) in collection order as it
frees up. Most of the suite's time is in a few tests that start processes (launched
jobs, builds, the examples), so the collection is reordered longest first (list
scheduling, longest processing time first), by the seconds measured for each file
(:data:`SECONDS`, from a full run on two cores: a stale figure slows the run, it never
changes a result). Tests that share a module-scoped fixture (a benchmark suite's run,
an example's training) stay one unit for one worker (``--dist loadgroup``): split
between workers, each would run the fixture again. The units are found in the test
files' source (:func:`scope`), so that xdist's controller, which collects nothing,
finds the same ones as its workers.
"""

import ast
import functools
import os
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]

SECONDS: Dict[str, float] = {  # a test's wall-clock seconds, by the longest matching prefix
    "tests/benchmarks/test_gluon_suite.py::test_every_contender_ran_in_every_cell": 36.0,
    "tests/executor_manager/test_pacing.py::test_the_bound_bounds_memory": 22.0,
    "tests/test_examples.py::test_mnist_one_epoch_reaches_97_percent": 21.0,
    "tests/benchmarks/test_suites.py::test_every_contender_ran_in_every_cell": 20.0,
    "tests/metrics/test_native_build.py::test_the_library_is_built_once_into_the_cache": 20.0,
    "tests/benchmarks/test_serving_suite.py::test_every_model_is_served_three_ways": 12.0,
    "tests/checkpoint/test_checkpoint_faults.py::test_random_kills_lose_no_row": 11.0,
    "tests/distributed/test_resumption_distributed.py": 10.0,
    "tests/distributed/test_hosts.py::test_a_wrong_slurm_task_count_is_an_error": 10.0,
    "tests/distributed/test_hosts_faults.py": 9.0,
    "tests/metrics/test_native_build.py": 9.0,
    "tests/distributed/test_resized_resumption.py": 7.0,
    "tests/main_loop/test_interrupt.py": 6.0,
    "tests/benchmarks/test_gluon_suite.py": 6.0,
    "tests/distributed/test_loss_scale_distributed.py": 4.0,
    "tests/test_operator_cache.py::test_every_operator_function_is_the_one_mxnet_makes": 6.4,
    "tests/test_operator_cache.py::test_processes_that_start_together": 2.6,
    "tests/test_operator_cache.py::test_training_runs_on_functions_from_the_file": 2.0,
    "tests/test_operator_cache.py": 1.2,
    "tests/benchmarks/test_serving_suite.py": 4.0,
    "tests/distributed/test_distributed_faults.py": 4.0,
    "tests/benchmarks/test_suites.py": 3.0,
    "tests/distributed/test_buckets_distributed.py": 3.0,
    "tests/distributed/test_averaging_distributed.py": 3.0,
    "tests/distributed/test_gluon_short_batch_distributed.py": 2.9,
    "tests/test_examples.py": 2.8,
    "tests/gluon/test_gluon_gaps.py": 2.7,
    "tests/distributed/test_jobs.py": 2.5,
    "tests/executor_manager/test_pacing.py": 2.1,
    "tests/benchmarks/test_buckets_suite.py": 1.6,
    "tests/gluon/test_gluon.py": 1.5,
    "tests/checkpoint/test_resumption.py": 1.4,
    "tests/distributed/test_launch.py": 1.2,
    "tests/distributed/test_slurm_checks.py": 1.2,
    "tests/main_loop/test_mixed_precision.py": 1.1,
    "tests/distributed/test_hosts.py": 1.1,
    "tests/checkpoint/test_checkpoint_faults.py": 1.0,
    "tests/test_packaging.py": 1.0,
}
DEFAULT_SECONDS = 0.5


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def seconds(nodeid: str) -> float:
    """A test's expected seconds: :data:`SECONDS` by its longest prefix, else the default."""
    matches = [prefix for prefix in SECONDS if nodeid.startswith(prefix)]
    return SECONDS[max(matches, key=len)] if matches else DEFAULT_SECONDS


@functools.cache
def _shared_fixtures(path: str) -> Dict[str, Tuple[str, ...]]:
    """For each test function of the file ``path``: the module- or class-scoped fixtures of
    that file it takes as arguments (read from the source: the controller collects nothing)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    shared = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                scopes = [
                    k.value.value
                    for k in getattr(decorator, "keywords", ())
                    if k.arg == "scope" and isinstance(k.value, ast.Constant)
                ]
                if "fixture" in ast.dump(decorator) and set(scopes) & {"module", "class"}:
                    shared.add(node.name)
    return {
        node.name: tuple(sorted(a.arg for a in node.args.args if a.arg in shared))
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    }


def scope(nodeid: str) -> str:
    """The unit ``nodeid`` belongs to: its file and the shared fixtures its test takes, or
    the test alone."""
    path, _, rest = nodeid.partition("::")
    name = rest.split("::")[-1].split("[")[0]
    fixtures = _shared_fixtures(str(Path(ROOT, path)) if not Path(path).is_absolute() else path)
    shared = fixtures.get(name, ())
    return f"{path}::{'+'.join(shared)}" if shared else nodeid


def longest_first(items: List) -> List:
    """``items`` in units (:func:`scope`), the longest unit first; a stable sort, so that
    equal units keep the collection's order."""
    units: Dict[str, List] = {}
    for item in items:
        units.setdefault(scope(item.nodeid), []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(seconds(i.nodeid) for i in unit))
    return [item for unit in ordered for item in unit]


def scheduler(config, log):
    """xdist's scheduler by units (:func:`scope`), handed out in the collection's order."""
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    config.option.loadscopereorder = False  # keep the order of longest_first
    return LongestFirst(config, log)
