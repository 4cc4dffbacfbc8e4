"""Whole-state bitwise twins under the public writer switch ``REPLAYBANK_WRITER``.

A buffer under test and its twin are built the same way; each runs its construction and
every ``add`` / ``extend`` / ``clear`` / ``load_state_dict`` under its own writer (e.g.
``auto`` and ``reference``, the validating general path and the reference writer, the
oracle). After the same calls, their states must be equal byte for byte.

Other test files import it: ``from tests.twins import Under, twins, same_state``.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> fast, ref = twins("auto", lambda: rb.ReplayBuffer(capacity=4, seed=0))
    >>> for b in (fast, ref):
    ...     b.add(obs=np.zeros(2, np.float32), action=0, reward=1.0,
    ...           next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    >>> same_state(fast, ref); same_everything(fast, ref); len(fast.buf), ref.writer
    (1, 'reference')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import replaybank as rb

__all__ = ["Under", "same_everything", "same_sampler", "same_state", "snapshot", "twins",
           "under_writer"]


@contextmanager
def under_writer(name: str) -> Iterator[None]:
    """Run the block with ``REPLAYBANK_WRITER=name`` (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPLAYBANK_WRITER", name)
        yield


class Under:
    """A buffer whose construction and every ``add`` / ``extend`` / ``clear`` /
    ``load_state_dict`` run under ``REPLAYBANK_WRITER=writer``; everything else is the
    buffer's own. (A buffer reads the switch when it builds its write plan; under
    ``reference`` no plan is kept, so the switch is read again at each call.)"""

    def __init__(self, writer: str, make: Callable[[], rb.ReplayBuffer]) -> None:
        self.writer = writer
        with under_writer(writer):
            self.buf = make()

    @classmethod
    def of(cls, writer: str, buf: Any) -> Under:
        """An existing buffer (e.g. unpickled) driven under ``writer`` from now on."""
        out = cls.__new__(cls)
        out.writer, out.buf = writer, buf
        return out

    def add(self, **kw: Any) -> None:
        with under_writer(self.writer):
            self.buf.add(**kw)

    def extend(self, **kw: Any) -> None:
        with under_writer(self.writer):
            self.buf.extend(**kw)

    def clear(self) -> None:
        with under_writer(self.writer):
            self.buf.clear()

    def load_state_dict(self, state: Any) -> None:
        with under_writer(self.writer):
            self.buf.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.buf, name)


def twins(kernel: str, make: Callable[[], rb.ReplayBuffer]) -> tuple[Under, Under]:
    """The buffer under test (writer ``kernel``) and its reference twin."""
    return Under(kernel, make), Under("reference", make)


def same_state(a: Any, b: Any) -> None:
    """The two buffers' metadata and table state (data, links, side store, free-slot
    order, counters) are equal, arrays byte for byte."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["metadata"] == sb["metadata"]
    ta, tb = sa["table"], sb["table"]
    assert ta.keys() == tb.keys()
    for k in ta:
        a, b = np.asarray(ta[k]), np.asarray(tb[k])
        assert a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes(), k


def same_sampler(a: Any, b: Any) -> None:
    """The two buffers' samplers hold equal state."""
    sa, sb = a.sampler.state_dict(), b.sampler.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])), k


def _frozen(value: Any) -> Any:
    """A deep copy of a state tree: arrays as ``(shape, dtype.str, bytes)``."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if t is dict or isinstance(value, Mapping):
        return {k: _frozen(v) for k, v in value.items()}
    if t is list or t is tuple:
        return t(_frozen(v) for v in value)
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        arr = np.asarray(value)
        return ("array", arr.shape, arr.dtype.str, arr.tobytes())
    return value


def snapshot(buf: Any) -> dict[str, Any]:
    """Everything a buffer's ``state_dict`` holds (table bytes, counters, sampler, view,
    generator), as a deep copy that later writes cannot change; ``init`` (constructor
    arguments, e.g. a memmap path) is left out."""
    state = dict(buf.state_dict())
    state.pop("init", None)
    return _frozen(state)  # type: ignore[no-any-return]


def same_everything(a: Any, b: Any) -> None:
    """Two buffers hold the same whole state (:func:`snapshot`: table, sampler, view,
    generator and metadata), arrays byte for byte; the first difference is named."""
    sa, sb = snapshot(a), snapshot(b)
    _same_tree(sa, sb, "")


def _same_tree(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            _same_tree(a[k], b[k], f"{where}/{k}")
        return
    assert a == b, where
