"""What a Gluon user reaches for: predict and score on DataLoaders, the block holding the
model whenever one can look, and the README's "Coming from Gluon" snippet as pasted."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data
from mxnet import gluon
from mxnet.gluon import nn

from mxoid import Checkpoint, Extension, FinishAfter, MainLoop

README = Path(__file__).resolve().parents[2] / "README.md"


def dense():
    net = nn.HybridSequential()
    net.add(nn.Dense(8, activation="relu"), nn.BatchNorm(), nn.Dense(3))
    mx.random.seed(2)
    net.initialize(mx.init.Xavier())
    return net


def test_predict_and_score_take_dataloaders():
    """predict(loader) equals net(x) on every sample (a short last batch included), for a
    loader of data and labels and one of data alone; score(loader) as Evaluate records."""
    X, y = classification_data(100)
    net = dense()
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), 32)
    loop = MainLoop(
        net,
        train,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[FinishAfter(after_n_epochs=2)],
    )
    loop.run()
    expected = net(mx.nd.array(X)).asnumpy()
    for loader in (train, gluon.data.DataLoader(gluon.data.ArrayDataset(X), 32)):
        predicted = loop.predict(loader, "output")["output"]
        assert predicted.shape == expected.shape
        np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)
    scores = loop.score(train, {"output": "acc"})
    assert scores["valid_accuracy"] == pytest.approx((expected.argmax(1) == y).mean())


class ReadsTheBlock(Extension):
    """Reads the block's values at every epoch end, as a user's extension would."""

    def __init__(self, net):
        super().__init__(after_epoch=True)
        self.net, self.seen = net, []

    def do(self, which_callback, *args):
        args, aux = self.main_loop.get_params()
        params = {p.name: p.data().asnumpy() for p in self.net.collect_params().values()}
        self.seen.append(all((params[k] == v.asnumpy()).all() for k, v in {**args, **aux}.items()))


def test_the_block_holds_the_trained_values_at_every_epoch_end_and_checkpoint(tmp_path):
    X, y = classification_data(100)
    net = dense()
    net(mx.nd.array(X[:1]))  # the shapes
    first = net[0].weight.data().asnumpy().copy()
    reader = ReadsTheBlock(net)
    loop = MainLoop(
        net,
        gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), 32),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[reader, FinishAfter(after_n_epochs=3)],
    )
    loop.run()
    assert reader.seen == [True, True, True]
    assert not (net[0].weight.data().asnumpy() == first).all()
    net = dense()  # a checkpoint mid-epoch
    MainLoop(
        net,
        gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), 32),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[Checkpoint(str(tmp_path), every_n_batches=2), FinishAfter(after_n_batches=2)],
    ).run()
    saved = mx.nd.load(str(next(tmp_path.glob("checkpoint-*")) / "net.params"))
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), saved["0.weight"].asnumpy())


def test_the_readme_gluon_snippet_runs_as_pasted_twice(tmp_path):
    """Its EarlyStopping has a patience; a second run writes beside the first's checkpoints."""
    text = README.read_text()
    start = text.index("\n## Coming from Gluon")
    (block,) = re.findall(r"```python\n(.*?)```", text[start : text.find("\n## ", start + 1)], re.S)
    script = tmp_path / "coming_from_gluon.py"
    script.write_text(block)
    for _ in (1, 2):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "(100, 3)" in done.stdout
    assert len([p for p in (tmp_path / "runs" / "gluon").iterdir() if p.is_dir()]) >= 2


def zoo_resnet():
    """A model-zoo ResNet-18 (thumbnail): each instance of a process gets another prefix."""
    net = gluon.model_zoo.vision.resnet18_v1(thumbnail=True, classes=4)
    for param in net.collect_params(".*beta|.*gamma|.*bias").values():
        param.wd_mult = 0.0  # as GluonCV's --no-wd: multipliers by name, to be renamed
    mx.random.seed(5)
    net.initialize(mx.init.Xavier())
    return net


def test_a_second_model_zoo_instance_resumes_from_the_first_ones_checkpoint(tmp_path):
    """Its parameters are named resnetv1<n+1>_...: matched by place in the block (the keys
    of net.params), the resumed run equals the uninterrupted one bit for bit, parameters,
    running statistics and momentum included, and nothing is warned of."""
    X = np.random.RandomState(0).rand(16, 3, 32, 32).astype("float32")
    y = (np.arange(16) % 4).astype("float32")

    def train(net, batches, **options):
        MainLoop(
            net,
            gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), 4),
            loss=gluon.loss.SoftmaxCrossEntropyLoss(),
            optimizer="sgd",
            optimizer_params={"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3},
            extensions=[FinishAfter(after_n_batches=batches), *options.pop("extensions", [])],
            **options,
        ).run()
        return {k: p.data().asnumpy() for k, p in net._collect_params_with_prefix().items()}

    whole = train(zoo_resnet(), 3)
    first = zoo_resnet()
    train(first, 1, extensions=[Checkpoint(str(tmp_path), every_n_batches=1)])
    second = zoo_resnet()
    assert first.prefix != second.prefix  # resnetv1<n>_ and resnetv1<n+1>_
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train(second, 3, resume_from=str(tmp_path))
    assert not [w for w in caught if "resuming from" in str(w.message)]  # lr_mult, wd_mult
    assert resumed.keys() == whole.keys()
    for place, value in whole.items():
        np.testing.assert_array_equal(resumed[place], value, err_msg=place)
