"""The seam between the loop and what it trains: :class:`Network`, and a plain symbol as one.

A :class:`~mxoid.MainLoop` trains one of three kinds of network: a symbol, a
``sym_gen`` of buckets (:mod:`.buckets`) or a Gluon ``HybridBlock`` traced to
graphs (:mod:`.gluon`). Whatever the kind, the loop, its extensions and
:meth:`~mxoid.MainLoop.predict` / :meth:`~mxoid.MainLoop.score` ask the network
the same questions, and only the network knows the answer:

- which graph serves inputs (:meth:`Network.graph`), and which executor set
  runs a forward pass over them (:meth:`Network.forward_set`: the cache key of
  that set is made here and nowhere else);
- which executor set trains a batch (:meth:`Network.training_set`, for a
  network whose batches switch graphs: :attr:`Network.switches_graphs`);
- the initial values and fixed parameters (:meth:`Network.loop_settings`);
- how the graphs compute: under mixed precision (:attr:`Network.precision`),
  every graph is converted once, when made (:meth:`Network.converted`), so that
  the executors, the private heads and the checkpoints all see the one graph;
- what goes back into the user's object when training ends
  (:meth:`Network.give_back`), and the files a checkpoint holds beside
  MXNet's (:meth:`Network.checkpoint_files`), and what the loop's state says
  of it (:meth:`Network.state`).

:class:`Network` itself is a plain symbol: one graph to train, evaluate and
predict with, for inputs of any shape.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import mxnet as mx

from ..executor_manager import DataParallelExecutorManager, ExecutorSet
from ..executor_manager.manager import set_key

__all__ = ["AskHeads", "Network"]

AskHeads = Callable[
    [mx.sym.Symbol, Sequence[Any], Sequence[Any], Any], Tuple[List[mx.sym.Symbol], List[Any]]
]
"""``ask_heads(symbol, data_descs, label_descs, key) -> (heads, owners)``: the private heads
the loop's extensions ask for when executors of ``symbol`` are bound for these inputs (of
bucket ``key``), and who asked for each (:func:`mxoid.main_loop.building.heads_asker`)."""


class Network:
    """A symbol the loop trains: the same graph for training, evaluation and prediction.

    The base of the loop's networks (see the module's documentation): the
    bucketed and Gluon networks answer the same questions their own way.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The graph (checked by the loop when it is built).
    train_data : mx.io.DataIter
        The training iterator, as the loop reads it.
    precision : mxoid.precision.MixedPrecision, optional
        How the graphs compute (None: as given, float32).

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The graph of the manager's training set, bound first (converted under
        mixed precision).
    train_data : mx.io.DataIter
    precision : mxoid.precision.MixedPrecision or None
    default_key : hashable or None
        The bucket key of the training set's graph (None: a network of one graph).
    switches_graphs : bool
        Whether batches of one epoch may need other training executors
        (:meth:`training_set`): False for one graph, whose training set
        trains every batch.
    """

    default_key: Optional[Hashable] = None
    switches_graphs: bool = False
    precision: Any = None

    def __init__(self, symbol: Any, train_data: Any, precision: Any = None) -> None:
        if precision is not None:
            self.precision = precision
            inputs = [
                *(getattr(train_data, "provide_data", None) or ()),
                *(getattr(train_data, "provide_label", None) or ()),
            ]
            symbol = self.converted(
                symbol, [d[0] if isinstance(d, tuple) else d.name for d in inputs]
            )
        self.symbol = symbol
        self.train_data = train_data

    def converted(self, symbol: mx.sym.Symbol, input_names: Sequence[str]) -> mx.sym.Symbol:
        """Return ``symbol`` as the executors run it, ``input_names`` its inputs.

        Under mixed precision, AMP's conversion (:meth:`mxoid.precision.MixedPrecision.convert`:
        float32 parameters, float32 outputs of the same names); else ``symbol`` itself.
        A network converts each graph once, when it makes it.
        """
        if self.precision is None or not isinstance(symbol, mx.sym.Symbol):
            return symbol
        return self.precision.convert(symbol, input_names)

    # ------------------------------------------------------------ parameters
    def loop_settings(
        self,
        arg_params: Optional[Mapping[str, mx.nd.NDArray]],
        aux_params: Optional[Mapping[str, mx.nd.NDArray]],
        fixed_param_names: Optional[Sequence[str]],
    ) -> Tuple[Any, Any, Any]:
        """Return the loop's initial values and fixed parameters: for a symbol, those given."""
        return arg_params, aux_params, fixed_param_names

    def give_back(self, get_params: Callable[[], Tuple[Dict, Dict]]) -> None:
        """At each epoch's end and when training ends, give the values to the user's object.

        A symbol has none; a Gluon block is set to them.

        ``get_params``: the loop's :meth:`~mxoid.MainLoop.get_params`, called
        only by a network that keeps values of its own (a Gluon block).
        """

    def checkpoint_files(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> Dict[str, Callable[[str], Any]]:
        """Return file name -> writer(path) of the files a checkpoint holds beside MXNet's."""
        return {}

    def state(self) -> Dict[str, Any]:
        """Return what the loop's state records of the network (plain data; none for a symbol)."""
        return {}

    def checkpoint_names(self, contents: Any) -> Dict[str, str]:
        """Return the checkpoint's parameter names that are named otherwise here: old -> new.

        ``contents``: a checkpoint read (:class:`~mxoid.checkpoint.CheckpointContents`),
        which :func:`~mxoid.checkpoint.renaming.rename_parameters` renames before
        resuming from it. A symbol's names are its own: none.
        """
        return {}

    def check_metrics(self, bound: Sequence[Tuple[str, Any]]) -> None:
        """Raise ``ValueError`` where a metric cannot read the output it is bound to.

        ``bound``: ``(output name, metric)`` pairs, as an extension binds them
        when attached. A symbol's outputs are what its metrics read (nothing
        refused); a Gluon block's scores are not probabilities.
        """

    # ------------------------------------------------------- graphs and sets
    @property
    def graph_keys(self) -> List[Optional[Hashable]]:
        """The keys of the graphs this network predicts with: ``[None]`` for one graph."""
        return [None]

    def key_of(self, batch: Any) -> Optional[Hashable]:
        """Return the key of ``batch``'s graph: None for a network of one graph."""
        return None

    def default_key_of(self, iterator: Any) -> Optional[Hashable]:
        """Return the key of the graph of ``iterator``'s ``provide_data``: None for one graph."""
        return None

    def graph(
        self, key: Optional[Hashable] = None, data_descs: Any = None, label_descs: Any = None
    ) -> mx.sym.Symbol:
        """Return the graph that evaluates and predicts inputs of ``key`` (None: the default).

        ``data_descs`` / ``label_descs``: the inputs' descriptions, which a
        bucketed network checks against its graph's input names.
        """
        return self.symbol

    def forward_set(
        self,
        manager: DataParallelExecutorManager,
        data_descs: Sequence[Any],
        label_descs: Optional[Sequence[Any]] = None,
        private_heads: Sequence[mx.sym.Symbol] = (),
        key: Optional[Hashable] = None,
    ) -> ExecutorSet:
        """Return the executor set for forward passes over these inputs of graph ``key``.

        Bound on first use and cached by the manager under the key made here:
        the graph's key, the inputs' names, shapes and types, and the private
        heads. Where the graph is the training set's and no head or fixed
        gamma stands in the way, the training set itself
        (:meth:`DataParallelExecutorManager.executor_set`).
        """
        graph = self.graph(key, data_descs, label_descs)
        return manager.executor_set(
            data_descs,
            label_descs,
            private_heads,
            key=(key,) + set_key(data_descs, label_descs, private_heads),
            symbol=None if graph is self.symbol else graph,
        )

    def training_set(
        self, manager: DataParallelExecutorManager, batch: Any, ask_heads: AskHeads
    ) -> ExecutorSet:
        """Return the executor set that trains ``batch``: for one graph, the training set."""
        return manager.training_set
