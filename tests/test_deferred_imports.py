"""``requests`` and ``onnx``, imported by ``import mxnet``, run at their first use
(mxoid/deferred_imports.py): the same modules as a plain import gives, once used."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mxoid import deferred_imports

HAS_ONNX = bool(__import__("importlib.util").util.find_spec("onnx"))
PACKAGES = ["requests"] + (["onnx"] if HAS_ONNX else [])


def fresh(code, *, path=(), **env):
    """Run ``code`` in a fresh Python; return what it printed last, as JSON."""
    environment = {**os.environ, "MXNET_SUBGRAPH_VERBOSE": "0", **env}
    if path:
        environment["PYTHONPATH"] = os.pathsep.join([*path, environment.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# What a module is once used: its names, its loader's kind, the package's submodules loaded.
DESCRIBE = """
def describe(name):
    import sys
    module = sys.modules[name]
    return {
        "class": type(module).__name__,
        "names": sorted(vars(module)),
        "loader": type(module.__spec__.loader).__name__,
        "__loader__": type(module.__loader__).__name__,
        "submodules": sorted(m for m in sys.modules if m.startswith(name + ".")),
    }
"""


def plain(first_use):
    """The packages imported without MXNet (nothing deferred), after ``first_use``."""
    return fresh(
        DESCRIBE
        + f"""
import json
{first_use}
print(json.dumps({{name: describe(name) for name in {PACKAGES!r}}}))
"""
    )


def test_import_mxnet_runs_neither_and_their_first_use_gives_the_modules_a_plain_import_gives():
    code = (
        DESCRIBE
        + f"""
import json, sys
import mxnet, mxnet.gluon.utils
before = {{name: type(sys.modules[name]).__name__ for name in {PACKAGES!r}}}
ran = sorted(m for m in ("urllib3", "charset_normalizer", "google.protobuf") if m in sys.modules)
same = mxnet.gluon.utils.requests is sys.modules["requests"]
for name in {PACKAGES!r}:
    sys.modules[name].__version__  # the first use
print(json.dumps([before, ran, same, {{name: describe(name) for name in {PACKAGES!r}}}]))
"""
    )
    before, ran, same, after = fresh(code)
    assert before == {name: "DeferredModule" for name in PACKAGES}
    assert ran == [] and same  # nothing of theirs ran; MXNet holds the module itself
    assert after == plain("import requests" + ("; import onnx" if HAS_ONNX else ""))


def test_a_submodule_import_or_dir_runs_the_package_first():
    first_use = "import requests.adapters" + ("; from onnx import defs" if HAS_ONNX else "")
    code = (
        DESCRIBE
        + f"""
import json, sys
import mxnet
{first_use}
dir(sys.modules["requests"])
print(json.dumps({{name: describe(name) for name in {PACKAGES!r}}}))
"""
    )
    assert fresh(code) == plain(first_use)


def test_the_programs_own_import_before_mxnet_or_the_switch_leaves_the_import_as_it_was():
    code = """
import json, sys
import requests
import mxnet
print(json.dumps(type(sys.modules["requests"]).__name__))
"""
    assert fresh(code) == "module"
    code = 'import json, sys, mxnet; print(json.dumps(type(sys.modules["requests"]).__name__))'
    assert fresh(code, MXOID_DEFERRED_IMPORTS="0") == "module"
    assert fresh(code) == "DeferredModule"


@pytest.mark.adversarial
def test_a_package_that_is_not_installed_raises_at_the_import(tmp_path):
    """MXNet's ``try: import onnx / except ImportError`` sees a missing package, as without."""
    assert deferred_imports.find_spec("onnx", [str(tmp_path)], None, True) is None
    assert deferred_imports.find_spec("onnx", None, None, False) is None  # not MXNet's import
    assert deferred_imports.find_spec("numpy", None, None, True) is None  # not deferred


@pytest.mark.adversarial
def test_a_broken_package_fails_at_its_first_use_once_and_is_gone_as_after_a_failed_import(
    tmp_path,
):
    """A package whose code raises: without the deferral, ``import mxnet`` itself fails
    (MXNet catches only ImportError); with it, MXNet imports and the first use raises
    the package's error, leaving it out of ``sys.modules`` as a failed import does."""
    package = tmp_path / "onnx"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('onnx broken on purpose')\n")
    code = """
import json, sys
import mxnet
import mxnet.onnx.mx2onnx._op_translations._op_translations_opset12 as translations
try:
    translations.onnx.helper
except RuntimeError as error:
    said = str(error)
print(json.dumps([said, "onnx" in sys.modules]))
"""
    assert fresh(code, path=[str(tmp_path)]) == ["onnx broken on purpose", False]
    done = subprocess.run(
        [sys.executable, "-c", "import mxnet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "MXOID_DEFERRED_IMPORTS": "0"},
    )
    assert done.returncode != 0 and "onnx broken on purpose" in done.stderr


@pytest.mark.adversarial
def test_threads_that_use_it_together_run_it_once(tmp_path):
    """Eight threads reach for an attribute of a deferred package at once: its code runs
    once (a slow package, counting its runs), and every thread gets the attribute."""
    package = tmp_path / "onnx"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os, time\n"
        f"with open({str(tmp_path / 'runs')!r}, 'a') as runs:\n"
        "    runs.write('ran\\n')\n"
        "time.sleep(0.3)\n"
        "VALUE = 42\n"
    )
    code = """
import json, sys, threading
import mxnet
module = sys.modules["onnx"]
got = []
threads = [threading.Thread(target=lambda: got.append(module.VALUE)) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps([type(sys.modules["onnx"]).__name__, got]))
"""
    assert fresh(code, path=[str(tmp_path)]) == ["module", [42] * 8]
    assert (tmp_path / "runs").read_text() == "ran\n"
