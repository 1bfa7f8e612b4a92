"""Running sums of metrics over batches, kept on the devices."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from ..executor_manager.invoke import PreparedCall
from ..executor_manager.outputs import output_short_name
from .creation import Metric
from .device import DeviceMetric
from .host import HostMetric
from .naming import label_for_output
from .shapes import check_sums_graph, fits_on_devices

if TYPE_CHECKING:  # pragma: no cover
    from ..executor_manager import DataParallelExecutorManager

__all__ = ["MetricAccumulator", "Reducer"]

Reducer = Callable[[np.ndarray], np.ndarray]
"""Maps the ``(metrics, 2)`` array of ``(sum, count)`` rows to the same, e.g. summed over
workers."""

_CACHED_OP_FLAGS = [("static_alloc", True), ("static_shape", True)]


def _real(array: mx.nd.NDArray, valid: int, rows: slice) -> mx.nd.NDArray:
    """Return the real rows of a device's ``array``: a row per sample, or several (tokens)."""
    device_rows = rows.stop - rows.start
    if valid == device_rows:
        return array
    return array[: valid * (array.shape[0] // device_rows)]


class MetricAccumulator:
    """Running sums of metrics over the batches run through one executor manager.

    Call :meth:`update` after each forward pass of ``manager``: it adds the
    batch's real rows (the first ``manager.valid_rows[k]`` rows of device
    ``k``) to per-device sums, with one cached operator call per device and
    no host synchronization for :class:`DeviceMetric` (the operator graphs
    and every array are made here, once). Given ``head``, the manager's
    private outputs of a :func:`~mxoid.metrics.head.per_row_head`, the executors have computed the
    per-row values already and one addition per device is left; given
    ``running_sums`` too, the executors add them and nothing is left.
    :meth:`values` reads the sums.

    Parameters
    ----------
    manager : DataParallelExecutorManager
        Bound for the batches to come (its ``outputs`` and ``labels``).
    metrics : sequence of (str, Metric)
        Output name (without ``_output``) and metric on it.
    head : list of NDArray, optional
        Per device, the ``(rows, device metrics)`` values of
        :func:`~mxoid.metrics.head.per_row_head` for these metrics, filled by
        each forward pass.
    running_sums : list of NDArray, optional
        With ``head``: per device, the head's running sums
        (:attr:`DataParallelExecutorManager.running_sums`), to which each
        training pass adds the values. :meth:`update` then queues nothing
        for a batch without padding, and takes the padding rows back out of
        a padded one.
    zero_sums : bool, default True
        Zero the running sums first. False takes them as they are: zeros bound
        for them, to which a training pass already queued may have added.

    Attributes
    ----------
    rows : int
        Real rows added since the last :meth:`reset`.

    Notes
    -----
    A reset right after a read (:meth:`values` or :meth:`totals`, with no
    batch added since) queues nothing on the devices: the sums read become
    the baseline later reads are taken from. A write at the end of an epoch
    has just waited for the engine, and a new operator would wake it up
    again (hundreds of microseconds of the loop's time on a CPU whose worker
    has gone idle). Otherwise the sums are zeroed on the devices.

    Examples
    --------
    .. code-block:: python

        accumulator = MetricAccumulator(manager, [("softmax", m) for m in create_metrics("acc")])
        for batch in it:
            manager.load_data_batch(batch); manager.forward(); accumulator.update()
        accumulator.values()
        # -> [0.93]
    """

    def __init__(
        self,
        manager: DataParallelExecutorManager,
        metrics: Sequence[Tuple[str, Metric]],
        head: Optional[Sequence[mx.nd.NDArray]] = None,
        running_sums: Optional[Sequence[mx.nd.NDArray]] = None,
        zero_sums: bool = True,
    ) -> None:
        if running_sums is not None and head is None:
            raise ValueError("running sums come with the head whose values they add")
        self.manager = manager
        self.metrics: List[Metric] = []
        self.rows = 0
        device_entries, self._host = [], []
        for output, metric in metrics:
            output = output_short_name(output)
            if output not in manager.outputs:
                raise ValueError(
                    f"no output named {output!r}; the symbol's outputs are {manager.output_names}"
                )
            label = label_for_output(output, manager.metric_outputs, manager.label_names)
            if isinstance(metric, DeviceMetric) and not fits_on_devices(
                metric, manager, output, label
            ):
                metric = HostMetric(metric.host())  # 'loss' of a loss already averaged
            if isinstance(metric, HostMetric):
                metric = copy.deepcopy(metric)  # each accumulator keeps its own state
                self._host.append((metric, manager.outputs[output], manager.labels[label]))
            else:
                device_entries.append((len(self.metrics), metric, output, label))
            self.metrics.append(metric)
        self._elements = np.zeros(len(self.metrics))
        # The columns of the device sums: per device metric, its values' column, and the
        # column of its per-row counts for a metric that counts (an ignored label).
        self._value_column: Dict[int, int] = {}
        self._count_column: Dict[int, int] = {}
        self._calls: List[List[tuple]] = [[], []]
        self._sums: List[List[List[mx.nd.NDArray]]] = [[], []]
        self._mask_position = 0
        self._masks: Dict[Tuple[int, ...], List[mx.nd.NDArray]] = {}
        # With a head: the executors' per-row values (rows, metrics), added to these.
        self._head: Optional[List[mx.nd.NDArray]] = None
        self._head_sums: List[mx.nd.NDArray] = []
        self._head_adds: List[PreparedCall] = []
        self._running = running_sums is not None
        if device_entries:
            self._bind_devices(device_entries, head, running_sums, zero_sums)
        self._parity = 0
        # The devices' sums at the last reset that zeroed nothing, per metric (subtracted
        # from every read), and the sums of the last read while no batch was added since.
        self._baseline = np.zeros(self._columns)
        self._last_read: Optional[np.ndarray] = None

    def _bind_devices(
        self,
        entries: List[Tuple[int, DeviceMetric, str, str]],
        head: Optional[Sequence[mx.nd.NDArray]] = None,
        running_sums: Optional[Sequence[mx.nd.NDArray]] = None,
        zero_sums: bool = True,
    ) -> None:
        manager = self.manager
        outputs = sorted({output for _, _, output, _ in entries})
        labels = sorted({label for _, _, _, label in entries})
        for device, ctx in enumerate(manager.contexts):
            pred_shapes = {o: tuple(manager.outputs[o][device].shape) for o in outputs}
            label_shapes = {n: tuple(manager.labels[n][device].shape) for n in labels}
            symbols = {f"pred{i}": mx.sym.var(f"pred{i}") for i in range(len(outputs))}
            symbols.update({f"label{i}": mx.sym.var(f"label{i}") for i in range(len(labels))})
            mask = mx.sym.var("mask")
            columns = []
            for index, metric, output, label in entries:
                pred = symbols[f"pred{outputs.index(output)}"]
                label_symbol = symbols[f"label{labels.index(label)}"]
                sums, elements = metric.per_row(
                    pred, label_symbol, pred_shapes[output], label_shapes[label]
                )
                self._value_column[index] = len(columns)
                columns.append(sums)
                if isinstance(elements, mx.sym.Symbol):  # each row's own count
                    self._count_column[index] = len(columns)
                    columns.append(elements)
                else:
                    self._elements[index] = elements
            new_sums = []
            for position, column in enumerate(columns):
                column = mx.sym.cast(column, dtype="float64")
                new_sums.append(
                    mx.sym.var(f"sum{position}")
                    + mx.sym.where(mask, column, mx.sym.zeros_like(column))
                )
            graph = mx.sym.Group(new_sums)
            rows = manager.slices[device].stop - manager.slices[device].start
            inputs = {f"pred{i}": manager.outputs[o][device] for i, o in enumerate(outputs)}
            inputs.update({f"label{i}": manager.labels[n][device] for i, n in enumerate(labels)})
            inputs["mask"] = mx.nd.ones((rows,), ctx=ctx, dtype="float64")
            check_sums_graph(graph, inputs, rows, [m for _, m, _, _ in entries])
            if head is not None:  # the executors compute the values: only the sums here
                if tuple(head[device].shape) != (rows, len(columns)):
                    raise ValueError(
                        f"the head gives per-row values of shape {tuple(head[device].shape)} "
                        f"on device {device}, not ({rows}, {len(columns)})"
                    )
                self._head = list(head)
                if running_sums is not None:  # the executors add the values
                    sums = running_sums[device]
                    if tuple(sums.shape) != tuple(head[device].shape):
                        raise ValueError(
                            f"the running sums have shape {tuple(sums.shape)} on device "
                            f"{device}, the values {tuple(head[device].shape)}"
                        )
                    if zero_sums:  # as simple_bind allocates gradients; a later bind may not
                        sums[:] = 0
                    self._head_sums.append(sums)
                    continue
                sums = mx.nd.zeros((rows, len(columns)), ctx, dtype="float64")
                self._head_sums.append(sums)
                # sums += values, as NDArray's += does it, prepared once.
                self._head_adds.append(PreparedCall("broadcast_add", [sums, head[device]], [sums]))
                continue
            names = graph.list_arguments()
            self._mask_position = names.index("mask")
            operator = mx.nd.CachedOp(graph, flags=_CACHED_OP_FLAGS)
            sums = [
                [mx.nd.zeros((rows,), ctx=ctx, dtype="float64") for _ in columns] for _ in range(2)
            ]
            for parity in (0, 1):
                inputs.update({f"sum{p}": array for p, array in enumerate(sums[parity])})
                self._calls[parity].append((operator, [inputs[n] for n in names], sums[1 - parity]))
                self._sums[parity].append(sums[parity])

    @property
    def _columns(self) -> int:
        """The columns of the device sums: each device metric's values, and its counts."""
        return len(self._value_column) + len(self._count_column)

    # ------------------------------------------------------------- batches
    def update(self) -> None:
        """Add the batch just run forward (its real rows only)."""
        manager = self.manager
        pad = manager.pad
        if self._head is not None:
            self._add_head(pad)
        calls = self._calls[self._parity]
        if pad:
            masks = self._masks_for(manager.valid_rows)
            position = self._mask_position
            for (operator, args, out), mask in zip(calls, masks):
                args = list(args)
                args[position] = mask
                operator(*args, out=out)
        else:
            for operator, args, out in calls:
                operator(*args, out=out)
        if calls:
            self._parity = 1 - self._parity
        if self._host:
            self._update_host(manager.valid_rows)
        self.rows += manager.batch_size - pad
        self._last_read = None

    def _add_head(self, pad: int) -> None:
        """Add the executors' per-row values: one addition per device (two with padding).

        With running sums the backward pass has added every row: a padded
        batch's padding rows are taken back out.
        """
        if not pad:
            for add in self._head_adds:
                add()
            return
        for sums, values, valid in zip(self._head_sums, self._head, self.manager.valid_rows):
            if self._running:
                if valid < sums.shape[0]:
                    view = sums[valid:]
                    view -= values[valid:]
            elif valid:
                view = sums[:valid]
                view += values[:valid]

    def _masks_for(self, valid_rows: Sequence[int]) -> List[mx.nd.NDArray]:
        key = tuple(valid_rows)
        masks = self._masks.get(key)
        if masks is None:
            masks = []
            for valid, slc, ctx in zip(valid_rows, self.manager.slices, self.manager.contexts):
                flags = (np.arange(slc.stop - slc.start) < valid).astype("float64")
                masks.append(mx.nd.array(flags, ctx=ctx, dtype="float64"))
            self._masks[key] = masks
        return masks

    def _update_host(self, valid_rows: Sequence[int]) -> None:
        devices = [(valid, slc) for valid, slc in zip(valid_rows, self.manager.slices)]
        for metric, preds, labels in self._host:
            metric.update(
                [_real(label, *device) for label, device in zip(labels, devices) if device[0]],
                [_real(pred, *device) for pred, device in zip(preds, devices) if device[0]],
            )

    def reset(self, zero: bool = False) -> None:
        """Forget every batch added.

        Right after a read nothing is queued: the sums go on, and what was read
        is taken off the next read (exact while the float64 sums are; a
        checkpoint keeps both, so a resumed run reads the same). ``zero=True``
        sets the sums to zero instead (one operation per array), so that the
        next read is the sum of its own batches alone, whatever came before:
        what an evaluation needs, which keeps no state across a resumption.
        """
        if self._last_read is not None and not zero:
            self._baseline = self._last_read
        else:
            for sums in self._head_sums:
                sums[:] = 0
            for device_sums in self._sums[self._parity]:
                for array in device_sums:
                    array[:] = 0
            self._baseline = np.zeros(self._columns)
        for metric, _, _ in self._host:
            metric.reset()
        self.rows = 0

    # --------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, object]:
        """Return the running sums as plain data (it reads the devices), for a checkpoint.

        The per-row sums are kept as they are on each device, so a resumed
        run adds the next batches to exactly the same numbers.
        """
        self.manager.synchronize()
        device_sums = [
            [array.asnumpy().tolist() for array in sums] for sums in self._sums[self._parity]
        ] + [sums.asnumpy().T.tolist() for sums in self._head_sums]
        host = [list(metric.totals()) for metric, _, _ in self._host]
        return {
            "rows": self.rows,
            "device_sums": device_sums,
            "host": host,
            "baseline": self._baseline.tolist(),
        }

    def load_state_dict(self, state: Dict[str, object], onto_running: bool = False) -> None:
        """Restore the running sums of :meth:`state_dict`.

        ``onto_running``: the executors' running sums already hold batches
        added since they were bound (zeros): the saved sums are added to them.
        """
        self.rows = int(state["rows"])
        # checkpoints written before the baseline existed had their sums zeroed instead
        baseline = np.asarray(state.get("baseline", np.zeros(self._columns)), "float64")
        if len(baseline) != self._columns:  # mxoid 0.3: one entry per metric, no counts
            by_column = np.zeros(self._columns)
            for index, column in self._value_column.items():
                by_column[column] = baseline[index]
            baseline = by_column
        self._baseline = baseline
        self._last_read = None
        for sums, saved in zip(self._sums[self._parity], state["device_sums"]):
            for array, values in zip(sums, saved):
                array[:] = np.asarray(values, dtype="float64")
        for sums, saved in zip(self._head_sums, state["device_sums"]):
            values = np.asarray(saved, dtype="float64").T
            if onto_running and self._running:
                sums += mx.nd.array(values, ctx=sums.context, dtype="float64")
            else:
                sums[:] = values
        for (metric, _, _), (total, count) in zip(self._host, state["host"]):
            metric.restore_totals(total, count)

    # -------------------------------------------------------------- values
    def totals(self) -> np.ndarray:
        """Return the ``(len(metrics), 2)`` array of ``(sum, count)`` per metric, on the host.

        This reads the devices: it first waits for the engine
        (:meth:`DataParallelExecutorManager.synchronize`). Sums and
        counts add up across workers, so a distributed run can sum them
        before :meth:`values` divides.
        """
        self.manager.synchronize()
        read = np.zeros(self._columns)
        for sums in self._sums[self._parity]:
            read += [float(array.asnumpy().sum()) for array in sums]
        for sums in self._head_sums:
            read += sums.asnumpy().sum(axis=0)
        self._last_read = read
        since = read - self._baseline
        totals = np.zeros((len(self.metrics), 2))
        totals[:, 1] = self.rows * self._elements
        for index, column in self._value_column.items():
            totals[index, 0] = since[column]
        for index, column in self._count_column.items():
            totals[index, 1] = since[column]
        for index, metric in enumerate(self.metrics):
            if isinstance(metric, HostMetric):
                totals[index] = metric.totals()
        return totals

    def values(self, reduce: Optional[Reducer] = None) -> List[float]:
        """Return the value of each metric over the batches added since :meth:`reset`.

        Parameters
        ----------
        reduce : callable, optional
            Applied to :meth:`totals` before the division, e.g. a sum over
            workers in distributed training.
        """
        totals = self.totals()
        if reduce is not None:
            totals = np.asarray(reduce(totals), dtype=np.float64)
        return [
            metric.value(float(total), float(count))
            for metric, (total, count) in zip(self.metrics, totals)
        ]
