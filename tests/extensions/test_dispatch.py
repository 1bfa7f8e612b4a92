"""The hook dispatcher: order, ranks, errors in on_error hooks, and the extensions' states;
the hooks of other libraries refused."""

import logging

import pytest
from scripted import small_loop

from mxoid import Extension, FinishAfter
from mxoid.extensions import HOOKS
from mxoid.extensions.dispatch import (
    FOREIGN_HOOKS,
    NOTHING_STOPS,
    HookDispatcher,
    check_extensions,
)


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


# ------------------------------------------------------------ other libraries' hooks
class KerasStyle(Extension):
    """A Keras habit: the loop would never call on_epoch_end."""

    def on_epoch_end(self):
        pass


def test_a_keras_hook_is_refused_when_the_loop_is_built_naming_the_mxoid_hook():
    with pytest.raises(TypeError, match=r"KerasStyle.on_epoch_end is a hook of Keras") as info:
        small_loop([KerasStyle(), FinishAfter(after_n_epochs=1)])
    assert "name it after_epoch" in str(info.value)


@pytest.mark.parametrize(
    "method, hook",
    [
        ("on_epoch_begin", "before_epoch"),
        ("on_train_batch_end", "after_batch"),
        ("on_batch_end", "after_batch"),
        ("on_batch_begin", "before_batch"),
        ("on_train_begin", "before_training"),
        ("on_train_end", "after_training"),
        ("on_validation_end", "after_epoch"),
        ("on_train_epoch_end", "after_epoch"),
        ("on_validation_epoch_end", "after_epoch"),
        ("on_after_backward", "after_backward"),
        ("on_before_optimizer_step", "before_update"),
        ("on_exception", "on_error"),
        ("on_epoch_completed", "after_epoch"),
        ("on_iteration_completed", "after_batch"),
    ],
)
def test_hooks_of_keras_lightning_and_ignite_are_refused_naming_the_mxoid_hook(method, hook):
    cls = type("Habit", (Extension,), {method: lambda self, *args: None, "stops_training": True})
    with pytest.raises(TypeError, match=rf"Habit.{method} is a hook of .*name it {hook}\b"):
        check_extensions([cls()])


def test_every_foreign_hook_names_a_hook_of_mxoid_and_none_is_one():
    assert all(hook in HOOKS for hook, _ in FOREIGN_HOOKS.values())
    assert not set(FOREIGN_HOOKS) & set(HOOKS)
