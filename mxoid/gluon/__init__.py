"""Gluon networks in the loop: a HybridBlock and its loss traced to the graphs it trains.

See :mod:`.network`; :class:`mxoid.MainLoop` takes a block and ``loss=`` in place of a symbol.
"""

from .network import GluonNetwork, input_names, is_block, network_inputs

__all__ = ["GluonNetwork", "input_names", "is_block", "network_inputs"]
