"""What the loop trains, behind one seam: a symbol, buckets of a ``sym_gen``, a Gluon block.

- :mod:`.base`: :class:`Network`, the questions the loop, its extensions and
  ``predict`` / ``score`` ask of what they train (which graph and which executor
  set serve a batch or an evaluation, the initial values, what goes back to the
  user's object, a checkpoint's extra files), answered for a plain symbol;
- :mod:`.buckets`: :class:`BucketNetwork`, a graph per bucket key from
  ``sym_gen``, as ``BucketingModule`` takes it;
- :mod:`.gluon`: :class:`GluonNetwork`, a ``HybridBlock`` and its loss traced to
  the graphs the loop trains and evaluates;
- :mod:`.choose`: :func:`as_network`, which of them ``MainLoop`` was given.
"""

from .base import AskHeads, Network
from .buckets import BucketNetwork, Buckets, resolve_network
from .choose import as_network, legacy_view
from .gluon import GluonNetwork, input_names, is_block, network_inputs

__all__ = [
    "AskHeads",
    "BucketNetwork",
    "Buckets",
    "GluonNetwork",
    "Network",
    "as_network",
    "input_names",
    "is_block",
    "legacy_view",
    "network_inputs",
    "resolve_network",
]
