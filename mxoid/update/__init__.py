"""The optimizer step: the kvstore, the optimizer, the update functions, a loop's step.

Plain functions, as in MXNet's own ``model.py``: a kvstore is created
(:func:`create_kvstore`) and initialized once (:func:`initialize_kvstore`),
the optimizer created with the rescaling and index map the update functions
use (:func:`create_optimizer`), then every batch either pushes the gradients
to the kvstore, which runs the optimizer (:func:`update_params_on_kvstore`),
or sums them through it and runs one local updater per device
(:func:`update_params`). :func:`prepare_update` does the whole set-up for a
loop in one call and returns an :class:`Update`.

- :mod:`.kvstore`: creating and filling the kvstore;
- :mod:`.optimizer`: creating the optimizer, its settings as plain data;
- :mod:`.functions`: the update functions;
- :mod:`.step`: :class:`Update` and :func:`prepare_update`;
- :mod:`.loss_scaler`: the loss scale of a step (:class:`LossScaler`);
- :mod:`.fused_updater`: SGD, NAG and Adam as one fused kernel per parameter;
- :mod:`.seed`: MXNet's own names and call forms (``_create_kvstore``,
  ``_initialize_kvstore``, ``_update_params_on_kvstore``, ``_update_params``), so
  that a loop written against ``mx.model``'s switches by changing its imports.
"""

from .functions import (
    local_update,
    local_update_parts,
    prepared_update_on_kvstore,
    update_params,
    update_params_on_kvstore,
)
from .kvstore import KVStoreLike, create_kvstore, initialize_kvstore, kvstore_keys
from .loss_scaler import LossScaler, device_gradients, loop_scaler
from .optimizer import create_optimizer, optimizer_settings
from .seed import _create_kvstore, _initialize_kvstore, _update_params, _update_params_on_kvstore
from .step import Update, prepare_update

__all__ = [
    "KVStoreLike",
    "LossScaler",
    "Update",
    "_create_kvstore",
    "_initialize_kvstore",
    "_update_params",
    "_update_params_on_kvstore",
    "create_kvstore",
    "create_optimizer",
    "device_gradients",
    "initialize_kvstore",
    "kvstore_keys",
    "local_update",
    "local_update_parts",
    "loop_scaler",
    "optimizer_settings",
    "prepare_update",
    "prepared_update_on_kvstore",
    "update_params",
    "update_params_on_kvstore",
]
