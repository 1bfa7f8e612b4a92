"""Resuming iterators that cannot be repositioned: MXNet's ImageRecordIter on a real RecordIO
file made from the digits, and a Python iterator, at an epoch boundary and mid-epoch."""

import io

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical, params_of
from networks import digits_images

from mxoid import Checkpoint, FinishAfter, MainLoop
from mxoid.checkpoint import list_checkpoints


@pytest.fixture(scope="module")
def record_file(tmp_path_factory):
    """The first 300 digits as PNG images in an indexed RecordIO file, labels in the headers."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("rec")
    X, y = digits_images(300)
    record = mx.recordio.MXIndexedRecordIO(str(folder / "d.idx"), str(folder / "d.rec"), "w")
    for index, (image, label) in enumerate(zip(X, y)):
        png = io.BytesIO()
        Image.fromarray((image[0] * 255).astype("uint8")).save(png, format="PNG")
        header = mx.recordio.IRHeader(0, float(label), index, 0)
        record.write_idx(index, mx.recordio.pack(header, png.getvalue()))
    record.close()
    return folder


def image_records(folder, deterministic=True):
    it = mx.io.ImageRecordIter(
        path_imgrec=str(folder / "d.rec"),
        path_imgidx=str(folder / "d.idx"),
        data_shape=(1, 8, 8),
        batch_size=30,
        shuffle=True,
        seed=5,
        round_batch=False,
        preprocess_threads=1,
        label_name="softmax_label",
    )
    if deterministic:
        it.resets_are_deterministic = True
    return it


def lenet():
    data = mx.sym.Variable("data")
    conv = mx.sym.Activation(
        mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv"), act_type="tanh"
    )
    fc = mx.sym.FullyConnected(mx.sym.Flatten(conv), num_hidden=10, name="fc")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def loop(train, directory, stop, resume=False):
    net = lenet()
    rng = np.random.RandomState(0)
    shapes = dict(zip(net.list_arguments(), net.infer_shape(data=(30, 1, 8, 8))[0]))
    params = {
        n: mx.nd.array(rng.uniform(-0.2, 0.2, s))
        for n, s in shapes.items()
        if n not in ("data", "softmax_label")
    }
    return MainLoop(
        net,
        train,
        arg_params=params,
        optimizer_params={"learning_rate": 0.1},
        extensions=[stop, Checkpoint(str(directory), every_n_batches=5, keep_last=None)],
        resume_from=str(directory) if resume else None,
    )


@pytest.mark.parametrize("cut", [10, 25])  # 10 batches per epoch: at its end, in the middle
def test_image_record_iter_resumes_exactly(record_file, tmp_path, cut):
    full = loop(image_records(record_file), tmp_path / "full", FinishAfter(after_n_epochs=4)).run()
    loop(image_records(record_file), tmp_path / "cut", FinishAfter(after_n_batches=cut)).run()
    resumed = loop(
        image_records(record_file), tmp_path / "cut", FinishAfter(after_n_epochs=4), resume=True
    )
    assert resumed.resumed_from.endswith(f"batch{cut:08d}")
    resumed.run()
    assert_identical(params_of(full), params_of(resumed))
    assert [p[-20:] for p in list_checkpoints(str(tmp_path / "cut"))][-1].endswith("00000040")


def test_replaying_an_iterator_warns_at_epoch_boundaries_too(record_file, tmp_path):
    loop(image_records(record_file), tmp_path, FinishAfter(after_n_epochs=1)).run()
    with pytest.warns(UserWarning, match=r"reset 0 time\(s\) and 0 batch\(es\) are skipped"):
        loop(
            image_records(record_file, deterministic=False),
            tmp_path,
            FinishAfter(after_n_epochs=2),
            resume=True,
        )
