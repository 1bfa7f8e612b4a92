"""Bucketing: MainLoop(sym_gen, ...) against BucketingModule.fit, evaluation over every real
token, exact resumption mid-epoch, checkpoints BucketingModule.load reads, and bad input."""

import logging
import os
import warnings

import mxnet as mx
import numpy as np
import pytest
from buckets import (
    BATCH,
    BUCKETS,
    OPTIMIZER_PARAMS,
    Batches,
    PairKeyIter,
    Replay,
    bucket_iter,
    bucketing_module_fit,
    initial_params,
    sym_gen_of,
    token_batches,
)
from checkpointing import comparable_log
from conftest import TWO_CPUS

from mxoid import (
    Checkpoint,
    ClipGradientNorm,
    Evaluate,
    FinishAfter,
    MainLoop,
    Prefetch,
    TrainingMonitoring,
)

CONTEXTS = {"one": [mx.cpu(0)], "two": TWO_CPUS}
PERPLEXITY = ("perplexity", {"ignore_label": 0})


def bucket_loop(extensions, contexts=None, train=None, **options):
    sym_gen = sym_gen_of()
    return MainLoop(
        sym_gen,
        train if train is not None else bucket_iter(),
        contexts=list(contexts or [mx.cpu(0)]),
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(sym_gen),
        extensions=extensions,
        exit_on_interrupt=False,
        **options,
    )


def params_of(loop):
    return {name: value.asnumpy() for name, value in loop.get_params()[0].items()}


@pytest.mark.parametrize("devices", ["one", "two"])
def test_the_parameters_equal_bucketing_module_fits(devices):
    """Three epochs over buckets of 4, 8 and 12 tokens (a new order each epoch)."""
    loop = bucket_loop(
        [FinishAfter(after_n_epochs=3), TrainingMonitoring(mx.metric.Perplexity(0))],
        CONTEXTS[devices],
    )
    assert len(loop.manager.executor_sets) == 0  # the default bucket's set only, so far
    loop.run()
    keys = {key[1] for key in loop.manager.executor_sets}
    assert keys == set(BUCKETS) - {max(BUCKETS)}  # every other bucket bound once
    theirs = bucketing_module_fit(CONTEXTS[devices], 3, bucket_iter())
    ours = params_of(loop)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    # Every bucket shares the default bucket's parameters and gradients (the same arrays).
    default = loop.manager.training_set.executors[0]
    for executors in loop.manager.executor_sets.values():
        for name in loop.manager.param_names:
            assert executors.executors[0].arg_dict[name] is default.arg_dict[name]
            assert executors.executors[0].grad_dict[name] is default.grad_dict[name]


def by_hand_perplexity(args, iterator):
    """Perplexity over every real token, ignoring label 0 (NumPy, MXNet's forward passes)."""
    module = mx.mod.BucketingModule(
        sym_gen_of(), default_bucket_key=iterator.default_bucket_key, logger=logging.getLogger("q")
    )
    module.bind(iterator.provide_data, iterator.provide_label, for_training=False)
    module.set_params(args, {})
    total, count = 0.0, 0
    iterator.reset()
    for batch in iterator:
        module.forward(batch, is_train=False)
        probabilities = module.get_outputs()[0].asnumpy().astype(np.float64)
        labels = batch.label[0].asnumpy().reshape(-1).astype(int)
        keep = labels != 0
        picked = probabilities[np.arange(len(labels)), labels]
        total -= np.log(np.maximum(picked, 1e-10))[keep].sum()
        count += int(keep.sum())
    return float(np.exp(total / count)), count


@pytest.mark.parametrize("devices", ["one", "two"])
def test_evaluation_counts_every_real_token_and_never_the_ignored_label(devices):
    valid = Replay(bucket_iter(seed=9, n=80, data_seed=4))
    loop = bucket_loop(
        [
            FinishAfter(after_n_epochs=1),
            Evaluate({"valid": valid}, [PERPLEXITY, ("ce", {"ignore_label": 0})]),
        ],
        CONTEXTS[devices],
    ).run()
    expected, tokens = by_hand_perplexity(loop.get_params()[0], valid)
    assert tokens > 0
    assert loop.log.last("valid_perplexity") == pytest.approx(expected, rel=1e-7)
    assert loop.log.last("valid_cross_entropy") == pytest.approx(np.log(expected), rel=1e-6)
    mxnet_metric = mx.metric.Perplexity(0)  # MXNet's own, on the host
    scored = loop.score(valid, mxnet_metric)  # the same metric, converted to the devices
    assert scored["valid_perplexity"] == pytest.approx(expected, rel=1e-7)


def test_resumed_mid_epoch_equals_the_uninterrupted_run_bit_for_bit(tmp_path):
    def run(stop, directory, resume=False):
        extensions = [
            stop,
            TrainingMonitoring(mx.metric.Perplexity(0), every_n_batches=4),
            Checkpoint(str(directory), every_n_batches=5),
        ]
        return bucket_loop(
            extensions, TWO_CPUS, resume_from=str(directory) if resume else None
        ).run()

    whole = run(FinishAfter(after_n_epochs=3), tmp_path / "whole")
    run(FinishAfter(after_n_batches=17), tmp_path / "cut")  # mid second epoch
    resumed = run(FinishAfter(after_n_epochs=3), tmp_path / "cut", resume=True)
    assert resumed.resumed_from.endswith("batch00000017")
    for name, value in params_of(whole).items():
        np.testing.assert_array_equal(value, params_of(resumed)[name], err_msg=name)
    whole_log, resumed_log = comparable_log(whole), comparable_log(resumed)
    for log in (whole_log, resumed_log):
        log.pop(17, None)  # the cut run's own last row
    assert whole_log == resumed_log
    assert "train_perplexity" in whole_log[20]


def test_a_checkpoint_loads_in_bucketing_module_and_predicts_the_same(tmp_path):
    loop = bucket_loop([FinishAfter(after_n_epochs=1), Checkpoint(str(tmp_path))]).run()
    folder = loop.log.last("checkpoint_saved_to")
    assert os.path.isfile(os.path.join(folder, "model.buckets"))
    module = mx.mod.BucketingModule.load(
        os.path.join(folder, "model"), 1, sym_gen_of(), default_bucket_key=max(BUCKETS)
    )
    data = Replay(bucket_iter(seed=9, n=60, data_seed=4))
    module.bind(data.provide_data, data.provide_label, for_training=False)
    theirs, ours = [], loop.predict(data)["softmax"]
    data.reset()
    for batch in data:
        module.forward(batch, is_train=False)
        theirs.append(module.get_outputs()[0].asnumpy())
    np.testing.assert_allclose(np.concatenate(theirs), ours, rtol=1e-5, atol=1e-7)


def test_clipping_on_buckets_equals_clipping_by_the_global_norm_by_hand():
    """One SGD step (no momentum) on a batch of a short bucket: the parameters move by
    -rate * gradient * min(1, max_norm / global norm), the gradient of MXNet's own forward
    and backward on BucketingModule's executors."""
    train = bucket_iter()
    batch = next(b for b in train if b.bucket_key == 4)

    class OneBatch(mx.io.DataIter):
        default_bucket_key = max(BUCKETS)
        provide_data = train.provide_data
        provide_label = train.provide_label

        def __iter__(self):
            yield batch

        def reset(self):
            pass

    sym_gen = sym_gen_of()
    start = initial_params(sym_gen)
    loop = MainLoop(
        sym_gen,
        OneBatch(),
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5},
        arg_params=start,
        extensions=[FinishAfter(after_n_batches=1), ClipGradientNorm(0.05)],
    ).run()
    module = mx.mod.BucketingModule(sym_gen_of(), default_bucket_key=max(BUCKETS))
    module.bind(train.provide_data, train.provide_label)
    module.init_params(arg_params=start)
    module.forward_backward(batch)
    names = list(start)
    group = module._curr_module._exec_group
    grads = {n: group.grad_arrays[group.param_names.index(n)][0].asnumpy() / BATCH for n in names}
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values()))
    assert norm > 0.05  # clipping happens
    for name, value in params_of(loop).items():
        expected = start[name].asnumpy() - 0.5 * grads[name] * (0.05 / norm)
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ bad input
class NoKeys(mx.io.DataIter):
    """Batches of the default shape without a bucket_key."""

    default_bucket_key = max(BUCKETS)

    def __init__(self):
        super().__init__(BATCH)
        inner = bucket_iter()
        self.provide_data, self.provide_label = inner.provide_data, inner.provide_label

    def __iter__(self):
        data = mx.nd.ones((BATCH, max(BUCKETS)))
        yield mx.io.DataBatch([data], [data])

    def reset(self):
        pass


def test_a_batch_without_a_bucket_key_is_a_clear_error():
    loop = bucket_loop([FinishAfter(after_n_epochs=1)], train=NoKeys())
    with pytest.raises(ValueError, match="the batch has no bucket_key, but the loop was given"):
        loop.run()


def test_a_sym_gen_naming_other_inputs_is_a_clear_error():
    sym_gen = sym_gen_of()

    def renamed(key):
        symbol, _, labels = sym_gen(key)
        return symbol, ("tokens",), labels

    with pytest.raises(
        ValueError, match=r"sym_gen\(12\) returns the inputs data_names=\['tokens'\]"
    ):
        MainLoop(renamed, bucket_iter(), extensions=[FinishAfter(after_n_epochs=1)])


def test_a_bucket_whose_parameters_have_other_shapes_is_a_clear_error_naming_it():
    wide, narrow = sym_gen_of(hidden=16), sym_gen_of(hidden=12)

    def sym_gen(key):
        return (wide if key == max(BUCKETS) else narrow)(key)

    loop = MainLoop(
        sym_gen,
        bucket_iter(),
        arg_params=initial_params(wide),
        extensions=[FinishAfter(after_n_epochs=1)],
    )
    with pytest.raises(ValueError, match=r"bucket (4|8): parameter 'lstm_l0_\w+' has shape"):
        loop.run()


def test_two_accumulated_batches_of_one_bucket_train_as_one_doubled_batch():
    """Every batch of bucket 8 (not the default one): batches of 4 accumulated in pairs,
    against batches of 8 of the same sentences in the same order."""

    def run(batch_size, accumulate):
        sym_gen = sym_gen_of()
        return MainLoop(
            sym_gen,
            Batches(token_batches(batch_size)),
            optimizer="sgd",
            optimizer_params={"learning_rate": 0.5, "momentum": 0.9},
            arg_params=initial_params(sym_gen),
            accumulate_batches=accumulate,
            extensions=[FinishAfter(after_n_epochs=2)],
        ).run()

    big, small = run(8, 1), run(4, 2)
    assert small.status.updates_done == big.status.updates_done == 8
    for name, value in params_of(big).items():
        np.testing.assert_allclose(
            params_of(small)[name], value, rtol=1e-5, atol=1e-6, err_msg=name
        )


def test_the_lstm_bucketing_example_beats_the_unigram_baseline(monkeypatch, capsys):
    """examples/lstm_bucketing.py with tiny settings, on Python's own help texts."""
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples")
    monkeypatch.syspath_prepend(examples)
    import lstm_bucketing

    with pytest.raises(SystemExit) as done:
        lstm_bucketing.parse_args(["--help"])
    assert done.value.code == 0 and "--buckets" in capsys.readouterr().out
    result = lstm_bucketing.main(
        ["--epochs", "4", "--num-hidden", "32", "--num-embed", "16", "--vocabulary", "500"]
    )
    assert result["test_perplexity"] < 0.75 * result["unigram_perplexity"]
    assert "the unigram baseline" in capsys.readouterr().out


def test_sentences_an_epoch_leaves_out_are_warned_of():
    """BucketSentenceIter drops each bucket's last partial batch without a word: the loop
    says how many sentences an epoch trains on, of how many, and what to change."""
    train = bucket_iter(n=120, batch_size=8)
    used = len(train.idx) * train.batch_size
    held = sum(len(bucket) for bucket in train.data)
    assert used < held  # the case warned of
    with pytest.warns(UserWarning, match=f"trains on {used} of its {held} sentences an epoch"):
        MainLoop(sym_gen_of(), train, extensions=[FinishAfter(after_n_epochs=1)])
    whole = bucket_iter(n=120, batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MainLoop(sym_gen_of(), whole, extensions=[FinishAfter(after_n_epochs=1)])


def test_tuple_bucket_keys_train_checkpoint_and_resume_exactly(tmp_path):
    """Pairs as bucket keys (which BucketingModule.load cannot read back): the loop trains
    as with the ints, and a run resumed mid-epoch from its checkpoint ends bit-identical."""
    by_length = sym_gen_of()

    def sym_gen(key):
        return by_length(key[0])

    def run(stop, directory, resume=False):
        return MainLoop(
            sym_gen,
            PairKeyIter(bucket_iter()),
            optimizer_params=dict(OPTIMIZER_PARAMS),
            arg_params=initial_params(by_length),
            extensions=[stop, Checkpoint(str(directory), every_n_batches=5)],
            resume_from=str(directory) if resume else None,
            exit_on_interrupt=False,
        ).run()

    ints = bucket_loop([FinishAfter(after_n_epochs=2)]).run()
    whole = run(FinishAfter(after_n_epochs=2), tmp_path / "whole")
    for name, value in params_of(ints).items():
        np.testing.assert_array_equal(params_of(whole)[name], value, err_msg=name)
    folder = whole.log.last("checkpoint_saved_to")
    assert not os.path.exists(os.path.join(folder, "model.buckets"))  # int keys only
    run(FinishAfter(after_n_batches=10), tmp_path / "cut")
    resumed = run(FinishAfter(after_n_epochs=2), tmp_path / "cut", resume=True)
    assert resumed.resumed_from.endswith("batch00000010")
    for name, value in params_of(whole).items():
        np.testing.assert_array_equal(params_of(resumed)[name], value, err_msg=name)


def test_prefetching_a_bucketed_iterator_trains_the_same():
    """Prefetch reads BucketSentenceIter's batches (each its own bucket and shapes) ahead on
    a thread: the same parameters and perplexity as reading them in the loop."""
    runs = [
        bucket_loop(
            [FinishAfter(after_n_epochs=2), TrainingMonitoring(PERPLEXITY)],
            train=Prefetch(bucket_iter()) if prefetch else bucket_iter(),
        ).run()
        for prefetch in (False, True)
    ]
    plain, prefetched = (params_of(loop) for loop in runs)
    for name, value in plain.items():
        np.testing.assert_array_equal(prefetched[name], value, err_msg=name)
    assert runs[0].log.last("train_perplexity") == runs[1].log.last("train_perplexity")


def test_the_loops_buckets_and_gluon_of_mxoid_0_4_answer_with_a_warning_naming_network():
    """``loop.buckets`` / ``loop.gluon`` are the network where it is of that kind, else None."""
    from mxoid.network import BucketNetwork

    loop = bucket_loop([FinishAfter(after_n_epochs=1)])
    assert isinstance(loop.network, BucketNetwork)
    assert loop.network.default_key == max(BUCKETS)
    with pytest.warns(DeprecationWarning, match="loop.network"):
        assert loop.buckets is loop.network
    with pytest.warns(DeprecationWarning, match="loop.network"):
        assert loop.gluon is None


def test_monitor_follows_bucket_switches_as_mx_mon_does_in_bucketing_module_fit():
    """Every 3rd batch, whichever its bucket, Monitor records what ``mx.mon.Monitor`` prints
    in ``BucketingModule.fit`` (which installs it in every bucket's module): the weights, and
    the outputs of that bucket's own graph (its unrolled length)."""
    import re

    from monitored import Lines

    from mxoid import Monitor

    pattern = ".*weight|.*softmax_output"
    replay = Replay(bucket_iter())
    keys = [batch.bucket_key for batch in replay.batches]
    assert len(set(keys[2::3])) > 1  # monitored batches of several buckets
    loop = bucket_loop(
        [FinishAfter(after_n_epochs=1), Monitor(pattern, every_n_batches=3)], train=replay
    ).run()
    monitor = mx.mon.Monitor(3, pattern=pattern)
    monitor.step = 1  # fires on batches 3, 6, ... as mxoid's does
    handler, root = Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        replay.reset()
        bucketing_module_fit([mx.cpu(0)], 1, replay, monitor=monitor)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    printed = {}
    for line in handler.lines:
        match = re.match(r"Batch:\s+(\d+) (\S+)\s+(\S+)", line)
        if match:
            printed.setdefault(int(match.group(1)) - 1, {})[match.group(2)] = float(match.group(3))
    assert sorted(printed) == list(range(3, len(keys) + 1, 3))
    for batch, values in printed.items():
        ours = {
            key[len("monitor_") : -len("_rms")]: value
            for key, value in loop.log[batch].items()
            if key.startswith("monitor_")
        }
        assert set(ours) == set(values), (batch, keys[batch - 1])
        for name, value in values.items():
            assert ours[name] == pytest.approx(value, rel=1e-5), (batch, name)
