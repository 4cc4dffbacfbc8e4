"""One validated ``ReplayBuffer.add`` / ``extend`` call: which lanes it writes, how many
steps it carries, on the first write which spec it implies, and its values shaped
``[n, m, *shape]`` and cast to the spec (:func:`check_call`).

These are the cold parts of the buffer's checked write path (the fast paths skip them);
like :mod:`replaybank.buffers.inputs` they only read the call's values, so a rejected
call leaves the buffer exactly as it was.

Example:
    >>> import numpy as np
    >>> lane_ids([2, 0], num_envs=4).tolist()
    [2, 0]
    >>> steps_of({"obs": np.zeros((5, 3)), "action": np.zeros(5)}, ndim_lead=1)
    5
    >>> spec = call_spec({"obs": np.zeros((5, 3), np.float32), "action": np.zeros(5)},
    ...                  steps=True, m=1, explicit=False)
    >>> spec["obs"].shape, sorted(spec)[-2:]
    ((3,), ['terminated', 'truncated'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from replaybank.buffers.inputs import (
    flags_as_bool,
    leading_dims_split,
    one_env_lead,
    prepare_split,
    reward_as_float32,
    rows_spec,
    split_next,
    standard_spec,
)
from replaybank.errors import ShapeError, SpecError, describe
from replaybank.host import as_numpy
from replaybank.spec import Spec, as_array

__all__ = ["CheckedCall", "call_spec", "check_call", "lane_ids", "steps_of"]

IntArray = npt.NDArray[np.int64]


def lane_ids(env_ids: Any, num_envs: int) -> IntArray:
    """The lanes a write goes to: ``env_ids`` checked, or every lane when None.

    Args:
        env_ids: None or a non-empty 1-D sequence of distinct ints in ``[0, num_envs)``.
        num_envs: The buffer's number of lanes.

    Returns:
        ``[m]`` int64 lane indices.

    Raises:
        ShapeError: env_ids is not 1-D ints, is empty, repeats a lane or is out of range,
            or is a ragged nest (the one ragged check, :func:`~replaybank.host.as_numpy`).

    Example:
        >>> lane_ids(None, 3).tolist()
        [0, 1, 2]
    """
    if env_ids is None:
        return np.arange(num_envs, dtype=np.int64)
    ids = as_numpy(
        env_ids,
        "env_ids",
        expected="a non-empty 1-D list of distinct int env indices",
        fix=f"pass e.g. env_ids=[0] (indices in [0, {num_envs}))",
    )
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) == 0:
        raise ShapeError(
            f"env_ids={describe(env_ids)}: expected a non-empty 1-D list of int env "
            f"indices in [0, {num_envs}); pass e.g. env_ids=[0]"
        )
    got = ids.tolist()  # Python ints: exact comparisons, no array reductions
    if min(got) < 0 or max(got) >= num_envs or len(set(got)) != len(got):
        raise ShapeError(
            f"env_ids={got}: expected distinct env indices in "
            f"[0, {num_envs}) (num_envs={num_envs}); drop duplicates and "
            "out-of-range ids"
        )
    return ids.astype(np.int64)


def steps_of(fields: Mapping[str, Any], ndim_lead: int, rows: bool = False) -> int:
    """Steps T of an ``extend`` call: the leading dim of ``obs`` (or of the first field).

    Args:
        fields: The call's fields.
        ndim_lead: Number of leading (step and lane) dims the call's values have.
        rows: A rows buffer's call (``next_obs`` is an ordinary field).

    Returns:
        T.

    Raises:
        SpecError: No fields were given.
        ShapeError: The values have no leading step dim.

    Example:
        >>> steps_of({"obs": [[1.0], [2.0]]}, ndim_lead=2)
        2
    """
    values, _ = split_next(fields, rows)
    return _steps(values, ndim_lead, rows, {})


def _steps(values: Mapping[str, Any], ndim_lead: int, rows: bool,
           arrays: dict[str, npt.NDArray[Any]]) -> int:
    """:func:`steps_of` of fields split by ``split_next``; ``arrays``: values already
    turned into arrays (by name; the value read is added)."""
    if not values:
        raise SpecError("extend: no fields given; pass obs, action, reward, next_obs, "
                        "terminated, truncated" if not rows else
                        "extend: no fields given; pass the fields this buffer stores")
    first = next((k for k in values if k == "obs" or k.startswith("obs/")), next(iter(values)))
    arr = arrays.get(first)
    if arr is None:
        arr = arrays[first] = as_array(values[first], first)
    if arr.ndim < 1 or ndim_lead < 1:
        raise ShapeError(
            f"extend: {first}={describe(values[first])}: expected a leading step dim T; "
            "use add() for a single step"
        )
    return int(arr.shape[0])


def call_spec(fields: Mapping[str, Any], steps: bool, m: int, explicit: bool,
              rows: bool = False) -> Spec:
    """The spec a buffer's first write implies (reward/terminated/truncated added; for a
    rows buffer, ``rows=True``, terminated/truncated only: :func:`~replaybank.buffers.
    inputs.rows_spec`).

    Arrays keep their dtype, except the standard fields: ``terminated``/``truncated`` are
    bool and ``reward`` is float32 whatever the dtype of the first reward (float64 from a
    gymnasium vector env, a Python int); a buffer given ``spec=`` stores what it declares.

    Args:
        fields: The call's fields.
        steps: The call is an ``extend`` (values have a leading step dim).
        m: Number of lanes written.
        explicit: The values carry a lane dim (several lanes or ``env_ids`` given); a
            single env's values may still come with a lane dim of 1.

    Returns:
        The inferred :class:`~replaybank.spec.Spec`; nothing is allocated.

    Example:
        >>> call_spec({"obs": [[1.0, 2.0]], "action": [0]}, steps=False, m=1,
        ...           explicit=True)["obs"].shape
        (2,)
    """
    values, _ = split_next(fields, rows)
    return _implied_spec(fields, values, steps, m, explicit, rows, {})


def _implied_spec(fields: Mapping[str, Any], values: Mapping[str, Any], steps: bool, m: int,
                  explicit: bool, rows: bool, arrays: dict[str, npt.NDArray[Any]]) -> Spec:
    """:func:`call_spec` of a call's ``fields`` whose stored values ``split_next`` gave
    (``values``); ``arrays``: values already turned into arrays (by name; added to)."""
    n0 = _steps(values, 1, rows, arrays) if steps else 0
    lead0: tuple[int, ...] = ((n0,) if steps else ()) + ((m,) if explicit else ())
    if not explicit:  # one env may still come with its lane dim of 1
        lead0 = one_env_lead(fields, lead0)
    spec = flags_as_bool(Spec.infer(values, lead0))
    return rows_spec(spec) if rows else standard_spec(reward_as_float32(spec))


class CheckedCall(NamedTuple):
    """A call whose every value was checked: what the reference writer needs.

    Attributes:
        spec: The stored fields (the table's, or the one the first call implies).
        lanes: The written lanes ``[m]``.
        values: Every stored field ``[n, m, *shape]``, cast to the spec.
        next_obs: Next observation of every obs field ``[n, m, *shape]``.
        out: ``(n, m)``.
    """

    spec: Spec
    lanes: IntArray
    values: dict[str, Any]
    next_obs: dict[str, Any]
    out: tuple[int, int]


def check_call(spec: Spec | None, fields: Mapping[str, Any], steps: bool, env_ids: Any,
               num_envs: int, rows: bool = False) -> CheckedCall:
    """Check every value of one ``add`` (``steps=False``) or ``extend`` call.

    Args:
        spec: The table's spec, or None before the first write (it is inferred).
        fields: The call's fields (standard fields the caller passed, then extras).
        steps: True for ``extend`` (a leading step dim).
        env_ids: The call's ``env_ids``.
        num_envs: Lanes of the buffer.
        rows: The buffer stores rows (``next_obs=False``): every key is an ordinary
            field, ``next_obs`` comes back empty, absent flags are False.

    Returns:
        The :class:`CheckedCall`; nothing of the buffer was touched.

    Raises:
        SpecError, ShapeError, DtypeError: A bad value, naming it and the fix.

    Example:
        >>> import numpy as np
        >>> c = check_call(None, {"obs": np.zeros(3), "action": 1, "reward": 0.5,
        ...                       "next_obs": np.ones(3), "terminated": False,
        ...                       "truncated": False}, steps=False, env_ids=None, num_envs=1)
        >>> c.values["obs"].shape, c.next_obs["obs"].shape, c.out
        ((1, 1, 3), (1, 1, 3), (1, 1))
        >>> r = check_call(None, {"obs": np.zeros((4, 2, 3)), "reward": np.ones((4, 2))},
        ...                steps=True, env_ids=None, num_envs=2, rows=True)
        >>> sorted(r.values), r.next_obs, r.out
        (['obs', 'reward', 'terminated', 'truncated'], {}, (4, 2))
    """
    call = "extend" if steps else "add"
    lanes = lane_ids(env_ids, num_envs)
    m = len(lanes)
    explicit = m > 1 or env_ids is not None
    shapes: list[tuple[int, ...]]  # the leading dims a call may have
    if steps:
        shapes = [(1, m)] if explicit else [(1,), (1, 1)]
    else:
        shapes = [(m,)] if explicit else [(), (1,)]
    # the fields are flattened and split once, and each value turned into an array once
    values, nxt = split_next(fields, rows)
    arrays: dict[str, npt.NDArray[Any]] = {}
    if spec is None:  # inferred, but the buffer allocates only once the call is valid
        spec = _implied_spec(fields, values, steps, m, explicit, rows, arrays)
    lead = leading_dims_split(spec, values, shapes, call, rows, arrays)
    if steps:
        n = _steps(values, len(lead), rows, arrays)
        lead = (n, *lead[1:])
        out = (n, m)
    else:
        out = (1, m)
    checked, checked_next = prepare_split(spec, values, nxt, lead, out, call, rows, arrays)
    return CheckedCall(spec, lanes, checked, checked_next, out)
