"""What any extension can do, built-in or a user's: read the training pass in after_backward,
declare its records, ask for a private head; and the mistakes refused when the loop is built."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Evaluate, Extension, FinishAfter, MainLoop, TrainingMonitoring

CONTEXTS = {"one": [mx.cpu(0)], "two": TWO_CPUS}


def loop_of(extensions, contexts=None, n=60, batch_size=20):
    X, y = classification_data(n=n)
    net = mlp()
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label"),
        contexts=contexts,
        arg_params=initial_params(net, (batch_size, 10)),
        optimizer_params={"learning_rate": 0.5},
        extensions=extensions,
    )


# ------------------------------------------------------------ after_backward
class TrainingPassReader(Extension):
    """Copies the batch, the parameters before its update, and the outputs at two hooks."""

    def __init__(self):
        super().__init__(priority=20)  # after the Evaluate below, in every shared hook
        self.batches, self.params, self.at_backward, self.at_batch_end = [], [], [], []

    def before_batch(self, batch):
        manager = self.main_loop.manager
        self.batches.append([a.copy() for a in batch.data])
        self.params.append(
            {n: a[0].copyto(mx.cpu()) for n, a in zip(manager.param_names, manager.param_arrays)}
        )

    def after_backward(self, batch):
        self.at_backward.append(self._outputs())

    def after_batch(self, batch):
        self.at_batch_end.append(self._outputs())

    def _outputs(self):
        return [array.copyto(mx.cpu()) for array in self.main_loop.manager.outputs["softmax"]]


@pytest.mark.parametrize("devices", ["one", "two"])
def test_after_backward_sees_the_training_pass_though_an_evaluation_replaces_it_later(devices):
    """An Evaluate at the training batch size (a host metric: it runs on the training
    executors) in after_batch, before the reader's after_batch, replaces the outputs there;
    in after_backward they are the training pass's, as a forward pass by hand computes them."""
    X, y = classification_data(n=40, seed=4)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    reader = TrainingPassReader()
    evaluation = Evaluate({"valid": valid}, [mx.metric.Accuracy()], every_n_batches=1)
    loop = loop_of([FinishAfter(after_n_epochs=1), evaluation, reader], CONTEXTS[devices])
    assert evaluation._accumulators["valid"].manager is loop.manager.training_set
    loop.run()
    # Bound with gradients: MKLDNN fuses an executor without, and caches its first weights.
    by_hand = mlp().simple_bind(mx.cpu(), data=(20, 10), softmax_label=(20,), grad_req="write")
    differed = 0
    for batch, params, at_backward, at_end in zip(
        reader.batches, reader.params, reader.at_backward, reader.at_batch_end
    ):
        for name, value in params.items():
            value.copyto(by_hand.arg_dict[name])
        by_hand.forward(is_train=True, data=batch[0])
        expected = by_hand.outputs[0].asnumpy()
        got = np.concatenate([a.asnumpy() for a in at_backward])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        differed += not np.allclose(np.concatenate([a.asnumpy() for a in at_end]), expected)
    assert differed == len(reader.batches) == 3  # after_batch saw the evaluation's outputs


# ------------------------------------------------------------ record names
class ValidAccuracy(Extension):
    def __init__(self):
        super().__init__(name="my_accuracy", after_epoch=True)

    @property
    def record_names(self):
        return ["valid_accuracy"]

    def do(self, which_callback, *args):
        self.main_loop.log.current_row["valid_accuracy"] = 1.0


def test_a_users_record_beside_a_built_ins_is_refused_naming_both():
    X, y = classification_data(n=40, seed=4)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    with pytest.raises(ValueError) as raised:
        loop_of([FinishAfter(after_n_epochs=1), Evaluate({"valid": valid}, "acc"), ValidAccuracy()])
    message = str(raised.value)
    assert "Evaluate and my_accuracy would both write the records ['valid_accuracy']" in message


def test_a_record_of_the_loops_own_is_refused():
    class WritesErrors(Extension):
        record_names = ["error"]

    with pytest.raises(ValueError, match="the loop and WritesErrors would both write .*'error'"):
        loop_of([FinishAfter(after_n_epochs=1), WritesErrors()])


def test_one_extension_may_name_a_record_twice_but_two_extensions_may_not_share_it():
    class Twice(Extension):
        record_names = ["a", "a", "b"]

    loop_of([FinishAfter(after_n_epochs=1), Twice()])
    with pytest.raises(
        ValueError, match=r"Twice and Twice would both write the records \['a', 'b'\]"
    ):
        loop_of([FinishAfter(after_n_epochs=1), Twice(), Twice()])


# ------------------------------------------------------------ a private head of one's own
class SquaredOutputs(Extension):
    """A user's head: each device's sum of squared softmax outputs, computed in the training
    graph (a second user of the capability TrainingMonitoring uses)."""

    def __init__(self):
        super().__init__()
        self.sums = []

    def private_head(self, request):
        return mx.sym.BlockGrad(mx.sym.sum(mx.sym.square(request.symbol), axis=1))

    def after_backward(self, batch):
        self.sums.append([a.copyto(mx.cpu()) for a in self.main_loop.private_outputs(self)])


@pytest.mark.parametrize("devices", ["one", "two"])
def test_a_users_extension_gets_its_private_head_computed_in_the_training_pass(devices):
    reader, squares = TrainingPassReader(), SquaredOutputs()
    monitoring = TrainingMonitoring("acc")  # a built-in asking for a head beside it
    loop_of([FinishAfter(after_n_epochs=1), monitoring, squares, reader], CONTEXTS[devices]).run()
    assert len(squares.sums) == 3
    for sums, outputs in zip(squares.sums, reader.at_backward):
        expected = np.concatenate([(a.asnumpy() ** 2).sum(axis=1) for a in outputs])
        np.testing.assert_allclose(np.concatenate([s.asnumpy() for s in sums]), expected, rtol=1e-6)


# ------------------------------------------------------------ mistakes found when the loop is built
class Misspelt(Extension):
    def after_epochs(self):
        pass


class WrongSignature(Extension):
    def after_batch(self):
        pass


class NoSuperInit(Extension):
    def __init__(self, value):
        self.value = value


class ConditionsWithoutDo(Extension):
    def __init__(self):
        super().__init__(every_n_epochs=1)


class OwnHelpers(Extension):
    """Methods of its own that are not hooks, and hooks with optional extras: all fine."""

    def after_batch(self, batch, *extra):
        pass

    def on_error(self, exception=None):
        pass

    def summary(self):
        pass

    def after_checkpoint_written(self):
        pass


@pytest.mark.parametrize(
    "extension, message",
    [
        (Misspelt, r"Misspelt.after_epochs is not a hook.*did you mean after_epoch\?"),
        (
            WrongSignature,
            r"WrongSignature.after_batch\(\) cannot take what the loop passes: it calls "
            r"after_batch\(batch\). Define it as def after_batch\(self, batch\):",
        ),
        (lambda: NoSuperInit(3), r"NoSuperInit.__init__ did not call super\(\).__init__\(\)"),
        (
            ConditionsWithoutDo,
            r"ConditionsWithoutDo has firing conditions \(after_epoch\) but does not implement do",
        ),
    ],
)
def test_a_mistaken_extension_is_refused_when_the_loop_is_built(extension, message):
    with pytest.raises(TypeError, match=message):
        loop_of([FinishAfter(after_n_epochs=1), extension()])


def test_methods_of_ones_own_and_hooks_with_optional_extras_are_accepted():
    loop_of([FinishAfter(after_n_epochs=1), OwnHelpers()]).run()


def test_every_built_in_extension_passes_the_checks(tmp_path):
    from mxoid import extensions
    from mxoid.extensions.dispatch import check_extension

    X, y = classification_data(n=40, seed=4)
    valid = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
    built = [
        extensions.Checkpoint(str(tmp_path / "c"), save_best_of="valid_accuracy"),
        extensions.ClipGradientNorm(1.0, record_every=2),
        extensions.CSVLog(str(tmp_path / "log.csv")),
        extensions.DataCheck(),
        extensions.EarlyStopping("valid_accuracy", patience=2),
        extensions.Evaluate({"valid": valid}, "acc"),
        extensions.FinishAfter(after_n_epochs=1),
        extensions.JSONLinesLog(str(tmp_path / "log.jsonl")),
        extensions.LearningRateSchedule(lambda status: 0.1),
        extensions.Monitor(),
        extensions.NaNGuard(),
        extensions.Printing(),
        extensions.ProgressBar(),
        extensions.Timing(),
        extensions.TrackBest("valid_accuracy", mode="max"),
        extensions.TrainingMonitoring(["acc", "ce"]),
    ]
    for extension in built:
        check_extension(extension)
    loop_of(built).run()
