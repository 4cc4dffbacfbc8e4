"""Validation of what users pass to :meth:`RolloutBuffer.add`, and the store of final
observations that wait for a value.

Everything is checked before anything is written, so a rejected add leaves the buffer
exactly as it was.

Example:
    >>> import numpy as np
    >>> spec = rollout_spec(Spec.infer({"obs": np.zeros(2, np.float32), "action": 0,
    ...     "reward": 1, "terminated": 0, "truncated": 0, "value": 0.0, "log_prob": 0.0}))
    >>> spec["reward"].dtype, spec["terminated"].dtype
    (dtype('float32'), dtype('bool'))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.inputs import RESERVED, obs_fields
from replaybank.errors import DtypeError, ShapeError, SpecError, describe
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.spec import (
    SEP,
    FieldSpec,
    Spec,
    as_array,
    flatten,
    real_floats,
    unflatten,
)

__all__ = [
    "ROLLOUT_RESERVED",
    "FinalObsStore",
    "check_names",
    "final_obs_rows",
    "per_env_float",
    "rollout_spec",
    "scalar_fields",
]

#: Names a rollout never stores (they are computed or are sample metadata).
ROLLOUT_RESERVED = RESERVED | {"advantages", "returns", "final_value", "final_obs", "next_obs"}
_FLOAT = ("reward", "value", "log_prob")
_FLAGS = ("terminated", "truncated")
scalar_fields = ("reward", "value", "terminated", "truncated")


def rollout_spec(spec: Spec) -> Spec:
    """Check a rollout field set and fill defaults.

    reward/value/log_prob default to float32 and must be floating; terminated/truncated
    are bool; reward, value, terminated and truncated hold one scalar per env.

    Args:
        spec: Inferred or user-given spec.

    Returns:
        The completed spec.

    Raises:
        SpecError: Missing obs/action, a reserved name, or a wrong standard field.
    """
    names = list(spec)
    if not obs_fields(spec):
        raise SpecError(f"spec has fields {names} but no 'obs'; a rollout stores obs")
    if not any(n == "action" or n.startswith("action" + SEP) for n in names):
        raise SpecError(f"spec has fields {names} but no 'action'")
    fields: list[FieldSpec] = []
    for n, f in spec.items():
        top = n.split(SEP)[0]
        if top in ROLLOUT_RESERVED:
            raise SpecError(f"field name {n!r} is reserved by RolloutBuffer; rename the field")
        dtype = f.dtype
        if n in _FLAGS:
            dtype = np.dtype(np.bool_)
        elif n in _FLOAT and dtype.kind != "f":
            dtype = np.dtype(np.float32)
        if n in scalar_fields and f.shape != ():
            raise SpecError(
                f"field {n!r} has per-env shape {f.shape}; {n} must be one scalar per env "
                f"(pass shape [num_envs], e.g. squeeze a trailing 1)"
            )
        fields.append(FieldSpec(n, f.shape, dtype))
    out = Spec(fields)
    extra = [FieldSpec(n, (), np.dtype(np.bool_ if n in _FLAGS else np.float32))
             for n in (*_FLOAT, *_FLAGS) if n not in out]
    return out.with_fields(extra)


def check_names(spec: Spec, flat: Mapping[str, Any]) -> None:
    """Raise a SpecError when ``flat`` does not hold exactly the spec's fields."""
    missing = sorted(set(spec) - set(flat))
    unknown = sorted(set(flat) - set(spec))
    if missing or unknown:
        parts = ([f"missing {missing}"] if missing else []) + (
            [f"unknown {unknown}"] if unknown else [])
        raise SpecError(
            f"add: wrong field set ({'; '.join(parts)}); this rollout stores "
            f"{sorted(spec)}; pass the same extras in every add"
        )


def final_obs_rows(spec: Spec, final_obs: Any, need: npt.NDArray[np.bool_],
                   lead: tuple[int, ...]) -> dict[str, npt.NDArray[Any]]:
    """Validate ``final_obs`` and return the rows of the envs in ``need``.

    Args:
        spec: The rollout spec (obs fields are read from it).
        final_obs: Either batched like ``obs`` (leading dims ``lead``; rows of envs not
            in ``need`` are ignored), or a list / object array with one entry per env
            (``None`` allowed for envs not in ``need``), as gymnasium's ``final_obs`` info.
        need: ``[num_envs]`` bool, envs whose final observation is needed.
        lead: Leading dims of a batched value (``()`` or ``(num_envs,)``).

    Returns:
        ``{obs_field: [k, *shape]}`` for the ``k = need.sum()`` envs, in env order.

    Raises:
        ShapeError, DtypeError, SpecError: Bad or missing entries.
    """
    names = obs_fields(spec)
    envs = np.flatnonzero(need)
    per_env = (isinstance(final_obs, np.ndarray) and final_obs.dtype == object) or (
        isinstance(final_obs, (list, tuple))
        and any(x is None or isinstance(x, (Mapping, np.ndarray)) for x in final_obs))
    if per_env:
        entries = list(final_obs)
        if len(entries) != len(need):
            raise ShapeError(
                f"final_obs={describe(final_obs)}: expected one entry per env "
                f"({len(need)}), got {len(entries)}"
            )
        rows: dict[str, list[Any]] = {n: [] for n in names}
        for e in envs:
            entry = entries[e]
            if entry is None:
                raise ShapeError(
                    f"final_obs[{e}] is None but env {e} was truncated and has no final_value;"
                    " give its final observation or final_value"
                )
            flat = _obs_flat(entry)
            check_obs_names(names, flat, f"final_obs[{e}]")
            for n in names:
                rows[n].append(spec[n].cast(f"final_obs[{e}]/{n}", flat[n], ()))
        return {n: (np.stack(v) if v else np.zeros((0, *spec[n].shape), spec[n].dtype))
                for n, v in rows.items()}
    flat = _obs_flat(final_obs)
    check_obs_names(names, flat, "final_obs")
    out = {}
    for n in names:
        arr = spec[n].cast(f"final_obs/{n}" if n != "obs" else "final_obs", flat[n], lead)
        out[n] = arr.reshape((len(need), *spec[n].shape))[envs]
    return out


def _obs_flat(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return flatten({"obs": value})
    return {"obs": value}


def check_obs_names(names: list[str], flat: Mapping[str, Any], arg: str) -> None:
    """Raise a SpecError when a final observation lacks or adds obs sub-fields."""
    if sorted(flat) != sorted(names):
        raise SpecError(
            f"{arg}: has fields {sorted(flat)} but obs has {sorted(names)}; pass a final "
            "observation shaped like obs"
        )


def per_env_float(arg: str, value: Any, num_envs: int) -> npt.NDArray[np.float64]:
    """``value`` as float64 ``[num_envs]`` (a scalar is broadcast).

    Raises:
        DtypeError: Not real numbers (strings, also numbers as text, None, complex
            values).
        ShapeError: Any other shape.

    Example:
        >>> per_env_float("last_values", 0.5, 2).tolist()
        [0.5, 0.5]
    """
    arr = real_floats(as_array(value), f"{arg}={describe(value)}",
                      f"pass {arg} as numbers, one per env (e.g. values.cpu().numpy())")
    if arr.shape == ():
        return np.full(num_envs, float(arr))
    if arr.shape != (num_envs,):
        raise ShapeError(
            f"{arg}={describe(value)}: expected one value per env, shape ({num_envs},)"
            + ("; squeeze the trailing dim" if arr.shape == (num_envs, 1) else "")
        )
    return arr


class FinalObsStore:
    """True final observations of truncated steps whose value is computed later.

    Rows are keyed by the flat rollout index ``t * num_envs + env``.

    Args:
        spec: The rollout spec (its obs fields are stored).

    Example:
        >>> spec = Spec.coerce({"obs": ((2,), "float32")})
        >>> store = FinalObsStore(spec)
        >>> store.append([3], {"obs": np.ones((1, 2), np.float32)})
        >>> store.values(lambda o: o.sum(axis=1), num_envs=2).tolist()
        [2.0]
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.names = obs_fields(spec)
        self.index: list[int] = []
        self.rows: dict[str, list[npt.NDArray[Any]]] = {n: [] for n in self.names}

    def __len__(self) -> int:
        return len(self.index)

    def append(self, flat_index: list[int], rows: Mapping[str, npt.NDArray[Any]]) -> None:
        """Keep ``rows[name][k]`` as the final observation of ``flat_index[k]``."""
        for k, i in enumerate(flat_index):
            self.index.append(int(i))
            for n in self.names:
                self.rows[n].append(rows[n][k])

    def clear(self) -> None:
        """Forget every stored observation."""
        self.index = []
        self.rows = {n: [] for n in self.names}

    def stacked(self) -> dict[str, npt.NDArray[Any]]:
        """``{name: [k, *shape]}`` (empty arrays when nothing is stored)."""
        return {n: (np.stack(v) if v else np.zeros((0, *self.spec[n].shape), self.spec[n].dtype))
                for n, v in self.rows.items()}

    def values(self, value_fn: Any, num_envs: int) -> npt.NDArray[np.float64]:
        """Call ``value_fn`` once on every stored observation (``[k, *shape]``, a dict for
        dict observations) and return the ``k`` values as float64.

        Raises:
            ShapeError: ``value_fn`` is None, or returned other than ``k`` values.
            DtypeError: ``value_fn`` returned other than real numbers (strings, None,
                complex values), or NaN or infinite values (listed with their steps).
        """
        k = len(self.index)
        if value_fn is None:
            t, e = divmod(self.index[0], num_envs)
            raise ShapeError(
                f"compute_returns_and_advantage(value_fn=None): {k} truncated steps (first: "
                f"step {t}, env {e}) were stored with final_obs and need their value; pass "
                "value_fn (final observations -> values)"
            )
        batch = self.stacked()
        arg = batch["obs"] if self.names == ["obs"] else unflatten(batch)["obs"]
        out = value_fn(arg)
        if is_tensor(out):
            out = tensor_to_numpy(out)
        arr = real_floats(out, f"value_fn returned {describe(out)}",
                          f"return {k} values as numbers, one per final observation"
                          ).reshape(-1)
        if arr.size != k:
            raise ShapeError(
                f"value_fn returned {describe(out)}: expected {k} values, one per final "
                "observation"
            )
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            where = ", ".join(f"step {t} env {e}" for t, e in
                              (divmod(self.index[int(i)], num_envs) for i in bad[:4]))
            raise DtypeError(
                f"value_fn returned {describe(out)} for {k} final observations: values "
                f"{arr[bad[:4]].tolist()} (of the truncated steps at {where}"
                f"{', ...' if bad.size > 4 else ''}) are NaN or infinite; return finite "
                "values, one per final observation"
            )
        return arr

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Arrays ``index`` ``[k]`` and one ``[k, *shape]`` per obs field."""
        return {"index": np.asarray(self.index, dtype=np.int64), **self.stacked()}

    def load(self, arrays: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state` (``arrays`` keyed like it).

        Raises:
            KeyError, ValueError: Missing or misshaped arrays.
        """
        index = [int(i) for i in np.asarray(arrays["index"]).reshape(-1)]
        rows = {n: list(np.asarray(arrays[n], dtype=self.spec[n].dtype).reshape(
            (len(index), *self.spec[n].shape))) for n in self.names}
        self.index, self.rows = index, rows
