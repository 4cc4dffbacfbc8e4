"""Where a call's values are: the observation fields of a dict observation, and the fields
of a rows table, found in the plain dicts a user passes.

Example:
    >>> import numpy as np
    >>> lay = ObsLayout(["obs/pos", "obs/vel"])
    >>> [x.tolist() for x in lay.parts({"vel": np.ones(2), "pos": np.zeros(2)})]
    [[0.0, 0.0], [1.0, 1.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.spec import UNSET

__all__ = ["ObsLayout", "RowsLayout"]

ND = np.ndarray


class ObsLayout:
    """Where a table's observation fields come from in a call's ``obs`` / ``next_obs``.

    A flat observation (the one field ``obs``) is the value itself; the fields
    ``obs/<key>[/<key>...]`` of a dict observation are found in nested plain dicts whose
    keys are exactly the table's (a missing or extra key, or a dict subclass or another
    mapping, is not for the compiled writer: the Python boundary takes the call).

    Args:
        obs_fields: The table's observation field names (``obs`` or ``obs/...``).

    Attributes:
        names: The observation field names, in table order.
        flat: The observation is the one field ``obs``.
        keys: The dict keys of a one-level dict observation (``obs/<key>`` fields, in
            table order), else None.
        valid: The names form a tree of dicts (else the compiled writer does not serve it).

    Example:
        >>> lay = ObsLayout(["obs/pos", "obs/goal/xy"])
        >>> a, b = np.zeros(2), np.ones(2)
        >>> [x.tolist() for x in lay.parts({"goal": {"xy": b}, "pos": a})]
        [[0.0, 0.0], [1.0, 1.0]]
        >>> lay.parts({"goal": {"xy": b}, "pos": a, "x": a}) is None, lay.keys
        (True, None)
    """

    __slots__ = ("flat", "keys", "names", "tree", "valid")

    def __init__(self, obs_fields: list[str]) -> None:
        self.names = tuple(obs_fields)
        self.flat = self.names == ("obs",)
        tree: dict[str, Any] = {}
        valid = bool(self.names) and not self.flat
        for i, name in enumerate(self.names if valid else ()):
            path = name.split("/")
            if path[0] != "obs" or len(path) < 2:
                valid = False
                break
            node = tree
            for key in path[1:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    valid = False
                    break
            if not valid or path[-1] in node:
                valid = False
                break
            node[path[-1]] = i
        self.valid = self.flat or valid
        self.tree = tree
        self.keys = tuple(tree) if valid and all(type(v) is int for v in tree.values()) \
            else None

    def parts(self, obs: Any) -> list[Any] | None:
        """The values of the observation fields in table order (not yet checked), or None
        when ``obs`` is not a tree of plain dicts with exactly the table's keys."""
        if self.flat:
            return [obs]
        keys = self.keys
        if keys is not None:  # one level: exactly the keys when as many and all found
            if type(obs) is not dict or len(obs) != len(keys):
                return None
            try:
                return list(map(obs.__getitem__, keys))
            except KeyError:
                return None
        out: list[Any] = [None] * len(self.names)
        return out if _walk(obs, self.tree, out) else None


#: The call arguments an ``add`` / ``extend`` names (the rest arrive as ``extras``).
NAMED = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
#: Fields a rows call may leave out (stored as False).
FLAGS = ("terminated", "truncated")


class RowsLayout:
    """Where a rows table's fields come from in a call (``ReplayBuffer(next_obs=False)``).

    Every stored field is an ordinary one: ``obs``, ``action``, ``reward`` and
    ``next_obs`` (when stored) are the named arguments, the flags ``terminated`` and
    ``truncated`` may be left out (stored as False), and any other top-level name is an
    extra; nested names (``a/b``) are found in plain dicts whose keys are exactly the
    table's. The compiled writer takes the values in its own field order
    (:attr:`order`): a field whose values show the leading dims first (one with a
    per-step shape when there is one), then two more fields, the flags, and the rest.

    Args:
        names: The table's field names, in table order (the flags among them).
        ndim: Each field's per-step ndim (``len(shape)``).

    Attributes:
        order: The field names in the compiled writer's order, or None when the table
            has fewer than three fields besides the flags (the Python paths serve it).

    Example:
        >>> lay = RowsLayout(["x", "r", "w/a", "w/b", "terminated", "truncated"],
        ...                  {"x": 1, "r": 0, "w/a": 0, "w/b": 0, "terminated": 0,
        ...                   "truncated": 0})
        >>> lay.order
        ('x', 'r', 'w/a', 'terminated', 'truncated', 'w/b')
        >>> none = (UNSET_,) * 6  # no named argument (obs, action, ...) given
        >>> v = lay.values(none, {"x": np.zeros((2, 3)), "r": np.ones(2),
        ...                       "w": {"a": 1, "b": 2}})
        >>> [type(x).__name__ for x in v], v[3].shape  # the flags: False [2]
        (['ndarray', 'ndarray', 'int', 'ndarray', 'ndarray', 'int'], (2,))
        >>> lay.values(none, {"x": np.zeros((2, 3)), "r": np.ones(2)}) is None  # no w
        True
    """

    __slots__ = ("_extra_tree", "_f0_ndim", "_named", "_unstored", "_zeros", "order")

    def __init__(self, names: list[str], ndim: dict[str, int]) -> None:
        others = [n for n in names if n not in FLAGS]
        self.order: tuple[str, ...] | None = None
        self._named: tuple[tuple[int, Any], ...] = ()
        self._unstored: tuple[int, ...] = ()
        self._extra_tree: dict[str, Any] = {}
        self._f0_ndim = 0
        self._zeros: dict[tuple[int, ...], Any] = {}
        if len(others) < 3 or not all(f in names for f in FLAGS):
            return
        first = next((n for n in others if ndim[n] > 0), others[0])
        rest = [n for n in others if n != first]
        order = (first, *rest[:2], *FLAGS, *rest[2:])
        tree: dict[str, Any] = {}
        for i, name in enumerate(order):
            path = name.split("/")
            node = tree
            for key in path[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    return  # "a" and "a/b" both stored: not a tree of dicts
            if path[-1] in node:
                return
            node[path[-1]] = i
        # a named argument's place: its field index, or its subtree of a dict value
        self._named = tuple((NAMED.index(k), v) for k, v in tree.items() if k in NAMED)
        # the named arguments the table does not store: a call must leave them out
        self._unstored = tuple(i for i, k in enumerate(NAMED) if k not in tree)
        self._extra_tree = {k: v for k, v in tree.items() if k not in NAMED}
        self._f0_ndim = ndim[first]
        self.order = order

    def values(self, named: tuple[Any, ...], extras: dict[str, Any]) -> tuple[Any, ...] | None:
        """The values of a call in :attr:`order` (not yet checked), or None when the call
        is not for the compiled writer (a missing or unknown field or key, a dict subclass,
        a left-out flag whose leading dims the first field does not show).

        Args:
            named: The call's ``(obs, action, reward, next_obs, terminated, truncated)``
                (``UNSET`` where not given).
            extras: The call's other keyword fields.
        """
        order = self.order
        if order is None:
            return None
        for i in self._unstored:
            if named[i] is not UNSET_:
                return None
        out: list[Any] = [UNSET_] * len(order)
        for i, sub in self._named:
            v = named[i]
            if v is UNSET_:
                continue
            if type(sub) is int:
                out[sub] = v
            elif not _walk(v, sub, out):
                return None
        if not _walk(extras, self._extra_tree, out):
            return None
        if out[3] is UNSET_ or out[4] is UNSET_:  # a flag left out: False, of the lead
            v0 = out[0]
            if type(v0) is not ND or v0.ndim < self._f0_ndim:
                return None
            lead = v0.shape[:v0.ndim - self._f0_ndim]
            z = self._zeros.get(lead)
            if z is None:
                z = False if lead == () else np.zeros(lead, np.bool_)
                if len(self._zeros) > 16:
                    self._zeros.clear()
                self._zeros[lead] = z
            for k in (3, 4):
                if out[k] is UNSET_:
                    out[k] = z
        for x in out:  # a stored field the call left out (not a flag)
            if x is UNSET_:
                return None
        return tuple(out)


def _walk(v: Any, tree: dict[str, Any], out: list[Any]) -> bool:
    if type(v) is not dict or len(v) != len(tree):
        return False
    for key, sub in tree.items():
        x = v.get(key, _MISSING)
        if x is _MISSING:
            return False
        if type(sub) is int:
            out[sub] = x
        elif not _walk(x, sub, out):
            return False
    return True


_MISSING = object()
UNSET_: Any = UNSET
