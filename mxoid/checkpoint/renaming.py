"""A checkpoint read under other parameter names: those of the network that resumes it.

A Gluon block's parameters are named after its prefix, which Gluon counts per
process: a second ``resnet18_v1`` in one process names its parameters
``resnetv11_...`` where the first had ``resnetv10_...``. The same network, its
parameters matched by structure (:meth:`mxoid.network.Network.checkpoint_names`),
resumes a checkpoint of the other once every name the checkpoint holds is
renamed: its parameter values, the gradients of an unfinished group, the
parameters of its symbol, the optimizer's per-parameter multipliers (in its
states and in the settings the run started with) and the fixed parameters.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Dict, Mapping

from .format import CheckpointContents

__all__ = ["rename_parameters"]


def rename_parameters(contents: CheckpointContents, names: Mapping[str, str]) -> None:
    """Rename, in place, the parameters ``contents`` holds: ``names`` maps old to new.

    Names ``names`` leaves out are kept; nothing happens for an empty map.
    """
    if not names:
        return

    def renamed(values: Dict[str, Any]) -> Dict[str, Any]:
        return {names.get(key, key): value for key, value in values.items()}

    contents.arg_params = renamed(contents.arg_params)
    contents.aux_params = renamed(contents.aux_params)
    if contents.gradients:  # '<device>:<parameter>'
        contents.gradients = {
            _gradient_key(key, names): value for key, value in contents.gradients.items()
        }
    if contents.symbol_json:
        contents.symbol_json = _renamed_symbol(contents.symbol_json, names)
    state = contents.loop_state
    if isinstance(state.get("fixed_param_names"), list):
        state["fixed_param_names"] = [names.get(n, n) for n in state["fixed_param_names"]]
    settings = (state.get("optimizer") or {}).get("settings") or {}
    for multipliers in ("lr_mult", "wd_mult"):
        if isinstance(settings.get(multipliers), dict):
            settings[multipliers] = renamed(settings[multipliers])
    if contents.optimizer_states is not None:
        contents.optimizer_states = _renamed_states(contents.optimizer_states, names)


def _gradient_key(key: str, names: Mapping[str, str]) -> str:
    device, _, name = key.partition(":")
    return f"{device}:{names.get(name, name)}" if name else key


def _renamed_symbol(symbol_json: str, names: Mapping[str, str]) -> str:
    """Return the symbol with its variables (parameters and auxiliary states) renamed."""
    graph = json.loads(symbol_json)
    for node in graph.get("nodes", []):
        if node.get("op") == "null" and node.get("name") in names:
            node["name"] = names[node["name"]]
    return json.dumps(graph)


def _renamed_states(states: bytes, names: Mapping[str, str]) -> bytes:
    """Return MXNet's dump of an updater and its optimizer, the optimizer's names renamed.

    The states themselves are keyed by index (by name on a distributed
    kvstore's servers, whose states a checkpoint does not hold).
    """
    loaded = pickle.loads(states)
    if not (isinstance(loaded, tuple) and len(loaded) == 2):
        return states  # without its optimizer: nothing named
    by_key, optimizer = loaded
    by_key = {names.get(k, k) if isinstance(k, str) else k: v for k, v in by_key.items()}
    for attribute in ("lr_mult", "wd_mult"):
        values = getattr(optimizer, attribute, None)
        if isinstance(values, dict):
            setattr(optimizer, attribute, {names.get(k, k): v for k, v in values.items()})
    idx2name = getattr(optimizer, "idx2name", None)
    if isinstance(idx2name, dict):
        optimizer.idx2name = {k: names.get(v, v) for k, v in idx2name.items()}
    return pickle.dumps((by_key, optimizer))
