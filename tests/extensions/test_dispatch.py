"""The hook dispatcher: order, ranks, errors in on_error hooks, and the extensions' states."""

import logging

import pytest

from mxoid import Extension
from mxoid.extensions.dispatch import NOTHING_STOPS, HookDispatcher, check_extensions


class Named(Extension):
    def __init__(self, calls, **kwargs):
        super().__init__(**kwargs)
        self.calls = calls

    def before_training(self):
        self.calls.append(self.name)

    def on_error(self, exception):
        self.calls.append(f"error {self.name}")
        if self.name == "broken":
            raise RuntimeError("an on_error hook that fails")

    def state_dict(self):
        return {"name": self.name}

    def load_state_dict(self, state):
        self.calls.append(f"loaded {state['name']}")


def test_hooks_run_by_priority_then_list_order_and_rank_zero_only_is_left_out_elsewhere():
    calls = []
    extensions = [
        Named(calls, name="b", priority=5),
        Named(calls, name="a"),
        Named(calls, name="c", priority=5),
        Named(calls, name="z", priority=-1),
        Named(calls, name="only0", rank_zero_only=True),
    ]
    HookDispatcher(extensions).fire("before_training")
    assert calls == ["z", "a", "only0", "b", "c"]
    calls.clear()
    HookDispatcher(extensions, rank=1).fire("before_training")
    assert calls == ["z", "a", "b", "c"]


def test_a_failing_on_error_hook_is_logged_and_the_others_still_run(caplog):
    calls = []
    dispatcher = HookDispatcher([Named(calls, name="broken"), Named(calls, name="fine")])
    with caplog.at_level(logging.ERROR):
        dispatcher.fire_on_error(ValueError("the first error"))
    assert calls == ["error broken", "error fine"]
    assert "an on_error hook that fails" in caplog.text


def test_states_are_keyed_by_name_and_repeats_get_a_number():
    calls = []
    dispatcher = HookDispatcher(
        [Named(calls, name="x"), Named(calls, name="x"), Named(calls, name="y")]
    )
    state = dispatcher.state_dict()
    assert list(state) == ["x", "x#2", "y"]
    dispatcher.load_state_dict({"x#2": {"name": "second"}, "gone": {}})
    assert calls == ["loaded second"]


def test_check_extensions_says_what_is_wrong():
    with pytest.raises(ValueError, match="nothing can stop"):
        check_extensions([Extension()])
    assert "FinishAfter" in NOTHING_STOPS
    with pytest.raises(TypeError, match="not int"):
        check_extensions(3)
