"""A step table's arrays as a flat state dict, and their restore.

Keys: ``fields/<name>`` (data ``[T, lanes, *shape]``), ``side/<name>`` (kept-aside next
observations), ``meta/<name>`` (links and lane counters) and ``free_slots`` (the order
in which free side slots are reused, so later adds match the original exactly).

Example:
    >>> import numpy as np
    >>> from replaybank.storage.writers.reference import write
    >>> from replaybank.spec import Spec
    >>> spec = Spec.coerce({"obs": ((2,), "float32"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> a = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> no = np.zeros((3, 1), bool)
    >>> _ = write(a, np.array([0]), {"obs": np.ones((3, 1, 2), np.float32),
    ...             "terminated": no, "truncated": no}, {"obs": np.ones((3, 1, 2), np.float32)})
    >>> b = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> load_table_state(b, table_state(a))
    >>> b.size, bool(np.array_equal(b.arrays["obs"], a.arrays["obs"]))
    (3, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.storage.backends.base import ArrayBackend
from replaybank.storage.table import StepTable

__all__ = ["load_table_state", "table_state"]


def table_state(t: StepTable) -> dict[str, npt.NDArray[Any]]:
    """The table's arrays as numpy (views where the storage allows), by state key."""
    be = t.backend
    arrays = {f"fields/{k}": be.to_numpy(v) for k, v in t.arrays.items()}
    arrays.update({f"side/{k}": be.to_numpy(v) for k, v in t.side.arrays.items()})
    arrays.update({f"meta/{k}": np.asarray(v) for k, v in t.state_arrays().items()})
    arrays["free_slots"] = np.asarray(t.side.free, dtype=np.int64)
    return arrays


def load_table_state(t: StepTable, arrays: Mapping[str, Any]) -> None:
    """Copy a :func:`table_state` into ``t`` (same spec, rows and lanes).

    Every shape is checked before anything is written; arrays are copied in chunks of
    rows, so a lazily read source (a checkpoint file) never needs a second full copy.

    Raises:
        CheckpointError: An array is missing or has the wrong shape.
    """
    side_len = _side_len(t, arrays)
    _check(t, arrays, side_len)  # before anything is written
    if side_len != t.side_capacity:
        t.side.resize(side_len)
    for name in t.arrays:
        _copy_rows(t.backend, t.arrays[name], arrays[f"fields/{name}"])
    for name in t.side.arrays:
        _copy_rows(t.backend, t.side.arrays[name], arrays[f"side/{name}"])
    for name, arr in t.state_arrays().items():
        arr[...] = arrays[f"meta/{name}"]
    t.rebuild_free_list()
    t.epoch += 1  # links changed without a write
    saved = arrays.get("free_slots")
    if saved is not None and sorted(np.asarray(saved).tolist()) == sorted(t.side.free):
        t.side.free = [int(i) for i in np.asarray(saved)]


def _side_len(t: StepTable, arrays: Mapping[str, Any]) -> int:
    key = f"side/{t.obs_fields[0]}"
    if key not in arrays:
        raise CheckpointError(f"load_state_dict: table array {key} is missing; the state "
                              "does not belong to a buffer of this spec")
    return int(arrays[key].shape[0])


def _check(t: StepTable, arrays: Mapping[str, Any], side_len: int) -> None:
    """Raise CheckpointError unless every table array of a state has the right shape."""
    want = {f"fields/{n}": tuple(a.shape) for n, a in t.arrays.items()}
    want.update({f"side/{n}": (side_len, *t.spec[n].shape) for n in t.obs_fields})
    want.update({f"meta/{n}": tuple(a.shape) for n, a in t.state_arrays().items()})
    for key, shape in want.items():
        got = tuple(arrays[key].shape) if key in arrays else None
        if got != shape:
            raise CheckpointError(
                f"load_state_dict: table array {key} has shape {got}, expected {shape}; "
                "the state does not belong to a buffer of this capacity/spec"
            )
    if not 0 < side_len <= t.T * t.lanes:
        raise CheckpointError(f"load_state_dict: side store of {side_len} slots; expected "
                              f"1..{t.T * t.lanes}")


def _copy_rows(backend: ArrayBackend, dst: Any, src: Any, chunk_bytes: int = 16 << 20) -> None:
    """``dst[:] = src`` in chunks of rows."""
    n = len(src)
    row = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * np.dtype(src.dtype).itemsize)
    step = max(1, chunk_bytes // row)
    for i in range(0, n, step):
        backend.write(dst, slice(i, min(n, i + step)), np.asarray(src[i:i + step]))
