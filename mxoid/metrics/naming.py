"""Names of metrics in records, and which label a metric on an output reads."""

from __future__ import annotations

import re
from typing import Sequence

__all__ = ["label_for_output", "snake_case"]

NO_LABEL = (
    "no label for output {output!r}: a metric on it reads the label named {wanted!r} (or the "
    "only label, when the symbol has one output), but the data provides {labels}; name the "
    "iterator's label {wanted!r}, e.g. NDArrayIter(X, {{{wanted!r}: y}})"
)


def snake_case(name: str) -> str:
    """Return a metric name as used in log records: ``'cross-entropy'`` -> ``'cross_entropy'``."""
    return re.sub(r"[^0-9a-z_]+", "_", name.lower()).strip("_") or "metric"


def label_for_output(output: str, output_names: Sequence[str], label_names: Sequence[str]) -> str:
    """Return the label a metric on ``output`` compares with.

    The label of output ``'softmax'`` is ``'softmax_label'``; a symbol with
    one output and one label uses that label whatever its name.

    Raises
    ------
    ValueError
        If no label fits.
    """
    wanted = f"{output}_label"
    if wanted in label_names:
        return wanted
    if len(output_names) == 1 and len(label_names) == 1:
        return label_names[0]
    raise ValueError(NO_LABEL.format(output=output, wanted=wanted, labels=list(label_names)))
