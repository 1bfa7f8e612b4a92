"""The executors: one per device, each batch split across them, in sets that share memory.

- :mod:`.manager`: :class:`DataParallelExecutorManager`: the training set of
  executors, the sets bound on first use for other inputs, the parameters;
- :mod:`.executor_set`: :class:`ExecutorSet`: the executors of one symbol for
  one set of input shapes;
- :mod:`.binding`: how a set binds its executors (its own arrays, or a shared set's);
- :mod:`.parameters`: values copied into the devices, and MXNet's average out of them;
- :mod:`.outputs`: the outputs by name (:class:`OutputArrays`);
- :mod:`.devices`: the contexts, the split of a batch, MXNet's random generators;
- :mod:`.private_heads`: outputs the executors compute for mxoid;
- :mod:`.invoke`: the per-batch operator and kvstore calls, prepared once;
- :mod:`.pacing`: how far the host runs ahead of the devices;
- :mod:`.initialization`: initial parameter values.
"""

from .devices import check_contexts, forward_work_load, one_random_generator, split_batch
from .executor_set import ExecutorSet
from .manager import DataParallelExecutorManager
from .outputs import OutputArrays, output_short_name
from .private_heads import COUNTING_SUFFIX, LOSS_SCALE_INPUT, RUNNING_SUMS_PREFIX

__all__ = [
    "COUNTING_SUFFIX",
    "LOSS_SCALE_INPUT",
    "RUNNING_SUMS_PREFIX",
    "DataParallelExecutorManager",
    "ExecutorSet",
    "OutputArrays",
    "check_contexts",
    "forward_work_load",
    "one_random_generator",
    "output_short_name",
    "split_batch",
]
