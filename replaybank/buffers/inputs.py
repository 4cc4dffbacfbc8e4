"""Validation of what users pass to ``add`` / ``extend``: the field set a buffer stores
(standard, reserved and misspelt names, the flags) and the walk over one call's values.

Each value is checked by its field's own rules (:meth:`~replaybank.spec.FieldSpec.cast`,
:meth:`~replaybank.spec.FieldSpec.leading_of`); this module only decides which field and
which leading dims each value is checked against. Everything is checked before anything
is written, so a rejected call leaves the buffer exactly as it was.

Example:
    >>> import numpy as np
    >>> spec = standard_spec(Spec.infer({"obs": np.zeros(2, np.float32), "action": 0}))
    >>> vals, nxt = prepare(spec, {"obs": np.zeros(2, np.float32), "action": 1, "reward": 1.0,
    ...     "next_obs": np.ones(2, np.float32), "terminated": False, "truncated": False},
    ...     leading=(), out_leading=(1, 1))
    >>> vals["action"].shape, nxt["obs"].shape
    ((1, 1), (1, 1, 2))

Rows buffers (``ReplayBuffer(next_obs=False)``) store every key as a plain field: no
``obs``/``action`` is required, nothing is linked as a next observation, and
``terminated``/``truncated`` may be left out of any call (stored as False):

    >>> spec = rows_spec(Spec.infer({"obs": np.zeros(2, np.float32), "first": True}))
    >>> sorted(spec)
    ['first', 'obs', 'terminated', 'truncated']
    >>> vals, nxt = prepare(spec, {"obs": np.ones(2, np.float32), "first": False},
    ...                     leading=(), out_leading=(1, 1), rows=True)
    >>> vals["terminated"].tolist(), nxt
    ([[False]], {})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ShapeError, SpecError, closest
from replaybank.spec import (
    FIELD_ALIASES,
    SEP,
    STANDARD,
    UNSET,
    FieldSpec,
    Spec,
    _canonical_bools,
    as_array,
    collect_fields,
    flatten,
)

__all__ = [
    "DONE_HINT",
    "RESERVED",
    "STANDARD",
    "UNSET",
    "collect_fields",
    "check_flags",
    "flags_as_bool",
    "leading_dims",
    "leading_dims_split",
    "key_hints",
    "name_hints",
    "one_env_lead",
    "obs_fields",
    "prepare",
    "prepare_split",
    "reward_as_float32",
    "rows_spec",
    "split_next",
    "standard_spec",
]

RESERVED = frozenset({"done", "indices", "weights", "probabilities", "discount", "mask",
                      "is_first", "is_last", "is_terminal", "burn_in", "starts", "slots",
                      "env_ids", "priority", "relabeled"})

_DONE_WHY = "(a batch's done is terminated | truncated)"
_DONE_FIX = ("pass terminated= (the episode ended in a terminal state) and truncated= (it "
             "was cut off, e.g. by a time limit; it still bootstraps) instead")
#: What ``done=`` (or ``dones=``) means here, for the messages that refuse it.
DONE_HINT = f"done is reserved {_DONE_WHY}: {_DONE_FIX}"

def name_hints(unexpected: Iterable[str], wanted: Iterable[str]) -> str:
    """What a refused field set probably meant: ``"; did you mean next_obs= (not
    next_observation=)"`` for a name close to (or a usual alias of) a field the call
    lacks, and what to pass instead of ``done``.

    Args:
        unexpected: Top-level names the call passed that the buffer does not expect (or
            that are not standard fields, when a standard one is missing).
        wanted: Top-level names the call lacks.

    Returns:
        The hints, each after ``"; "`` (empty when there is none).

    Example:
        >>> name_hints(["next_observation"], ["next_obs"])
        '; did you mean next_obs= (not next_observation=)'
        >>> name_hints(["hidden"], ["next_obs"])
        ''
    """
    want = sorted(set(wanted))
    hints: list[str] = []
    for name in sorted(set(unexpected)):
        if name in ("done", "dones"):
            hints.append(DONE_HINT if name == "done" else DONE_HINT.replace(
                "done is reserved", "dones is not a field (done is reserved)", 1))
            continue
        guess = FIELD_ALIASES.get(name)
        if guess not in want:
            guess = closest(name, want)
        if guess is not None and guess != name:
            hints.append(f"did you mean {guess}= (not {name}=)")
    return "".join(f"; {h}" for h in hints)


def _path(name: str) -> str:
    """A flat field name as the user writes it: ``obs/goal/xy`` -> ``obs['goal']['xy']``."""
    top, *keys = name.split(SEP)
    return top + "".join(f"[{k!r}]" for k in keys)


def key_hints(unexpected: Iterable[str], wanted: Iterable[str], where: str = "") -> str:
    """What a refused set of nested fields probably meant: a dict given where the buffer
    stores one array, an array where it stores a dict, or a dict key close to one the
    call lacks (under the same parent).

    Args:
        unexpected: Flat names (``obs/goal/yx``) the call passed that the buffer does not
            store.
        wanted: Flat names the call lacks.
        where: Put before each hint (e.g. ``"next_obs: "``).

    Returns:
        The hints, each after ``"; "`` (empty when there is none).

    Example:
        >>> key_hints(["obs/goal/pso"], ["obs/goal/pos", "obs/vel"])
        "; did you mean obs['goal']['pos'] (not obs['goal']['pso'])"
        >>> key_hints(["obs/a"], ["obs"])
        '; obs is one array in this buffer, not a dict (it got the key a)'
        >>> key_hints(["obs"], ["obs/pos", "obs/vel"])
        "; obs is a dict in this buffer, of the keys ['pos', 'vel']"
    """
    want = sorted(set(wanted))
    hints: list[str] = []
    for name in sorted(set(unexpected)):
        if any(w.startswith(name + SEP) for w in want):
            keys = sorted({w[len(name) + 1:].split(SEP, 1)[0] for w in want
                           if w.startswith(name + SEP)})
            hints.append(f"{_path(name)} is a dict in this buffer, of the keys {keys}")
            continue
        whole = next((w for w in want if name.startswith(w + SEP)), None)
        if whole is not None:
            hints.append(f"{_path(whole)} is one array in this buffer, not a dict (it got "
                         f"the key {name[len(whole) + 1:].split(SEP, 1)[0]})")
            continue
        parent, _, key = name.rpartition(SEP)
        if not parent:
            continue
        siblings = {w.rpartition(SEP)[2]: w for w in want if w.rpartition(SEP)[0] == parent}
        near = closest(key, siblings)
        if near is not None:
            hints.append(f"did you mean {_path(siblings[near])} (not {_path(name)})")
    return "".join(f"; {where}{h}" for h in hints)


def _reserved(name: str, rows: bool = False) -> SpecError:
    """The error of a reserved field name (``done``: what to pass instead)."""
    where = f" (a front end may store it under a prefix, e.g. 'user{SEP}{name}')" if rows \
        else ""
    if name.split(SEP)[0] == "done":
        return SpecError(f"field name {name!r} is reserved by replaybank {_DONE_WHY}: "
                         f"{_DONE_FIX}{where}")
    return SpecError(f"field name {name!r} is reserved by replaybank; rename the field{where}")


_DEFAULTS = {
    "reward": FieldSpec("reward", (), np.dtype(np.float32)),
    "terminated": FieldSpec("terminated", (), np.dtype(np.bool_)),
    "truncated": FieldSpec("truncated", (), np.dtype(np.bool_)),
}


def obs_fields(spec: Spec) -> list[str]:
    """Flat names of the observation fields (``obs`` or ``obs/...``)."""
    return [n for n in spec if n == "obs" or n.startswith("obs" + SEP)]


def rows_spec(spec: Spec) -> Spec:
    """The stored fields of a rows buffer (``ReplayBuffer(next_obs=False)``): the
    ``terminated``/``truncated`` flags added when absent; any other name is an ordinary
    field (``obs`` and ``next_obs`` included), except the reserved ones.

    Raises:
        SpecError: A reserved name (``done``, ``is_first``, ...).
        ShapeError: ``terminated``/``truncated`` with a per-step shape.

    Example:
        >>> rows_spec(Spec.infer({"is_first": False}))
        Traceback (most recent call last):
        ...
        replaybank.errors.SpecError: field name 'is_first' is reserved by replaybank; rename the field (a front end may store it under a prefix, e.g. 'user/is_first')
    """  # noqa: E501
    for n in spec:
        if n.split(SEP)[0] in RESERVED:
            raise _reserved(n, rows=True)
    check_flags(spec)
    extra = [f for k, f in _DEFAULTS.items() if k != "reward" and k not in spec]
    return spec.with_fields(extra)


def standard_spec(spec: Spec) -> Spec:
    """Add the default reward/terminated/truncated fields and check the field set.

    Raises:
        SpecError: Missing ``obs``/``action``, a ``next_obs`` field in the spec, or a
            reserved name.
        ShapeError: ``terminated``/``truncated`` with a per-step shape.
    """
    names = list(spec)
    if not obs_fields(spec):
        raise SpecError(f"spec has fields {names} but no 'obs'; every buffer stores obs")
    if not any(n == "action" or n.startswith("action" + SEP) for n in names):
        raise SpecError(f"spec has fields {names} but no 'action'")
    for n in names:
        top = n.split(SEP)[0]
        if top == "next_obs":
            raise SpecError(
                f"spec field {n!r}: next_obs is not stored separately (it is the next "
                "step's obs); describe obs only"
            )
        if top in RESERVED:
            raise _reserved(n)
    check_flags(spec)
    extra = [f for k, f in _DEFAULTS.items() if k not in spec]
    return spec.with_fields(extra)


def one_env_lead(fields: Mapping[str, Any], lead: tuple[int, ...]) -> tuple[int, ...]:
    """The leading dims of a one-env call whose first values also carry the lane dim.

    ``terminated``/``truncated`` hold one flag per step: a flag value with one more,
    trailing dim of size 1 than ``lead`` (``[n, 1]`` for ``extend``, ``[1]`` for
    ``add``) says every value has the lane dim, so it is not inferred into the fields'
    shapes.

    Raises:
        ShapeError: The flag value is a ragged nest (the one ragged check,
            :func:`~replaybank.spec.as_array`, naming it as the call's checks do).

    Example:
        >>> one_env_lead({"terminated": np.zeros((5, 1), bool)}, (5,))
        (5, 1)
        >>> one_env_lead({"terminated": np.zeros(5, bool)}, (5,))
        (5,)
    """
    name = "terminated" if "terminated" in fields else "truncated"
    flag = fields.get(name)
    if flag is None:
        return lead
    shape = as_array(flag, name).shape
    if len(shape) == len(lead) + 1 and shape[-1] == 1:
        return (*lead, 1)
    return lead


def check_flags(spec: Spec) -> None:
    """``terminated``/``truncated`` must be one flag per step, and ``reward`` one number
    per step (n-step returns, hindsight relabelling, episode sums and the samplers read
    it as one; a per-step shape such as ``(1,)`` failed only at the first sample).

    Raises:
        ShapeError: A flag or reward field with a per-step shape.
    """
    for name in ("terminated", "truncated"):
        if name in spec and spec[name].shape != ():
            shape = spec[name].shape
            # (a vector env's first add to a buffer built without num_envs)
            envs = f"; if they are {shape[0]} envs' flags, build the buffer with " \
                f"num_envs={shape[0]}" if len(shape) == 1 and shape[0] > 1 else ""
            raise ShapeError(
                f"{name}: inferred per-step shape {shape}; expected one flag "
                f"per step (shape ()); pass {name} shaped like reward, e.g. [T] for extend "
                f"or a bool for add{envs}"
            )
    if "reward" in spec and spec["reward"].shape != ():
        shape = spec["reward"].shape
        envs = f"; if they are {shape[0]} envs' rewards, build the buffer with " \
            f"num_envs={shape[0]}" if len(shape) == 1 and shape[0] > 1 else ""
        raise ShapeError(
            f"reward: per-step shape {shape}; expected one number per step (shape ()); "
            "pass reward shaped like terminated, e.g. a float for add or [T] for extend "
            f"(a [1] array of one env: reward[0], or obs with its env dim too){envs}. "
            "Several numbers per step (a multi-objective reward) are an extra field, "
            "e.g. add(..., reward=total, objectives=vector)"
        )


def flags_as_bool(spec: Spec) -> Spec:
    """Store inferred numeric ``terminated``/``truncated`` fields as bool (flags, not counts).

    Example:
        >>> flags_as_bool(Spec.infer({"terminated": 0}))["terminated"].dtype
        dtype('bool')
    """
    fields = []
    for name, f in spec.items():
        if name in ("terminated", "truncated") and f.dtype.kind in "iuf":
            f = FieldSpec(name, f.shape, np.dtype(np.bool_))
        fields.append(f)
    return Spec(fields)


def reward_as_float32(spec: Spec) -> Spec:
    """Store an inferred numeric ``reward`` field as float32, the documented default.

    Gymnasium's vector envs (and envs such as Pendulum) return float64 rewards; kept as
    inferred, they would make every torch loss computed from a batch float64. A reward
    declared in the buffer's ``spec=`` keeps its dtype (this is applied to inferred specs
    only), and so does the spec of a loaded checkpoint.

    Example:
        >>> reward_as_float32(Spec.infer({"reward": np.ones(4)}, (4,)))["reward"].dtype
        dtype('float32')
    """
    fields = []
    for name, f in spec.items():
        if name == "reward" and f.dtype.kind in "biuf":
            f = FieldSpec(name, f.shape, np.dtype(np.float32))
        fields.append(f)
    return Spec(fields)


def split_next(fields: Mapping[str, Any],
               rows: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flatten user fields and split off ``next_obs`` (renamed to obs field names); a rows
    buffer's ``next_obs`` is an ordinary field (``rows=True``: nothing is split off)."""
    flat = flatten(fields)  # a new dict: the next_obs fields are taken out of it
    if rows:
        return flat, {}
    names = tuple(flat)
    nexts = _NEXT_NAMES.get(names)
    if nexts is None:  # the same few field sets come every call
        if len(_NEXT_NAMES) > 64:
            _NEXT_NAMES.clear()
        nexts = _NEXT_NAMES[names] = [n for n in names if n == "next_obs"
                                      or n.startswith("next_obs" + SEP)]
    return flat, {name[len("next_"):]: flat.pop(name) for name in nexts}


#: The next_obs names among a call's flat field names, by those names.
_NEXT_NAMES: dict[tuple[str, ...], list[str]] = {}


class _SpecFacts:
    """What the checks read of one spec (its obs fields, its name sets, the shapes each
    value must have for given leading dims), worked out once per spec object."""

    __slots__ = ("_layouts", "lead_field", "names", "obs", "obs_names", "spec")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.obs = obs_fields(spec)
        # the field whose value shows a call's leading dims (a rows spec: see leading_dims)
        self.lead_field = spec[self.obs[0]] if self.obs else None
        self.names = frozenset(spec)
        self.obs_names = frozenset(self.obs)
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, int]], Any] = {}

    def layout(self, leading: tuple[int, ...], out_leading: tuple[int, int],
               rows: bool) -> tuple[list[_Slot], list[_Slot]]:
        """The stored fields, then the obs fields (their next obs; none for rows), as
        ``(name, field, leading + shape, dtype, is a bool field, out_leading + shape, the
        index that adds the unit dims between leading and out_leading or None)``."""
        key = (leading, out_leading)
        got = self._layouts.get(key)
        if got is None:
            if len(self._layouts) > 32:  # extends of many lengths
                self._layouts.clear()
            unit = _unit_dims(leading, out_leading)
            got = self._layouts[key] = tuple(
                [(n, f, leading + f.shape, f.dtype, f.dtype.kind == "b",
                  out_leading + f.shape, unit)
                 for n, f in ((n, self.spec[n]) for n in names)]
                for names in (list(self.spec), [] if rows else self.obs))
        return got


def _unit_dims(leading: tuple[int, ...], out_leading: tuple[int, int]) -> tuple[Any, ...] | None:
    """The index that turns a value ``leading + shape`` into ``out_leading + shape`` when
    only unit dims are added (a view, as ``reshape`` gives, in fewer steps), else None."""
    if out_leading == leading:
        return (...,)
    if out_leading == (1, *leading):
        return (None,)
    if out_leading == (1, 1) and leading == ():
        return (None, None)
    if len(leading) == 1 and out_leading == (leading[0], 1):
        return (slice(None), None)
    return None


_Slot = tuple[str, FieldSpec, tuple[int, ...], np.dtype[Any], bool, tuple[int, ...],
              "tuple[Any, ...] | None"]
_FACTS: dict[int, _SpecFacts] = {}


def _facts(spec: Spec) -> _SpecFacts:
    """The :class:`_SpecFacts` of ``spec`` (kept for the few specs in use)."""
    facts = _FACTS.get(id(spec))
    if facts is None or facts.spec is not spec:
        if len(_FACTS) > 64:
            _FACTS.clear()
        facts = _FACTS[id(spec)] = _SpecFacts(spec)
    return facts


def _check_rows_names(spec: Spec, values: Mapping[str, Any], call: str) -> None:
    expected = set(spec)
    got = set(values)
    missing = sorted(expected - got - {"terminated", "truncated"})
    unknown = sorted(got - expected)
    if missing or unknown:
        parts = [f"{what} {names}" for what, names in (("missing", missing),
                                                        ("unknown", unknown)) if names]
        hints = name_hints(_tops(unknown), _tops(missing) | {"terminated", "truncated"}) \
            + key_hints(unknown, missing)
        raise SpecError(
            f"{call}: wrong field set ({'; '.join(parts)}){hints}; this rows buffer "
            f"(next_obs=False) stores {sorted(expected)}; pass exactly those in every call "
            "(terminated/truncated may be left out: stored as False)"
        )


def _check_names(spec: Spec, values: Mapping[str, Any], nxt: Mapping[str, Any],
                 call: str) -> None:
    expected = set(spec)
    got = set(values)
    missing = sorted(expected - got)
    unknown = sorted(got - expected)
    obs_names = set(obs_fields(spec))
    nxt_missing = sorted(obs_names - set(nxt))
    nxt_unknown = sorted(set(nxt) - obs_names)
    if missing or unknown or nxt_missing or nxt_unknown:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        if nxt_missing:
            parts.append(f"missing next_obs for {nxt_missing}")
        if nxt_unknown:
            parts.append(f"next_obs has {nxt_unknown} which obs does not")
        # a misspelt standard field is unknown, or (first add) an inferred extra field
        wanted = _tops(missing) | ({"next_obs"} if nxt_missing else set())
        hints = name_hints(_tops(unknown) | (_tops(got) - set(STANDARD) if wanted else set()),
                           wanted) + key_hints(unknown, missing) \
            + key_hints(nxt_unknown, nxt_missing, where="next_obs: ")
        raise SpecError(
            f"{call}: wrong field set ({'; '.join(parts)}){hints}; the buffer stores "
            f"{sorted(expected)} plus next_obs; pass exactly those (extras must be present "
            "in every add once the buffer has seen them)"
        )


def _tops(names: Iterable[str]) -> set[str]:
    """The top-level names of flat field names (``obs/pos`` -> ``obs``)."""
    return {n.split(SEP, 1)[0] for n in names}


def prepare(
    spec: Spec,
    fields: Mapping[str, Any],
    leading: tuple[int, ...],
    out_leading: tuple[int, int],
    call: str = "add",
    rows: bool = False,
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, npt.NDArray[Any]]]:
    """Validate, cast and reshape one add/extend call.

    Args:
        spec: The buffer's full spec (with reward/terminated/truncated).
        fields: The user's keyword fields, next_obs included (may be nested).
        leading: The leading dims every value must have, e.g. ``()``, ``(num_envs,)``.
        out_leading: The ``(n_steps, n_lanes)`` shape to reshape the leading dims to.
        call: Name of the call for messages.
        rows: A rows buffer's call (:func:`rows_spec`): no ``next_obs``; absent
            ``terminated``/``truncated`` are stored as False.

    Returns:
        ``(values, next_obs)``: flat dicts of arrays shaped ``out_leading + field_shape``
        (``next_obs`` empty for rows).

    Raises:
        SpecError, ShapeError, DtypeError: On any bad input (nothing is written).
    """
    values, nxt = split_next(fields, rows)
    return prepare_split(spec, values, nxt, leading, out_leading, call, rows, {})


def prepare_split(spec: Spec, values: dict[str, Any], nxt: dict[str, Any],
                  leading: tuple[int, ...], out_leading: tuple[int, int], call: str,
                  rows: bool, arrays: Mapping[str, npt.NDArray[Any]],
                  ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, npt.NDArray[Any]]]:
    """:func:`prepare` of fields already split by :func:`split_next` (``values`` may get
    the absent flags of a rows call); ``arrays``: values already turned into arrays
    (``as_array``, by name), which are not converted again. Each value is cast by its
    field (:meth:`~replaybank.spec.FieldSpec.cast`: an array that already matches is
    kept as it is)."""
    facts = _facts(spec)
    if rows:
        _check_rows_names(spec, values, call)
        for flag in ("terminated", "truncated"):
            if flag not in values:
                values[flag] = np.zeros(leading, dtype=np.bool_)
    elif values.keys() != facts.names or nxt.keys() != facts.obs_names:
        _check_names(spec, values, nxt, call)
    stored, obs = facts.layout(leading, out_leading, rows)
    out_v: dict[str, npt.NDArray[Any]] = {}
    out_n: dict[str, npt.NDArray[Any]] = {}
    # a value f.cast returns as it is (an array of the stored shape and dtype; bools: 0/1
    # bytes) skips the call, the boundary's most common case (FieldSpec.cast's first step)
    for name, f, full, dt, bools, shaped, unit in stored:
        v = values[name]
        if type(v) is not np.ndarray or v.shape != full or (v.dtype is not dt and v.dtype != dt) \
                or (bools and not _canonical_bools(v)):
            v = f.cast(name, v, leading, arrays.get(name))
        out_v[name] = v.reshape(shaped) if unit is None else v[unit]
    for name, f, full, dt, bools, shaped, unit in obs:
        v = nxt[name]
        if type(v) is not np.ndarray or v.shape != full or (v.dtype is not dt and v.dtype != dt) \
                or (bools and not _canonical_bools(v)):
            v = f.cast("next_" + name, v, leading)
        out_n[name] = v.reshape(shaped) if unit is None else v[unit]
    return out_v, out_n


def leading_dims(spec: Spec, fields: Mapping[str, Any], candidates: list[tuple[int, ...]],
                 call: str, rows: bool = False) -> tuple[int, ...]:
    """Pick which of the allowed leading shapes the user's obs has (by ndim); for a rows
    buffer, its first field other than the flags (the flags when it has no other)."""
    values, _ = split_next(fields, rows)
    return leading_dims_split(spec, values, candidates, call, rows, {})


def leading_dims_split(spec: Spec, values: Mapping[str, Any],
                       candidates: list[tuple[int, ...]], call: str, rows: bool,
                       arrays: dict[str, npt.NDArray[Any]]) -> tuple[int, ...]:
    """:func:`leading_dims` of fields already split by :func:`split_next`; the value it
    reads is taken from ``arrays`` (by name) or added to it as the array it was turned
    into."""
    field = None if rows else _facts(spec).lead_field
    if field is None:
        names = [n for n in spec if n not in ("terminated", "truncated")]
        name = names[0] if names else next((n for n in spec if n in values), "terminated")
    else:
        name = field.name
    if name not in values:
        hints = name_hints(_tops(values) - _tops(spec), _tops([name])) \
            + key_hints(set(values) - set(spec), [n for n in spec if n not in values])
        raise SpecError(f"{call}: missing field {name!r}{hints}")
    arr = arrays.get(name)
    if arr is None:
        arr = arrays[name] = as_array(values[name], name)
    return (spec[name] if field is None else field).leading_of(call, values[name],
                                                               candidates, arr)
