"""The placement file (docs/formats.md, "Placement file"): the project's own format.

```
{"schema_version": 1, "num_layers": L, "num_logical_experts": E, "num_gpus": G, "gpus_per_node": 8,
 "slots_per_gpu": S, "physical_to_logical_map": [[P ints] x L], "replica_weights": [[P floats] x L],
 "policy": "...", "info": {...}}
```

The files engines load are written from a placement in their rooms (`eplb/engines/`), not here.
"""

import json
import os
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from placement.cluster import ClusterSpec
from placement.errors import PlacementFormatError
from placement.placement_model import Placement
from traces.atomic_file import write_text_atomically

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "num_layers",
    "num_logical_experts",
    "num_gpus",
    "slots_per_gpu",
    "physical_to_logical_map",
    "replica_weights",
)


def placement_to_dict(placement: Placement) -> dict:
    """The JSON-ready dict of the placement file. What the fit measured on the clock (`info["timing"]`) stays out:
    a file holds what was decided, so the same fit writes the same bytes in any process."""
    return {
        "schema_version": SCHEMA_VERSION,
        "num_layers": placement.num_layers,
        "num_logical_experts": placement.num_experts,
        "num_gpus": placement.cluster.num_gpus,
        "gpus_per_node": placement.cluster.gpus_per_node,
        "slots_per_gpu": placement.cluster.slots_per_gpu,
        "physical_to_logical_map": placement.phy2log_LP.tolist(),
        "replica_weights": np.round(placement.weights_LP, 12).tolist(),
        "policy": placement.policy,
        "info": {key: value for key, value in placement.info.items() if key != "timing"},
    }


def save_placement(placement: Placement, path: str | os.PathLike) -> None:
    """Write the placement file atomically."""
    write_text_atomically(path, json.dumps(placement_to_dict(placement), separators=(",", ":")) + "\n")


def load_placement(path: str | os.PathLike) -> Placement:
    """Read and validate a placement file; raise `PlacementFormatError` with the reason if it is bad."""
    file = Path(path)
    if not file.is_file():
        raise PlacementFormatError(f"placement file not found: {file}; write one with `eplb place ... --out FILE`")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlacementFormatError(f"{file} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise PlacementFormatError(f"{file} nests JSON too deeply; expected the placement file of docs/formats.md, 'Placement file'") from None
    except OSError as exc:
        raise PlacementFormatError(f"cannot read placement file {file}: {exc.strerror or exc}") from None
    return placement_from_dict(data, str(file))


def placement_from_dict(data: dict, where: str = "placement") -> Placement:
    """Build a `Placement` from the placement file's dict."""
    if not isinstance(data, dict):
        raise PlacementFormatError(f"{where}: expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise PlacementFormatError(f"{where}: schema_version {version} is not supported; expected {SCHEMA_VERSION}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise PlacementFormatError(f"{where}: missing keys {missing}; expected the placement file of docs/formats.md, 'Placement file'")
    for key in ("num_layers", "num_logical_experts", "num_gpus", "slots_per_gpu", "gpus_per_node"):
        value = data.get(key, 8)
        if not _is_int(value) or value < 1:
            raise PlacementFormatError(f"{where}: {key} must be a positive integer; found {_short(value)}")
    if not isinstance(data.get("info", {}), dict):
        raise PlacementFormatError(f"{where}: info must be a JSON object; found {_short(data['info'])}")
    if not isinstance(data.get("policy", ""), str):
        raise PlacementFormatError(f"{where}: policy must be a string; found {_short(data['policy'])}")
    try:
        cluster = ClusterSpec(
            num_gpus=data["num_gpus"], slots_per_gpu=data["slots_per_gpu"], gpus_per_node=data.get("gpus_per_node", 8)
        )
    except ValidationError as exc:
        raise PlacementFormatError(f"{where}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from exc
    shape = (data["num_layers"], cluster.num_slots)
    phy2log = _matrix(data["physical_to_logical_map"], "physical_to_logical_map", shape, _is_int, "expert ids",
                      np.int64, where)
    weights = _matrix(data["replica_weights"], "replica_weights", shape, _is_number, "numbers", np.float64, where)
    return Placement(phy2log, weights, cluster, data["num_logical_experts"], data.get("policy", ""),
                     dict(data.get("info", {})))


def _is_int(value) -> bool:
    """A JSON integer (not a boolean, not 15.0) small enough for int64."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**62) < value < 2**62


def _is_number(value) -> bool:
    """A JSON number (not a boolean, not a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2**62


def _matrix(value, key: str, shape: tuple[int, int], accept, what: str, dtype, where: str) -> np.ndarray:
    """`value` as a [rows, cols] array after checking it is a list of `rows` lists of `cols` accepted entries."""
    rows, cols = shape
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise PlacementFormatError(f"{where}: {key} must be a list of {rows} lists (one per layer)")
    lengths = {len(row) for row in value}
    if len(value) != rows or lengths - {cols}:
        found = f"{len(value)} rows of {sorted(lengths)[:4]} entries"
        raise PlacementFormatError(f"{where}: {key} has {found}; expected [{rows}, {cols}] (layers x slots)")
    for layer, row in enumerate(value):
        bad = [entry for entry in row if not accept(entry)]
        if bad:
            bad = bad[0]
            raise PlacementFormatError(f"{where}: {key} layer {layer} holds {_short(bad)}; expected {what}")
    return np.asarray(value, dtype=dtype).reshape(rows, cols)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
