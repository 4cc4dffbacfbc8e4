"""Split a nested state dict into flat arrays + a JSON tree, and join them back.

A component's ``state_dict()`` is a nested dict whose leaves are numpy arrays or
JSON-able values (see DESIGN.md, principle 8). A checkpoint stores the arrays in a
safetensors file and everything else in a JSON manifest. :func:`split_state` replaces
every array by a marker ``{"__tensor__": "<name>"}`` (its flat name, the ``/``-joined key
path) and :func:`join_state` puts arrays back in place of the markers. Small 1-D integer
and bool arrays (lane counters; never ``fields/...`` or ``side/...`` data) are kept
inline in the JSON as ``{"__array__": [...], "dtype": ..., "shape": [...]}`` so the
manifest stays readable; floats always go to the
tensor file (JSON would not keep NaN payloads or -0.0 bit-exact in every reader).

Example:
    >>> import numpy as np
    >>> state = {"rng": {"seed": 3},
    ...          "table": {"fields/obs": np.zeros((2, 1, 3), np.float32),
    ...                    "meta/counts": np.array([2])}}
    >>> tree, tensors = split_state(state)
    >>> sorted(tensors), tree["table"]["fields/obs"]
    (['table/fields/obs'], {'__tensor__': 'table/fields/obs'})
    >>> back = join_state(tree, tensors)
    >>> back["table"]["meta/counts"].tolist(), back["rng"]
    ([2], {'seed': 3})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, describe

__all__ = ["INLINE_MAX", "TENSOR", "ARRAY", "is_marker", "join_state", "split_state",
           "walk_markers"]

TENSOR = "__tensor__"
ARRAY = "__array__"
INLINE_MAX = 256
"""Integer/bool arrays with at most this many elements are kept inline in the JSON."""


def _check_key(key: Any, path: str) -> str:
    if not isinstance(key, str):
        raise CheckpointError(
            f"state_dict key {key!r} at {path or '<root>'}: keys must be str (JSON has no "
            "other key type); convert the key in the component's state_dict()"
        )
    if key in (TENSOR, ARRAY):
        raise CheckpointError(f"state_dict key {key!r} at {path or '<root>'} is reserved")
    return key


def _json_leaf(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            raise CheckpointError(
                f"state_dict value at {path}={f!r}: non-finite floats are not valid JSON; "
                "store it in a numpy array instead"
            )
        return f
    raise CheckpointError(
        f"state_dict value at {path}={describe(value)}: leaves must be numpy arrays or "
        "JSON-able values (None, bool, int, float, str, lists and dicts of them)"
    )


def split_state(
    state: Mapping[str, Any], inline_max: int = INLINE_MAX
) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Separate the arrays of a nested state dict from its JSON-able part.

    Args:
        state: Nested dict; leaves are numpy arrays or JSON-able values. Keys are str.
        inline_max: 1-D integer/bool arrays with at most this many elements stay inline
            (never stored data: keys ``fields/<name>`` or ``side/<name>``).

    Returns:
        ``(tree, tensors)``: the JSON-able tree with markers in place of arrays, and the
        arrays by flat name (the ``/``-joined key path; views, never copies).

    Raises:
        CheckpointError: A key that is not a str, or a leaf that is neither an array nor
            JSON-able.

    Example:
        >>> tree, tensors = split_state({"a": [1, np.float32(2.5)], "b": np.ones(300)})
        >>> tree, list(tensors)
        ({'a': [1, 2.5], 'b': {'__tensor__': 'b'}}, ['b'])
    """
    tensors: dict[str, npt.NDArray[Any]] = {}

    def name_for(path: str) -> str:
        name, k = path, 1
        while name in tensors:
            name, k = f"{path}#{k}", k + 1
        return name

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, sub in value.items():
                key = _check_key(key, path)
                out[key] = walk(sub, f"{path}/{key}" if path else key)
            return out
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, np.ndarray) or (hasattr(value, "__array__")
                                             and hasattr(value, "dtype")
                                             and not isinstance(value, np.generic)):
            arr = np.asarray(value)
            data = "/fields/" in f"/{path}" or "/side/" in f"/{path}"
            if arr.dtype.kind in "biu" and arr.ndim <= 1 and arr.size <= inline_max \
                    and arr.dtype.isnative and not data:
                return {ARRAY: arr.reshape(-1).tolist(), "dtype": arr.dtype.str,
                        "shape": list(arr.shape)}
            name = name_for(path or "root")
            tensors[name] = arr
            return {TENSOR: name}
        return _json_leaf(value, path)

    tree = walk(state, "")
    return tree, tensors


def is_marker(value: Any) -> bool:
    """Whether a JSON value is a tensor marker ``{"__tensor__": name}``."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(TENSOR), str)


def walk_markers(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """List ``(key path, tensor name)`` of every tensor marker in a tree.

    Example:
        >>> walk_markers({"x": {"y": {"__tensor__": "x/y"}}, "z": 1})
        [(('x', 'y'), 'x/y')]
    """
    out: list[tuple[tuple[str, ...], str]] = []
    if is_marker(tree):
        out.append((path, tree[TENSOR]))
    elif isinstance(tree, dict):
        for key, sub in tree.items():
            out.extend(walk_markers(sub, (*path, key)))
    elif isinstance(tree, list):
        for i, sub in enumerate(tree):
            out.extend(walk_markers(sub, (*path, str(i))))
    return out


def join_state(tree: Any, tensors: Mapping[str, Any],
               path: tuple[str, ...] = ()) -> Any:
    """Inverse of :func:`split_state`: put the arrays back in place of the markers.

    Args:
        tree: The JSON tree from :func:`split_state` (or a manifest).
        tensors: Arrays (or array-likes) by flat name.

    Returns:
        The nested state dict.

    Raises:
        CheckpointError: A marker names a tensor that is missing, or an inline array is
            malformed.

    Example:
        >>> join_state({"n": {"__array__": [1, 2], "dtype": "<i8", "shape": [2]}}, {})
        {'n': array([1, 2])}
    """
    where = "/".join(path) or "<root>"
    if is_marker(tree):
        name = tree[TENSOR]
        if name not in tensors:
            raise CheckpointError(f"state entry {where} refers to tensor {name!r}, which the "
                                  "state file does not hold")
        return tensors[name]
    if isinstance(tree, dict) and ARRAY in tree:
        try:
            arr = np.asarray(tree[ARRAY], dtype=np.dtype(tree["dtype"]))
            return arr.reshape([int(s) for s in tree["shape"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"state entry {where}: malformed inline array ({exc})") \
                from exc
    if isinstance(tree, dict):
        return {k: join_state(v, tensors, (*path, k)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [join_state(v, tensors, (*path, str(i))) for i, v in enumerate(tree)]
    return tree
