"""Emphasizing recent experience (ERE, Wang & Ross 2019), optionally prioritized.

For update ``k`` of ``K`` updates after an episode (``k`` counted from 0), draw from the
``c_k = max(floor(N * eta ** (k * 1000 / K)), c_min)`` most recent steps (capped at the
``N`` live steps). Callers say which update this is through the buffer's sample
kwargs: ``buf.sample(B, update=k, num_updates=K)``; without them ``k = 0`` and the
window is the whole buffer.

With several lanes each lane contributes its newest ``ceil(counts[l] * c_k / N)``
steps (the same fraction of every lane; for synchronous vector envs that is exactly the
most recent rows of all lanes).

Combined with PER (``RecentSampler(prioritized=PrioritizedSampler(...))``) the draw is
proportional to priority *within* the window, ``P(i) = p_i / sum_window p``, and the IS
weights use the window's size ``N_w`` and (``weight_norm="buffer"``) the window's
smallest priority. The sampler then also takes priority updates.

Adaptive eta (:meth:`RecentSampler.update_eta`): the rule is documented there.

Behind a view that rejects some steps (frame stacks) the rejected keys are redrawn, so
the draw follows the law above conditioned on servable steps; when redraw rounds do not
finish, the batch is finished exactly from that law among the servable steps of the
window (:class:`~replaybank.samplers.base.SubsetDraws`: :meth:`RecentSampler.key_weights`,
:meth:`RecentSampler.sample_among`), with the probabilities and weights ``sample`` gives
those keys. The prioritized sampler's beta schedule is the buffer's for every draw of one
call (:class:`~replaybank.samplers.base.InnerSchedule`: beta resolved once, the call counted
once, whatever the redraw rounds), and ``weight_norm="batch"`` weights are computed over the
rows returned (:meth:`RecentSampler.batch_weights`).

Example:
    >>> import numpy as np
    >>> from replaybank.samplers.base import LaneView
    >>> s = RecentSampler(eta=0.9, c_min=10)
    >>> s.window_size(n_items=1000, update=5, num_updates=10)  # 1000 * 0.9 ** 500 < c_min
    10
    >>> lv = LaneView(T=1000, lanes=1, written=np.array([1000]), counts=np.array([1000]))
    >>> keys = s.sample(64, lv, np.random.default_rng(0), update=5, num_updates=10).keys
    >>> int(keys.min()) >= 990
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError, EmptyBufferError, describe
from replaybank.ops import ring
from replaybank.ops.draws import uniform_ints
from replaybank.samplers.base import FloatArray, IntArray, LaneView, SampleResult
from replaybank.samplers.prioritized import PrioritizedSampler, is_weights
from replaybank.samplers.sample_args import check_batch_size

__all__ = ["RecentSampler", "window_counts"]


def window_counts(counts: IntArray, c: int) -> IntArray:
    """Per-lane window sizes: ``ceil(counts[l] * c / N)`` (``N = counts.sum()``), ``[lanes]``.

    Example:
        >>> window_counts(np.array([100, 100]), 50).tolist()
        [25, 25]
    """
    counts = np.array(counts, dtype=np.int64)
    n = int(counts.sum())
    if n == 0 or c >= n:
        return counts
    return np.asarray(np.minimum(counts, -(-(counts * c) // n)), dtype=np.int64)


def _returns_of(info: Any) -> list[float]:
    """Episode returns in ``info``: a number, a list, or a dict with ``episode_returns``,
    ``episode_return`` or ``episode: {"r": ...}`` (gymnasium's RecordEpisodeStatistics)."""
    if isinstance(info, dict):
        for key in ("episode_returns", "episode_return", "return"):
            if key in info:
                return _returns_of(info[key])
        if "episode" in info and isinstance(info["episode"], dict) and "r" in info["episode"]:
            r = np.asarray(info["episode"]["r"], dtype=np.float64).reshape(-1)
            mask = np.asarray(info.get("_episode", np.ones(len(r), bool))).reshape(-1)
            return [float(x) for x in r[mask.astype(bool)]] if len(mask) == len(r) \
                else [float(x) for x in r]
        return []
    arr = np.asarray(info, dtype=np.float64).reshape(-1)
    return [float(x) for x in arr if np.isfinite(x)]


class RecentSampler:
    """ERE: uniform (or prioritized) draws among the most recent ``c_k`` steps.

    Args:
        eta: Emphasis in ``(0, 1]`` (1 = uniform over the buffer); the starting value
            when ``adaptive``.
        c_min: Smallest window.
        prioritized: A :class:`PrioritizedSampler` to draw within the window by priority.
        adaptive: Let :meth:`update_eta` move eta with learning progress.
        eta_min: Strongest emphasis adaptive eta may reach (default: ``eta``).
        history: Episode returns kept for the adaptive rule.

    Raises:
        ConfigError: An argument is out of range.

    Example:
        >>> s = RecentSampler(prioritized=PrioritizedSampler())
        >>> from replaybank.samplers.base import PrioritySampler
        >>> isinstance(s, PrioritySampler), isinstance(RecentSampler(), PrioritySampler)
        (True, False)
    """

    update: Callable[[IntArray, FloatArray], None]
    update_keys: Callable[[IntArray, FloatArray, LaneView], int]

    def __init__(
        self,
        eta: float = 0.996,
        c_min: int = 5000,
        prioritized: PrioritizedSampler | None = None,
        adaptive: bool = False,
        eta_min: float | None = None,
        history: int = 20,
    ) -> None:
        def eta_ok(name: str, v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) \
                    or not 0.0 < float(v) <= 1.0:
                raise ConfigError(f"RecentSampler({name}={v!r}): must be a float in (0, 1]")
            return float(v)

        self.eta0 = eta_ok("eta", eta)
        self.eta = self.eta0
        self.eta_min = self.eta0 if eta_min is None else eta_ok("eta_min", eta_min)
        if isinstance(c_min, bool) or not isinstance(c_min, (int, np.integer)) or c_min < 1:
            raise ConfigError(f"RecentSampler(c_min={c_min!r}): must be an int >= 1")
        if isinstance(history, bool) or not isinstance(history, (int, np.integer)) \
                or history < 4:
            raise ConfigError(f"RecentSampler(history={history!r}): must be an int >= 4")
        if not isinstance(adaptive, (bool, np.bool_)):
            raise ConfigError(f"RecentSampler(adaptive={adaptive!r}): must be a bool (True: "
                              "adapt eta to the recent returns)")
        if prioritized is not None and not isinstance(prioritized, PrioritizedSampler):
            raise ConfigError(
                f"RecentSampler(prioritized={describe(prioritized)}): expected a "
                "PrioritizedSampler or None; pass prioritized=PrioritizedSampler(alpha=0.6) "
                "(in a config: prioritized: {type: prioritized, alpha: 0.6})"
            )
        self.c_min = int(c_min)
        self.prioritized = prioritized
        self.adaptive = bool(adaptive)
        self.history = int(history)
        self.returns: list[float] = []
        self._rows = 0
        self._lanes = 1
        if prioritized is not None:
            # an instance attribute, so only a prioritized ERE is a PrioritySampler
            self.update = prioritized.update
            self.update_keys = prioritized.update_keys

    @property
    def priority_limit(self) -> float:
        """The prioritized sampler's largest raw priority (inf without one)."""
        return math.inf if self.prioritized is None else self.prioritized.priority_limit

    @property
    def schedule(self) -> PrioritizedSampler | None:
        """The prioritized sampler whose beta schedule the draws follow (each draw is one
        of its calls), or None without one."""
        return self.prioritized

    def batch_weights(self, res: SampleResult, lanes: LaneView, beta: float | None = None,
                      **kwargs: Any) -> SampleResult:
        """``res`` weighed as one batch (:meth:`PrioritizedSampler.batch_weights`: with
        ``weight_norm="batch"`` the weights divided by the largest of ``res``, whose rows
        may come from several draws); ``res`` itself without a prioritized sampler."""
        per = self.prioritized
        return res if per is None else per.batch_weights(res, lanes, beta)

    # ------------------------------------------------------------------ protocol
    def bind(self, T: int, lanes: int) -> None:  # noqa: N803
        """Remember the table shape; bind the prioritized sampler."""
        self._rows, self._lanes = int(T), int(lanes)
        if self.prioritized is not None:
            self.prioritized.bind(T, lanes)

    def drawable(self) -> npt.NDArray[np.bool_] | None:
        """The prioritized sampler's drawable slots (None without one: the recent window
        holds live steps only)."""
        return None if self.prioritized is None else self.prioritized.drawable()

    def on_write(self, slots: IntArray, priorities: FloatArray | None = None) -> None:
        """Forward writes to the prioritized sampler."""
        if self.prioritized is not None:
            self.prioritized.on_write(slots, priorities)

    def on_write_range(self, lo: int, hi: int) -> None:
        """``on_write(np.arange(lo, hi))``: forwarded to the prioritized sampler."""
        if self.prioritized is not None:
            self.prioritized.on_write_range(lo, hi)

    def on_clear(self) -> None:
        """Forward to the prioritized sampler."""
        if self.prioritized is not None:
            self.prioritized.on_clear()

    def window_size(self, n_items: int, update: int = 0, num_updates: int = 1) -> int:
        """``c_k = min(N, max(floor(N * eta ** (k * 1000 / K)), c_min))``.

        Raises:
            ConfigError: ``update``/``num_updates`` out of range.
        """
        for name, v, lo in (("update", update, 0), ("num_updates", num_updates, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ConfigError(f"sample({name}={v!r}): must be an int >= {lo}")
        if update >= num_updates:
            raise ConfigError(
                f"sample(update={update}, num_updates={num_updates}): update counts from 0 "
                "and must be < num_updates"
            )
        c = int(np.floor(n_items * self.eta ** (update * 1000.0 / num_updates)))
        return int(min(n_items, max(c, self.c_min)))

    def sample(
        self,
        batch_size: int,
        lanes: LaneView,
        rng: np.random.Generator,
        update: int = 0,
        num_updates: int = 1,
        replace: bool = True,
        beta: float | None = None,
        **kwargs: Any,
    ) -> SampleResult:
        """Draw among the newest ``c_k`` steps (``update=k`` of ``num_updates=K``).

        Raises:
            ConfigError: Bad ``batch_size``, ``update``/``num_updates`` or ``beta``
                (without a prioritized sampler ``beta`` is ignored here, and a buffer's
                ``sample`` refuses it).
            EmptyBufferError: Empty buffer, ``replace=False`` with a batch larger than the
                window, or a zero-priority window.

        Every check comes before the generator is read and the beta schedule advances.
        """
        batch_size = check_batch_size(batch_size, lanes.size, replace)
        replace = bool(replace)
        c = self.window_size(lanes.size, update, num_updates)
        wc = window_counts(lanes.counts, c)  # [lanes]
        n_w = int(wc.sum())
        check_batch_size(batch_size, n_w, replace)
        if self.prioritized is None:
            if replace:
                flat = rng.integers(0, n_w, size=batch_size, dtype=np.int64)
            else:
                flat = rng.choice(n_w, size=batch_size, replace=False).astype(np.int64)
            return SampleResult(ring.uniform_keys(flat, lanes.written, wc))
        if not replace:
            raise ConfigError(
                "sample(replace=False): prioritized ERE draws with replacement only; "
                "use replace=True"
            )
        return self._prioritized(batch_size, lanes, rng, wc, n_w, beta)

    def _per(self) -> PrioritizedSampler:
        if self.prioritized is None:
            raise ConfigError("RecentSampler: no prioritized sampler configured")
        return self.prioritized

    def _ranges(self, lanes: LaneView, wc: IntArray) -> list[tuple[int, int]] | None:
        """The window as at most two contiguous slot ranges, when the lanes are in step."""
        w = lanes.written
        if not (np.all(w == w[0]) and np.all(wc == wc[0])):
            return None
        rows, nl = lanes.T, lanes.lanes
        r0 = int((w[0] - wc[0]) % rows)
        r1 = r0 + int(wc[0])
        if r1 <= rows:
            return [(r0 * nl, r1 * nl)]
        return [(r0 * nl, rows * nl), (0, (r1 - rows) * nl)]

    def _prioritized(self, batch_size: int, lanes: LaneView, rng: np.random.Generator,
                     wc: IntArray, n_w: int, beta: float | None) -> SampleResult:
        per = self._per()
        b = per.resolve_beta(beta)  # checked; the schedule advances once all checks passed
        ranges = self._ranges(lanes, wc)
        if ranges is not None:
            masses = [per.range_sum(a, e) for a, e in ranges]
            mass = float(sum(masses))
        else:
            cand = self._window_slots(lanes, wc)
            pc = per.priorities(cand)
            cum = np.cumsum(pc)
            mass = float(cum[-1])
        if not mass > 0.0:
            raise EmptyBufferError(
                "sample: every priority in the recent window is 0; update priorities with "
                "positive values or use eps > 0"
            )
        per.calls += 1
        u = (np.arange(batch_size) + rng.random(batch_size)) / batch_size  # [B] in [0, 1)
        if ranges is not None:
            starts = [per.range_sum(0, a) for a, _ in ranges]
            p_min = min(per.range_min(a, e) for a, e in ranges)
            slots = self._draw_ranges(u * mass, ranges, masses, starts)
            p = per.priorities(slots)
        else:
            p_min = float(pc[pc > 0].min())
            pos = np.searchsorted(cum, u * mass, side="right")
            pos = np.minimum(pos, len(cum) - 1)
            # never return a zero-priority step: step back to the last positive one
            nzpos = np.flatnonzero(pc > 0)
            bad = pc[pos] <= 0
            if np.any(bad):
                pos[bad] = nzpos[np.maximum(np.searchsorted(nzpos, pos[bad]) - 1, 0)]
            slots = cand[pos]
            p = pc[pos]
        w = is_weights(p, p_min, b, per.weight_norm, n_w, mass)
        keys = ring.slot_to_key(slots, lanes.written, lanes.counts, lanes.T)
        return SampleResult(keys, p / mass, w)

    @staticmethod
    def _window_slots(lanes: LaneView, wc: IntArray) -> IntArray:
        """The slots of the window, lane by lane, oldest first ``[n_w]``."""
        seq = [np.arange(int(wr - k), int(wr), dtype=np.int64)
               for wr, k in zip(lanes.written, wc, strict=True)]
        lane_of = np.concatenate([np.full(len(s), i) for i, s in enumerate(seq)])
        return ring.seq_to_slot(np.concatenate(seq), lane_of, lanes.T, lanes.lanes)

    def _window_mass(self, lanes: LaneView, wc: IntArray) -> tuple[float, float]:
        """The window's total priority and smallest priority for the weights, computed
        as :meth:`_prioritized` computes them (the window holds a positive priority)."""
        per = self._per()
        ranges = self._ranges(lanes, wc)
        if ranges is not None:
            return float(sum([per.range_sum(a, e) for a, e in ranges])), \
                min(per.range_min(a, e) for a, e in ranges)
        pc = per.priorities(self._window_slots(lanes, wc))
        return float(np.cumsum(pc)[-1]), float(pc[pc > 0].min())

    # ------------------------------------------------------------------ among given keys
    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """Each live key's weight in the law of :meth:`sample` with its default options
        (the window is then the whole buffer): 1 each, or the stored priority with a
        prioritized sampler ``[n]``. The window of other ``update``/``num_updates``
        options is applied by :meth:`sample_among`, which takes them.

        Example:
            >>> lv = LaneView(T=8, lanes=1, written=np.array([8]), counts=np.array([8]))
            >>> RecentSampler(c_min=2).key_weights(np.array([3, 7]), lv).tolist()
            [1.0, 1.0]
        """
        if self.prioritized is None:
            return np.ones(len(keys), np.float64)
        return self.prioritized.key_weights(keys, lanes)

    def sample_among(self, keys: IntArray, batch_size: int, lanes: LaneView,
                     rng: np.random.Generator, update: int = 0, num_updates: int = 1,
                     replace: bool = False, beta: float | None = None,
                     **kwargs: Any) -> SampleResult:
        """Keys among the distinct live ``keys`` from the law of :meth:`sample` (the
        window of ``update``/``num_updates``) restricted to them: with ``replace=True``
        ``batch_size`` keys i.i.d. (uniform over the keys in the window, or in proportion
        to priority there, with the ``P(i) = p_i / sum_window p`` and weights
        :meth:`sample` gives them); without, ``batch_size`` distinct keys of the window, a
        uniformly random ordered subset (successive uniform draws). The prioritized
        sampler's beta schedule is not advanced.

        Args:
            keys: Distinct live keys ``[n]`` to draw among.
            batch_size: B.
            lanes: Lane bookkeeping of the table.
            rng: Generator.
            update: ``k`` (see :meth:`window_size`).
            num_updates: ``K``.
            replace: Draw independently (True) or distinct keys (False).
            beta: IS exponent of a prioritized sampler (None: its schedule's).
            **kwargs: Ignored (the sample call's other options).

        Returns:
            The keys ``[B]`` in draw order (prioritized: with ``P(i)`` and weights).

        Raises:
            ConfigError: Bad ``update``/``num_updates`` or ``beta``, or ``replace=False``
                with a prioritized sampler (it draws with replacement only, as
                :meth:`sample`).
            EmptyBufferError: Fewer than ``batch_size`` of ``keys`` lie in the window
                (``replace=True``: none; prioritized: none with a positive priority);
                nothing is drawn.

        Example:
            >>> lv = LaneView(T=8, lanes=1, written=np.array([8]), counts=np.array([8]))
            >>> s = RecentSampler(eta=0.5, c_min=4)  # update 1 of 2: the newest 4 steps
            >>> res = s.sample_among(np.array([1, 5, 6]), 2, lv, np.random.default_rng(0),
            ...                      update=1, num_updates=2)
            >>> sorted(res.keys.tolist())
            [5, 6]
        """
        c = self.window_size(lanes.size, update, num_updates)
        per = self.prioritized
        if per is not None and not replace:
            raise ConfigError("sample(replace=False): prioritized ERE draws with replacement "
                              "only; use replace=True")
        b = None if per is None else per.resolve_beta(beta)
        keys = np.asarray(keys, np.int64)
        wc = window_counts(lanes.counts, c)  # [lanes]
        lane = keys % lanes.lanes
        among = keys[keys // lanes.lanes >= lanes.written[lane] - wc[lane]]  # in the window
        p = None if per is None else per.key_weights(among, lanes)
        n = len(among) if p is None else int(np.count_nonzero(p > 0))
        if n < (batch_size if not replace else 1):
            what = " with a positive priority" if per is not None else ""
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}{'' if replace else ', replace=False'}, "
                f"update={update}, num_updates={num_updates}): {n} of the {len(keys)} keys "
                f"to draw among lie in the window of the newest {int(wc.sum())} steps"
                f"{what}; " + ("lower batch_size or use replace=True, " if n else "") +
                "use an earlier update, or add more data")
        if p is None:
            if replace:
                return SampleResult(among[uniform_ints(rng, n, batch_size)])
            return SampleResult(among[rng.choice(n, size=batch_size, replace=False)])
        assert per is not None and b is not None  # (p is the prioritized sampler's)
        nz = np.flatnonzero(p > 0)
        cum = np.cumsum(p[nz])
        at = np.searchsorted(cum, rng.random(batch_size) * cum[-1], side="right")  # [B]
        pick = nz[np.minimum(at, len(nz) - 1)]
        mass, p_min = self._window_mass(lanes, wc)
        w = is_weights(p[pick], p_min, b, per.weight_norm, int(wc.sum()), mass)
        return SampleResult(among[pick], p[pick] / mass, w)

    def _draw_ranges(self, targets: FloatArray, ranges: list[tuple[int, int]],
                     masses: list[float], starts: list[float]) -> IntArray:
        """Slots at window-relative prefix masses, clamped into the ranges."""
        per = self._per()
        out = np.zeros(len(targets), dtype=np.int64)
        keep = [i for i, m in enumerate(masses) if m > 0.0]
        lo = 0.0
        for i in keep:
            (a, e), m, s0 = ranges[i], masses[i], starts[i]
            last = i == keep[-1]
            sel = (targets >= lo) & ((targets < lo + m) | last)
            if np.any(sel):
                t = np.minimum(targets[sel] - lo, np.nextafter(m, 0.0))
                slots = per.find(s0 + t)
                # round-off at the range edges: clamp to the range's positive slots
                off = (slots < a) | (slots >= e)
                if np.any(off):
                    slots[off] = self._edge_slot(slots[off], a, e)
                out[sel] = slots
            lo += m
        return out

    def _edge_slot(self, slots: IntArray, a: int, e: int) -> IntArray:
        per = self._per()
        pr = per.priorities(np.arange(a, e))
        nz = np.flatnonzero(pr > 0) + a
        return np.asarray(np.where(slots < a, nz[0], nz[-1]), dtype=np.int64)

    # ------------------------------------------------------------------ adaptive eta
    def update_eta(self, info: Any) -> float:
        """Move eta with learning progress; returns the new eta.

        Rule: keep the last ``history`` episode returns found in ``info`` (a number, a
        list, or a dict with ``episode_returns`` / ``episode: {"r": ...}``). With at
        least 4 of them, fit a least-squares line ``R ~ a + s * i`` over their index and
        measure progress as the rise over the window in standard deviations,
        ``z = s * (h - 1) / (std(R) + 1e-8)``. Map ``z`` clipped to ``[0, 1]`` to
        ``eta = 1 - (1 - eta_min) * z``: fast improvement emphasises recent data
        (``eta -> eta_min``); a plateau or decline samples uniformly (``eta -> 1``), as the
        paper anneals eta towards 1 when learning slows. Without ``adaptive`` it only
        records the returns.

        Example:
            >>> s = RecentSampler(eta=0.99, adaptive=True)
            >>> s.update_eta([1.0, 2.0, 3.0, 4.0, 5.0])
            0.99
            >>> s.update_eta({"episode_returns": [5.0, 5.0, 5.0, 5.0, 5.0] * 4})
            1.0
        """
        self.returns = (self.returns + _returns_of(info))[-self.history:]
        if not self.adaptive or len(self.returns) < 4:
            return self.eta
        r = np.asarray(self.returns, dtype=np.float64)
        i = np.arange(len(r), dtype=np.float64)
        slope = float(np.polyfit(i, r, 1)[0])
        z = float(np.clip(slope * (len(r) - 1) / (r.std() + 1e-8), 0.0, 1.0))
        self.eta = float(1.0 - (1.0 - self.eta_min) * z)
        return self.eta

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``eta``, recent ``returns`` and the prioritized sampler's state."""
        state: dict[str, Any] = {
            "eta": self.eta, "returns": np.asarray(self.returns, dtype=np.float64),
        }
        if self.prioritized is not None:
            state["prioritized"] = self.prioritized.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (everything is checked before anything changes).

        Raises:
            CheckpointError: ``eta`` outside ``(0, 1]``, ``returns`` not finite numbers
                ``[k]``, or the prioritized sampler's state does not fit it.
        """
        where = "RecentSampler.load_state_dict"
        damaged = "the sampler state is damaged, restore it from a checkpoint"
        if not isinstance(state, dict) or "eta" not in state or "returns" not in state:
            raise CheckpointError(f"{where}: state {describe(state)} lacks eta or returns; "
                                  "pass a RecentSampler.state_dict()")
        try:
            eta = float(state["eta"])
            returns = np.asarray(state["returns"], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: eta or returns are not numbers ({exc}); "
                                  f"{damaged}") from exc
        if not 0.0 < eta <= 1.0:
            raise CheckpointError(f"{where}: eta = {eta}; must be in (0, 1]: {damaged}")
        if returns.ndim != 1:
            raise CheckpointError(f"{where}: returns have shape {returns.shape}, expected "
                                  f"[k]: {damaged}")
        bad = np.flatnonzero(~np.isfinite(returns))
        if len(bad):
            raise CheckpointError(f"{where}: returns[{bad[0]}] = {returns[bad[0]]}; episode "
                                  f"returns must be finite: {damaged}")
        if self.prioritized is not None and state.get("prioritized") is not None:
            self.prioritized.load_state_dict(state["prioritized"])  # checked before it changes
        self.eta = eta
        self.returns = [float(x) for x in returns]

    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able) with ``"type": "recent"``."""
        return {
            "type": "recent", "eta": self.eta0, "c_min": self.c_min, "adaptive": self.adaptive,
            "eta_min": self.eta_min, "history": self.history,
            "prioritized": None if self.prioritized is None else self.prioritized.config(),
        }
