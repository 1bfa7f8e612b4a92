"""DataLoaderIter: a Gluon DataLoader as the loop's iterator, its epochs, seeds and resumption."""

import json
import random
import warnings

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical, comparable_log, make_loop, params_of
from conftest import TWO_CPUS, classification_data, initial_params, mlp
from mxnet.gluon.data import ArrayDataset, BatchSampler, DataLoader, Dataset, SequentialSampler

from mxoid import Extension, FinishAfter, MainLoop
from mxoid.checkpoint import ResumeError
from mxoid.data import DataLoaderIter, Prefetch, as_data_iter
from mxoid.extensions import Evaluate, TrainingMonitoring


def jitter(x):
    """A random augmentation from NumPy's and Python's global generators."""
    noise = np.random.normal(0, 0.1, x.shape) + random.uniform(-0.05, 0.05)
    return (x + noise).astype("float32")


def jitter_with_mxnet(x):
    """The same, plus MXNet's random operators (seeded per sample in worker processes)."""
    return jitter(x) + mx.nd.random.uniform(-0.05, 0.05, shape=x.shape).asnumpy()


class Counting(Dataset):
    """Counts the samples loaded in this process."""

    def __init__(self, X, y):
        self.X, self.y, self.loads = X, y, 0

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        self.loads += 1
        return self.X[index], self.y[index]


class OwnRandomSampler:
    """A sampler of the user's drawing from a generator of its own, one draw per epoch."""

    def __init__(self, length, seed):
        self.length, self.rng = length, np.random.RandomState(seed)

    def __iter__(self):
        return iter(self.rng.permutation(self.length).tolist())

    def __len__(self):
        return self.length


class Recorder(Extension):
    """Keeps every batch the loop trains on: its arrays and padding, per epoch."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def before_epoch(self):
        self.epochs.append([])

    def before_batch(self, batch):
        arrays = [a.asnumpy() for a in list(batch.data) + list(batch.label)]
        self.epochs[-1].append((arrays, batch.pad))


class Replay(mx.io.DataIter):
    """Serves recorded epochs of batches, one epoch per reset."""

    def __init__(self, epochs):
        super().__init__(len(epochs[0][0][0][0]))
        self.epochs, self.epoch, self.cursor = epochs, 0, 0
        (data, label), _ = self.epochs[0][0]
        self.provide_data = [mx.io.DataDesc("data", data.shape, data.dtype)]
        self.provide_label = [mx.io.DataDesc("softmax_label", label.shape, label.dtype)]

    def reset(self):
        self.epoch, self.cursor = self.epoch + 1, 0

    def next(self):
        if self.cursor == len(self.epochs[self.epoch]):
            raise StopIteration
        (data, label), pad = self.epochs[self.epoch][self.cursor]
        self.cursor += 1
        return mx.io.DataBatch([mx.nd.array(data)], [mx.nd.array(label)], pad=pad)


def loader(X, y, batch_size=20, transform=None, **kwargs):
    dataset = ArrayDataset(X, y)
    return DataLoader(
        dataset if transform is None else dataset.transform_first(transform),
        batch_size=batch_size,
        **kwargs,
    )


def epochs_of(iterator, count):
    """Each epoch's batches as (rows of data, labels, pad); reset between epochs."""
    epochs = []
    for epoch in range(count):
        if epoch:
            iterator.reset()
        epochs.append([(b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad) for b in iterator])
    return epochs


def real_rows(epochs):
    """Every epoch's rows but the padding: (data, labels)."""
    return [
        (
            np.concatenate([d[: len(d) - p] for d, _, p in e]),
            np.concatenate([lab[: len(lab) - p] for _, lab, p in e]),
        )
        for e in epochs
    ]


def bare_epochs(make, count):
    """The batches of the bare DataLoader, ``count`` loops over it."""
    bare = make()

    def host(array):
        return array.asnumpy() if isinstance(array, mx.nd.NDArray) else np.asarray(array)

    return [[(host(d), host(lab)) for d, lab in bare] for _ in range(count)]


def numbered(n=110, dim=3):
    """Rows whose label is their index, and whose values say it too."""
    X = np.arange(n * dim, dtype="float32").reshape(n, dim)
    return X, np.arange(n, dtype="float32")


# ------------------------------------------------------------ shapes, names, padding
def test_provide_data_and_label_come_from_the_first_batch_which_is_not_lost():
    X, y = numbered()
    it = DataLoaderIter(loader(X, y.astype("int32"), batch_size=32), label_names="label")
    assert it.provide_data == [mx.io.DataDesc("data", (32, 3), np.float32)]
    assert it.provide_label == [mx.io.DataDesc("label", (32,), np.int32)]
    assert it.provide_label[0].dtype == np.int32 and it.batch_size == 32 and len(it) == 4
    labels = [b.label[0].asnumpy().tolist() for b in it]
    assert labels[0] == list(range(32)) and labels[3][:14] == list(range(96, 110))
    assert [type(b) for b in it] == []  # the epoch is over until reset
    it.reset()
    assert [b.label[0].asnumpy()[0] for b in it] == [0, 32, 64, 96]


@pytest.mark.parametrize("last_batch", ["keep", "discard", "rollover"])
def test_the_same_batches_as_the_bare_loader_after_the_same_seed(last_batch):
    X, y = numbered()

    def make():
        return loader(X, y, batch_size=20, shuffle=True, last_batch=last_batch)

    np.random.seed(3)
    bare = bare_epochs(make, 3)
    after_bare = numpy_state()
    np.random.seed(3)
    adapted = epochs_of(DataLoaderIter(make()), 3)
    assert numpy_state() == after_bare  # the same draws
    assert [len(e) for e in adapted] == [len(e) for e in bare]
    if last_batch == "rollover":  # 110 = 5 * 20 + 10, the 10 carried into the next epoch
        assert [len(e) for e in adapted] == [5, 6, 5]
    for bare_epoch, epoch in zip(bare, adapted):
        for (data, label), (padded, padded_label, pad) in zip(bare_epoch, epoch):
            assert len(padded) == 20 and pad == 20 - len(data)
            np.testing.assert_array_equal(padded[: len(data)], data)
            np.testing.assert_array_equal(padded_label[: len(label)], label)
            np.testing.assert_array_equal(padded[len(data) :], np.repeat(data[-1:], pad, 0))


def test_pad_is_what_ndarrayiter_reports():
    X, y = numbered(n=47)
    it = DataLoaderIter(loader(X, y, batch_size=10))
    reference = mx.io.NDArrayIter(X, y, batch_size=10, last_batch_handle="pad")
    assert [b.pad for b in it] == [b.pad for b in reference] == [0, 0, 0, 0, 3]
    it.reset()
    assert it.iter_next() and it.getpad() == 0 and it.getdata()[0].shape == (10, 3)
    assert it.getlabel()[0].asnumpy().tolist() == list(range(10)) and it.getindex() is None


def test_a_batch_sampler_of_the_users_gives_the_first_batch_size_and_pads_smaller_ones():
    X, y = numbered(n=30)
    batches = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    it = DataLoaderIter(DataLoader(ArrayDataset(X, y), batch_sampler=batches))
    assert it.batch_size == 4 and it.provide_data[0].shape == (4, 3)
    assert [(b.label[0].asnumpy().tolist(), b.pad) for b in it] == [
        ([0, 1, 2, 3], 0),
        ([4, 5, 6, 7], 0),
        ([8, 9, 9, 9], 2),
    ]


def test_a_loader_of_data_only_works_with_no_label_names():
    X, _ = numbered(n=25)
    it = DataLoaderIter(DataLoader(ArrayDataset(X), batch_size=10), label_names=())
    assert it.provide_label == [] and [len(b.label) for b in it] == [0, 0, 0]
    it.reset()
    assert [b.data[0].shape for b in it] == [(10, 3)] * 3


def test_several_data_and_label_arrays_are_named_in_order():
    X, y = numbered(n=20)
    dataset = ArrayDataset(X, X[:, :1] * 2, y, y * 3)
    it = DataLoaderIter(
        DataLoader(dataset, batch_size=8), data_names=("a", "b"), label_names=("c", "d")
    )
    assert [d.name for d in it.provide_data + it.provide_label] == ["a", "b", "c", "d"]
    assert [d.shape for d in it.provide_data] == [(8, 3), (8, 1)]
    batch = next(it)
    np.testing.assert_array_equal(batch.label[1].asnumpy(), np.arange(8) * 3)


def doubled(samples):
    """A batchify_fn of the user's: NumPy arrays out, the data doubled."""
    data, labels = zip(*samples)
    return np.stack(data) * 2, np.asarray(labels)


@pytest.mark.parametrize(
    "settings",
    [
        {"batchify_fn": doubled},
        {"pin_memory": True},
        {"num_workers": 2, "thread_pool": True, "prefetch": 1, "timeout": 30},
    ],
)
def test_the_loaders_other_settings_are_kept(settings):
    X, y = numbered(n=45)
    np.random.seed(2)
    bare = bare_epochs(lambda: loader(X, y, shuffle=True, **settings), 2)
    np.random.seed(2)
    it = DataLoaderIter(loader(X, y, shuffle=True, **settings))
    # a thread pool's batches: this process's (batchify_without_waiting), on the CPU
    context = {"pin_memory": mx.cpu_pinned(0), "num_workers": mx.cpu(0)}
    first = next(DataLoaderIter(loader(X, y, **settings))).data[0]
    assert first.context == context.get(next(iter(settings)), mx.cpu(0))
    for bare_epoch, epoch in zip(bare, epochs_of(it, 2)):
        for (data, label), (padded, padded_label, _) in zip(bare_epoch, epoch):
            np.testing.assert_array_equal(padded[: len(data)], data)
            np.testing.assert_array_equal(padded_label[: len(label)], label)


@pytest.mark.parametrize("dim", [3, 16384])
def test_worker_processes_send_small_batches_by_value_and_large_ones_in_shared_memory(dim):
    """A shared-memory array costs its receiver a connection to the worker (about 1 ms):
    batch arrays of up to 1 MiB come from the workers by value, larger ones as Gluon sends
    them; the same values as the bare loader's either way."""
    from mxoid.data.loader import BY_VALUE_BYTES

    X, y = numbered(n=90, dim=dim)
    bare = bare_epochs(lambda: loader(X, y, num_workers=2), 1)[0]
    batches = list(DataLoaderIter(loader(X, y, num_workers=2)))
    large = X[:20].nbytes > BY_VALUE_BYTES
    assert large == (dim == 16384)
    for batch, (data, label) in zip(batches, bare):
        if not batch.pad:  # (a padded batch is a new array)
            shared = mx.Context("cpu_shared", 0)
            assert batch.data[0].context == (shared if large else mx.cpu(0))
            assert batch.label[0].context == mx.cpu(0)  # 20 labels: by value
        rows = len(data)
        np.testing.assert_array_equal(batch.data[0].asnumpy()[:rows], data)
        np.testing.assert_array_equal(batch.label[0].asnumpy()[:rows], label)
        assert batch.data[0].dtype == data.dtype and batch.label[0].dtype == label.dtype


def test_state_dict_is_plain_json():
    X, y = numbered()
    it = DataLoaderIter(loader(X, y, shuffle=True, last_batch="rollover"), seed=11)
    next(it)
    state = it.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["seed"] == 11 and state["served"] == 1 and state["order"]["sampler"] == "random"


# ------------------------------------------------------------ seeds
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_same_seed_gives_the_same_augmented_samples_whatever_the_workers(num_workers):
    X, y = numbered(n=60)

    def samples(seed, workers):
        np.random.seed(seed)
        it = DataLoaderIter(loader(X, y, transform=jitter, shuffle=True, num_workers=workers))
        return real_rows(epochs_of(it, 2))

    first, again = samples(4, num_workers), samples(4, num_workers)
    for (data, labels), (data_again, labels_again) in zip(first, again):
        np.testing.assert_array_equal(data, data_again)
        np.testing.assert_array_equal(labels, labels_again)
    # The same samples without workers: each is seeded by (seed, epoch, index) alone.
    for (data, labels), (plain, plain_labels) in zip(first, samples(4, 1 - num_workers // 2)):
        np.testing.assert_array_equal(labels, plain_labels)
        np.testing.assert_array_equal(data, plain)
    noise = first[0][0] - X[first[0][1].astype(int)]
    assert len(np.unique(noise[:, 0])) == len(noise)  # no two samples augmented alike
    second_epoch = first[1][0] - X[first[1][1].astype(int)]
    order = np.argsort(first[0][1]), np.argsort(first[1][1])
    assert not np.allclose(noise[order[0]], second_epoch[order[1]])  # each epoch its own
    other = samples(5, num_workers)[0]
    assert not np.allclose(np.sort(other[0], axis=0), np.sort(first[0][0], axis=0))


def test_workers_draw_mxnet_random_numbers_from_the_samples_seeds():
    X, y = numbered(n=40)

    def samples(seed):
        it = DataLoaderIter(
            loader(X, y, batch_size=8, transform=jitter_with_mxnet, num_workers=2), seed=seed
        )
        return real_rows(epochs_of(it, 1))[0][0]

    first = samples(9)
    np.testing.assert_array_equal(first, samples(9))
    assert len(np.unique(first[:, 0] - X[:, 0])) == len(X)  # every sample its own noise
    # (The bare loader's workers, forked with one NumPy state, repeat each other's noise
    # whenever both load batches: which worker loads which batch is up to the pool.)


def test_the_generators_are_seeded_once_a_batch_in_and_out_of_workers(monkeypatch):
    """Seeding costs more than a jitter draws (MXNet's re-seeds its 1,024 parallel generators,
    about 1.3 ms; NumPy's and Python's about 17 us a sample): once a batch, before its first
    sample, from the run's seed, the epoch and the batch's number (its samples load in order,
    in one worker); MXNet's in workers only. On threads of this process, per sample."""
    from mxoid.data import sampling

    X, y = numbered(n=12)
    transformed = ArrayDataset(X, y).transform_first(jitter)
    keys = sampling.KeyBatches()
    keys.batches, keys.seed, keys.epoch, keys.start = [[9, 4], [3, 1, 2], [0, 5]], 7, 1, 1
    seeds = []
    monkeypatch.setattr(mx.random, "seed", lambda value, ctx=None: seeds.append(value))
    for worker in (True, False):
        seeds.clear()
        dataset = sampling.SeededDataset(transformed, threads=False)
        if worker:
            dataset._pid = -1  # as in a worker process
        loaded = [[dataset[key] for key in batch] for batch in keys]
        assert seeds == (
            [sampling.batch_seed(7, 1, 1), sampling.batch_seed(7, 1, 2)] if worker else []
        )
        np.random.seed(sampling.batch_seed(7, 1, 1))
        random.seed(sampling.batch_seed(7, 1, 1))
        expected = [jitter(X[3]), jitter(X[1]), jitter(X[2])]  # drawn in order, seeded once
        for (sample, _), value in zip(loaded[0], expected):
            np.testing.assert_array_equal(sample, value)
    threaded = sampling.SeededDataset(transformed, threads=True)
    sample, _ = threaded[(2, 7, 1, -1)]
    np.random.seed(sampling.sample_seed(7, 1, 2))
    random.seed(sampling.sample_seed(7, 1, 2))
    np.testing.assert_array_equal(sample, jitter(X[2]))  # on threads: each sample its own


def test_a_dataset_that_draws_nothing_is_read_unseeded_in_and_out_of_workers():
    """Arrays and Gluon's ArrayDataset / SimpleDataset of arrays draw no random number:
    seeding the generators before each of their samples would only cost time."""
    from mxoid.data.sampling import SeededDataset, draws_nothing

    X, y = numbered(n=8)
    plain = [X, list(y), ArrayDataset(X, y), mx.gluon.data.SimpleDataset(X), mx.nd.array(X)]
    assert all(draws_nothing(dataset) for dataset in plain)
    drawing = [ArrayDataset(X, y).transform_first(jitter), ArrayDataset(X, Counting(X, y))]
    assert not any(draws_nothing(dataset) for dataset in drawing)
    assert not SeededDataset(ArrayDataset(X, y), threads=False).seeded
    for num_workers in (0, 2):
        np.random.seed(3)
        it = DataLoaderIter(loader(X, y, batch_size=4, num_workers=num_workers))
        state = numpy_state()
        data, labels = real_rows(epochs_of(it, 1))[0]
        np.testing.assert_array_equal(data, X[labels.astype(int)])
        assert numpy_state() == state


def numpy_state():
    name, keys, position, has_gauss, cached = np.random.get_state()
    return keys.tolist(), position, has_gauss, cached


@pytest.mark.parametrize("thread_pool", [False, True])
def test_augmenting_in_this_process_draws_nothing_from_the_trainings_generators(thread_pool):
    """Only the epochs' orders are drawn, as by a loader without augmentation."""
    X, y = numbered(n=50)
    np.random.seed(8)
    random.seed(8)
    for _ in range(2):
        for _ in loader(X, y, shuffle=True):
            pass
    expected = numpy_state(), random.getstate()
    np.random.seed(8)
    random.seed(8)
    workers = {"num_workers": 2, "thread_pool": True} if thread_pool else {}
    augmented = loader(X, y, transform=jitter, shuffle=True, **workers)
    epochs = epochs_of(DataLoaderIter(augmented), 2)
    assert (numpy_state(), random.getstate()) == expected
    data, labels = real_rows(epochs)[0]
    assert not np.allclose(data, X[labels.astype(int)])  # augmented indeed


# ------------------------------------------------------------ resumption of the iterator
@pytest.mark.parametrize("last_batch", ["keep", "rollover"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_epoch_gives_the_same_samples_without_loading_the_earlier_ones(
    last_batch, num_workers
):
    X, y = numbered(n=70)
    dataset = Counting(X, y)

    def make(seed=None):
        data = DataLoader(
            dataset.transform_first(jitter),
            batch_size=20,
            shuffle=True,
            last_batch=last_batch,
            num_workers=num_workers,
        )
        return DataLoaderIter(data, seed=seed)

    np.random.seed(6)
    full = make()
    first = epochs_of(full, 2)
    np.random.seed(6)
    cut = make()
    epochs_of(cut, 1)
    cut.reset()
    next(cut), next(cut)
    states = cut.state_dict(), np.random.get_state()
    np.random.seed(99)
    resumed = make(seed=1)
    resumed.load_state_dict(json.loads(json.dumps(states[0])))
    dataset.loads = 0
    rest = list(resumed)
    if num_workers == 0:
        assert dataset.loads == sum(20 - b.pad for b in rest)  # the rest only, no replay
    assert len(resumed._keys) == len(first[1]) - 2  # the workers are handed the rest only
    for (data, label, pad), batch in zip(first[1][2:], rest):
        np.testing.assert_array_equal(batch.data[0].asnumpy(), data)
        np.testing.assert_array_equal(batch.label[0].asnumpy(), label)
        assert batch.pad == pad
    np.random.set_state(states[1])  # as the loop restores it
    resumed.reset()
    np.random.set_state(states[1])
    full.reset()
    later = [b.label[0].asnumpy() for b in full]
    np.testing.assert_array_equal([b.label[0].asnumpy() for b in resumed], later)


def test_a_sampler_of_the_users_resumes_from_its_saved_order_and_replayed_draws():
    X, y = numbered(n=30)

    def make():
        sampler = OwnRandomSampler(30, seed=2)
        return DataLoaderIter(DataLoader(ArrayDataset(X, y), batch_size=8, sampler=sampler))

    full = make()
    expected = [[b.label[0].asnumpy().tolist() for b in e] for e in [list(full)]]
    for _ in range(2):
        full.reset()
        expected.append([b.label[0].asnumpy().tolist() for b in full])
    cut = make()
    list(cut)
    cut.reset()
    next(cut)
    resumed = make()
    with pytest.warns(UserWarning, match="OwnRandomSampler.*replayed: 1 iteration"):
        resumed.load_state_dict(cut.state_dict())
    assert [b.label[0].asnumpy().tolist() for b in resumed] == expected[1][1:]
    resumed.reset()  # its own generator went on as in the uninterrupted run
    assert [b.label[0].asnumpy().tolist() for b in resumed] == expected[2]
    OwnRandomSampler.resets_are_deterministic = True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make().load_state_dict(cut.state_dict())
    finally:
        del OwnRandomSampler.resets_are_deterministic
    assert not [w for w in caught if "OwnRandomSampler" in str(w.message)]


def test_the_state_of_another_loader_is_refused():
    X, y = numbered()
    state = DataLoaderIter(loader(X, y, shuffle=True)).state_dict()
    with pytest.raises(ResumeError, match="a number of samples 110, this one has 100"):
        DataLoaderIter(loader(X[:100], y[:100], shuffle=True)).load_state_dict(state)
    with pytest.raises(ResumeError, match="a sampler of kind 'random', this one has 'sequential'"):
        DataLoaderIter(loader(X, y)).load_state_dict(state)
    with pytest.raises(ValueError, match="damaged: 9 batches served of the epoch's 6"):
        DataLoaderIter(loader(X, y, shuffle=True)).load_state_dict({**state, "served": 9})


# ------------------------------------------------------------ in the loop
def test_training_equals_training_on_the_same_batches_in_the_same_order():
    X, y = classification_data(n=190)
    net = mlp()
    args = initial_params(net, (20, 10))

    def train(iterator, recorder):
        return MainLoop(
            net,
            iterator,
            contexts=TWO_CPUS,
            arg_params=args,
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            extensions=[FinishAfter(after_n_epochs=2), recorder],
        ).run()

    def make():
        return loader(X, y, shuffle=True)

    np.random.seed(5)
    bare = bare_epochs(make, 2)
    np.random.seed(5)
    recorded = Recorder()
    adapted = train(DataLoaderIter(make()), recorded)
    # The loop trained on the bare loader's batches, in its order, the last one padded.
    assert [len(e) for e in recorded.epochs] == [10, 10]
    for bare_epoch, epoch in zip(bare, recorded.epochs):
        for (data, label), ((padded, padded_label), pad) in zip(bare_epoch, epoch):
            assert pad == 20 - len(data)
            np.testing.assert_array_equal(padded[: len(data)], data)
            np.testing.assert_array_equal(padded_label[: len(label)], label)
    replayed = train(Replay(recorded.epochs), Recorder())
    assert_identical(params_of(adapted), params_of(replayed))


def test_evaluate_on_a_loader_with_a_smaller_last_batch_equals_numpy_over_every_sample():
    X, y = classification_data(n=110, seed=3)  # by 32: the last batch 14 rows, 18 padding
    loop = MainLoop(
        mlp(),
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        contexts=TWO_CPUS,
        arg_params=initial_params(mlp(), (20, 10)),
        extensions=[FinishAfter(after_n_epochs=1)],
    ).run()
    it = DataLoaderIter(loader(X, y, batch_size=32))
    evaluate = Evaluate({"valid": it}, ["acc", "ce"])
    evaluate.attach(loop)
    records = evaluate.evaluate()
    p = loop.get_params()[0]
    hidden = np.maximum(X @ p["fc1_weight"].asnumpy().T + p["fc1_bias"].asnumpy(), 0)
    logits = hidden @ p["fc2_weight"].asnumpy().T + p["fc2_bias"].asnumpy()
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    picked = prob[np.arange(len(y)), y.astype(int)]
    accuracy, cross_entropy = np.mean(prob.argmax(axis=1) == y), np.mean(-np.log(picked + 1e-12))
    assert records["valid_accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert records["valid_cross_entropy"] == pytest.approx(cross_entropy, rel=1e-5)
    with_padding = np.mean(-np.log(np.concatenate([picked, np.repeat(picked[-1:], 18)])))
    assert records["valid_cross_entropy"] != pytest.approx(with_padding, rel=1e-4)
    assert evaluate.evaluate() == records  # evaluated again: the same epoch's samples


def loader_factory(num_workers=0, transform=None, prefetch=False):
    def factory(X, y):
        it = DataLoaderIter(
            loader(X, y, shuffle=True, transform=transform, num_workers=num_workers)
        )
        return Prefetch(it) if prefetch else it

    return factory


def valid_loader():
    X, y = classification_data(n=50, seed=7)
    return Evaluate({"valid": DataLoaderIter(loader(X, y, batch_size=16))}, ["acc", "ce"])


@pytest.mark.parametrize(
    "kind, cut",
    [
        ("in this process", 15),
        ("in this process", 20),
        ("two workers", 15),
        ("prefetched", 15),  # a checkpoint reads the states the Prefetch thread swaps
    ],
)
def test_interrupted_and_resumed_training_equals_uninterrupted_bit_for_bit(tmp_path, kind, cut):
    """Stopped at batch ``cut`` (epoch 2 of 3: in the middle, at its end), a resumed loop
    with a fresh loader and adapter ends with the parameters and log of an uninterrupted
    one; shuffled, with a random augmentation."""
    factory = {
        "in this process": loader_factory(transform=jitter),
        "two workers": loader_factory(num_workers=2, transform=jitter_with_mxnet),
        "prefetched": loader_factory(transform=jitter, prefetch=True),
    }[kind]

    def extra():
        return [TrainingMonitoring(["acc", "ce"], every_n_batches=4), valid_loader()]

    full = make_loop(
        tmp_path / "full", FinishAfter(after_n_epochs=3), iterator_factory=factory, extra=extra()
    ).run()
    make_loop(
        tmp_path / "cut", FinishAfter(after_n_batches=cut), iterator_factory=factory, extra=extra()
    ).run()
    np.random.seed(1234)
    resumed = make_loop(
        tmp_path / "cut",
        FinishAfter(after_n_epochs=3),
        iterator_factory=factory,
        resume=True,
        extra=extra(),
    )
    assert resumed.status.iterations_done == cut
    resumed.run()
    assert resumed.status.iterations_done == full.status.iterations_done == 30
    assert_identical(params_of(full), params_of(resumed))
    full_log, resumed_log = comparable_log(full), comparable_log(resumed)
    full_log.pop(cut), resumed_log.pop(cut)  # the cut run stopped (and saved) there
    assert full_log == resumed_log and "valid_cross_entropy" in full_log[30]


# ------------------------------------------------------------ bad input
@pytest.mark.adversarial
def test_more_arrays_than_names_says_what_the_loader_yields_and_how_to_name_them():
    X, y = numbered(n=20)
    three = DataLoader(ArrayDataset(X, y, y), batch_size=5)
    with pytest.raises(ValueError) as info:
        DataLoaderIter(three, data_names=("data",), label_names=("softmax_label",))
    message = str(info.value)
    assert "yields 3 array(s) per batch (shapes [(5, 3), (5,), (5,)])" in message
    assert "data_names=('data',), label_names=('softmax_label',)" in message
    assert (
        "DataLoaderIter(loader, data_names=('data', 'data1'), label_names=('softmax_label',))"
        in message
    )
    one = DataLoader(ArrayDataset(X), batch_size=5)
    with pytest.raises(ValueError, match=r"yields 1 array.*label_names=\(\)"):
        DataLoaderIter(one)


@pytest.mark.adversarial
def test_what_is_not_a_loader_is_refused_naming_what_is_accepted():
    X, y = numbered(n=20)
    with pytest.raises(TypeError, match="expected an mx.io.DataIter or an mx.gluon.data"):
        as_data_iter({"data": X})
    with pytest.raises(TypeError, match=r"DataLoader\(dataset, batch_size=32, shuffle=True\)"):
        as_data_iter(ArrayDataset(X, y))
    with pytest.raises(TypeError, match="DataLoaderIter reads an mx.gluon.data.DataLoader, not"):
        DataLoaderIter(mx.io.NDArrayIter(X, y))
    iterator = mx.io.NDArrayIter(X, y)
    assert as_data_iter(iterator) is iterator
    adapted = as_data_iter(loader(X, y, batch_size=4), label_names=("label",))
    assert isinstance(adapted, DataLoaderIter) and adapted.provide_label[0].name == "label"
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        DataLoaderIter(loader(X, y), seed=-1)
    with pytest.raises(ValueError, match="no batches: its dataset has 0 sample"):
        DataLoaderIter(loader(X[:0], y[:0]))


@pytest.mark.adversarial
def test_a_batch_of_another_shape_is_refused_naming_the_fix():
    rows = [np.zeros(3, "float32")] * 4 + [np.zeros(5, "float32")] * 4
    it = DataLoaderIter(DataLoader(ArrayDataset(rows, np.zeros(8)), batch_size=4))
    next(it)
    with pytest.raises(ValueError, match=r"batch 1 .* 'data' of shape \(4, 5\).*of one shape"):
        next(it)


@pytest.mark.adversarial
def test_a_sampler_that_yields_no_indices_is_refused():
    X, y = numbered(n=4)
    sampler = BatchSampler(SequentialSampler(4), 2)
    sampler._sampler = ["a", "b", "c", "d"]
    with pytest.raises(TypeError, match="integer indices into the dataset; list yielded 'a'"):
        DataLoaderIter(DataLoader(ArrayDataset(X, y), batch_sampler=sampler))


def test_batches_read_in_this_process_equal_gluons_without_waiting_for_the_engine():
    """Gluon's default_batchify_fn copies a NumPy batch into an NDArray, which waits for
    every operator queued before it: reading never overlapped training. The batch is now
    the NumPy array itself, shared: the same values, shapes and types."""
    from mxnet.gluon.data.dataloader import default_batchify_fn

    from mxoid.data.loader import WorkerBatchify, batchify_without_waiting

    rng = np.random.RandomState(0)
    samples = [
        [(rng.rand(3).astype("float32"), float(i), np.int32(i)) for i in range(4)],
        [rng.rand(2, 2) for _ in range(3)],  # float64 stays float64, as Gluon keeps it
        [(mx.nd.array(rng.rand(2)), 1.0) for _ in range(2)],  # NDArray samples: Gluon's own
        [np.array([True, False]) for _ in range(2)],  # bool: Gluon's own
    ]
    for data in samples:
        ours, gluons = batchify_without_waiting(data), default_batchify_fn(data)
        ours, gluons = (x if isinstance(x, list) else [x] for x in (ours, gluons))
        for mine, theirs in zip(ours, gluons):
            assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
            assert mine.context == theirs.context
            np.testing.assert_array_equal(mine.asnumpy(), theirs.asnumpy())
    X, y = numbered(n=6)
    it = DataLoaderIter(loader(X, y, batch_size=4, transform=jitter))
    assert isinstance(it._loader._batchify_fn, WorkerBatchify)  # here: batchify_without_waiting
    custom = DataLoaderIter(loader(X, y, batch_size=4, batchify_fn=default_batchify_fn))
    assert isinstance(custom._loader._batchify_fn, WorkerBatchify)  # Gluon's default, given
    for data in samples:
        here, theirs = custom._loader._batchify_fn(data), batchify_without_waiting(data)
        here, theirs = (x if isinstance(x, list) else [x] for x in (here, theirs))
        for mine, expected in zip(here, theirs):
            assert mine.context == expected.context and mine.dtype == expected.dtype
            np.testing.assert_array_equal(mine.asnumpy(), expected.asnumpy())
    # in a worker: NumPy by value where Gluon's shared NDArray would hold the same values
    from mxnet.gluon.data.dataloader import default_mp_batchify_fn

    from mxoid.data.loader import _worker_batch

    for data in samples:
        sent, gluons = _worker_batch(data, by_value=True), default_mp_batchify_fn(data)
        sent, gluons = (x if isinstance(x, list) else [x] for x in (sent, gluons))
        for mine, theirs in zip(sent, gluons):
            if isinstance(mine, np.ndarray):
                assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
                np.testing.assert_array_equal(mine, theirs.asnumpy())
            else:  # NDArray and bool samples: Gluon's own
                assert mine.context == theirs.context == mx.Context("cpu_shared", 0)
