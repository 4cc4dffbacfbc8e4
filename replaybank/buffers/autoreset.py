"""Steps that a NEXT_STEP-autoreset vector env makes look like transitions.

gymnasium's vector envs reset a finished sub-env on the *next* ``step()`` by default
(``AutoresetMode.NEXT_STEP``): that call ignores the action and returns the reset
observation with reward 0 and no episode end. A hand-written loop that adds every step of
every env therefore stores one false transition per episode: from the final observation
(the previous step's ``next_obs``) to the next episode's reset observation.

The step table can see such a step: its lane's previous step ended the episode (so its
``next_obs`` is kept aside) and the step's ``obs`` is bitwise that final ``next_obs``.
A real first step of an episode starts from a reset observation instead.

* :func:`reset_steps` counts such steps among the stored ones (the buffer checks at its
  1st, 2nd, 4th, 8th, ... sample and warns once: ``autoreset_mode=None``);
* :func:`reset_lanes` says which lanes' incoming step is one (``autoreset_mode=
  "next_step"`` drops them before they are written);
* :class:`ResetFreeRuns` remembers which steps a writer that leaves reset steps out itself
  wrote (``rb.collect``, through :class:`ResetFreeWrites`): the count skips them, so a
  genuine first step that starts from its predecessor's final observation (Blackjack's
  hand, FrozenLake's cell) is not flagged.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(16, seed=0)
    >>> o = lambda v: np.full(2, v, np.float32)
    >>> buf.add(obs=o(0), action=0, reward=1.0, next_obs=o(1), terminated=True,
    ...         truncated=False)
    >>> buf.add(obs=o(1), action=0, reward=0.0, next_obs=o(5), terminated=False,
    ...         truncated=False)  # the NEXT_STEP reset step: obs is the final obs
    >>> reset_steps(buf.table)
    1
    >>> reset_lanes(buf.table, np.array([0]), {"obs": o(5)[None]}).tolist()
    [False]
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError, describe
from replaybank.ops.continuity import bitwise_equal_rows
from replaybank.storage.table import StepTable

# (ResetSteps: the writers' part; ResetFreeRuns and the ResetFreeWrites protocol: the
# buffer's and the collector's; none of them public)
__all__ = ["AUTORESET_MODES", "AutoresetWarning", "check_autoreset_mode", "reset_lanes",
           "reset_steps", "warn_resets"]


class AutoresetWarning(UserWarning):
    """The stored data holds NEXT_STEP reset steps (see the module docstring)."""

#: ``None``: detect and warn once; ``"next_step"``: drop the reset steps;
#: ``"same_step"`` / ``"disabled"``: the data has none (no check).
AUTORESET_MODES = (None, "next_step", "same_step", "disabled")

#: The newest steps per lane that :func:`reset_steps` looks at (bounds its cost).
WINDOW = 4096

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def check_autoreset_mode(mode: Any) -> str | None:
    """``mode`` when it is one of :data:`AUTORESET_MODES`.

    Raises:
        ConfigError: Any other value.
    """
    if mode is not None and not (isinstance(mode, str) and mode in AUTORESET_MODES):
        raise ConfigError(
            f"autoreset_mode={mode!r}: expected None (the default), 'same_step' or "
            "'disabled' (every added step is a transition: SAME_STEP vector envs or manual "
            "resets) or 'next_step' (gymnasium's default vector-env autoreset: the step "
            "after each episode end is a reset step, which ReplayBuffer drops and "
            "RolloutBuffer masks)"
        )
    return mode


def _done(table: StepTable, rows: IntArray, lanes: IntArray) -> BoolArray:
    """``terminated | truncated`` of steps ``(rows, lanes)`` ``[k]``."""
    be = table.backend
    term = np.asarray(be.to_numpy(be.gather(table.arrays["terminated"], (rows, lanes))))
    trunc = np.asarray(be.to_numpy(be.gather(table.arrays["truncated"], (rows, lanes))))
    out: BoolArray = term.astype(bool) | trunc.astype(bool)
    return out


def _is_final(table: StepTable, rows: IntArray, lanes: IntArray,
              obs: Mapping[str, Any]) -> BoolArray:
    """Which of the steps ``(rows, lanes)`` ``[k]`` ended an episode whose final
    ``next_obs`` is bitwise ``obs[name]`` ``[k, *shape]`` (for every obs field)."""
    out = _done(table, rows, lanes)
    links = table.link[rows, lanes].astype(np.int64)
    out &= links > 0  # an episode's last step always keeps its next obs aside
    if not out.any():
        return out
    be = table.backend
    pick = np.flatnonzero(out)
    for name in table.obs_fields:
        kept = np.asarray(be.to_numpy(be.gather(table.side.arrays[name], links[pick] - 1)))
        same = bitwise_equal_rows(kept, np.asarray(obs[name])[pick])
        out[pick[~same]] = False
        pick = pick[same]
    return out


@runtime_checkable
class ResetFreeWrites(Protocol):
    """A buffer that checks its data for NEXT_STEP reset steps and can be told that a
    block of writes holds none: their writer left the reset steps out itself
    (:class:`~replaybank.integrations.gymnasium.Collector` does). ``ReplayBuffer`` and
    ``HerReplayBuffer`` implement it."""

    def reset_free_writes(self) -> AbstractContextManager[None]:
        """A context in which every ``add``/``extend`` is a real transition."""
        ...


class ResetFreeRuns:
    """Per lane, the newest run of steps written inside
    :meth:`ResetFreeWrites.reset_free_writes`, as ``[start, stop)`` in the lane's
    ``written`` counts (which keep counting through ``clear()`` and ring overwrites, so a
    run never names another step). :func:`reset_steps` does not count them.

    A lane keeps its newest run only: a run continues while that writer's writes follow
    each other in the lane, and one written after another writer's steps replaces it. The
    older run's steps are then checked again (at worst a warning, never a reset step left
    unreported).

    Args:
        lanes: Lanes of the buffer.

    Attributes:
        start: ``[lanes]`` int64, the first written count of each lane's run.
        stop: ``[lanes]`` int64, one past its last (``start == stop``: no run).

    Example:
        >>> import numpy as np
        >>> runs = ResetFreeRuns(2)
        >>> runs.wrote(np.array([0, 0]), np.array([3, 0]))  # lane 0: steps 0, 1, 2
        >>> runs.wrote(np.array([3, 0]), np.array([5, 1]))  # both lanes, continued
        >>> runs.start.tolist(), runs.stop.tolist()
        ([0, 0], [5, 1])
        >>> runs.wrote(np.array([7, 1]), np.array([8, 1]))  # after someone else's steps
        >>> runs.start.tolist(), runs.stop.tolist()
        ([7, 0], [8, 1])
    """

    def __init__(self, lanes: int) -> None:
        self.start: IntArray = np.zeros(lanes, dtype=np.int64)
        self.stop: IntArray = np.zeros(lanes, dtype=np.int64)

    def wrote(self, before: IntArray, after: IntArray) -> None:
        """Each lane's ``written`` count went from ``before`` to ``after`` ``[lanes]``
        inside the block."""
        if np.array_equal(before, self.stop):  # every lane continues its run (or has none)
            self.stop[:] = after
            return
        grew = after > before
        fresh = grew & (before != self.stop)  # not continuing the lane's run
        self.start[fresh] = before[fresh]
        self.stop[grew] = after[grew]

    def covers(self, lane: int, counts: IntArray) -> BoolArray:
        """Which of the lane's written counts ``counts`` ``[k]`` lie in its run."""
        out: BoolArray = (counts >= self.start[lane]) & (counts < self.stop[lane])
        return out

    def state_dict(self) -> dict[str, Any] | None:
        """``{"start": [lanes], "stop": [lanes]}`` (copies), or None while no lane has a
        run (nothing to save)."""
        if not (self.stop > self.start).any():
            return None
        return {"start": self.start.copy(), "stop": self.stop.copy()}

    def checked(self, saved: Any) -> tuple[IntArray, IntArray]:
        """``(start, stop)`` of a saved :meth:`state_dict` (None: no runs).

        Raises:
            CheckpointError: Not two int64 ``[lanes]`` arrays with ``start <= stop``.
        """
        lanes = len(self.start)
        if saved is None:
            return np.zeros(lanes, dtype=np.int64), np.zeros(lanes, dtype=np.int64)
        got = dict(saved) if isinstance(saved, Mapping) else {}
        out = []
        for key in ("start", "stop"):
            value = got.get(key)
            arr = np.asarray(value) if value is not None else None
            if arr is None or arr.dtype != np.int64 or arr.shape != (lanes,):
                raise CheckpointError(
                    f"load_state_dict: reset_free/{key} is {describe(value)}, expected "
                    f"int64[{lanes}] (one per lane); the state is damaged")
            out.append(np.array(arr, dtype=np.int64))
        if (out[0] > out[1]).any():
            raise CheckpointError(
                f"load_state_dict: reset_free/start {out[0].tolist()} is past reset_free/"
                f"stop {out[1].tolist()} in some lane; the state is damaged")
        return out[0], out[1]

    def load(self, parsed: tuple[IntArray, IntArray]) -> None:
        """Install what :meth:`checked` returned."""
        self.start[:], self.stop[:] = parsed


def reset_steps(table: StepTable, window: int = WINDOW,
                reset_free: ResetFreeRuns | None = None) -> int:
    """How many of the newest ``window`` stored steps of each lane are NEXT_STEP reset
    steps (see the module docstring; counted only where the step also has reward 0 and
    no episode end, as gymnasium's reset steps do); 0 for storage not in host memory.
    Steps in a lane's ``reset_free`` run are not counted (their writer left the reset
    steps out)."""
    if not table.backend.host_numpy:
        return 0
    found = 0
    T = table.T  # noqa: N806
    for lane in range(table.lanes):
        c, w = int(table.counts[lane]), int(table.written[lane])
        c = min(c, window)
        if c < 2:
            continue
        prev = np.arange(w - c, w - 1, dtype=np.int64) % T  # [c - 1] steps with a successor
        nxt = (prev + 1) % T
        lanes = np.full(len(prev), lane, dtype=np.int64)
        be = table.backend
        # gymnasium's reset step has reward 0 and no episode end: constant-observation
        # data (dummy envs, bandits) with rewards is not mistaken for one
        quiet = ~_done(table, nxt, lanes)
        quiet &= np.asarray(be.to_numpy(be.gather(table.arrays["reward"], (nxt, lanes)))) == 0
        if reset_free is not None:  # [c - 1] written counts of the steps nxt
            quiet &= ~reset_free.covers(lane, np.arange(w - c + 1, w, dtype=np.int64))
        if not quiet.any():
            continue
        prev, nxt, lanes = prev[quiet], nxt[quiet], lanes[quiet]
        obs = {name: be.to_numpy(be.gather(table.arrays[name], (nxt, lanes)))
               for name in table.obs_fields}
        found += int(np.count_nonzero(_is_final(table, prev, lanes, obs)))
    return found


def reset_lanes(table: StepTable, lane_ids: IntArray, obs: Mapping[str, Any]) -> BoolArray:
    """Which lanes' incoming step (``obs[name]`` ``[m, *shape]`` of lanes ``lane_ids``
    ``[m]``) is a NEXT_STEP reset step: the lane's newest stored step ended its episode
    with exactly this observation as its final ``next_obs``."""
    lane_ids = np.asarray(lane_ids, dtype=np.int64)
    live = table.counts[lane_ids] > 0
    out = np.zeros(len(lane_ids), dtype=bool)
    if not live.any():
        return out
    pick = np.flatnonzero(live)
    rows = (table.written[lane_ids[pick]] - 1) % table.T
    sub = {name: np.asarray(obs[name])[pick] for name in table.obs_fields}
    out[pick] = _is_final(table, rows.astype(np.int64), lane_ids[pick], sub)
    return out


class ResetSteps:
    """The NEXT_STEP reset steps a buffer with ``autoreset_mode="next_step"`` drops: each
    lane's one step after an episode end, when its ``obs`` is that episode's final
    ``next_obs`` (:func:`reset_lanes`).

    Exactly one step per episode end is dropped: :attr:`dropped` remembers, per lane,
    that the reset step of its newest stored step's episode end is gone, so the lane's
    next steps are kept even when they start from the same observation (a bandit's
    constant observation, an episode that ends on its start cell). A ``clear()`` right
    after an episode end keeps what the check needs (:meth:`on_clear`): the env's next
    step is still that episode's reset step, and the emptied table no longer holds the
    final observation it starts from.

    Args:
        lanes: Lanes of the buffer.

    Attributes:
        dropped: ``[lanes]`` bool: the lane's reset step was dropped and no step of the
            lane was written since.
        armed: ``[lanes]`` bool: the buffer was cleared after the lane's episode ended
            (its reset step not seen yet), and :attr:`final` holds the final observation.
        final: ``{obs field: [lanes, *shape]}``, the armed lanes' final observations
            (empty while no lane is armed).

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(16, seed=0)
        >>> o = lambda v: np.full(2, v, np.float32)
        >>> buf.add(obs=o(0), action=0, reward=1.0, next_obs=o(0), terminated=True,
        ...         truncated=False)
        >>> resets, lanes = ResetSteps(1), np.array([0])
        >>> resets.due(buf.table, lanes, {"obs": o(0)[None]}).tolist()
        [True]
        >>> resets.dropped[lanes] = True  # the writer dropped it
        >>> resets.due(buf.table, lanes, {"obs": o(0)[None]}).tolist()  # a real step
        [False]
    """

    def __init__(self, lanes: int) -> None:
        self.dropped: BoolArray = np.zeros(lanes, dtype=bool)
        self.armed: BoolArray = np.zeros(lanes, dtype=bool)
        self.final: dict[str, Any] = {}

    def due(self, table: StepTable, lane_ids: IntArray, obs: Mapping[str, Any]) -> BoolArray:
        """Which lanes' incoming step (``obs[name]`` ``[m, *shape]`` of lanes ``lane_ids``
        ``[m]``) is the reset step to drop."""
        out = reset_lanes(table, lane_ids, obs)
        armed = self.armed[lane_ids]
        if armed.any():  # emptied lanes: the final observation kept by on_clear
            pick = np.flatnonzero(armed)
            same = np.ones(len(pick), dtype=bool)
            for name in table.obs_fields:
                same &= bitwise_equal_rows(self.final[name][lane_ids[pick]],
                                           np.asarray(obs[name])[pick])
            out[pick] = same
        out &= ~self.dropped[lane_ids]
        return out

    def written(self, lane_ids: IntArray, drop: BoolArray) -> None:
        """A step of each of the lanes ``lane_ids`` ``[m]`` arrived; ``drop`` ``[m]``: it
        was the reset step (and was left out)."""
        self.dropped[lane_ids] = drop
        if self.armed.any():
            self.armed[lane_ids] = False
            if not self.armed.any():
                self.final = {}

    def on_clear(self, table: StepTable) -> None:
        """Before ``table`` is emptied: arm each lane whose newest step ended an episode
        and whose reset step has not arrived, keeping the final observation it will
        start from (lanes already armed and still empty stay armed)."""
        lanes = np.flatnonzero(table.counts > 0).astype(np.int64)
        ended = np.zeros(0, dtype=bool)
        if len(lanes):
            rows = ((table.written[lanes] - 1) % table.T).astype(np.int64)
            ended = _done(table, rows, lanes) & (table.link[rows, lanes] > 0) \
                & ~self.dropped[lanes]
        self.dropped[lanes] = False
        self.armed[lanes] = False
        if not ended.any():
            if not self.armed.any():
                self.final = {}
            return
        lanes, rows = lanes[ended], rows[ended]
        links = table.link[rows, lanes].astype(np.int64) - 1
        be = table.backend
        if not self.final:
            self.final = {name: np.zeros((len(self.armed), *table.spec[name].shape),
                                         table.spec[name].dtype)
                          for name in table.obs_fields}
        for name in table.obs_fields:
            self.final[name][lanes] = np.asarray(be.to_numpy(be.gather(
                table.side.arrays[name], links)))
        self.armed[lanes] = True

    def state_dict(self) -> dict[str, Any]:
        """``{"dropped": [lanes] bool, "armed": [lanes] bool}`` and, while a lane is
        armed, ``final/<obs field>`` ``[lanes, *shape]`` (copies)."""
        out: dict[str, Any] = {"dropped": self.dropped.copy(), "armed": self.armed.copy()}
        out.update({f"final/{name}": a.copy() for name, a in self.final.items()})
        return out

    def checked(self, saved: Any, obs_rows: Mapping[str, tuple[tuple[int, ...], Any]]
                ) -> tuple[BoolArray, BoolArray, dict[str, Any]]:
        """``(dropped, armed, final)`` of a saved :meth:`state_dict` (None, from a
        checkpoint of an older version or another mode: no reset step dropped, no lane
        armed).

        Args:
            saved: The saved state.
            obs_rows: ``{obs field: (row shape, dtype)}`` of the state's table (what an
                armed lane's final observation must be).

        Raises:
            CheckpointError: A flag array is not ``[lanes]`` bool, or an armed lane's final
                observation is missing or misshaped.
        """
        lanes = len(self.dropped)
        if saved is None:
            return np.zeros(lanes, dtype=bool), np.zeros(lanes, dtype=bool), {}
        got = dict(saved) if isinstance(saved, Mapping) else {}

        def flags(key: str, optional: bool) -> BoolArray:
            value = got.get(key)
            if value is None and optional:  # (written before clear() armed lanes)
                return np.zeros(lanes, dtype=bool)
            arr = np.asarray(value) if value is not None else None
            if arr is None or arr.dtype != np.bool_ or arr.shape != (lanes,):
                raise CheckpointError(
                    f"load_state_dict: autoreset/{key} is {describe(value)}, expected "
                    f"bool[{lanes}] (one per lane); the state is damaged")
            return np.array(arr, dtype=bool)

        dropped, armed = flags("dropped", False), flags("armed", True)
        final: dict[str, Any] = {}
        if armed.any():
            if not obs_rows:
                raise CheckpointError(
                    "load_state_dict: autoreset/armed marks lanes cleared after an episode "
                    "end, but the state stores no observations; the state is damaged")
            for name, (shape, dtype) in obs_rows.items():
                value = got.get(f"final/{name}")
                arr = np.asarray(value) if value is not None else None
                if arr is None or arr.shape != (lanes, *shape) or arr.dtype != dtype:
                    raise CheckpointError(
                        f"load_state_dict: autoreset/final/{name} is {describe(value)}, "
                        f"expected {np.dtype(dtype)}{[lanes, *shape]} (the final "
                        "observations of the lanes cleared after an episode end); the "
                        "state is damaged")
                final[name] = np.array(arr)
        return dropped, armed, final

    def load(self, parsed: tuple[BoolArray, BoolArray, dict[str, Any]]) -> None:
        """Install what :meth:`checked` returned."""
        self.dropped[:], self.armed[:] = parsed[0], parsed[1]
        self.final = parsed[2]


def warn_resets(found: int, stacklevel: int = 3) -> None:
    """Warn (once per buffer: the caller remembers) that ``found`` stored steps are
    NEXT_STEP reset steps, with the fixes."""
    warnings.warn(
        f"{found} stored step(s) go from an episode's final observation to the next "
        "episode's reset observation: a gymnasium vector env in its default NEXT_STEP "
        "autoreset mode was added step by step. Those are not transitions. Fix: pass "
        "autoreset_mode='next_step' to the buffer (drops them), add only the lanes that "
        "did not just reset (env_ids=), or collect with rb.collect. If they are real steps "
        "(an env that resets to the very observation its episodes end on, with reward 0), "
        "autoreset_mode='same_step' silences this check",
        AutoresetWarning, stacklevel=stacklevel,
    )
