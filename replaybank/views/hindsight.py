"""Hindsight experience replay (HER) as a view: goals relabelled at sample time.

Nothing is stored twice: a step is stored once with the goal it was collected for, and a
sampled step is served with a new goal drawn from the achieved goals of its episode
(Andrychowicz et al., 2017). Observations are dicts in the gymnasium-robotics GoalEnv
convention, stored as the fields ``obs/observation``, ``obs/achieved_goal`` and
``obs/desired_goal``.

Which rows get a new goal: each sampled row independently with probability
``k / (k + 1)`` (``k`` = the paper's and SB3's ``n_sampled_goal``), among the rows whose
episode has ended (terminated, truncated, or a discontinuity in the lane's data); with
``relabel_unfinished=True`` the rows of running episodes too, which then use the steps
they have so far. The batch field ``relabeled`` ``[B]`` marks the rows with a new goal.

Where the new goal comes from, for a sampled step ``t`` of an episode whose surviving
steps are ``b..e`` in its lane (``b`` is later than the episode's first step when the ring
overwrote its start; ``e`` is the episode's last step, or the lane's newest step of a
running episode): the goal is the achieved goal of the *next observation* of step ``j``
(``next_obs/achieved_goal[j]``), with ``j``

* ``"future"``: uniform on ``t..e`` (the next observation of ``t`` itself included),
* ``"final"``: ``e`` (the episode's final next observation),
* ``"episode"``: uniform on ``b..e``,
* ``"random"``: uniform over every live step of every lane.

For a relabelled row the new goal ``g`` goes into both ``obs/desired_goal`` and
``next_obs/desired_goal`` (in the desired goal's dtype); ``reward`` becomes
``reward_fn(next_obs/achieved_goal, g, info)`` with ``g`` as the batch holds it (one
vectorised call per batch over the relabelled rows; with ``n_step > 1`` one
call over every step of their windows, never a step past a window's end, whose rewards
then enter the n-step sum);
``terminated`` is kept as stored unless ``terminated_fn`` is given, which then decides it
(and with ``n_step > 1`` cuts a window at the first relabelled termination). Stored
``info`` dicts are not kept: ``info`` is an empty dict, which is all
``env.unwrapped.compute_reward`` of the gymnasium-robotics tasks reads.

The episode extents come from an :class:`~replaybank.ops.episodes.EpisodeIndex` kept
current from the lane counters (each written step indexed once), never searched per
sample. Draws use the buffer's generator, so a seeded buffer and a restored checkpoint
give the identical next sample.

Device storage (``storage="torch"``): which rows get a new goal and which step each goal
comes from are chosen on the host exactly as above (the episode index reads the lane
counters, the links and each lane's newest done flag, all kept on the host), so a seeded
torch-storage buffer relabels the same rows with the same goals as numpy storage; the
goals are then gathered and the rewards recomputed on the device
(:mod:`replaybank.device.hindsight`), with no device value read on the host.
``reward_fn`` and ``terminated_fn`` then receive torch tensors on the storage's device
and may return a tensor (moved to that device) or anything ``numpy.asarray`` takes
(copied there); ``relabeled`` is a device tensor too.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> def reward(achieved, desired, info):
    ...     return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)
    >>> buf = rb.ReplayBuffer(64, seed=0, view=HerView(reward, "final", k=4))
    >>> goal = np.array([9.0], np.float32)
    >>> for t in range(5):
    ...     buf.add(obs={"observation": np.array([t], np.float32),
    ...                  "achieved_goal": np.array([t], np.float32), "desired_goal": goal},
    ...             action=0, reward=-1.0,
    ...             next_obs={"observation": np.array([t + 1], np.float32),
    ...                       "achieved_goal": np.array([t + 1], np.float32),
    ...                       "desired_goal": goal},
    ...             terminated=False, truncated=t == 4)
    >>> b = buf.sample(256)
    >>> new = b["relabeled"]
    >>> set(b.obs["desired_goal"][new, 0].tolist())   # "final": the last achieved goal
    {5.0}
    >>> bool(np.all(b.reward[new] == (b.next_obs["achieved_goal"][new, 0] == 5) - 1.0))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank import registry
from replaybank.errors import ConfigError, DtypeError, ShapeError, describe
from replaybank.ops import nstep
from replaybank.ops.episodes import EpisodeIndex
from replaybank.ops.hindsight import STRATEGY_CODES, goal_kernel
from replaybank.spec import Spec, real_array
from replaybank.storage.table import StepTable
from replaybank.views.base import LaneSpanView, StatelessView, next_name
from replaybank.views.named_functions import function_name, resolve_function
from replaybank.views.nstep import NStepView
from replaybank.views.transition import TransitionView

__all__ = ["STRATEGIES", "HerView", "count_message", "function_values"]

IntArray = npt.NDArray[np.int64]
STRATEGIES = tuple(STRATEGY_CODES)


class HerView(StatelessView):
    """Hindsight relabelling over one-step or n-step transitions.

    Args:
        reward_fn: ``reward_fn(achieved_goal [N, *g], desired_goal [N, *g], info) -> [N]``
            (a callable, a name given to :func:`~replaybank.views.named_functions.
            register_function`, or ``"module:attr"``); ``env.unwrapped.compute_reward``
            works unchanged on numpy and memmap storage. On torch storage it receives
            torch tensors on the storage's device (see the module docstring).
        strategy: ``"future"``, ``"final"``, ``"episode"`` or ``"random"`` (see the
            module docstring for the exact support of each).
        k: Relabelled goals per real goal: a row gets a new goal with probability
            ``k / (k + 1)`` (0: never).
        terminated_fn: Same signature, ``-> [N]`` bool: the relabelled ``terminated``
            (None: keep the stored flag).
        relabel_unfinished: Relabel the rows of running episodes too (goals from their
            steps so far); by default only finished episodes are relabelled.
        n_step: Steps per transition (n-step returns of the relabelled rewards).
        gamma: Discount of the n-step returns.
        achieved_key: The achieved-goal key of the dict observations.
        desired_key: The desired-goal key of the dict observations.

    Raises:
        ConfigError: A bad strategy, ``k``, ``n_step``, ``gamma`` or function.

    Example:
        >>> HerView("builtins:max", "future", k=4).config()["strategy"]
        'future'
    """

    every_step = True

    def __init__(self, reward_fn: Callable[..., Any] | str, strategy: str = "future",
                 k: int = 4, *, terminated_fn: Callable[..., Any] | str | None = None,
                 relabel_unfinished: bool = False, n_step: int = 1, gamma: float = 0.99,
                 achieved_key: str = "achieved_goal",
                 desired_key: str = "desired_goal") -> None:
        if not isinstance(strategy, str) or strategy not in STRATEGIES:
            raise ConfigError(f"HerView(strategy={strategy!r}): choose one of {list(STRATEGIES)}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ConfigError(f"HerView(k={k!r}): k (relabelled goals per real one) must be "
                              "an int >= 0")
        if not isinstance(relabel_unfinished, (bool, np.bool_)):
            raise ConfigError(f"HerView(relabel_unfinished={relabel_unfinished!r}): must be "
                              "a bool")
        for name, key in (("achieved_key", achieved_key), ("desired_key", desired_key)):
            if not isinstance(key, str) or not key or "/" in key:
                raise ConfigError(f"HerView({name}={key!r}): must be a dict observation key "
                                  "(a non-empty str without '/')")
        if reward_fn is None:
            raise ConfigError("HerView(reward_fn=None): pass the reward function, "
                              "e.g. env.unwrapped.compute_reward, a registered name or "
                              "'module:attr'")
        self.reward_fn = resolve_function(reward_fn, "reward_fn")
        self.terminated_fn = None if terminated_fn is None \
            else resolve_function(terminated_fn, "terminated_fn")
        self._names = (reward_fn if isinstance(reward_fn, str) else None,
                       terminated_fn if isinstance(terminated_fn, str) else None)
        self.strategy = strategy
        self._code = STRATEGY_CODES[strategy]
        self.k = int(k)
        self.relabel_unfinished = bool(relabel_unfinished)
        one_step = isinstance(n_step, (int, np.integer)) and not isinstance(n_step, bool) \
            and n_step == 1
        self.inner: NStepView | TransitionView = TransitionView() if one_step \
            else NStepView(n_step, gamma)  # NStepView checks n_step (and gamma)
        if one_step:  # gamma is checked by NStepView
            NStepView(1, gamma)
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.achieved = "obs/" + achieved_key
        self.desired = "obs/" + desired_key
        self._keys = (achieved_key, desired_key)
        self._index: EpisodeIndex | None = None
        self._indexed: StepTable | None = None
        self._checked: StepTable | None = None  # the table _check_table accepted

    @property
    def probability(self) -> float:
        """Chance that a row of a finished episode gets a new goal, ``k / (k + 1)``."""
        return self.k / (self.k + 1)

    # ------------------------------------------------------------------ episode index
    def episode_index(self, table: StepTable) -> EpisodeIndex:
        """The episode index of ``table``, brought up to date with what was written."""
        idx = self._index
        if idx is None or self._indexed is not table:
            idx = self._index = EpisodeIndex(table.T, table.lanes)
            self._indexed = table
        if table.tail is None:  # the flags are host arrays
            idx.sync(table.link, table.arrays["terminated"], table.arrays["truncated"],
                     table.written, table.counts, table.epoch)
        else:  # device storage: the newest steps' done flags, kept on the host
            idx.sync_newest(table.link, table.tail.done, table.written, table.counts,
                            table.epoch)
        return idx

    def check_fields(self, spec: Spec) -> None:
        """Raise when fields stored as ``spec`` cannot be relabelled
        (:class:`~replaybank.views.base.FieldsCheckedView`: the buffer asks before its
        first add is stored).

        A relabelled goal is an achieved goal written into the desired-goal field, and
        ``reward_fn`` gives one reward per step, so the two goal fields must have one
        shape and the achieved goals' dtype must fit the desired goals' without turning
        fractions into integers (a reward of one number per step every buffer checks).

        Raises:
            ShapeError: The achieved or desired goal key is not among the observation
                fields, or the two goals differ in shape.
            DtypeError: Achieved goals whose values the desired goals' dtype cannot hold
                (e.g. float achieved goals, integer desired goals).
        """
        stored = [n for n in spec if n == "obs" or n.startswith("obs/")]
        for field in (self.achieved, self.desired):
            if field not in stored:
                raise ShapeError(
                    f"HerView: the observations have no {field.split('/', 1)[1]!r} key "
                    f"(stored observation fields: {stored}); add dict "
                    "observations {'observation', 'achieved_goal', 'desired_goal'} or pass "
                    "achieved_key=/desired_key=")
        achieved, desired = spec[self.achieved], spec[self.desired]
        keys = f"{self._keys[0]!r} and {self._keys[1]!r}"
        if achieved.shape != desired.shape:
            raise ShapeError(
                f"HerView: goals {keys} have shapes {achieved.shape} and {desired.shape} "
                "per step; a relabelled goal is an achieved goal stored as the desired "
                "goal: give both goals the same shape")
        if not np.can_cast(achieved.dtype, desired.dtype, casting="same_kind"):
            raise DtypeError(
                f"HerView: goals {keys} are stored as {achieved.dtype} and "
                f"{desired.dtype}; a relabelled goal is an achieved goal stored as the "
                f"desired goal, and {desired.dtype} cannot hold {achieved.dtype} values: "
                "store the desired goal as the achieved goal's dtype (spec=)")

    def _check_table(self, table: StepTable) -> None:
        self.check_fields(table.spec)

    # ------------------------------------------------------------------ gather
    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        """Fields of the transitions at ``keys`` ``[B]``, with new goals for a fraction.

        Returns:
            The inner view's fields (``[B, *shape]``; ``discount`` with ``n_step > 1``)
            and ``relabeled`` ``[B]`` bool (numpy arrays, or tensors on the device of
            torch storage).

        Raises:
            ConfigError: No generator (``rng``).
            ShapeError: The observations have no goal keys, or ``reward_fn`` /
                ``terminated_fn`` returned the wrong number of values.
            DtypeError: ``reward_fn`` / ``terminated_fn`` returned other than finite real
                numbers (strings, also numbers as text, None, complex values, NaN).
        """
        if rng is None:
            raise ConfigError("HerView.gather draws goals: pass the buffer's generator "
                              "(rng=buf.rng)")
        if self._checked is not table:
            self._check_table(table)
            self._checked = table
        keys = np.asarray(keys, dtype=np.int64)
        out = self.inner.gather(table, keys, rng)
        b = len(keys)
        relabeled = out["relabeled"] = np.zeros(b, dtype=bool)
        if self.k == 0 or b == 0:
            return out if table.backend.host_numpy else self._on_device(out)
        idx = self.episode_index(table)
        rows, nxt, side = goal_kernel()(
            keys, rng.random(2 * b), self.probability, idx.end, idx.begin, table.written,
            table.counts, table.flat(table.link), table.T, table.lanes, self._code,
            self.relabel_unfinished)
        if not table.backend.host_numpy:  # device storage: goals and rewards on the device
            relabeled[rows] = True
            if len(rows):
                registry.feature("her_device_relabel")(self, table, out, keys, rows, nxt,
                                                       side)
            return self._on_device(out)
        if len(rows) == 0:
            return out
        relabeled[rows] = True
        # the goal step's next achieved goal: the next step's, or the one kept aside
        goals = table.flat(table.arrays[self.achieved]).take(nxt, axis=0)  # [S, *g]
        aside = (side >= 0).nonzero()[0]
        if len(aside):
            goals[aside] = table.side.arrays[self.achieved].take(side[aside], axis=0)
        # the goals as the batch holds them: the rewards are those of the goals served
        goals = goals.astype(out[self.desired].dtype, copy=False)
        for name in (self.desired, next_name(self.desired)):
            arr = out[name]
            if not arr.flags.writeable:
                arr = out[name] = arr.copy()
            arr[rows] = goals
        self._relabel_rewards(table, out, keys, rows, goals)
        return out

    def _on_device(self, out: dict[str, Any]) -> dict[str, Any]:
        """A device batch with its ``relabeled`` mask moved beside its other fields."""
        out["relabeled"] = registry.feature("to_device")(out["relabeled"],
                                                         out[next_name(self.achieved)])
        return out

    def _relabel_rewards(self, table: StepTable, out: dict[str, Any], keys: IntArray,
                         rows: IntArray, goals: npt.NDArray[Any]) -> None:
        """New rewards (and, with ``terminated_fn``, terminations) of the relabelled
        ``rows`` of a batch of ``keys`` ``[B]``."""
        s = len(rows)
        n = self.n_step
        if n == 1:
            achieved = out[next_name(self.achieved)][rows]  # [S, *g]
            rewards = self._call(self.reward_fn, "reward_fn", achieved, goals, s)
            out["reward"][rows] = rewards
            if self.terminated_fn is not None:
                out["terminated"][rows] = self._call(self.terminated_fn, "terminated_fn",
                                                     achieved, goals, s) != 0
            return
        assert isinstance(self.inner, NStepView)
        wslots, length = self.inner.window(table, keys[rows])  # [S, n], [S]
        # the functions see the steps of the windows only: past a window's end are other
        # episodes' steps or slots never written (zeros), which they need not handle
        inside = np.arange(n)[None, :] < length[:, None]  # [S, n]
        m = int(length.sum())
        achieved = table.take_next(self.achieved, *table.next_index(wslots[inside]))
        repeated = np.repeat(goals, length, axis=0)  # [M, *g], window by window
        rewards = np.zeros((s, n), np.float64)
        rewards[inside] = self._call(self.reward_fn, "reward_fn", achieved, repeated, m)
        if self.terminated_fn is not None:
            term = np.zeros((s, n), bool)
            term[inside] = self._call(self.terminated_fn, "terminated_fn", achieved,
                                      repeated, m) != 0
            hit = term.any(axis=1)
            cut = np.where(hit, term.argmax(axis=1) + 1, length)
            moved = np.flatnonzero(cut != length)
            if len(moved):  # windows cut short by a relabelled termination
                last = wslots[moved, cut[moved] - 1]
                where = table.next_index(last)
                for name in table.obs_fields:
                    out[next_name(name)][rows[moved]] = table.take_next(name, *where)
                out[next_name(self.desired)][rows[moved]] = goals[moved]
                out["truncated"][rows[moved]] = table.take("truncated", last)
            out["terminated"][rows] = hit
            length = cut
            out["discount"][rows] = (self.gamma ** length.astype(np.float64)
                                     ).astype(np.float32)
        out["reward"][rows] = nstep.discounted_returns(rewards, length, self.gamma)

    def _call(self, fn: Callable[..., Any], what: str, achieved: npt.NDArray[Any],
              desired: npt.NDArray[Any], n: int) -> npt.NDArray[Any]:
        """``fn``'s ``[n]`` values for the goal pairs (:func:`~replaybank.views.
        hindsight.function_values`: finite real numbers)."""
        return function_values(fn(achieved, desired, {}), what, n, achieved.shape)

    def user_functions(self) -> tuple[Any, ...]:
        """The reward (and termination) function: a buffer restores its generator when one
        of them fails (:class:`~replaybank.views.base.CallbackView`)."""
        return (self.reward_fn,) if self.terminated_fn is None \
            else (self.reward_fn, self.terminated_fn)

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Every live step can be served: always None."""
        return None

    def lane_spans(self) -> dict[str, int]:
        """An n-step window reads up to ``n_step`` steps of its lane
        (:class:`~replaybank.views.base.LaneSpanView`)."""
        return self.inner.lane_spans() if isinstance(self.inner, LaneSpanView) else {}

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments (functions by name: ``None`` for a function
        that has none, e.g. a bound method; register it with ``rb.register_function``)."""
        reward = self._names[0] or function_name(self.reward_fn)
        term = None if self.terminated_fn is None \
            else self._names[1] or function_name(self.terminated_fn)
        return {"type": "her", "reward_fn": reward, "strategy": self.strategy, "k": self.k,
                "terminated_fn": term, "relabel_unfinished": self.relabel_unfinished,
                "n_step": self.n_step, "gamma": self.gamma,
                "achieved_key": self._keys[0], "desired_key": self._keys[1]}

    def nbytes(self) -> int:
        """Bytes of the episode index (built at the first sample)."""
        return 0 if self._index is None else self._index.nbytes()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the episode index is rebuilt from the table on use."""
        state = self.__dict__.copy()
        state["_index"] = None
        state["_indexed"] = None
        state["_checked"] = None
        return state


def function_values(got: Any, what: str, n: int, achieved: tuple[int, ...]
                    ) -> npt.NDArray[Any]:
    """What a HER function (``reward_fn``, ``terminated_fn``) returned for ``n`` goal
    pairs, on the host: ``[n]`` finite real numbers (bools, ints or floats, in their own
    dtype).

    Args:
        got: The function's result.
        what: ``"reward_fn"`` or ``"terminated_fn"``.
        n: Goal pairs it was called with.
        achieved: Shape of the achieved goals it got, for the message.

    Raises:
        DtypeError: Not real numbers (strings, also numbers as text, None, complex
            values), or NaN or infinite values.
        ShapeError: Other than ``n`` values.

    Example:
        >>> function_values([0.0, -1.0], "reward_fn", 2, (2, 3)).tolist()
        [0.0, -1.0]
    """
    label = f"HerView: {what} returned {describe(got)} for {n} goal pairs"
    values = "rewards" if what == "reward_fn" else "flags"
    arr = real_array(got, label, f"return {n} numbers, one per pair (e.g. a float32 "
                     f"array of {values})")
    if arr.size != n:
        raise ShapeError(count_message(what, arr.shape, n, achieved))
    arr = arr.reshape(n)
    if arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
        bad = arr[~np.isfinite(arr)][:4].tolist()
        raise DtypeError(f"{label}: values {bad} are NaN or infinite; return finite {values}")
    return arr


def count_message(what: str, shape: tuple[int, ...], n: int,
                  achieved: tuple[int, ...]) -> str:
    """The error for a HER function that returned other than one value per goal pair."""
    return (f"HerView: {what} returned shape {shape} for {n} goal pairs (achieved_goal "
            f"{achieved}); it must return one value per pair, vectorised over the leading "
            "dim")
