"""Private heads: outputs the executors compute for mxoid after the network's own.

A private head is a symbol on the network's arrays (behind ``BlockGrad``) whose
outputs serve mxoid, not the user: the per-row metric values of
:class:`~mxoid.extensions.TrainingMonitoring` and :class:`~mxoid.extensions.Evaluate`
(:func:`mxoid.metrics.per_row_head`). The executor manager binds them after the
symbol's outputs; the symbol, its outputs, parameters and checkpoints stay as
they were. A head may keep running sums of its own, arrays private to mxoid:

- an argument named ``_mxoid_running_sums...`` whose gradient is the sum, bound
  with ``grad_req='add'`` (each backward pass adds the batch's values);
- or an auxiliary state of that name, which the head's operator adds to in
  forward passes for training, while its switch, the argument
  ``<sums name>_counting`` (float64, shape ``(1,)``), is 1. MXNet does not tell
  an operator loaded from a library whether a pass is for training, so the
  manager sets the switch whenever a forward pass's ``is_train`` differs from
  the pass before (evaluation on the training executors must not count): one
  write per device and change, nothing for a run of training batches.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import mxnet as mx

__all__ = [
    "COUNTING_SUFFIX",
    "LOSS_SCALE_INPUT",
    "RUNNING_SUMS_PREFIX",
    "TALLY_SUFFIX",
    "PrivateHeads",
]

RUNNING_SUMS_PREFIX = "_mxoid_running_sums"
"""How a private head names its running sums (see
:attr:`DataParallelExecutorManager.running_sums`): an argument whose gradient is
the sum, or an auxiliary state that its operator adds to."""
COUNTING_SUFFIX = "_counting"
"""How a private head names the switch of sums kept as an auxiliary state: the
argument ``<sums name>_counting``, float64 of shape ``(1,)``, 1 while the executors
run forward passes for training, else 0 (the manager sets it)."""

LOSS_SCALE_INPUT = "_mxoid_loss_scale"
"""The input through which loss scaling (:mod:`mxoid.loss_scale`) puts the scale in a graph:
float32 of shape ``(1,)``, one array per device shared by every set, no parameter
(``grad_req='null'``, not in ``param_names``), written by the loop's step."""

TALLY_SUFFIX = "_tally"
"""How a private head names a tally: running sums (an argument named
``<sums name>_tally``, bound with ``grad_req='add'``) whose gradient array is the
argument's own array, so that the head reads in each forward pass what the
backward passes added so far: counts that depend on what was counted before
(the first batch where something happened), with no operator queued by the host."""


class PrivateHeads:
    """The private heads of one executor manager: what it binds, and their arrays.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The network.
    heads : sequence of mx.sym.Symbol
        The private heads, bound in this order after the symbol's outputs.
    for_training : bool
        Whether the executors are a training manager's own (only those keep
        running sums).

    Attributes
    ----------
    symbol : mx.sym.Symbol
        What the executors run: ``symbol``, or a group of it and the heads.
    sum_names : list of str
        The running sums' names (arguments or auxiliary states).
    outputs, running_sums, switches
        Filled by :meth:`attach`, once the executors are bound.
    """

    def __init__(
        self, symbol: mx.sym.Symbol, heads: Sequence[mx.sym.Symbol], for_training: bool
    ) -> None:
        self.symbol = mx.sym.Group([symbol, *heads]) if heads else symbol
        bound_args = self.symbol.list_arguments()
        own_args = symbol.list_arguments()
        bound_aux = self.symbol.list_auxiliary_states()
        own_aux = symbol.list_auxiliary_states()
        private = bound_args[len(own_args) :] + bound_aux[len(own_aux) :]
        if (
            bound_args[: len(own_args)] != own_args
            or bound_aux[: len(own_aux)] != own_aux
            or any(not name.startswith(RUNNING_SUMS_PREFIX) for name in private)
        ):
            raise ValueError(
                "private heads may only read the symbol's own arrays (and running sums "
                f"named {RUNNING_SUMS_PREFIX}...)"
            )
        self.switch_names = [n for n in private if n.endswith(COUNTING_SUFFIX)]
        self.sum_names = [n for n in private if n not in self.switch_names]
        if self.sum_names and not for_training:
            raise ValueError("running sums are kept by training executors only")
        self._aux_sums = {n for n in self.sum_names if n in bound_aux}
        self.tally_names = [n for n in self.sum_names if n.endswith(TALLY_SUFFIX)]
        self._first_outputs = []  # where each head's outputs start, after the symbol's
        first = len(symbol.list_outputs())
        for head in heads:
            self._first_outputs.append(first)
            first += len(head.list_outputs())
        self.outputs: List[List[mx.nd.NDArray]] = []
        self.running_sums: Dict[str, List[mx.nd.NDArray]] = {}
        self.switches: List[mx.nd.NDArray] = []
        self.counting = False

    def grad_req(self, name: str) -> Optional[str]:
        """Return the ``grad_req`` of a private argument (None for the symbol's own)."""
        if name in self.sum_names:
            return "add"
        if name in self.switch_names:
            return "null"
        return None

    def attach(self, executors: Sequence[mx.executor.Executor]) -> None:
        """Take the heads' arrays from the bound executors; the switches start off."""
        # Each head's first output; the others serve its sums.
        self.outputs = [[e.outputs[first] for e in executors] for first in self._first_outputs]
        self.running_sums = {
            name: [(e.aux_dict if name in self._aux_sums else e.grad_dict)[name] for e in executors]
            for name in self.sum_names
        }
        self.switches = [e.arg_dict[n] for n in self.switch_names for e in executors]
        for switch in self.switches:
            switch[:] = 0
        self.counting = False

    def count(self, is_train: bool) -> None:
        """Turn the switches on for forward passes for training, off for the others."""
        for switch in self.switches:
            switch[:] = 1 if is_train else 0
        self.counting = is_train
