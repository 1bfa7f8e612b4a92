"""The servers' optimizer states without a job: the controller's two commands beside MXNet's,
and the checkpoint file that holds them, read back or refused when damaged (issue 39, item 1).
The jobs themselves: tests/distributed/test_resumption_distributed.py."""

import pickle

import mxnet as mx
import numpy as np
import pytest

from mxoid import CheckpointError, FinishAfter, MainLoop
from mxoid.checkpoint import read_checkpoint
from mxoid.checkpoint.format import SERVER_STATES, write_checkpoint
from mxoid.distributed import ServerOptimizer
from mxoid.distributed.server_states import LOAD, SAVE, StatesServer, state_file


class FakeStore:
    """What a server's controller uses of its kvstore: the rank, the updater, set_optimizer."""

    def __init__(self, rank):
        self.rank, self._updater = rank, None

    def set_optimizer(self, optimizer):
        self._updater = mx.optimizer.get_updater(optimizer)


def controller_of(store):
    server = StatesServer.__new__(StatesServer)  # no ps-lite: only its controller
    server.kvstore, server.handle, server.init_logginig = store, None, True
    return server._controller()


def test_the_controller_saves_and_loads_its_states_and_passes_mxnets_command_on(tmp_path):
    store = FakeStore(rank=1)
    control = controller_of(store)
    control(0, pickle.dumps(mx.optimizer.SGD(momentum=0.9, learning_rate=0.1)), None)
    weight = mx.nd.ones((4,))
    store._updater(0, mx.nd.ones((4,)), weight)  # a momentum state, one update counted
    control(0, SAVE + str(tmp_path).encode(), None)
    saved = state_file(str(tmp_path), 1)
    states, optimizer = pickle.loads(open(saved, "rb").read())
    assert np.allclose(states[0].asnumpy(), -0.1) and optimizer.num_update == 1

    fresh = FakeStore(rank=1)
    control = controller_of(fresh)
    control(0, pickle.dumps(mx.optimizer.SGD(momentum=0.9, learning_rate=0.1)), None)
    control(0, LOAD + str(tmp_path).encode(), None)
    assert np.array_equal(fresh._updater.states[0].asnumpy(), states[0].asnumpy())
    assert fresh._updater.optimizer.num_update == 1
    assert not (tmp_path / "server1.states").exists()  # loaded: removed, none left


def test_a_server_that_cannot_save_says_why_and_keeps_serving(tmp_path, capsys):
    control = controller_of(FakeStore(rank=0))  # no optimizer yet
    control(0, SAVE + str(tmp_path).encode(), None)
    assert "mxoid server 0: cannot save its optimizer states" in capsys.readouterr().err
    assert not (tmp_path / "server0.states").exists()


def write_with(folder, data):
    """A checkpoint of a small loop, whose servers-optimizer.states holds ``data``."""
    symbol = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2, name="fc"), name="softmax"
    )
    train = mx.io.NDArrayIter(
        np.ones((4, 3)), np.zeros(4), batch_size=2, label_name="softmax_label"
    )
    loop = MainLoop(symbol, train, extensions=[FinishAfter(after_n_epochs=1)])
    arg, aux = loop.get_params()

    def write(path):
        with open(path, "wb") as handle:
            handle.write(data)

    state, states = loop.state_dict(), loop.optimizer_states()
    write_checkpoint(
        str(folder), symbol, arg, aux, state, states, extra_files={SERVER_STATES: write}
    )


def test_the_checkpoint_file_holds_each_servers_dump_by_rank(tmp_path):
    updater = mx.optimizer.get_updater(ServerOptimizer(mx.optimizer.Adam(), 1, 2))
    updater(0, mx.nd.ones((3,)), mx.nd.ones((3,)))
    dump = updater.get_states(dump_optimizer=True)
    layout = {"num_servers": 2, "bigarray_bound": 150}
    write_with(tmp_path / "c", pickle.dumps({"layout": layout, "servers": [dump, dump]}))
    read = read_checkpoint(str(tmp_path / "c"))
    assert read.server_states["layout"] == layout and read.server_states["servers"] == [dump] * 2


@pytest.mark.parametrize(
    "data",
    [b"garbage", pickle.dumps({"servers": []}), pickle.dumps({"layout": {}, "servers": [b"x"]})],
)
def test_a_damaged_server_states_file_is_a_checkpoint_error_naming_it(tmp_path, data):
    write_with(tmp_path / "c", data)
    with pytest.raises(CheckpointError, match="servers-optimizer.states is damaged"):
        read_checkpoint(str(tmp_path / "c"))
