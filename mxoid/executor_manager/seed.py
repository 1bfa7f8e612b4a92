"""MXNet's own form of the manager's arguments, beside mxoid's.

mxoid descends from the MXNet pull request that split ``_train_multi_device``
into ``mx.executor_manager.DataParallelExecutorManager`` and ``mx.model``'s
kvstore and update functions. A loop written against that manager builds it as
``DataParallelExecutorManager(symbol, ctx, train_data, arg_names, param_names,
aux_names, work_load_list=None, logger=None, sym_gen=None)``; mxoid's own form is
``(symbol, contexts, data_shapes, label_shapes, ...)``. :func:`is_seed_form` tells
them apart (a third argument with ``provide_data``, a DataIter or DataBatch, or any
argument only MXNet's form has) and :func:`seed_arguments` reads MXNet's form into
mxoid's, checking the names against the symbol's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import mxnet as mx

from .devices import check_contexts

__all__ = ["SEED_KEYWORDS", "SeedArguments", "is_seed_form", "seed_arguments"]

SEED_POSITIONS = (
    "ctx",
    "train_data",
    "arg_names",
    "param_names",
    "aux_names",
    "work_load_list",
    "logger",
    "sym_gen",
)
"""MXNet's manager's arguments after ``symbol``, in order."""
SEED_KEYWORDS = ("ctx", "train_data", "arg_names", "param_names", "aux_names", "logger", "sym_gen")
"""The keywords only MXNet's form has (``work_load_list`` both forms have)."""
TWO_FORMS = (
    "DataParallelExecutorManager takes mxoid's form (symbol, contexts, data_shapes, "
    "label_shapes, ...) or MXNet's (symbol, ctx, train_data, arg_names, param_names, "
    "aux_names, work_load_list=None, logger=None, sym_gen=None)"
)
MISSING = "{form}; MXNet's form was given without {names}"
NOT_THE_SYMBOLS = (
    "{kind} {given} are not the symbol's {expected}; in MXNet's form give "
    "{kind}={how}, as FeedForward does"
)
HOW = {
    "arg_names": "symbol.list_arguments()",
    "param_names": "[n for n in arg_names if n not in the iterator's data and label names]",
    "aux_names": "symbol.list_auxiliary_states()",
}


@dataclass
class SeedArguments:
    """MXNet's form read into mxoid's: what the manager binds, and its buckets.

    Attributes
    ----------
    contexts, data_shapes, label_shapes, work_load_list
        mxoid's arguments (``train_data``'s ``provide_data`` and ``provide_label``).
    sym_gen : callable or None
        A bucket key's symbol, as MXNet's manager calls it per batch.
    default_bucket_key : object
        ``train_data``'s, whose batches the training set runs (with ``sym_gen``).
    """

    contexts: List[mx.Context]
    data_shapes: List[Any]
    label_shapes: List[Any]
    work_load_list: Optional[Sequence[float]]
    sym_gen: Optional[Callable[[Any], mx.sym.Symbol]] = None
    default_bucket_key: Any = None


def is_seed_form(data_shapes: Any, seed_args: Sequence[Any], keywords: Dict[str, Any]) -> bool:
    """Return whether a manager is built in MXNet's form (see the module's documentation)."""
    given = any(value is not None for value in keywords.values())
    return bool(seed_args) or given or hasattr(data_shapes, "provide_data")


def seed_arguments(
    symbol: mx.sym.Symbol,
    positional: Sequence[Any],
    keywords: Dict[str, Any],
) -> SeedArguments:
    """Read MXNet's form of the manager's arguments into mxoid's.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The network (with ``sym_gen``, the default bucket's).
    positional : sequence
        The arguments after ``symbol``, in MXNet's order (``ctx, train_data,
        arg_names, ...``).
    keywords : dict
        MXNet's arguments given by keyword (None where not given).

    Raises
    ------
    TypeError
        For more arguments than MXNet's form has, one given twice, or one missing.
    ValueError
        For ``arg_names``, ``param_names`` or ``aux_names`` other than the symbol's.
    """
    if len(positional) > len(SEED_POSITIONS):
        raise TypeError(f"{TWO_FORMS}: {len(positional) + 1} positional arguments given")
    values = dict(zip(SEED_POSITIONS, positional))
    for name, value in keywords.items():
        if value is not None:
            if values.get(name) is not None:
                raise TypeError(f"DataParallelExecutorManager got multiple values for {name!r}")
            values[name] = value
    missing = [n for n in SEED_POSITIONS[:5] if values.get(n) is None]
    if missing:
        raise TypeError(MISSING.format(form=TWO_FORMS, names=", ".join(missing)))
    train_data = values["train_data"]
    data_shapes, label_shapes = list(train_data.provide_data), list(train_data.provide_label or [])
    _check_names(symbol, values, data_shapes + label_shapes)
    contexts = check_contexts(values["ctx"])
    (values.get("logger") or logging).info("Start training with %s", str(values["ctx"]))
    return SeedArguments(
        contexts,
        data_shapes,
        label_shapes,
        values.get("work_load_list"),
        values.get("sym_gen"),
        getattr(train_data, "default_bucket_key", None),
    )


def _check_names(symbol: mx.sym.Symbol, values: Dict[str, Any], inputs: List[Any]) -> None:
    """Raise ``ValueError`` unless the names given are the symbol's, in its order."""
    arg_names = symbol.list_arguments()
    input_names = {desc[0] for desc in inputs}
    expected = {
        "arg_names": arg_names,
        "param_names": [n for n in arg_names if n not in input_names],
        "aux_names": symbol.list_auxiliary_states(),
    }
    for kind, names in expected.items():
        if list(values[kind]) != names:
            raise ValueError(
                NOT_THE_SYMBOLS.format(
                    kind=kind, given=list(values[kind]), expected=names, how=HOW[kind]
                )
            )
