"""Bad training data found on the devices: non-finite inputs and labels out of range.

A NaN in the inputs trains the network to NaN parameters without a word, and a
label outside a softmax output's classes (7 for 2 classes) trains and reports a
cross-entropy. Checking every batch on the host would cost a sync per batch:
:class:`DataCheck` counts on the devices instead, in the training pass itself.
"""

from __future__ import annotations

import json
import logging
import warnings
from typing import Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np

from ..executor_manager.private_heads import TALLY_SUFFIX
from ..log.records import counted
from .base import Extension, HeadRequest

__all__ = ["DataCheck", "DataError"]

logger = logging.getLogger(__name__)

NONFINITE = "train_data_nonfinite"
"""The record of the non-finite values found in the training inputs since the last check."""
BAD_LABELS = "train_labels_out_of_range"
"""The record of the labels found outside their softmax output's classes since the last check."""
_COLUMNS = 4  # non-finite values, bad labels, batches counted, first batch with either
_FLOAT_MAX = {"float16": 65504.0, "float32": 3.4028234e38, "float64": 1.7976931348623157e308}


class DataError(ValueError):
    """The training data holds non-finite inputs or labels out of range (``error=True``)."""


class DataCheck(Extension):
    """Count non-finite inputs and out-of-range labels of the training batches on the devices.

    The training executors compute the counts in the training pass (a private
    head, see :meth:`Extension.private_head`) and add them up on the devices,
    with the number of the first batch where one of them was not zero: nothing
    is queued by the host and nothing waits, per batch. When the extension
    fires (after every epoch by default; ``every_n_batches=N`` for sooner) it
    reads the counts (one wait for the engine), writes them as records
    (``train_data_nonfinite``, ``train_labels_out_of_range``) when they are not
    zero, and warns, naming the iterator, the counts and the first batch; with
    ``error=True`` it raises :class:`DataError` instead.

    Inputs: every float data input, each value that is NaN or infinite. Labels:
    each label of a ``SoftmaxOutput`` whose output is ``(rows, classes)`` and
    label ``(rows,)``: a label that is not a whole number in ``[0, classes)``
    (its ``ignore_label`` excepted, with ``use_ignore=True``) is out of range;
    and each label a ``pick`` reads from ``(rows, classes)`` scores, as a Gluon
    block's ``gluon.loss.SoftmaxCrossEntropyLoss`` (``sparse_label=True``, its
    default) reads it (``pick`` would silently clip it into range). The labels of
    other losses (dense labels, regression) are not checked: attaching says so
    in the log (``logging``, at INFO).

    It costs the devices about twenty small operators per batch (see the
    micro benchmark), too much to be on by default; add it while a data set
    is new, or in a job that must not train on bad data.

    Parameters
    ----------
    error : bool, default False
        Raise :class:`DataError` instead of warning.
    **kwargs
        Firing conditions and options of :class:`Extension`;
        ``after_epoch=True`` by default.

    Examples
    --------
    >>> from mxoid import DataCheck
    >>> check = DataCheck(error=True)  # stop at the first epoch end with bad data
    """

    def __init__(self, error: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("after_epoch", True)
        kwargs.setdefault("priority", 1)
        super().__init__(**kwargs)
        self.error = error
        self.tally: Optional[str] = None
        self.labels: List[str] = []
        self._batches_before = 0  # batches of earlier checks, for the first batch's number

    @property
    def record_names(self) -> List[str]:
        """``train_data_nonfinite`` and ``train_labels_out_of_range``."""
        return [NONFINITE, BAD_LABELS]

    def private_head(self, request: HeadRequest) -> Optional[mx.sym.Symbol]:
        """Return the head that counts, in the training pass, into a tally on each device."""
        descs = list(request.data_descs) + list(request.label_descs)
        types = {d[0]: np.dtype(getattr(d, "dtype", None) or np.float32).name for d in descs}
        shapes = {d[0]: tuple(d[1]) for d in descs}
        internals = request.symbol.get_internals()  # the network's own input variables
        known = set(internals.list_outputs())
        terms = [  # NaN and infinities are not <= the largest finite value
            mx.sym.sum((mx.sym.abs(internals[name]) <= _FLOAT_MAX[types[name]]) == 0)
            for name in (d[0] for d in request.data_descs)
            if types.get(name) in _FLOAT_MAX and name in known
        ]
        nonfinite = _total(terms)
        label_terms = []
        for label, classes, ignored in _softmax_labels(request.symbol, shapes, request):
            value = internals[label]
            inside = (value >= 0) * (value < classes) * (value == mx.sym.floor(value))
            if ignored is not None:
                inside = mx.sym.broadcast_maximum(inside, value == ignored)
            label_terms.append(mx.sym.sum(inside == 0))
            self.labels.append(label)
        bad_labels = _total(label_terms)
        unchecked = sorted({d[0] for d in request.label_descs} - set(self.labels))
        if unchecked:
            logger.info(
                "DataCheck does not check the labels %s: only those of a SoftmaxOutput or of "
                "a softmax cross-entropy's pick (gluon.loss.SoftmaxCrossEntropyLoss)",
                unchecked,
            )
        if nonfinite is None and bad_labels is None:
            return None
        nonfinite, bad_labels = (
            mx.sym.zeros((1,), dtype="float64")
            if count is None
            else mx.sym.reshape(count.astype("float64"), (1,))
            for count in (nonfinite, bad_labels)
        )
        self.tally = request.running_sums + TALLY_SUFFIX
        tally = mx.sym.var(self.tally, shape=(_COLUMNS,), dtype="float64")
        batches = mx.sym.slice_axis(tally, axis=0, begin=2, end=3)
        first = mx.sym.slice_axis(tally, axis=0, begin=3, end=4)
        found = (nonfinite + bad_labels) > 0
        first_here = found * (first == 0) * (batches + 1)
        counts = mx.sym.BlockGrad(
            mx.sym.concat(
                nonfinite, bad_labels, mx.sym.ones((1,), dtype="float64"), first_here, dim=0
            )
        )
        return mx.sym.MakeLoss(tally * counts)  # the backward pass adds the counts to the tally

    def do(self, which_callback: str, *args: Any) -> None:
        """Read the counts since the last check: record them, and warn or raise, when not zero."""
        nonfinite, bad_labels, batches, first = self._read()
        if nonfinite or bad_labels:
            row = self.main_loop.log.current_row
            if nonfinite:
                row[NONFINITE] = nonfinite
            if bad_labels:
                row[BAD_LABELS] = bad_labels
            message = self._message(nonfinite, bad_labels, first)
            if self.error:
                raise DataError(message)
            warnings.warn(message, stacklevel=2)

    def _message(self, nonfinite: int, bad_labels: int, first: int) -> str:
        found = []
        if nonfinite:
            found.append(
                f"{counted(nonfinite, 'non-finite value')} (NaN or infinite) in its inputs"
            )
        if bad_labels:
            found.append(
                f"{counted(bad_labels, 'label')} outside the classes of the softmax outputs "
                f"({', '.join(self.labels)})"
            )
        iterator = type(self.main_loop.train_data).__name__
        return (
            f"the training data (train_data, a {iterator}) holds {' and '.join(found)}, "
            f"first in batch {first} of training (iteration {first - 1}, counted from 0); "
            "find the samples with NaN or out-of-range values, or drop them, before training on"
        )

    def _read(self) -> Tuple[int, int, int, int]:
        """Return the counts since the last read, and zero the tallies (a wait for the engine)."""
        if self.tally is None:
            return 0, 0, 0, 0
        loop = self.main_loop
        loop.synchronize()
        tallies = loop.manager.running_sums[self.tally]
        values = np.stack([t.asnumpy() for t in tallies])
        for tally in tallies:
            tally[:] = 0
        firsts = [int(f) for f in values[:, 3] if f > 0]
        batches = int(values[0, 2])
        first = self._batches_before + min(firsts) if firsts else 0
        self._batches_before += batches
        return int(values[:, 0].sum()), int(values[:, 1].sum()), batches, first

    # ------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """Return the counts not read yet: a resumed run reports as the uninterrupted one."""
        if self.tally is None:
            return {}
        self.main_loop.synchronize()
        tallies = [t.asnumpy().tolist() for t in self.main_loop.manager.running_sums[self.tally]]
        return {"tallies": tallies, "batches_before": self._batches_before}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Put back the counts of :meth:`state_dict`."""
        if self.tally is None or not state:
            return
        tallies = self.main_loop.manager.running_sums[self.tally]
        if len(state["tallies"]) != len(tallies):
            raise ValueError(f"{len(state['tallies'])} devices' counts for {len(tallies)} devices")
        for array, values in zip(tallies, state["tallies"]):
            array[:] = np.asarray(values, dtype=np.float64)
        self._batches_before = int(state["batches_before"])


def _total(terms: List[mx.sym.Symbol]) -> Optional[mx.sym.Symbol]:
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _picked(
    nodes: List[Dict[str, Any]],
    node: Dict[str, Any],
    label: str,
    attributes: Dict[str, Any],
    internals: mx.sym.Symbol,
    shapes: Dict[str, tuple],
) -> List[Tuple[str, int, Optional[float]]]:
    """Return ``[(label, classes, None)]`` for a pick of 2-D scores along their last axis."""
    scores, entry = nodes[node["inputs"][0][0]], node["inputs"][0][1]
    if scores["op"] != "null" and entry != 0:
        return []
    name = scores["name"] if scores["op"] == "null" else scores["name"] + "_output"
    try:
        source = internals[name]
        known = set(source.list_arguments())
        _, (shape,), _ = source.infer_shape(**{k: v for k, v in shapes.items() if k in known})
    except (mx.base.MXNetError, ValueError, IndexError):
        return []
    axis = int(attributes.get("axis", -1))
    if len(shape) != 2 or axis not in (-1, 1) or tuple(shapes[label])[:1] != shape[:1]:
        return []
    if str(attributes.get("mode", "clip")) != "clip" or len(shapes[label]) > 2:
        return []
    return [(label, int(shape[1]), None)]


def _softmax_labels(
    symbol: mx.sym.Symbol, shapes: Dict[str, tuple], request: HeadRequest
) -> List[Tuple[str, int, Optional[float]]]:
    """Return ``(label, classes, ignored label or None)`` of each checkable SoftmaxOutput.

    And of each ``pick`` of ``(rows, classes)`` scores by a label of ``(rows,)``
    (or ``(rows, 1)``): a Gluon softmax cross-entropy's.
    """
    label_names = {d[0] for d in request.label_descs}
    nodes = json.loads(symbol.tojson())["nodes"]
    internals = symbol.get_internals()
    found = []
    for node in nodes:
        if node["op"] not in ("SoftmaxOutput", "pick") or len(node["inputs"]) < 2:
            continue
        label = nodes[node["inputs"][1][0]]
        if label["op"] != "null" or label["name"] not in label_names:
            continue
        attributes = node.get("attrs") or node.get("attr") or node.get("param") or {}
        if node["op"] == "pick":
            found += _picked(nodes, node, label["name"], attributes, internals, shapes)
            continue
        if str(attributes.get("multi_output", "False")).lower() in ("true", "1"):
            continue
        try:
            _, (shape,), _ = internals[node["name"] + "_output"].infer_shape(**shapes)
        except (mx.base.MXNetError, ValueError):
            continue
        if len(shape) != 2 or tuple(shapes[label["name"]]) != shape[:1]:
            continue
        ignored = None
        if str(attributes.get("use_ignore", "False")).lower() in ("true", "1"):
            ignored = float(attributes.get("ignore_label", -1))
        found.append((label["name"], int(shape[1]), ignored))
    return found
