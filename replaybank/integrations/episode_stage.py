"""Whole episodes for a one-lane buffer fed by several sub-envs.

A buffer lane is one stream of steps: next-step, n-step, frame-stack, sequence and HER
lookups are index arithmetic within it, and a step whose ``obs`` is not its predecessor's
``next_obs`` starts a new episode there. A vector env of ``N`` sub-envs runs ``N``
episodes at once, so a one-lane buffer can only take them one after another:
:class:`EpisodeStage` holds each sub-env's steps until its episode ends (terminated or
truncated) and then appends the episode whole, with one ``extend``, in the order the
episodes end (sub-env order within one vector step). Every episode in the lane is then
contiguous and complete, exactly as in a buffer with one lane per sub-env.

Steps are held, not lost, but they reach the buffer late. Two things append steps of an
episode that is still running (its *prefix*); the buffer sees the prefix end where the
next appended step does not continue it (as at a time limit: bootstrapped from its last
``next_obs``), and the rest of the episode, appended later, as an episode of its own:

* :meth:`EpisodeStage.flush`, on request (when collection stops for good);
* the bound ``max_held``: when more steps are held than that, the sub-env holding the
  most appends its prefix, so memory stays bounded (an env whose episodes never end
  still gets its steps into the buffer).

The buffer checks held steps only when they are appended. When it refuses a sub-env's
held steps (a value its fields cannot hold), only those steps are lost: the stage
appends that sub-env's held steps one by one, leaving out each step the buffer refuses
(the episode is cut around them, as at a time limit, and nothing bridges them), and
records the refusal (:meth:`EpisodeStage.take_refused`); the other sub-envs' held steps
stay held and are appended whole when their episodes end. No env needs a reset for it.

Example:
    >>> import numpy as np
    >>> got = []
    >>> stage = EpisodeStage(2, max_held=100, extend=lambda **f: got.append(f["reward"]))
    >>> step = lambda r: {"reward": np.array([r, 10 * r], np.float32)}
    >>> stage.hold(step(1), real=np.array([True, True]), done=np.array([False, False]))
    0
    >>> stage.hold(step(2), real=np.array([True, True]), done=np.array([False, True]))
    2
    >>> [g.tolist() for g in got], stage.held   # sub-env 1's episode, whole
    ([[10.0, 20.0]], 2)
    >>> stage.flush(), [g.tolist() for g in got][-1]   # sub-env 0's running prefix
    (2, [1.0, 2.0])
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, ReplayBankError

__all__ = ["EpisodeStage", "Refusal", "check_max_held"]

BoolArray = npt.NDArray[np.bool_]


def check_max_held(max_held: Any, capacity: int) -> int:
    """``max_held`` as an int (None: ``capacity``, the most steps the buffer holds).

    Raises:
        ConfigError: Not a positive int.
    """
    if max_held is None:
        return int(capacity)
    if isinstance(max_held, bool) or not isinstance(max_held, (int, np.integer)) \
            or max_held <= 0:
        raise ConfigError(
            f"Collector(max_held={max_held!r}): must be a positive int (the most steps of "
            "running episodes held for a one-lane buffer), or None for the buffer's "
            f"capacity ({capacity})")
    return int(max_held)


@dataclass(frozen=True)
class Refusal:
    """Held steps of one sub-env that the buffer refused when they were appended.

    Attributes:
        env: The sub-env.
        steps: How many of its held steps were left out.
        error: The buffer's error for the whole batch of its held steps.
    """

    env: int
    steps: int
    error: ReplayBankError


class EpisodeStage:
    """Holds each sub-env's steps until its episode ends, then appends it whole.

    Args:
        n: Number of sub-envs.
        max_held: The most steps held at once (see the module docstring).
        extend: ``extend(**fields)`` of the buffer; fields ``[T, *shape]`` (nested dicts
            for dict observations).

    Attributes:
        steps: Per sub-env, its held steps (one dict of fields each, copies).
    """

    def __init__(self, n: int, max_held: int, extend: Callable[..., Any]) -> None:
        self.steps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.max_held = max_held
        self._extend = extend
        self._held = 0
        self._refused: list[Refusal] = []

    @property
    def held(self) -> int:
        """Steps held now (of episodes still running)."""
        return self._held

    def hold(self, fields: dict[str, Any], real: BoolArray, done: BoolArray) -> int:
        """Hold one vector step and append what is due.

        Args:
            fields: The step's fields, leading dim ``n`` (nested dicts allowed).
            real: ``[n]``: the sub-env's step is a transition (not a NEXT_STEP reset step).
            done: ``[n]``: it ended its episode.

        Returns:
            Steps appended to the buffer.
        """
        for i in np.flatnonzero(real).tolist():
            self.steps[i].append(_lane(fields, i))
            self._held += 1
        appended = 0
        for i in np.flatnonzero(real & done).tolist():
            appended += self._append(i)
        while self._held > self.max_held:
            appended += self._append(int(np.argmax([len(s) for s in self.steps])))
        return appended

    def flush(self) -> int:
        """Append every held step now, sub-env by sub-env: the running episodes are cut
        there (see the module docstring). Returns the steps appended."""
        return sum(self._append(i) for i in range(len(self.steps)))

    def drop(self) -> int:
        """Forget every held step (their episodes will not continue); returns how many."""
        dropped, self._held = self._held, 0
        self.steps = [[] for _ in self.steps]
        return dropped

    def take_refused(self) -> list[Refusal]:
        """The refusals since the last call (module docstring), oldest first; forgets
        them."""
        out, self._refused = self._refused, []
        return out

    def _append(self, i: int) -> int:
        """Append sub-env ``i``'s held steps; returns how many the buffer took (a batch
        it refuses is appended step by step without the refused steps, see the module
        docstring)."""
        steps = self.steps[i]
        if not steps:
            return 0
        try:
            self._extend(**_stack(steps))
            appended = len(steps)
        except ReplayBankError as exc:
            appended = 0
            for step in steps:  # the steps the buffer takes, in order; a gap cuts there
                try:
                    self._extend(**_stack([step]))
                except ReplayBankError:
                    continue
                appended += 1
            self._refused.append(Refusal(i, len(steps) - appended, exc))
        self.steps[i] = []
        self._held -= len(steps)
        return appended


def _stack(steps: list[Any]) -> Any:
    """Steps (dicts of fields) as one dict of ``[T, *shape]`` fields: arrays stacked,
    Python values (a policy's list of actions) as a list, which the buffer's inference
    reads as it reads them in ``add``."""
    first = steps[0]
    if isinstance(first, dict):
        return {k: _stack([s[k] for s in steps]) for k in first}
    return np.stack(steps) if isinstance(first, np.ndarray) else steps


def _lane(tree: Any, i: int) -> Any:
    """Lane ``i`` of every leaf (a copy; an array's row stays an array)."""
    if isinstance(tree, dict):
        return {k: _lane(v, i) for k, v in tree.items()}
    return np.array(tree[i]) if isinstance(tree, np.ndarray) else copy.deepcopy(tree[i])
