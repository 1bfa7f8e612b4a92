"""The outputs of the executors, by name."""

from __future__ import annotations

import json
from typing import List

import mxnet as mx

__all__ = ["OutputArrays", "metric_output_names", "output_short_name"]

_OUTPUT_SUFFIX = "_output"


def output_short_name(name: str) -> str:
    """Return an output name without MXNet's ``_output`` suffix.

    ``softmax_output`` -> ``softmax``.
    """
    return name[: -len(_OUTPUT_SUFFIX)] if name.endswith(_OUTPUT_SUFFIX) else name


def metric_output_names(symbol: mx.sym.Symbol) -> List[str]:
    """Return the outputs metrics bind to when none is named, without ``_output``.

    Every output but the losses (``MakeLoss`` outputs: a Gluon network's ``loss``,
    a loss added beside a prediction), unless every output is one.
    """
    graph = json.loads(symbol.tojson())
    nodes = graph["nodes"]
    names = [output_short_name(n) for n in symbol.list_outputs()]
    kept = [n for n, (node, *_) in zip(names, graph["heads"]) if nodes[node]["op"] != "MakeLoss"]
    return kept or names


class OutputArrays(dict):
    """The outputs of the last batch: output name -> one NDArray per device.

    The last forward pass's: an evaluation on these executors (at the training
    batch size), or on executors sharing their memory (other sizes), replaces
    them. An extension reads a training batch's outputs in its
    ``after_backward`` hook, which runs before any evaluation of that batch's
    other hooks.

    Keys are output names without the ``_output`` suffix (``'softmax'``);
    the full name (``'softmax_output'``) is accepted as well.
    """

    def __missing__(self, key: str) -> List[mx.nd.NDArray]:
        short = output_short_name(key)
        if short != key and short in self:
            return self[short]
        raise KeyError(f"no output named {key!r}; the symbol's outputs are {sorted(self)}")

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (
            isinstance(key, str) and dict.__contains__(self, output_short_name(key))
        )
