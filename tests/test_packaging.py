"""Packaging: one version, the wheel's files, and an sdist whose tests run."""

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


def test_the_sdist_runs_its_own_tests(dist, tmp_path):
    sdist = build("sdist", dist)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path)
    unpacked = tmp_path / sdist.name[: -len(".tar.gz")]
    for helper in ("conftest.py", "checkpointing.py", "monitored.py", "networks.py", "scripted.py"):
        assert (unpacked / "tests" / helper).is_file(), helper
    assert (unpacked / "LICENSE").is_file() and (unpacked / "CHANGELOG.md").is_file()
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
