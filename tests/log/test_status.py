"""TrainingStatus: attributes and a read-only mapping; the log answers its counters too."""

import json

import pytest

from mxoid.log import TrainingLog, TrainingStatus


def test_status_is_a_read_only_mapping_with_attribute_access():
    status = TrainingStatus(iterations_done=7, epochs_done=2)
    as_dict = dict(status)
    assert as_dict["iterations_done"] == status.iterations_done == status["iterations_done"] == 7
    assert list(status.keys()) == list(as_dict) and len(status) == len(as_dict)
    assert dict(status.items()) == as_dict and "epochs_done" in status and "nope" not in status
    assert json.loads(json.dumps(dict(status))) == as_dict == status.state_dict()
    with pytest.raises(KeyError):
        status["no_such_counter"]
    with pytest.raises(TypeError):
        status["iterations_done"] = 5


def test_the_log_answers_the_status_counters():
    log = TrainingLog(TrainingStatus(iterations_done=3))
    assert log.iterations_done == 3
    with pytest.raises(AttributeError):
        getattr(log, "no_such_counter")  # noqa: B009
