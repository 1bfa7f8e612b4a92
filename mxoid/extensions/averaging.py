"""Averages of the trained parameters: ExponentialMovingAverage, and what SWA shares with it.

An average keeps one array per trained parameter on one of the devices (the
parameters are the same on every device), updated in place by one engine
operation per parameter: the per-batch path never waits for the devices.
Evaluate (``parameters=``) and ``MainLoop.score`` evaluate with the averages
swapped into the network's arrays (:meth:`ParameterAverage.swapped_in`); each
checkpoint holds the averaged model in MXNet's format beside the loop's
(``<prefix>-symbol.json``, ``<prefix>-<epoch>.params``: ``mx.mod.Module.load``
reads it), which resumption reads back, so a resumed run continues the
averages bit for bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import mxnet as mx

from ..checkpoint.format import CheckpointError
from ..checkpoint.reading import read_manifest
from ..loss_scale import without_loss_scale
from .base import Extension

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["ExponentialMovingAverage", "ParameterAverage"]

Params = Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]
NOT_ATTACHED = "{name} is not attached to a MainLoop yet: give it to MainLoop(extensions=[...])"
NOT_SAVED = (
    "checkpoint {path} has no {file} (the averages of {name}): it was written without "
    "{name}, or with another prefix; resume without it or from a checkpoint that has it"
)


class ParameterAverage(Extension):
    """An average of the trained parameters, kept on the devices (see the module).

    Subclasses decide when and how the average moves (:meth:`_blend`). It is
    evaluated through ``Evaluate(..., parameters=average)`` and
    ``loop.score(..., parameters=average)``, read with :meth:`get_params`, and
    written into every checkpoint.

    Parameters
    ----------
    prefix : str
        Of its files in a checkpoint folder; one per average of a loop.
    **kwargs
        Options and firing conditions of :class:`Extension`.
    """

    def __init__(self, prefix: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not prefix or os.sep in prefix or prefix == "model":
            raise ValueError(f"prefix must be a plain file name other than 'model', got {prefix!r}")
        self.prefix = prefix
        self.averages: Optional[List[mx.nd.NDArray]] = None
        self._restore: Optional[Dict[str, Any]] = None

    def attach(self, loop: MainLoop) -> None:
        """Find the trained parameters and the device each one's average lives on."""
        super().attach(loop)
        manager = loop.manager
        fixed = set(manager.fixed_param_names)
        self.names = [n for n in manager.param_names if n not in fixed]
        index = {n: i for i, n in enumerate(manager.param_names)}
        devices = len(manager.param_arrays[0]) if manager.param_arrays else 1
        # Parameter j's average on device j mod n: the memory shared out over the devices.
        self._sources = [
            manager.param_arrays[index[n]][j % devices] for j, n in enumerate(self.names)
        ]
        self._indices = [index[n] for n in self.names]

    # --------------------------------------------------------------- moving
    def _start(self) -> None:
        """Make the averages the parameters as they are now (engine copies)."""
        self.averages = [source.copy() for source in self._sources]

    def _blend(self, keep: float) -> None:
        """Blend: ``average = keep * average + (1 - keep) * parameter``, in place.

        ``sgd_update`` computes ``(1 - lr * wd) * w - lr * rescale_grad * g``; with
        ``lr=1``, ``wd=1-keep`` and ``rescale_grad=-(1-keep)`` that is the blend.
        """
        if self.averages is None:
            self._start()
            return
        move = 1.0 - keep
        for average, source in zip(self.averages, self._sources):
            mx.nd.sgd_update(average, source, lr=1.0, wd=move, rescale_grad=-move, out=average)

    # -------------------------------------------------------------- reading
    def _loop(self) -> MainLoop:
        if self.main_loop is None:
            raise RuntimeError(NOT_ATTACHED.format(name=self.name))
        return self.main_loop

    def aux_params(self) -> Optional[Dict[str, mx.nd.NDArray]]:
        """Return the auxiliary states to evaluate the average with; None: the loop's own."""
        return None

    def get_params(self) -> Params:
        """Return ``(arg_params, aux_params)`` with the averages, as host copies.

        As :meth:`MainLoop.get_params` (it waits for the engine); the parameters
        not trained, and the BatchNorm statistics (unless :meth:`aux_params`
        says otherwise), are the loop's.
        """
        loop = self._loop()
        arg_params, aux_params = loop.get_params()
        if self.averages is not None:
            cpu = mx.cpu()
            arg_params.update((n, a.copyto(cpu)) for n, a in zip(self.names, self.averages))
            own = self.aux_params()
            if own is not None:
                aux_params = {n: v.copyto(cpu) for n, v in own.items()}
        return arg_params, aux_params

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Within the block, the network's arrays hold the averages; afterwards, their own values.

        Waits for the engine before and after (the manager's ``synchronize`` rule).
        """
        loop = self._loop()
        if self.averages is None:
            yield
            return
        manager = loop.manager
        loop.synchronize()
        params = [manager.param_arrays[i] for i in self._indices]
        saved = [[array.copy() for array in arrays] for arrays in params]
        aux = self.aux_params()
        saved_aux = [[array.copy() for array in arrays] for arrays in manager.aux_arrays]
        try:
            for average, arrays in zip(self.averages, params):
                for array in arrays:
                    average.copyto(array)
            if aux is not None:
                for name, arrays in zip(manager.aux_names, manager.aux_arrays):
                    for array in arrays:
                        aux[name].copyto(array)
            yield
        finally:
            loop.synchronize()
            for kept, arrays in zip(saved + saved_aux, params + list(manager.aux_arrays)):
                for value, array in zip(kept, arrays):
                    value.copyto(array)
            loop.synchronize()

    # ---------------------------------------------------------- checkpoints
    def _file(self, epochs: int) -> str:
        return f"{self.prefix}-{epochs:04d}.params"

    def checkpoint_files(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> Dict[str, Callable[[str], Any]]:
        """Return the averaged model's files: MXNet's, and a Gluon block's (prefixed)."""
        loop = self._loop()
        arg, aux = self.get_params()
        values = {f"arg:{n}": v for n, v in arg.items()}
        values.update({f"aux:{n}": v for n, v in aux.items()})
        files: Dict[str, Callable[[str], Any]] = {
            f"{self.prefix}-symbol.json": lambda path: without_loss_scale(loop.symbol).save(path),
            self._file(loop.status.epochs_done): lambda path: mx.nd.save(path, values),
        }
        for name, write in loop.network.checkpoint_files(arg, aux).items():
            files[f"{self.prefix}-{name}"] = write
        return files

    def state_dict(self) -> Dict[str, Any]:
        """Return whether there are averages, and the names they are saved under.

        Their values are in the checkpoint's files; the names, in the network's
        order, let a Gluon block resumed by another instance (its parameters named
        otherwise) read them back by place.
        """
        manager = self._loop().manager
        names = {"names": list(self.names), "aux_names": list(manager.aux_names)}
        return {"started": self.averages is not None, **names}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Keep the state until ``on_resumption``, when the checkpoint's folder is known."""
        self._restore = state

    def on_resumption(self) -> None:
        """Read the averages back from the checkpoint resumed from; fire the conditions."""
        state, self._restore = self._restore, None
        if state is not None:
            self._read_back(state)
        super().on_resumption()

    def _read_back(self, state: Dict[str, Any]) -> None:
        loop = self._loop()
        if not state.get("started"):
            self.averages = None
            return
        path = loop.resumed_from
        name = self._file(loop.status.epochs_done)
        expected = read_manifest(path)["files"].get(name)
        full = os.path.join(path, name)
        if expected is None or not os.path.isfile(full):
            raise CheckpointError(NOT_SAVED.format(path=path, file=name, name=self.name))
        with open(full, "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise CheckpointError(f"checkpoint file {full} is damaged: its SHA-256 differs")
        here = {"arg": self.names, "aux": loop.manager.aux_names}
        renamed = {
            f"{kind}:{old}": f"{kind}:{new}"
            for kind in ("arg", "aux")
            for old, new in zip(
                state.get(f"{kind}_names" if kind == "aux" else "names", []), here[kind]
            )
        }
        saved = {renamed.get(k, k): v for k, v in mx.nd.load_frombuffer(data).items()}
        self.averages = [
            saved[f"arg:{n}"].as_in_context(s.context).astype(s.dtype)
            for n, s in zip(self.names, self._sources)
        ]
        self._loaded(saved, state)

    def _loaded(self, saved: Dict[str, mx.nd.NDArray], state: Dict[str, Any]) -> None:
        """Take back what a subclass keeps in the saved file and state (nothing here)."""


class ExponentialMovingAverage(ParameterAverage):
    """An exponential moving average of every trained parameter, kept on the devices.

    After the optimizer step of every ``every_n_batches``-th batch, each average
    becomes ``decay * average + (1 - decay) * parameter``: one in-place operation per
    parameter on the engine, nothing read to the host. It starts from the
    parameters training starts with (as TensorFlow's and Ignite's). Evaluate
    it with ``Evaluate(iterators, metrics, parameters=ema, name="ema")``
    (records ``<iterator>_<metric>`` as usual: give the Evaluate a prefix of
    its own, ``{"ema_valid": valid}``) or ``loop.score(valid, "acc",
    parameters=ema)``; the BatchNorm statistics used are the loop's. Each
    checkpoint holds ``ema-symbol.json`` and ``ema-<epoch>.params``.

    Parameters
    ----------
    decay : float, default 0.999
        In [0, 1).
    every_n_batches : int, default 1
        Move the average after the optimizer step of every batch whose number is a
        multiple of n (the batch's number, as every firing condition counts). With
        ``MainLoop(accumulate_batches=k)`` steps follow every k-th batch: 1 moves
        the average after every step, ``k * m`` after every m-th.
    prefix : str, default 'ema'
        Of its files in checkpoints.
    **kwargs
        Options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import ExponentialMovingAverage
    >>> ema = ExponentialMovingAverage(decay=0.999)
    """

    def __init__(
        self, decay: float = 0.999, every_n_batches: int = 1, prefix: str = "ema", **kwargs: Any
    ) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        kwargs.setdefault("after_update", every_n_batches)
        super().__init__(prefix, **kwargs)
        self.decay = float(decay)

    def before_training(self) -> None:
        """Start the average from the parameters training starts with."""
        self._start()
        super().before_training()

    def do(self, which_callback: str, *args: Any) -> None:
        """Move the average towards the parameters just updated."""
        self._blend(self.decay)
