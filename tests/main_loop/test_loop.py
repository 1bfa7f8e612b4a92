"""MainLoop against Module.fit, across devices and update paths, and its hooks."""

import logging

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Extension, FinishAfter, MainLoop

OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def iterator(X, y, batch_size=20, shuffle=True, seed=3):
    np.random.seed(seed)
    return mx.io.NDArrayIter(
        X, y, batch_size=batch_size, shuffle=shuffle, label_name="softmax_label"
    )


def train_with_mxoid(contexts, kvstore="local", update_on_kvstore=None, epochs=3):
    X, y = classification_data()
    net = mlp()
    loop = MainLoop(
        net,
        iterator(X, y),
        contexts=contexts,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(net, (20, 10)),
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        extensions=[FinishAfter(after_n_epochs=epochs)],
    )
    loop.run()
    return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def train_with_module_fit(contexts, epochs=3):
    X, y = classification_data()
    net = mlp()
    module = mx.mod.Module(net, context=contexts, logger=logging.getLogger("quiet"))
    module.fit(
        iterator(X, y),
        num_epoch=epochs,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(net, (20, 10)),
        kvstore="local",
    )
    return {k: v.asnumpy() for k, v in module.get_params()[0].items()}


def assert_params_close(a, b, rtol=1e-5, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


def test_one_context_matches_module_fit():
    ours = train_with_mxoid([mx.cpu()])
    theirs = train_with_module_fit([mx.cpu()])
    initial = {k: v.asnumpy() for k, v in initial_params(mlp(), (20, 10)).items()}
    assert not np.allclose(ours["fc1_weight"], initial["fc1_weight"], atol=1e-3)
    assert_params_close(ours, theirs)


def test_two_contexts_match_module_fit_on_two_contexts():
    assert_params_close(train_with_mxoid(TWO_CPUS), train_with_module_fit(TWO_CPUS))


@pytest.mark.parametrize("kvstore", ["local", "device"])
@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_two_contexts_equal_one_context(kvstore, update_on_kvstore):
    one = train_with_mxoid([mx.cpu()])
    two = train_with_mxoid(TWO_CPUS, kvstore=kvstore, update_on_kvstore=update_on_kvstore)
    assert_params_close(one, two)


def test_update_on_kvstore_choice_is_honoured():
    X, y = classification_data()
    for wanted in (True, False):
        loop = MainLoop(
            mlp(),
            iterator(X, y),
            contexts=TWO_CPUS,
            update_on_kvstore=wanted,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
        assert loop.update_on_kvstore is wanted
        assert (loop.updater is None) is wanted
        assert loop.kvstore is not None


def test_kvstore_none_on_two_devices_is_refused():
    X, y = classification_data()
    with pytest.raises(ValueError, match="own gradients"):
        MainLoop(
            mlp(),
            iterator(X, y),
            contexts=TWO_CPUS,
            kvstore=None,
            extensions=[FinishAfter(after_n_epochs=1)],
        )


class HookRecorder(Extension):
    """Records every hook it receives, with the counters at that moment."""

    def __init__(self, calls, **kwargs):
        super().__init__(**kwargs)
        self.calls = calls

    def _record(self, hook):
        status = self.main_loop.status
        self.calls.append((self.name, hook, status.iterations_done, status.epochs_done))

    def before_training(self):
        self._record("before_training")

    def before_epoch(self):
        self._record("before_epoch")

    def before_batch(self, batch):
        self._record("before_batch")

    def after_backward(self, batch):
        self._record("after_backward")

    def after_batch(self, batch):
        self._record("after_batch")

    def after_epoch(self):
        self._record("after_epoch")

    def after_training(self):
        self._record("after_training")


def test_each_hook_fires_the_documented_number_of_times_in_order():
    X, y = classification_data(n=100)
    calls = []
    loop = MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[
            HookRecorder(calls, name="first"),
            FinishAfter(after_n_epochs=2),
            HookRecorder(calls, name="second"),
        ],
    )
    loop.run()
    firsts = [c[1:] for c in calls if c[0] == "first"]
    expected = [("before_training", 0, 0)]
    for epoch in range(2):
        expected.append(("before_epoch", 4 * epoch, epoch))
        for batch in range(4):
            done = 4 * epoch + batch
            expected += [
                ("before_batch", done, epoch),
                ("after_backward", done, epoch),
                ("after_batch", done + 1, epoch),
            ]
        expected.append(("after_epoch", 4 * epoch + 4, epoch + 1))
    expected.append(("after_training", 8, 2))
    assert firsts == expected
    # Within a hook, extensions run in list order.
    assert [c[0] for c in calls[:2]] == ["first", "second"]
    assert loop.status.training_finished and loop.status.epochs_done == 2


def test_priority_orders_extensions_before_list_order():
    X, y = classification_data(n=50)
    calls = []
    MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[
            HookRecorder(calls, name="late", priority=10),
            HookRecorder(calls, name="early", priority=-1),
            FinishAfter(after_n_batches=1),
        ],
    ).run()
    assert [c[0] for c in calls if c[1] == "before_training"] == ["early", "late"]


class RecordWeightNorm(Extension):
    """A user extension written with firing conditions and do()."""

    def __init__(self, **kwargs):
        kwargs.setdefault("every_n_batches", 2)
        super().__init__(**kwargs)

    def do(self, which_callback, *args):
        weight = self.main_loop.manager.param_arrays[0][0]
        self.main_loop.log.current_row["fc1_weight_norm"] = float(mx.nd.norm(weight).asscalar())
        self.main_loop.log.current_row["callback"] = which_callback


def test_user_extension_reads_loop_state_and_writes_records():
    X, y = classification_data(n=100)
    loop = MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[RecordWeightNorm(), FinishAfter(after_n_epochs=2)],
    )
    loop.run()
    rows = {i: row["fc1_weight_norm"] for i, row in loop.log.items() if "fc1_weight_norm" in row}
    assert sorted(rows) == [2, 4, 6, 8]
    final = np.linalg.norm(loop.get_params()[0]["fc1_weight"].asnumpy())
    assert loop.log.last("fc1_weight_norm") == pytest.approx(final, rel=1e-5)
    assert loop.log[4]["callback"] == "after_batch"
    assert loop.log.status is loop.status


def test_firing_conditions():
    X, y = classification_data(n=100)
    fired = []

    class Note(Extension):
        def do(self, which_callback, *args):
            status = self.main_loop.status
            fired.append((self.name, which_callback, status.iterations_done, status.epochs_done))

    MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[
            Note(name="every2epochs", every_n_epochs=2),
            Note(name="after3batches", after_n_batches=3),
            Note(name="after1epoch", after_n_epochs=1),
            Note(name="edges", before_training=True, after_training=True),
            FinishAfter(after_n_epochs=4),
        ],
    ).run()
    assert [f[1:] for f in fired if f[0] == "every2epochs"] == [
        ("after_epoch", 8, 2),
        ("after_epoch", 16, 4),
    ]
    assert [f[1:] for f in fired if f[0] == "after3batches"] == [("after_batch", 3, 0)]
    assert [f[1:] for f in fired if f[0] == "after1epoch"] == [("after_epoch", 4, 1)]
    assert [f[1] for f in fired if f[0] == "edges"] == ["before_training", "after_training"]


class StopAt(Extension):
    stops_training = True

    def __init__(self, hook, at):
        super().__init__()
        self.hook, self.at = hook, at

    def after_batch(self, batch):
        if self.hook == "after_batch" and self.main_loop.status.iterations_done == self.at:
            self.main_loop.request_stop("batch limit")

    def after_epoch(self):
        if self.hook == "after_epoch" and self.main_loop.status.epochs_done == self.at:
            self.main_loop.request_stop("epoch limit")


def test_stop_requested_in_after_batch_stops_after_that_batch():
    X, y = classification_data(n=100)
    loop = MainLoop(
        mlp(), iterator(X, y, batch_size=25), extensions=[StopAt("after_batch", 6)]
    ).run()
    assert (loop.status.iterations_done, loop.status.epochs_done) == (6, 1)
    assert loop.status.epoch_started and loop.status.stop_reason == "batch limit"
    assert loop.log[6]["training_finish_requested"] == "batch limit"


def test_stop_requested_in_after_epoch_stops_after_that_epoch():
    X, y = classification_data(n=100)
    loop = MainLoop(
        mlp(), iterator(X, y, batch_size=25), extensions=[StopAt("after_epoch", 3)]
    ).run()
    assert (loop.status.iterations_done, loop.status.epochs_done) == (12, 3)
    assert not loop.status.epoch_started


def test_finish_after_batches_stops_mid_epoch():
    X, y = classification_data(n=100)
    loop = MainLoop(
        mlp(), iterator(X, y, batch_size=25), extensions=[FinishAfter(after_n_batches=5)]
    ).run()
    assert loop.status.iterations_done == 5


class Boom(Extension):
    def __init__(self, hook, **kwargs):
        super().__init__(**kwargs)
        self.hook = hook
        self.errors = []

    def after_batch(self, batch):
        if self.hook == "after_batch" and self.main_loop.status.iterations_done == 2:
            raise RuntimeError("kaboom")

    def on_error(self, exception):
        self.errors.append(exception)


def test_error_in_a_hook_runs_on_error_records_it_and_names_the_extension():
    X, y = classification_data(n=100)
    boom, witness = Boom("after_batch", name="boomer"), Boom("none", name="witness")
    loop = MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[boom, witness, FinishAfter(after_n_epochs=1)],
    )
    with pytest.raises(RuntimeError, match="kaboom") as info:
        loop.run()
    assert any("'boomer'" in note and "after_batch" in note for note in info.value.__notes__)
    assert witness.errors == [info.value] and boom.errors == [info.value]
    assert "kaboom" in loop.log[2]["error"] and "boomer" in loop.log[2]["error"]


def test_a_loop_nothing_can_stop_is_refused():
    X, y = classification_data()
    with pytest.raises(ValueError, match="nothing can stop this loop"):
        MainLoop(mlp(), iterator(X, y), extensions=[Extension()])


@pytest.mark.parametrize(
    "make_kwargs, error, message",
    [
        (
            lambda X, y: dict(extensions=[FinishAfter(after_n_epochs=1), "printing"]),
            TypeError,
            "must be mxoid.Extension",
        ),
        (
            lambda X, y: dict(contexts=[], extensions=[FinishAfter(after_n_epochs=1)]),
            ValueError,
            "contexts is empty",
        ),
        (
            lambda X, y: dict(optimizer="sgdd", extensions=[FinishAfter(after_n_epochs=1)]),
            ValueError,
            "unknown optimizer 'sgdd'",
        ),
        (
            lambda X, y: dict(
                optimizer_params={"learning_rat": 0.1}, extensions=[FinishAfter(after_n_epochs=1)]
            ),
            ValueError,
            "learning_rat",
        ),
        (
            lambda X, y: dict(kvstore="locall", extensions=[FinishAfter(after_n_epochs=1)]),
            ValueError,
            "unknown kvstore",
        ),
        (
            lambda X, y: dict(
                arg_params={"fc3_weight": mx.nd.zeros((2,))},
                extensions=[FinishAfter(after_n_epochs=1)],
            ),
            ValueError,
            "fc3_weight",
        ),
    ],
)
def test_bad_input_is_refused_at_construction(make_kwargs, error, message):
    X, y = classification_data()
    with pytest.raises(error, match=message):
        MainLoop(mlp(), iterator(X, y), **make_kwargs(X, y))


def test_batch_smaller_than_devices_is_refused():
    X, y = classification_data(n=10)
    with pytest.raises(ValueError, match="cannot be split across 2 devices"):
        MainLoop(
            mlp(),
            iterator(X, y, batch_size=1),
            contexts=TWO_CPUS,
            extensions=[FinishAfter(after_n_epochs=1)],
        )


def test_label_name_the_symbol_does_not_take_is_refused():
    X, y = classification_data()
    good = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    bad = mx.io.NDArrayIter(X, y, batch_size=20, label_name="target")
    with pytest.raises(ValueError, match="'target'"):
        MainLoop(mlp(), bad, extensions=[FinishAfter(after_n_epochs=1)])
    MainLoop(mlp(), good, extensions=[FinishAfter(after_n_epochs=1)])


def test_data_shape_the_symbol_rejects_is_refused():
    data = mx.sym.Variable("data")
    conv = mx.sym.Convolution(data, kernel=(3, 3), num_filter=2, name="conv")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(conv, num_hidden=3, name="fc"), name="softmax")
    X, y = classification_data()
    with pytest.raises(ValueError, match="rejects the input shapes") as info:
        MainLoop(net, iterator(X, y), extensions=[FinishAfter(after_n_epochs=1)])
    assert "Stack trace" not in str(info.value)


def test_profile_accounts_time_per_extension_and_hook():
    X, y = classification_data(n=100)
    loop = MainLoop(
        mlp(),
        iterator(X, y, batch_size=25),
        extensions=[RecordWeightNorm(), FinishAfter(after_n_epochs=1)],
    ).run()
    rows = {(name, hook): calls for name, hook, calls, seconds in loop.profile()}
    assert rows[("RecordWeightNorm", "after_batch")] == 4
    assert ("RecordWeightNorm", "after_epoch") not in rows  # not handled, never dispatched
