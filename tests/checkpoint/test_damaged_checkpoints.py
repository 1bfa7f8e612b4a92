"""Damaged and inconsistent checkpoints never block resumption: the run's own directory with a
damaged newest checkpoint, a loop state that contradicts itself behind a valid manifest, and a
checkpoint pruned while another process reads it. Each resumed run falls back to the previous
checkpoint, says which one it skipped, and ends bit-identical to the uninterrupted run.
"""

import json
import os
import shutil

import pytest
from checkpointing import assert_identical, comparable_log, make_loop, params_of, rewrite

from mxoid import CheckpointError, FinishAfter, MainLoop, Predictor, load_params
from mxoid.checkpoint import directory as checkpoint_directory
from mxoid.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint
from mxoid.checkpoint.loading import checkpoint_of_epoch

pytestmark = pytest.mark.adversarial


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Two epochs without interruption: what every resumed run below must equal."""
    loop = make_loop(tmp_path_factory.mktemp("full"), FinishAfter(after_n_epochs=2)).run()
    return params_of(loop), comparable_log(loop)


def cut_run(directory):
    """Stop in the second epoch, after 17 batches (checkpoints after batches 3, 6, ..., 15 and
    17; the shuffled order is kept from the first reset on); return the last two folders."""
    make_loop(directory, FinishAfter(after_n_batches=17)).run()
    return list_checkpoints(str(directory))[-2:]


def resume_and_compare(directory, resumes_from, skipped, uninterrupted):
    """Resume in ``directory``: from ``resumes_from``, warning of ``skipped``; as uninterrupted."""
    with pytest.warns(UserWarning, match=f"skipping a damaged checkpoint.*{skipped}"):
        resumed = make_loop(directory, FinishAfter(after_n_epochs=2), resume=True)
    assert resumed.resumed_from == resumes_from
    resumed.run()  # the directory is the run's own: its Checkpoint must accept it
    params, log = uninterrupted
    assert_identical(params, params_of(resumed))
    # Rows 15 and 17: the cut run's last saves, where resumption marks its row.
    assert {k: v for k, v in log.items() if k not in (15, 17)} == {
        k: v for k, v in comparable_log(resumed).items() if k not in (15, 17)
    }
    return resumed


def write_manifest(folder, data):
    with open(os.path.join(folder, "MANIFEST.json"), "wb") as handle:
        handle.write(data)


def manifest_missing(folder):
    os.remove(os.path.join(folder, "MANIFEST.json"))


def manifest_truncated(folder):
    with open(os.path.join(folder, "MANIFEST.json"), "rb") as handle:
        data = handle.read()
    write_manifest(folder, data[: len(data) // 2])


def manifest_empty(folder):
    write_manifest(folder, b"")


def manifest_a_list(folder):
    write_manifest(folder, b"[1, 2, 3]")


def manifest_of_another_version(folder):
    with open(os.path.join(folder, "MANIFEST.json")) as handle:
        manifest = json.load(handle)
    manifest["format_version"] = 99
    write_manifest(folder, json.dumps(manifest).encode())


@pytest.mark.parametrize(
    "damage",
    [
        manifest_missing,
        manifest_truncated,
        manifest_empty,
        manifest_a_list,
        manifest_of_another_version,
    ],
)
def test_a_damaged_newest_checkpoint_of_the_runs_own_directory_never_blocks_resuming(
    tmp_path, uninterrupted, damage
):
    previous, newest = cut_run(tmp_path)
    damage(newest)
    resume_and_compare(tmp_path, previous, os.path.basename(newest), uninterrupted)
    assert os.path.isdir(newest)  # left in place: nothing is deleted that cannot be told


def test_an_empty_newer_checkpoint_folder_never_blocks_resuming(tmp_path, uninterrupted):
    _, newest = cut_run(tmp_path)
    os.makedirs(tmp_path / "checkpoint-000099-epoch0001-batch00000018")
    resume_and_compare(tmp_path, newest, "checkpoint-000099", uninterrupted)


def test_a_damaged_best_folder_never_blocks_resuming(tmp_path, uninterrupted):
    previous, newest = cut_run(tmp_path)
    shutil.copytree(newest, tmp_path / "best")
    manifest_truncated(str(tmp_path / "best"))
    manifest_missing(newest)
    resume_and_compare(tmp_path, previous, os.path.basename(newest), uninterrupted)


# ------------------------------------------------------------ a loop state that contradicts itself
def edit_loop_state(folder, change):
    """Change loop.json and rehash it in the manifest: the checkpoint verifies, but is wrong."""
    path = os.path.join(folder, "loop.json")
    with open(path) as handle:
        state = json.load(handle)
    change(state)
    rewrite(folder, "loop.json", json.dumps(state).encode())


def short_order(state):
    state["data_position"]["order"] = state["data_position"]["order"][:10]


def short_idx(state):
    state["data_position"]["idx"] = state["data_position"]["idx"][:-1]


def repeated_idx(state):
    idx = state["data_position"]["idx"]
    idx[1] = idx[0]


def cursor_beyond_the_data(state):
    state["data_position"]["cursor"] = 10_000


def malformed_numpy_state(state):
    state["random"]["numpy"][1] = state["random"]["numpy"][1][:10]


def numpy_position_out_of_range(state):
    state["random"]["numpy"][2] = 5000


def malformed_python_state(state):
    state["random"]["python"] = [3, [1, 2], None]


def negative_counter(state):
    state["status"]["iterations_done_in_epoch"] = -1


def text_counter(state):
    state["status"]["epochs_done"] = "zero"


@pytest.mark.parametrize(
    "change, field",
    [
        (short_order, "data_position.order"),
        (short_idx, "data_position.idx"),
        (repeated_idx, "data_position.idx"),
        (cursor_beyond_the_data, "data_position.cursor"),
        (malformed_numpy_state, "random"),
        (numpy_position_out_of_range, "random"),
        (malformed_python_state, "random"),
        (negative_counter, "status.iterations_done_in_epoch"),
        (text_counter, "status.epochs_done"),
    ],
)
def test_an_inconsistent_loop_state_is_named_and_resumption_falls_back(
    tmp_path, uninterrupted, change, field
):
    previous, newest = cut_run(tmp_path)
    edit_loop_state(newest, change)
    resumed = resume_and_compare(tmp_path, previous, "loop.json", uninterrupted)
    with pytest.raises(CheckpointError, match=f"loop.json is damaged: its '{field}"):
        MainLoop(
            resumed.symbol,
            resumed.train_data,
            contexts=resumed.contexts,
            optimizer="adam",
            extensions=[FinishAfter(after_n_epochs=2)],
            resume_from=newest,
        )


def test_every_checkpoint_damaged_is_one_error_naming_the_directory(tmp_path):
    cut_run(tmp_path)
    damages = [manifest_missing, lambda f: edit_loop_state(f, short_order), manifest_a_list]
    for number, folder in enumerate(list_checkpoints(str(tmp_path))):
        damages[number % len(damages)](folder)
    with (
        pytest.warns(UserWarning, match="damaged"),
        pytest.raises(CheckpointError, match=f"every checkpoint in {tmp_path} is damaged"),
    ):
        make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)


# ------------------------------------------------------------ a reader racing a pruning writer
@pytest.fixture
def pruned_while_read(tmp_path, monkeypatch):
    """A directory whose newest checkpoint is pruned between its listing and its reading.

    The first listing shows a checkpoint that the writer then renames away (as
    ``remove_checkpoint`` does) after saving a newer one: the reader must come back
    with the newer one, never a raw ``FileNotFoundError``.
    """
    cut_run(tmp_path)
    folders = list_checkpoints(str(tmp_path))
    newest = folders[-1]
    hidden = tmp_path / "elsewhere"
    shutil.move(newest, hidden)  # not listed yet: "saved" during the read below
    listed = checkpoint_directory.list_checkpoints
    calls = []

    def list_then_prune(directory):
        found = listed(directory)
        calls.append(list(found))
        if len(calls) == 1:
            checkpoint_directory.remove_checkpoint(found[-1])  # pruned after listing
            shutil.move(hidden, newest)  # and a newer checkpoint is in place
        return found

    monkeypatch.setattr(checkpoint_directory, "list_checkpoints", list_then_prune)
    return newest, calls


def test_latest_checkpoint_racing_a_pruning_writer_gets_the_newest_whole_one(pruned_while_read):
    newest, calls = pruned_while_read
    assert latest_checkpoint(os.path.dirname(newest)).path == newest
    assert len(calls) == 2  # listed again once the folder vanished


def test_resume_from_racing_a_pruning_writer_resumes_from_the_newest_whole_one(
    tmp_path, pruned_while_read
):
    newest, _ = pruned_while_read
    resumed = make_loop(tmp_path, FinishAfter(after_n_epochs=2), resume=True)
    assert resumed.resumed_from == newest


def test_load_params_and_predictor_racing_a_pruning_writer_read_the_newest_once(
    tmp_path, pruned_while_read
):
    newest, calls = pruned_while_read
    arg_params, _ = load_params(str(tmp_path))
    contents = read_checkpoint(newest)
    assert_identical(
        {k: v.asnumpy() for k, v in arg_params.items()},
        {k: v.asnumpy() for k, v in contents.arg_params.items()},
    )
    assert checkpoint_of_epoch(str(tmp_path)) == newest
    assert Predictor(str(tmp_path)).arg_params.keys() == arg_params.keys()


def test_a_folder_removed_while_read_is_a_checkpoint_error_naming_it(tmp_path, monkeypatch):
    _, newest = cut_run(tmp_path)
    from mxoid.checkpoint import reading

    opened = []

    def open_then_remove(path, *args, **kwargs):
        opened.append(path)
        if len(opened) == 3:  # the folder is renamed away after two of its files were read
            checkpoint_directory.remove_checkpoint(newest)
        return open(path, *args, **kwargs)

    monkeypatch.setattr(reading, "open", open_then_remove, raising=False)
    with pytest.raises(CheckpointError, match=f"checkpoint {newest} was removed while it was read"):
        read_checkpoint(newest)
