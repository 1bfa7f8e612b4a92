"""The serving suite runs end to end (``python benchmarks/run.py serving --check``): each
model trained, exported to ONNX and quantized to int8, the three served side by side at
batch 1 and 32; onnxruntime computes what MXNet float32 computes on the held-out images.

Only correctness is asserted here; speed lives in the suite's output.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import full_environment

pytest.importorskip("onnxruntime", reason="the serving suite needs onnxruntime: mxoid[onnx]")

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks")
RUN = os.path.join(BENCHMARKS, "run.py")
KINDS = ("mxnet_fp32", "mxnet_int8", "onnxruntime")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """``run.py serving --check``: tiny training on the digits, two rounds (about 15 s)."""
    path = tmp_path_factory.mktemp("serving") / "serving.json"
    done = subprocess.run(
        [sys.executable, RUN, "serving", "--check", "--json", str(path)],
        env=full_environment(),  # its workers load the digits with scikit-learn
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(path.read_text())
    assert data["suite"] == "serving" and data["mode"] == "check"
    return data, done.stdout


def test_every_model_is_served_three_ways_at_batch_1_and_32(report):
    data, stdout = report
    assert [r["model"] for r in data["results"]] == ["mlp", "lenet", "resnet20"]
    for result in data["results"]:
        assert set(result["batches"]) == {"1", "32"}
        for cells in result["batches"].values():
            for kind in KINDS:
                assert cells[kind]["latency_ms"] > 0 and cells[kind]["samples_per_second"] > 0
                if kind != "mxnet_fp32":
                    low, high = cells[kind]["speed_over_fp32_interval"]
                    assert low <= cells[kind]["speed_over_fp32"] <= high
        assert result["int8_layers"] >= 2
    assert "| mlp      |     1 |" in stdout and "Correctness: ok" in stdout


def test_onnxruntime_computes_what_mxnet_computes_and_int8_keeps_the_accuracy(report):
    data, _ = report
    assert data["correctness"]["ok"], data["correctness"]["failures"]
    for result in data["results"]:
        assert result["onnx_max_difference"] <= 1e-5
        accuracy = result["accuracy"]
        assert abs(accuracy["onnxruntime"] - accuracy["mxnet_fp32"]) <= 1 / result["held_out"]
        assert accuracy["mxnet_int8"] >= accuracy["mxnet_fp32"] - 0.05


def test_the_run_records_the_machines_load(report):
    data, stdout = report
    assert data["other_load_cores"] >= 0 and len(data["settings"]["load_average_before"]) == 3
    assert data["settings"]["threads"] == 1 and "cores busy meanwhile" in stdout
