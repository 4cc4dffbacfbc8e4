"""The n-step view: transitions whose reward is the n-step return.

Computed at sample time from stored one-step data, so ``n`` can change without
refilling. See :mod:`replaybank.ops.nstep` for the window rule.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=16, n_step=3, gamma=0.5, seed=0)
    >>> buf.extend(obs=np.arange(4, dtype=np.float32)[:, None], action=np.zeros(4),
    ...            reward=np.ones(4, np.float32),
    ...            next_obs=np.arange(1, 5, dtype=np.float32)[:, None],
    ...            terminated=np.array([False, False, False, True]), truncated=np.zeros(4, bool))
    >>> out = buf.view.gather(buf.table, np.array([0, 2]))
    >>> out["reward"].tolist(), out["discount"].tolist(), out["next_obs"][:, 0].tolist()
    ([1.75, 1.5], [0.125, 0.25], [3.0, 4.0])
    >>> out["terminated"].tolist()
    [False, True]
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError
from replaybank.ops import nstep
from replaybank.storage.table import StepTable
from replaybank.views.base import StatelessView, next_name

__all__ = ["NStepView"]

IntArray = npt.NDArray[np.int64]


class NStepView(StatelessView):
    """n-step transitions: every stored field of step ``t``, with

    * ``reward`` = ``sum_{k<L} gamma**k r[t+k]`` (the stored reward dtype),
    * ``discount`` = ``gamma ** L`` (float32 ``[B]``),
    * ``next_obs`` (every obs field), ``terminated`` and ``truncated`` of step ``t+L-1``,

    where ``L = min(n, steps up to and including the first step whose next observation
    is not the next step's observation)``. That first step is an episode end
    (terminated or truncated), a discontinuity in the data, or the lane's newest step,
    so a window never crosses an episode end or the write head, and never reads
    overwritten data. Bootstrap with ``reward + discount * (1 - terminated) * V(next_obs)``.

    Args:
        n: Steps per window (>= 1; 1 gives one-step transitions plus ``discount``).
        gamma: Discount factor in ``[0, 1]``.

    Raises:
        ConfigError: Bad ``n`` or ``gamma``.

    Example:
        >>> NStepView(3, 0.99).config()
        {'type': 'nstep', 'n': 3, 'gamma': 0.99}
    """

    every_step = True

    def __init__(self, n: int, gamma: float = 0.99) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"NStepView(n={n!r}): n must be an int >= 1")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) \
                or not 0.0 <= float(gamma) <= 1.0:
            raise ConfigError(f"NStepView(gamma={gamma!r}): gamma must be a float in [0, 1]")
        self.n = int(n)
        self.gamma = float(gamma)

    def window(self, table: StepTable, keys: IntArray) -> tuple[IntArray, IntArray]:
        """Storage slots of the window steps ``[B, n]`` and the window lengths ``[B]``."""
        wslots = table.slots_of(nstep.window_keys(keys, self.n, table.lanes))  # [B, n]
        link = table.flat(table.link)
        return wslots, nstep.window_lengths(link[wslots] > 0)

    def lengths(self, table: StepTable, keys: IntArray) -> IntArray:
        """Window length ``L`` of each key, ``[B]`` in ``[1, n]``."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.n == 1:
            return np.ones(len(keys), dtype=np.int64)
        return self.window(table, keys)[1]

    def last_keys(self, table: StepTable, keys: IntArray) -> IntArray:
        """Keys of the last window step ``t+L-1``, ``[B]`` (used by frame stacking)."""
        keys = np.asarray(keys, dtype=np.int64)
        return keys + (self.lengths(table, keys) - 1) * table.lanes

    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        """Fields of the n-step transitions starting at ``keys`` (``[B, *shape]``).

        In-memory numpy storage with a float32 or float64 scalar reward, where the C
        extension is built, finds the windows (last steps, lengths, returns) with one
        call of :func:`~replaybank.ops.nstep.nstep_windows`'s C twin and gathers the
        fields with :meth:`~replaybank.storage.table.StepTable.gather_spans`; the result
        is the same, bit for bit, as the general path below (which pure-Python installs
        take: its few numpy calls on ``[B, n]`` arrays cost less there than the numpy
        twin's)."""
        keys = np.asarray(keys, dtype=np.int64)
        reward = table.spec.get("reward")
        if table.plain_numpy and reward is not None and reward.shape == () \
                and reward.dtype in _HOST_REWARDS and nstep.nstep_kernel()[1] == "c":
            return self._gather_host(table, keys)
        wslots, length = self.window(table, keys)  # [B, n], [B]
        rows = np.arange(len(keys))
        first = wslots[:, 0]
        last = wslots[rows, length - 1]  # slots of step t+L-1
        out: dict[str, Any] = {}
        for name in table.arrays:
            if name in ("terminated", "truncated"):
                out[name] = table.take(name, last)
            elif name == "reward":
                out[name] = self._returns(table.take(name, wslots), length,
                                          table.spec["reward"].dtype)
            else:
                out[name] = table.take(name, first)
        where = table.next_index(last)
        for name in table.obs_fields:
            out[next_name(name)] = table.take_next(name, *where)
        discount = _discounts(self.n, self.gamma).take(length)
        # where the rewards live (host arrays, or tensors on the storage's device)
        out["discount"] = discount if isinstance(out["reward"], np.ndarray) \
            else _like(out["reward"], discount)
        return out

    def _gather_host(self, table: StepTable, keys: IntArray) -> dict[str, Any]:
        """:meth:`gather` of in-memory numpy storage: one pass for the windows, two
        gathers (the first steps' fields; the last steps' flags and next obs)."""
        first = table.slots_of(keys)
        b = len(first)
        last, length = np.empty(b, np.int64), np.empty(b, np.int64)
        returns = np.empty(b, table.spec["reward"].dtype)
        nstep.nstep_kernel()[0](first, table.lanes, table.flat(table.link),
                                _weights(self.n, self.gamma),
                                table.flat(table.arrays["reward"]), last, length, returns)
        out = table.gather_spans(first, last, _AT_LAST)
        out["reward"] = returns
        out["discount"] = _discounts(self.n, self.gamma).take(length)
        return out

    def _returns(self, r: Any, length: IntArray, dtype: np.dtype[Any]) -> Any:
        """n-step returns ``[B]`` from window rewards ``r`` ``[B, n]`` where ``r`` lives.

        Numpy rewards are summed on the host; device tensors are summed on their device
        (only the ``[B, n]`` weights travel), so torch storage has no host round trip.
        """
        if isinstance(r, np.ndarray):
            return nstep.discounted_returns(r, length, self.gamma).astype(dtype)
        w = _like(r, nstep.return_weights(length, self.n, self.gamma)).double()
        return (r.double() * w).sum(dim=1).to(r.dtype)

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Every live step starts a (possibly shortened) window: always None."""
        return None

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments."""
        return {"type": "nstep", "n": self.n, "gamma": self.gamma}

    def lane_spans(self) -> dict[str, int]:
        """A window reads up to ``n`` steps of its lane
        (:class:`~replaybank.views.base.LaneSpanView`)."""
        return {"n_step": self.n}


#: Reward dtypes the one-pass window kernel reads.
_HOST_REWARDS = (np.dtype(np.float32), np.dtype(np.float64))
#: The fields an n-step transition takes from its last step.
_AT_LAST = frozenset({"terminated", "truncated"})


@lru_cache(maxsize=64)
def _weights(n: int, gamma: float) -> npt.NDArray[np.float64]:
    """``gamma ** k`` for ``k < n`` (read-only, shared), as
    :func:`~replaybank.ops.nstep.discounted_returns` computes them."""
    w = nstep.return_powers(n, gamma)
    w.flags.writeable = False
    return w


@lru_cache(maxsize=64)
def _discounts(n: int, gamma: float) -> npt.NDArray[np.float32]:
    """``gamma ** L`` as float32 for every window length ``L`` in ``[0, n]``: one power per
    length instead of one per sampled item (read-only: it is shared by every call)."""
    table = (gamma ** np.arange(n + 1, dtype=np.float64)).astype(np.float32)
    table.flags.writeable = False
    return table


def _like(tensor: Any, values: npt.NDArray[Any]) -> Any:
    """``values`` as a tensor on ``tensor``'s device (torch storage imported torch already:
    it is taken from ``sys.modules``, so this module imports no torch)."""
    return sys.modules["torch"].as_tensor(values, device=tensor.device)
