"""The processes the tests start see only mxoid's dependencies (tests/lean_site).

MXNet imports SciPy and scikit-learn whenever they are installed (0.7 of the 1.8 CPU
seconds of ``import mxnet``); the test environment has them for the digits. What the
README says of the test command: the processes the tests start import MXNet without
them, the examples (which load the digits) with them, and the test processes themselves
keep them.
"""

import json
import os
import shutil
import subprocess
import sys

from conftest import LEAN_SITE, full_environment

PROBE = (
    "import json, sys, mxnet\n"
    "try:\n"
    "    import scipy\n"
    "    said = None\n"
    "except ImportError as error:\n"
    "    said = str(error)\n"
    "print(json.dumps({name: name in sys.modules for name in ('scipy', 'sklearn')}"
    " | {'said': said}))\n"
)


def probe(env):
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_started_process_imports_mxnet_without_scipy_and_sklearn():
    lean = probe(dict(os.environ))
    assert not lean["scipy"] and not lean["sklearn"], lean
    assert lean["said"] == "No module named 'scipy' (hidden by MXOID_TESTS_HIDDEN)"


def test_the_examples_environment_hides_nothing_and_the_test_process_keeps_both():
    full = probe(full_environment())
    assert full["scipy"] and full["sklearn"] and full["said"] is None, full
    import sklearn.datasets  # noqa: F401  (the digits, in this process)

    assert "scipy" in sys.modules


def test_the_sitecustomize_it_shadows_still_runs(tmp_path):
    """Python runs the first sitecustomize on sys.path: the lean one runs the next one that
    is not a lean site. Here a clone's lean site comes first (as where a test runs pytest
    in a clone): one finder, no error, and the shadowed one runs once."""
    clone = tmp_path / "clone_lean_site"
    clone.mkdir()
    shutil.copy(os.path.join(LEAN_SITE, "sitecustomize.py"), clone)
    shadowed = tmp_path / "shadowed"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text(
        "import os\nos.environ['SHADOWED_RAN'] = os.environ.get('SHADOWED_RAN', '') + '1'\n"
    )
    path = os.pathsep.join([str(clone), LEAN_SITE, str(shadowed)])
    env = dict(os.environ, PYTHONPATH=path)
    code = (
        "import os, sys; print(os.environ.get('SHADOWED_RAN'), 'scipy' in sys.modules, "
        "sum(getattr(f, 'mxoid_lean_site', False) for f in sys.meta_path)); import scipy"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["1", "False", "1"], done.stdout + done.stderr
    assert "hidden by MXOID_TESTS_HIDDEN" in done.stderr
    assert "Error in sitecustomize" not in done.stderr, done.stderr
