"""Buckets to the standard of a fixed symbol (issue 37): every sentence evaluated once, an
evaluation that never moves training, exact resumption in any epoch with int and tuple keys."""

import logging
import random
import warnings

import mxnet as mx
import numpy as np
import pytest
from buckets import (
    BATCH,
    BUCKETS,
    OPTIMIZER_PARAMS,
    VOCAB,
    Batches,
    PairKeyIter,
    bucket_iter,
    bucketing_module_fit,
    initial_params,
    sentences,
    sym_gen_of,
    token_batches,
)
from checkpointing import comparable_log
from conftest import TWO_CPUS

from mxoid import Checkpoint, Evaluate, Extension, FinishAfter, MainLoop, TrainingMonitoring

CONTEXTS = {"one": [mx.cpu(0)], "two": TWO_CPUS}
PERPLEXITY = ("perplexity", {"ignore_label": 0})
BATCHES_AN_EPOCH = 14  # bucket_iter(): buckets of 21, 49 and 50 sentences in batches of 8


def valid_iter():
    """Buckets of 19, 32 and 32 sentences: bucket 4's last batch is partial (3 of 8)."""
    return bucket_iter(seed=9, n=83, data_seed=4)


def records(loop, name):
    return [row[name] for row in comparable_log(loop).values() if name in row]


def params_of(loop):
    return {name: value.asnumpy() for name, value in loop.get_params()[0].items()}


def bucket_loop(extensions, contexts=None, train=None, sym_gen=None, **options):
    sym_gen = sym_gen or sym_gen_of()
    return MainLoop(
        sym_gen,
        train if train is not None else bucket_iter(),
        contexts=list(contexts or [mx.cpu(0)]),
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(sym_gen_of()),
        extensions=extensions,
        exit_on_interrupt=False,
        **options,
    )


def every_sentence_perplexity(args, iterator):
    """Perplexity over every sentence the iterator holds and every real token (label != 0):
    MXNet's forward pass on one batch per bucket (all its sentences), the rest in NumPy."""
    module = mx.mod.BucketingModule(
        sym_gen_of(), default_bucket_key=iterator.default_bucket_key, logger=logging.getLogger("q")
    )
    module.bind(iterator.provide_data, iterator.provide_label, for_training=False)
    module.set_params(args, {})
    total, count = 0.0, 0
    for key, bucket in zip(iterator.buckets, iterator.data):
        label = np.concatenate([bucket[:, 1:], np.zeros((len(bucket), 1), bucket.dtype)], 1)
        batch = mx.io.DataBatch(
            [mx.nd.array(bucket)],
            [mx.nd.array(label)],
            bucket_key=key,
            provide_data=[mx.io.DataDesc("data", bucket.shape)],
            provide_label=[mx.io.DataDesc("softmax_label", label.shape)],
        )
        module.forward(batch, is_train=False)
        probabilities = module.get_outputs()[0].asnumpy().astype(np.float64)
        labels = label.reshape(-1).astype(int)
        keep = labels != 0
        picked = probabilities[np.arange(len(labels)), labels]
        total -= np.log(np.maximum(picked, 1e-10))[keep].sum()
        count += int(keep.sum())
    return float(np.exp(total / count)), count


@pytest.mark.parametrize("devices", ["one", "two"])
def test_evaluation_sees_every_sentence_once_and_never_resets_the_iterator(devices):
    valid = valid_iter()
    assert any(len(bucket) % BATCH for bucket in valid.data)  # partial batches to read
    before = [bucket.copy() for bucket in valid.data], list(valid.idx)
    loop = bucket_loop(
        [FinishAfter(after_n_epochs=1), Evaluate({"valid": valid}, [PERPLEXITY])],
        CONTEXTS[devices],
    ).run()
    expected, tokens = every_sentence_perplexity(loop.get_params()[0], valid)
    assert loop.log.last("valid_perplexity") == pytest.approx(expected, rel=1e-6)
    assert loop.score(valid, [PERPLEXITY])["valid_perplexity"] == pytest.approx(expected, rel=1e-6)
    outputs = loop.predict(valid)["softmax"]  # a row per token of every sentence, padding dropped
    assert outputs.shape[0] == sum(bucket.size for bucket in valid.data)
    for bucket, kept in zip(valid.data, before[0]):  # never reset: never shuffled
        np.testing.assert_array_equal(bucket, kept)
    assert valid.idx == before[1]


class Wrapped(mx.io.DataIter):
    """A BucketSentenceIter behind a wrapper mxoid cannot read whole: read as it yields."""

    def __init__(self, iterator):
        super().__init__(iterator.batch_size)
        self.iterator = iterator
        self.provide_data, self.provide_label = iterator.provide_data, iterator.provide_label
        self.default_bucket_key = iterator.default_bucket_key

    def reset(self):
        self.iterator.reset()  # shuffles with NumPy's and Python's global generators

    def next(self):
        return self.iterator.next()


@pytest.mark.parametrize("devices", ["one", "two"])
def test_training_with_evaluate_equals_training_without_and_bucketing_module_fit(devices):
    valid, wrapped = valid_iter(), Wrapped(valid_iter())  # built before the training data
    extensions = [
        FinishAfter(after_n_epochs=3),
        Evaluate({"valid": valid, "wrapped": wrapped}, [PERPLEXITY]),
    ]
    with pytest.warns(UserWarning, match=r"iterator 'wrapped': the iterator yielded 80 of the 83"):
        evaluated = bucket_loop(extensions, CONTEXTS[devices]).run()
    plain = bucket_loop([FinishAfter(after_n_epochs=3)], CONTEXTS[devices]).run()
    theirs = bucketing_module_fit(CONTEXTS[devices], 3, bucket_iter())
    for name, value in theirs.items():
        np.testing.assert_array_equal(params_of(plain)[name], value, err_msg=name)
        np.testing.assert_array_equal(params_of(evaluated)[name], value, err_msg=name)
    assert len(records(evaluated, "valid_perplexity")) == 3


class DrawsEachEpoch(Extension):
    """A user's extension drawing from NumPy's and Python's generators after every epoch: the
    training iterator's next reset draws from other states than the one before it."""

    def after_epoch(self):
        np.random.random_sample(3)
        random.random()


def pair_sym_gen():
    by_length = sym_gen_of()
    return lambda key: by_length(key[0])


def resumable_run(keys, stop, directory, resume=False):
    if keys == "int":
        train, sym_gen = bucket_iter(), sym_gen_of()
        valid = {"valid": valid_iter()}
    else:
        train, sym_gen = PairKeyIter(bucket_iter()), pair_sym_gen()
        valid = {}
    extensions = [
        stop,
        DrawsEachEpoch(),
        TrainingMonitoring(mx.metric.Perplexity(0), every_n_batches=4),
        Checkpoint(str(directory), every_n_batches=6),
    ]
    if valid:
        extensions.append(Evaluate(valid, [PERPLEXITY]))
    return bucket_loop(
        extensions,
        TWO_CPUS,
        train=train,
        sym_gen=sym_gen,
        resume_from=str(directory) if resume else None,
    ).run()


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    return {
        keys: resumable_run(keys, FinishAfter(after_n_epochs=3), tmp_path_factory.mktemp(keys))
        for keys in ("int", "tuple")
    }


@pytest.mark.parametrize("epoch", [1, 2, 3])
@pytest.mark.parametrize("keys", ["int", "tuple"])
def test_a_run_stopped_in_any_epoch_resumes_bit_identical(whole_runs, tmp_path, keys, epoch):
    cut = (epoch - 1) * BATCHES_AN_EPOCH + 5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumable_run(keys, FinishAfter(after_n_batches=cut), tmp_path)
        resumed = resumable_run(keys, FinishAfter(after_n_epochs=3), tmp_path, resume=True)
    inexact = [str(w.message) for w in caught if "exact" in str(w.message)]
    assert not inexact  # the replay of the tuple keys' wrapper is exact, and says nothing
    assert resumed.resumed_from.endswith(f"batch{cut:08d}")
    whole = whole_runs[keys]
    for name, value in params_of(whole).items():
        np.testing.assert_array_equal(params_of(resumed)[name], value, err_msg=name)
    whole_log, resumed_log = comparable_log(whole), comparable_log(resumed)
    for log in (whole_log, resumed_log):
        log.pop(cut, None)  # the cut run's own last row
    assert whole_log == resumed_log
    if keys == "int":
        assert len(records(whole, "valid_perplexity")) == 3


# ------------------------------------------------------------------ bad input
def per_bucket_names(key):
    """A sym_gen naming its output layer after the bucket: pred4_weight, pred8_weight..."""
    data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data, input_dim=VOCAB, output_dim=4, name="embed")
    name = "pred" if key == max(BUCKETS) else f"pred{key}"
    pred = mx.sym.FullyConnected(mx.sym.Reshape(embed, shape=(-1, 4)), num_hidden=VOCAB, name=name)
    label = mx.sym.Reshape(label, shape=(-1,))
    return mx.sym.SoftmaxOutput(pred, label, name="softmax"), ("data",), ("softmax_label",)


def test_a_bucket_whose_parameters_are_named_otherwise_is_an_error_naming_both():
    with pytest.raises(
        ValueError, match=r"bucket 4: sym_gen\(4\) has the parameter 'pred4_weight'"
    ):
        MainLoop(per_bucket_names, bucket_iter(), extensions=[FinishAfter(after_n_epochs=1)])
    # An iterator that does not list its buckets: the error when the bucket is first bound.
    loop = MainLoop(
        per_bucket_names, Batches(token_batches(BATCH)), extensions=[FinishAfter(after_n_epochs=1)]
    )
    with pytest.raises(ValueError, match=r"bucket 8: .* 'pred8_weight', which the default bucket"):
        loop.run()


def test_a_default_bucket_smaller_than_the_largest_is_an_error_naming_the_key_and_the_fix():
    with pytest.raises(
        ValueError, match=r"default_bucket_key=8: .* pass default_bucket_key=12 \(or leave it out\)"
    ):
        bucket_loop([FinishAfter(after_n_epochs=1)], default_bucket_key=8)


def test_evaluation_buckets_longer_than_every_training_bucket_are_evaluated_whole():
    longer = mx.rnn.BucketSentenceIter(
        sentences(67, seed=5, longest=16), BATCH, buckets=[4, 8, 12, 16], invalid_label=0
    )
    assert len(longer.data[-1]) % BATCH  # a partial batch of the longest bucket too
    loop = bucket_loop(
        [FinishAfter(after_n_epochs=1), Evaluate({"valid": longer}, [PERPLEXITY])]
    ).run()
    expected, _ = every_sentence_perplexity(loop.get_params()[0], longer)
    assert loop.log.last("valid_perplexity") == pytest.approx(expected, rel=1e-6)
    outputs = loop.predict(longer)["softmax"]
    assert outputs.shape[0] == sum(bucket.size for bucket in longer.data)


def test_the_left_out_warning_counts_the_sentences_too_long_and_names_both_causes():
    from mxoid.data.sentences import bucket_sentence_iter

    np.random.seed(1)
    random.seed(1)
    given = sentences(120, seed=0, longest=16)  # some longer than the largest bucket, 12
    too_long = sum(len(sentence) > 12 for sentence in given)
    assert too_long > 0
    train = bucket_sentence_iter(given, BATCH, buckets=list(BUCKETS), invalid_label=0)
    used, held = len(train.idx) * BATCH, sum(len(bucket) for bucket in train.data)
    with pytest.warns(UserWarning) as caught:
        MainLoop(sym_gen_of(), train, extensions=[FinishAfter(after_n_epochs=1)])
    (message,) = [str(w.message) for w in caught if "sentences an epoch" in str(w.message)]
    assert f"trains on {used} of its {held} sentences an epoch" in message
    assert f"last partial batch of each bucket (batches of 8: {held - used} sentences)" in message
    assert f"{too_long} longer than its largest bucket (12 tokens)" in message
    assert f"{held - used + too_long} left out in all" in message


def test_ce_takes_the_label_layouts_mxnet_cross_entropy_ravels():
    """A (batch, time) label against (batch * time, vocabulary) outputs: 'ce' equals MXNet's
    own CrossEntropy metric over the same batches (which ravels the label)."""
    valid = valid_iter()
    loop = bucket_loop([FinishAfter(after_n_epochs=1)]).run()
    ours = loop.score(valid, "ce")["valid_cross_entropy"]
    metric = mx.metric.CrossEntropy()
    module = mx.mod.BucketingModule(
        sym_gen_of(), default_bucket_key=valid.default_bucket_key, logger=logging.getLogger("q")
    )
    module.bind(valid.provide_data, valid.provide_label, for_training=False)
    module.set_params(loop.get_params()[0], {})
    for key, bucket in zip(valid.buckets, valid.data):  # every sentence, each bucket one batch
        label = np.concatenate([bucket[:, 1:], np.zeros((len(bucket), 1), bucket.dtype)], 1)
        batch = mx.io.DataBatch(
            [mx.nd.array(bucket)],
            [mx.nd.array(label)],
            bucket_key=key,
            provide_data=[mx.io.DataDesc("data", bucket.shape)],
            provide_label=[mx.io.DataDesc("softmax_label", label.shape)],
        )
        module.forward(batch, is_train=False)
        metric.update([mx.nd.array(label)], module.get_outputs())
    assert ours == pytest.approx(metric.get()[1], rel=1e-6)
