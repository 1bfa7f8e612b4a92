"""LearningRateSchedule: the rate it sets is the one the updates use, on both update paths;
ClipGradientNorm against clipping by hand in NumPy."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from monitored import CountHostSyncs, SyncProbe
from scripted import Script, small_loop

from mxoid import ClipGradientNorm, Extension, FinishAfter, LearningRateSchedule
from mxoid.log.records import GRADIENT_NORM

UPDATE_PATHS = [
    pytest.param([mx.cpu()], "local", None, id="one-device-local-updater"),
    pytest.param([mx.cpu()], "local", True, id="one-device-update-on-kvstore"),
    pytest.param(TWO_CPUS, "local", False, id="two-devices-local-updater"),
    pytest.param(TWO_CPUS, "local", True, id="two-devices-update-on-kvstore"),
]


def train(contexts, kvstore, update_on_kvstore, batches, extensions=(), **optimizer_params):
    loop = small_loop(
        list(extensions) + [FinishAfter(after_n_batches=batches)],
        contexts=contexts,
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        optimizer_params=optimizer_params,
    ).run()
    return loop, {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def assert_same_params(a, b):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("contexts, kvstore, update_on_kvstore", UPDATE_PATHS)
def test_the_rate_set_is_the_rate_the_update_uses(contexts, kvstore, update_on_kvstore):
    # Rate 0.5 for the first batch, 0 for the second (no momentum, no weight decay): the
    # parameters must equal those after one batch at rate 0.5, and differ from rate 0.1.
    schedule = LearningRateSchedule(lambda status: 0.5 if status.iterations_done == 0 else 0.0)
    loop, scheduled = train(contexts, kvstore, update_on_kvstore, 2, [schedule], learning_rate=0.1)
    assert loop.update_on_kvstore is bool(update_on_kvstore)
    _, reference = train(contexts, kvstore, update_on_kvstore, 1, learning_rate=0.5)
    _, unscheduled = train(contexts, kvstore, update_on_kvstore, 1, learning_rate=0.1)
    assert_same_params(scheduled, reference)
    assert not np.allclose(scheduled["fc1_weight"], unscheduled["fc1_weight"], atol=1e-4)
    assert loop.log[0]["learning_rate"] == 0.5 and loop.log[1]["learning_rate"] == 0.0
    assert loop.optimizer.lr == 0.0


@pytest.mark.parametrize("contexts, kvstore, update_on_kvstore", UPDATE_PATHS)
def test_an_lr_scheduler_trains_as_the_optimizers_own(contexts, kvstore, update_on_kvstore):
    ours = LearningRateSchedule(mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.4))
    loop, scheduled = train(
        contexts, kvstore, update_on_kvstore, 6, [ours], learning_rate=0.4, momentum=0.9
    )
    theirs = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.4)
    _, reference = train(
        contexts,
        kvstore,
        update_on_kvstore,
        6,
        learning_rate=0.4,
        momentum=0.9,
        lr_scheduler=theirs,
    )
    assert_same_params(scheduled, reference)
    # Updates 1-2 at 0.4, 3-4 at 0.2, 5-6 at 0.1: recorded only when the rate changes.
    rates = {i: row["learning_rate"] for i, row in loop.log.items() if "learning_rate" in row}
    assert rates == {0: 0.4, 2: 0.2, 4: 0.1}


def test_a_schedule_per_epoch_uses_the_status():
    schedule = LearningRateSchedule(lambda status: 0.1 * 0.5**status.epochs_done, every="epoch")
    loop = small_loop([schedule, FinishAfter(after_n_epochs=3)]).run()
    rates = {i: row["learning_rate"] for i, row in loop.log.items() if "learning_rate" in row}
    assert rates == {0: 0.1, 4: 0.05, 8: 0.025}
    assert loop.optimizer.lr == 0.025


def test_an_optimizer_with_its_own_scheduler_is_refused():
    loop = small_loop([LearningRateSchedule(lambda status: 0.1), FinishAfter(after_n_batches=1)])
    loop.optimizer.lr_scheduler = mx.lr_scheduler.FactorScheduler(step=2)
    with pytest.raises(ValueError, match="its own lr_scheduler"):
        loop.run()


def test_a_bad_rate_is_refused():
    loop = small_loop([LearningRateSchedule(lambda status: -0.1), FinishAfter(after_n_batches=1)])
    with pytest.raises(ValueError, match="learning rate -0.1 at iteration 0"):
        loop.run()
    with pytest.raises(ValueError, match="every"):
        LearningRateSchedule(lambda status: 0.1, every="step")
    with pytest.raises(TypeError, match="callable"):
        LearningRateSchedule(0.1)


# ------------------------------------------------------------ ReduceLROnPlateau
def test_reduce_lr_on_plateau_lowers_the_rate_after_patience_checks_without_improvement():
    from mxoid import ReduceLROnPlateau

    losses = [1.0, 0.8, 0.9, 0.85, 0.81, 0.7, 0.75, 0.76, 0.77, 0.78]
    plateau = ReduceLROnPlateau("valid_loss", factor=0.5, patience=2, cooldown=1, min_lr=0.02)
    loop = small_loop(
        [Script("valid_loss", losses), plateau, FinishAfter(after_n_epochs=10)], learning_rate=0.1
    ).run()
    rates = {i // 4: row["learning_rate"] for i, row in loop.log.items() if "learning_rate" in row}
    # No gain at epochs 3 and 4: halved at 4. Epoch 5 is the cooldown; 6 improves; no gain at 7
    # and 8: halved at 8; 9 is the cooldown, and 10 would go below min_lr: 0.025 -> 0.02.
    assert rates == {4: 0.05, 8: 0.025}
    assert loop.optimizer.learning_rate == 0.025


def test_reduce_lr_on_plateau_never_goes_below_min_lr_and_survives_a_resumption(tmp_path):
    from mxoid import Checkpoint, ReduceLROnPlateau

    losses = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]

    def run(epochs, resume):
        script = Script("valid_loss", losses)
        if resume:
            script.fired = 3
        plateau = ReduceLROnPlateau("valid_loss", factor=0.1, patience=2, min_lr=0.005)
        return small_loop(
            [script, plateau, FinishAfter(after_n_epochs=epochs), Checkpoint(str(tmp_path))],
            learning_rate=0.1,
            resume_from=str(tmp_path) if resume else None,
        ).run()

    full = small_loop(
        [
            Script("valid_loss", losses),
            ReduceLROnPlateau("valid_loss", factor=0.1, patience=2, min_lr=0.005),
            FinishAfter(after_n_epochs=7),
        ],
        learning_rate=0.1,
    ).run()
    run(3, resume=False)
    resumed = run(7, resume=True)
    expected = [(i, r["learning_rate"]) for i, r in full.log.items() if "learning_rate" in r]
    assert [i for i, _ in expected] == [12, 20]  # a tenth, then min_lr; then no lower
    assert [rate for _, rate in expected] == pytest.approx([0.01, 0.005])
    got = [(i, r["learning_rate"]) for i, r in resumed.log.items() if "learning_rate" in r]
    assert got == expected and resumed.optimizer.learning_rate == 0.005


# ------------------------------------------------------------ run() again, seeds
def test_run_again_goes_on_to_a_raised_limit_and_says_when_it_does_nothing():
    finish = FinishAfter(after_n_epochs=1)
    loop = small_loop([finish]).run()
    with pytest.warns(UserWarning, match="trains nothing more: FinishAfter: 1 epoch done"):
        loop.run()
    assert loop.status.iterations_done == 4
    finish.epoch_limit = 3
    loop.run()
    assert (loop.status.epochs_done, loop.status.iterations_done) == (3, 12)
    assert loop.status.training_finished


def test_seed_everything_makes_runs_repeat():
    import random

    from mxoid import seed_everything

    draws = []
    for _ in range(2):
        seed_everything(11)
        draws.append(
            (np.random.rand(), random.random(), mx.nd.random.uniform(shape=(2,)).asnumpy())
        )
    assert draws[0][:2] == draws[1][:2] and (draws[0][2] == draws[1][2]).all()
    with pytest.raises(ValueError):
        seed_everything(-1)


# ------------------------------------------------------------ ClipGradientNorm
class ClipByHand(Extension):
    """Global-norm clipping in NumPy: the reference for ClipGradientNorm.

    The gradient the optimizer uses is rescale_grad times the sum over the devices (with
    the kvstore updating, each device holds its part; otherwise each holds the sum)."""

    def __init__(self, max_norm):
        super().__init__()
        self.max_norm, self.norms = max_norm, []

    def before_update(self):
        loop = self.main_loop
        grads = [g for g in loop.manager.grad_arrays if g[0] is not None]
        if loop.update_on_kvstore:
            summed = [sum(part.asnumpy().astype("float64") for part in g) for g in grads]
        else:
            summed = [g[0].asnumpy().astype("float64") for g in grads]
        norm = np.sqrt(sum((s**2).sum() for s in summed)) * loop.optimizer.rescale_grad
        self.norms.append(norm)
        scale = min(1.0, self.max_norm / (norm + 1e-12))
        for g in grads:
            for part in g:
                part[:] = part.asnumpy() * np.float32(scale)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("contexts, kvstore, update_on_kvstore", UPDATE_PATHS)
def test_clip_gradient_norm_equals_clipping_by_hand_in_numpy(
    contexts, kvstore, update_on_kvstore, accumulate
):
    def run(extension):
        return small_loop(
            [extension, FinishAfter(after_n_epochs=3)],
            contexts=contexts,
            kvstore=kvstore,
            update_on_kvstore=update_on_kvstore,
            optimizer_params={"learning_rate": 0.5, "momentum": 0.9},
            accumulate_batches=accumulate,
        ).run()

    by_hand = ClipByHand(1.0)
    reference = run(by_hand)
    clipped = run(ClipGradientNorm(1.0, record_every=1))
    unclipped = run(ClipByHand(1e9))
    norms = [r[GRADIENT_NORM] for _, r in clipped.log.items() if GRADIENT_NORM in r]
    assert len(norms) == len(by_hand.norms) == 12 // accumulate
    np.testing.assert_allclose(norms, by_hand.norms, rtol=1e-5)
    assert sum(n > 1.0 for n in norms) >= 2 and min(norms) < 1.0  # both cases met
    ours = {k: v.asnumpy() for k, v in clipped.get_params()[0].items()}
    for name, value in reference.get_params()[0].items():
        np.testing.assert_allclose(ours[name], value.asnumpy(), rtol=1e-5, atol=1e-6)
        assert not np.allclose(ours[name], unclipped.get_params()[0][name].asnumpy())


def test_clip_gradient_norm_adds_no_host_sync_per_batch(monkeypatch):
    counter = CountHostSyncs(monkeypatch)
    probe = SyncProbe(counter)
    small_loop(
        [ClipGradientNorm(0.1), probe, FinishAfter(after_n_epochs=2)], contexts=TWO_CPUS
    ).run()
    epochs = []  # the counts after each batch, by epoch (an epoch end may wait for the engine)
    for hook, count in probe.notes:
        if hook == "before_epoch":
            epochs.append([])
        elif hook == "after_batch":
            epochs[-1].append(count)
    assert [len(counts) for counts in epochs] == [4, 4]
    assert all(len(set(counts)) == 1 for counts in epochs)  # not one read in any batch


def test_clip_gradient_norm_reads_only_the_recorded_norms(monkeypatch):
    counter = CountHostSyncs(monkeypatch)
    probe = SyncProbe(counter)
    loop = small_loop(
        [ClipGradientNorm(0.1, record_every=4), probe, FinishAfter(after_n_epochs=2)]
    ).run()
    epochs = []
    for hook, count in probe.notes:
        if hook == "before_epoch":
            epochs.append([count])
        elif hook == "after_batch":
            epochs[-1].append(count)
    for start, *batches in epochs:  # four batches an epoch: the fourth reads its norm
        assert batches[:3] == [start] * 3 and batches[3] > start
    assert sorted(i for i, r in loop.log.items() if GRADIENT_NORM in r) == [4, 8]


def test_clip_gradient_norm_checks_its_arguments():
    with pytest.raises(ValueError, match="max_norm must be finite and > 0"):
        ClipGradientNorm(0)
    with pytest.raises(TypeError, match="max_norm must be a number"):
        ClipGradientNorm("1")
    with pytest.raises(ValueError, match="record_every"):
        ClipGradientNorm(1.0, record_every=0)
