"""Packaging: one version, the wheel's files, an sdist whose tests run, the installer of
the README's commands (install.py), and the commands CI reads from the README."""

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import mxoid

ROOT = Path(__file__).resolve().parents[1]


def build(kind, out):
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    return tmp_path_factory.mktemp("dist")


def test_one_version_everywhere(capsys):
    from mxoid.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"mxoid {mxoid.__version__}"
    project = (ROOT / "pyproject.toml").read_text().split("[project]")[1].split("\n[")[0]
    assert 'dynamic = ["version"]' in project and "\nversion" not in project


def test_the_wheel_holds_the_package_the_start_up_file_and_the_license(dist):
    wheel = build("wheel", dist)
    assert wheel.name == f"mxoid-{mxoid.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "mxoid-mxnet-compat.pth" in names and "mxoid/py.typed" in names
    assert "mxoid/metrics/native/metric_rows.cc" in names  # built on first use
    assert f"mxoid-{mxoid.__version__}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith("tests/")]
    metadata = zipfile.ZipFile(wheel).read(f"mxoid-{mxoid.__version__}.dist-info/METADATA").decode()
    assert (
        "License-Expression: Apache-2.0" in metadata and "Requires-Python: <3.14,>=3.9" in metadata
    )
    # NumPy 1.x has no wheel for Python 3.13: plain pip stops there at once (install.py works).
    assert 'Requires-Dist: numpy>=1.17; python_version < "3.13"' in metadata
    assert 'Requires-Dist: numpy>=2.1; python_version >= "3.13"' in metadata


def test_the_sdist_runs_its_own_tests(dist, tmp_path):
    sdist = build("sdist", dist)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path)
    unpacked = tmp_path / sdist.name[: -len(".tar.gz")]
    for helper in ("conftest.py", "checkpointing.py", "monitored.py", "networks.py", "scripted.py"):
        assert (unpacked / "tests" / helper).is_file(), helper
    assert (unpacked / "LICENSE").is_file() and (unpacked / "CHANGELOG.md").is_file()
    assert (unpacked / "install.py").is_file()  # the README's commands run in the sdist too
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_architecture.py",
            "tests/log",
            "tests/extensions/test_base.py",
        ],
        cwd=unpacked,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert (
        "passed" in done.stdout
        and str(unpacked)
        in subprocess.run(
            [sys.executable, "-c", "import mxoid; print(mxoid.__file__)"],
            cwd=unpacked,
            capture_output=True,
            text=True,
        ).stdout
    )  # the sdist's own mxoid was tested


# ------------------------------------------------------------------ install.py
def installer():
    spec = importlib.util.spec_from_file_location("mxoid_install", ROOT / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "requirement, expected",
    [
        ("numpy (<2.0.0,>1.16.0)", "numpy (>1.16.0)"),
        ("numpy<2,>=1.17", "numpy>=1.17"),
        ("numpy<2.0", "numpy"),
        ('numpy (<2.0.0,>1.16.0) ; python_version < "4"', 'numpy (>1.16.0) ; python_version < "4"'),
        ("numpy>=1.17", "numpy>=1.17"),
    ],
)
def test_the_installer_removes_upper_bounds_only(requirement, expected):
    assert installer().uncapped(requirement) == expected


def fake_mxnet(folder):
    """An installed mxnet-1.9.1.dist-info, with MXNet's own requirements."""
    dist_info = folder / "mxnet-1.9.1.dist-info"
    dist_info.mkdir()
    metadata = (
        "Metadata-Version: 2.1\nName: mxnet\nVersion: 1.9.1\n"
        "Requires-Dist: numpy (<2.0.0,>1.16.0)\nRequires-Dist: requests (<3,>=2.20.0)\n"
        "Requires-Dist: graphviz (<0.9.0,>=0.8.1)\n\nApache MXNet\n"
    )
    (dist_info / "METADATA").write_text(metadata)
    (dist_info / "RECORD").write_text(
        "mxnet/__init__.py,sha256=abc,10\n"
        "mxnet-1.9.1.dist-info/METADATA,sha256=old,100\n"
        "mxnet-1.9.1.dist-info/RECORD,,\n"
    )
    return dist_info


def test_the_installer_rewrites_metadata_and_its_record(tmp_path):
    install = installer()
    dist_info = fake_mxnet(tmp_path)
    assert install.remove_numpy_cap(dist_info)
    data = (dist_info / "METADATA").read_bytes()
    text = data.decode()
    assert "Requires-Dist: numpy (>1.16.0)\n" in text and "<2.0.0" not in text
    assert "Requires-Dist: graphviz (<0.9.0,>=0.8.1)" in text  # other caps kept
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = (dist_info / "RECORD").read_text().splitlines()
    assert record == [
        "mxnet/__init__.py,sha256=abc,10",
        f"mxnet-1.9.1.dist-info/METADATA,sha256={digest},{len(data)}",
        "mxnet-1.9.1.dist-info/RECORD,,",
    ]
    assert not install.remove_numpy_cap(dist_info)  # once is enough


@pytest.mark.parametrize("python_313", [False, True])
def test_the_installer_is_pip_install_and_on_313_first_uncaps_mxnet(
    tmp_path, monkeypatch, capsys, python_313
):
    install = installer()
    dist_info = fake_mxnet(tmp_path)
    calls = []
    monkeypatch.setattr(install.subprocess, "call", lambda command: calls.append(command) or 0)
    monkeypatch.setattr(install, "installed_dist_info", lambda name: dist_info)
    monkeypatch.setattr(install, "NEEDS_UNCAPPED_NUMPY", (3, 0) if python_313 else (4, 0))
    arguments = ["-e", ".[test]", "--no-cache-dir", "-i", "https://example.org/simple"]
    assert install.main(arguments) == 0
    pip = [sys.executable, "-m", "pip", "install"]
    compiled = [sys.executable, "-m", "compileall", "-q", str(ROOT / "mxoid")]
    if not python_313:
        assert calls == [pip + arguments, compiled]
        return
    options = ["--no-cache-dir", "-i", "https://example.org/simple"]
    assert calls == [pip + ["--no-deps", *options, "mxnet==1.9.1"], pip + arguments, compiled]
    assert "numpy (>1.16.0)" in (dist_info / "METADATA").read_text()
    out = capsys.readouterr().out
    assert "$ " + " ".join(pip + arguments) in out and "removed the numpy<2 cap" in out


@pytest.mark.parametrize(
    "arguments, compiles",
    [
        (["-e", ".[test]"], True),
        (["--editable", "."], True),
        (["--editable=.[examples]"], True),
        (["-e.[test]", "-q"], True),
        (["-e", ".[test]", "--no-compile"], False),  # pip's own option
        ([".[test]"], False),  # a regular install: pip compiles
        (["-e", "/nonexistent/other-clone"], False),  # another project
    ],
)
def test_an_editable_install_of_this_clone_compiles_its_bytecode(monkeypatch, arguments, compiles):
    install = installer()
    monkeypatch.chdir(ROOT)
    assert install.editable_clone(arguments) == compiles


def test_the_compiled_bytecode_is_what_a_process_loads(tmp_path):
    """compileall's files are those the import system reads: with PYTHONDONTWRITEBYTECODE
    set, a fresh process imports the package from them, compiling nothing."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 42\n")
    assert installer().compile_bytecode(package) == 0
    cached = list((package / "__pycache__").glob("__init__.*.pyc"))
    assert len(cached) == 1
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-v", "-c", "import pkg; print(pkg.VALUE)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    assert f"code object from '{cached[0]}'" in done.stderr  # not from the source


def test_the_installer_stops_when_pip_fails(monkeypatch):
    install = installer()
    calls = []
    monkeypatch.setattr(install.subprocess, "call", lambda command: calls.append(command) or 3)
    monkeypatch.setattr(install, "NEEDS_UNCAPPED_NUMPY", (3, 0))
    assert install.main(["."]) == 3 and len(calls) == 1


# ------------------------------------------------------------------ the README's commands
def test_ci_reads_the_readmes_two_commands_and_they_use_the_installer():
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run"), "commands"],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    example, tests = done.stdout.splitlines()
    assert example == "python install.py -e '.[examples]' && python examples/train_digits.py"
    assert tests == "python install.py -e '.[test]' && python -m pytest -q -n auto"
    top = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert f"```bash\n{example}\n```" in top and f"```bash\n{tests}\n```" in top
