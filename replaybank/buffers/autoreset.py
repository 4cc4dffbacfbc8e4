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
  "next_step"`` drops them before they are written).

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
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError, describe
from replaybank.ops.continuity import bitwise_equal_rows
from replaybank.storage.table import StepTable

__all__ = ["AUTORESET_MODES", "AutoresetWarning", "check_autoreset_mode", "reset_lanes",
           "reset_steps", "warn_resets"]  # (ResetSteps: the writers' part, not public)


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


def reset_steps(table: StepTable, window: int = WINDOW) -> int:
    """How many of the newest ``window`` stored steps of each lane are NEXT_STEP reset
    steps (see the module docstring; counted only where the step also has reward 0 and
    no episode end, as gymnasium's reset steps do); 0 for storage not in host memory."""
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
    constant observation, an episode that ends on its start cell).

    Args:
        lanes: Lanes of the buffer.

    Attributes:
        dropped: ``[lanes]`` bool: the lane's reset step was dropped and no step of the
            lane was written since.

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

    def due(self, table: StepTable, lane_ids: IntArray, obs: Mapping[str, Any]) -> BoolArray:
        """Which lanes' incoming step (``obs[name]`` ``[m, *shape]`` of lanes ``lane_ids``
        ``[m]``) is the reset step to drop."""
        out = reset_lanes(table, lane_ids, obs)
        out &= ~self.dropped[lane_ids]
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"dropped": [lanes] bool}`` (a copy)."""
        return {"dropped": self.dropped.copy()}

    def checked(self, saved: Any) -> BoolArray:
        """The :attr:`dropped` of a saved :meth:`state_dict` (None, from a checkpoint of
        an older version or another mode: no reset step dropped).

        Raises:
            CheckpointError: It is not ``[lanes]`` bool.
        """
        if saved is None:
            return np.zeros_like(self.dropped)
        got = saved.get("dropped") if isinstance(saved, Mapping) else None
        arr = np.asarray(got) if got is not None else None
        if arr is None or arr.dtype != np.bool_ or arr.shape != self.dropped.shape:
            raise CheckpointError(
                f"load_state_dict: autoreset/dropped is {describe(got)}, expected "
                f"bool[{len(self.dropped)}] (one per lane); the state is damaged"
            )
        return np.array(arr, dtype=bool)


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
