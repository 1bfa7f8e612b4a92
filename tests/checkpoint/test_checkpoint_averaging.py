"""average_checkpoints, `mxoid average`: NumPy's mean, the best N by a record, MXNet loads it."""

import os

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data, initial_params, mlp

from mxoid import Checkpoint, Evaluate, FinishAfter, MainLoop, average_checkpoints
from mxoid.checkpoint import list_checkpoints, read_checkpoint
from mxoid.checkpoint.averaging import record_at
from mxoid.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("avg") / "run"
    X, y = classification_data(n=120)
    valid = mx.io.NDArrayIter(X[:60], y[:60], batch_size=30, label_name="softmax_label")
    net = mlp()
    MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label", shuffle=True),
        optimizer_params={"learning_rate": 0.3},
        arg_params=initial_params(net, (20, 10)),
        extensions=[
            FinishAfter(after_n_epochs=5),
            Evaluate({"valid": valid}, ["ce"]),
            Checkpoint(str(directory), keep_last=None),
        ],
    ).run()
    return str(directory)


def test_average_equals_numpys_mean(run):
    folders = list_checkpoints(run)[1:4]
    arg, aux = average_checkpoints(folders)
    each = [read_checkpoint(f).arg_params for f in folders]
    assert set(arg) == set(each[0]) and aux == {}
    for name, value in arg.items():
        expected = np.mean([e[name].asnumpy() for e in each], axis=0)
        np.testing.assert_allclose(value.asnumpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["--min", "--max"])
def test_cli_picks_the_best_n_by_the_record_and_mxnet_loads_the_output(run, tmp_path, mode, capsys):
    out = str(tmp_path / "averaged")
    assert (
        main(["average", run, "--best", "2", "--by", "valid_cross_entropy", mode, "-o", out]) == 0
    )
    values = {f: record_at(f, "valid_cross_entropy") for f in list_checkpoints(run)}
    ranked = sorted(values, key=values.get, reverse=mode == "--max")[:2]
    printed = capsys.readouterr().out
    assert all(f in printed for f in ranked)
    assert not any(f in printed for f in set(values) - set(ranked))
    expected, _ = average_checkpoints(ranked)
    module = mx.mod.Module.load(out, 0)
    module.bind(data_shapes=[("data", (5, 10))], label_shapes=[("softmax_label", (5,))])
    loaded = module.get_params()[0]
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name].asnumpy(), value.asnumpy())
    block = mx.gluon.SymbolBlock.imports(
        out + "-symbol.json", ["data", "softmax_label"], out + "-0000.params"
    )
    X, _ = classification_data(n=5)
    block(mx.nd.array(X), mx.nd.zeros(5))


def test_cli_last_n(run, tmp_path):
    out = str(tmp_path / "last")
    assert main(["average", run, "--last", "3", "-o", out]) == 0
    expected, _ = average_checkpoints(list_checkpoints(run)[-3:])
    saved = mx.nd.load(out + "-0000.params")
    for name, value in expected.items():
        np.testing.assert_allclose(saved[f"arg:{name}"].asnumpy(), value.asnumpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "arguments, says",
    [
        (["--best", "2", "-o", "x"], "--by RECORD"),
        (["--best", "2", "--by", "nothing_such", "-o", "x"], "no checkpoint with the record"),
        (["--last", "0", "-o", "x"], "at least 1"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_1(
    run, arguments, says, capsys, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    assert main(["average", run, *arguments]) == 1
    error = capsys.readouterr().err
    assert error.startswith("mxoid average: error:") and says in error
    assert main(["average", str(tmp_path / "none"), "--last", "1", "-o", "x"]) == 1


def test_gluon_block_checkpoints_give_gluons_files(tmp_path):
    X, y = classification_data(n=60)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        loss=mx.gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[FinishAfter(after_n_epochs=3), Checkpoint(str(tmp_path / "g"), keep_last=None)],
    ).run()
    out = str(tmp_path / "avg")
    assert main(["average", str(tmp_path / "g"), "--last", "2", "-o", out]) == 0
    folders = list_checkpoints(str(tmp_path / "g"))[-2:]
    copy = mx.gluon.nn.HybridSequential()
    copy.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Dense(3))
    copy.load_parameters(out + ".params")
    each = [mx.nd.load(os.path.join(f, "net.params")) for f in folders]
    for name, param in copy._collect_params_with_prefix().items():
        expected = np.mean([e[name].asnumpy() for e in each], axis=0)
        np.testing.assert_allclose(param.data().asnumpy(), expected, rtol=1e-6, atol=1e-7)
    data_name = [
        n
        for n in mx.sym.load(out + "-net-symbol.json").list_arguments()
        if "weight" not in n and "bias" not in n
    ]
    imported = mx.gluon.SymbolBlock.imports(
        out + "-net-symbol.json", data_name, out + "-0000.params"
    )
    np.testing.assert_allclose(
        imported(mx.nd.array(X[:4])).asnumpy(), copy(mx.nd.array(X[:4])).asnumpy(), rtol=1e-5
    )
