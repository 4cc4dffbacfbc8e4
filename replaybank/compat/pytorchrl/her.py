"""pytorchrl's ``HERBuffer``: hindsight copies of each finished episode, per env.

pytorchrl's hindsight API is a whole-transition rewrite: at the end of an episode,
``her_function(obs, rhs, obs2, rhs2, rew, initial_state, final_state) -> (obs, rhs, obs2,
rhs2, rew)`` is called for each of its transitions but the last (whose next observation
already belongs to the next episode in pytorchrl's vector envs), and the rewritten
transitions are stored as extra data. pytorchrl did it only when every env ended at the
same step (fixed episode lengths); here each env's episode is relabelled when *that* env's
``NextDone`` is set, so episodes of any length work with any number of envs.

A learner fed by several collectors (``insert_data_slice`` with their exports
interleaved) keeps each collector's running episodes apart: an episode is continued only
by a slice that continues it (:mod:`~replaybank.compat.pytorchrl.streams`: the slice
re-sends the stream's newest rows, or its first ``Observation`` is their
``NextObservation``), so ``initial_state``, ``final_state`` and the relabelled steps are
always one collector's one episode.

Storage: the core buffer has ``2 * num_envs`` lanes; lane ``e`` holds env ``e``'s real
steps and lane ``num_envs + e`` its hindsight copies (the last copy of an episode is
marked truncated, so n-step windows stop there and still bootstrap). Both are sampled
together, uniformly, by priority or by recency as the ERE/PER parameters say. The
``her_function`` sees arrays with an env dim of 1 (``[1, *shape]``), as pytorchrl's
single-env case passes them.

For goal-conditioned envs with dict observations, :class:`replaybank.HerReplayBuffer`
relabels at sample time instead (future/final/episode/random goals, nothing stored twice).

Example:
    >>> import torch
    >>> def her(obs, rhs, obs2, rhs2, rew, initial_state, final_state):
    ...     goal = final_state[:, :1]
    ...     return (np.concatenate([obs[:, :1], goal], 1), rhs,
    ...             np.concatenate([obs2[:, :1], goal], 1), rhs2,
    ...             (obs2[:, :1] == goal).astype(np.float32))
    >>> buf = HERBuffer(100, "cpu", None, None, None, her_function=her, seed=0)
    >>> lengths = [3, 5]   # env 0 ends every 3 steps, env 1 every 5
    >>> for t in range(15):
    ...     ends = torch.tensor([[float(t % n == n - 1)] for n in lengths])
    ...     buf.insert_transition({
    ...         "Observation": torch.tensor([[t % n, 9.0] for n in lengths]),
    ...         "Action": torch.zeros(2, 1), "Reward": torch.zeros(2, 1),
    ...         "NextObservation": torch.tensor([[t % n + 1, 9.0] for n in lengths]),
    ...         "Done": torch.zeros(2, 1), "NextDone": ends})
    >>> buf.relabelled   # (3 - 1) * 5 episodes of env 0, (5 - 1) * 3 of env 1
    22
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from replaybank.buffers.checked_call import check_call
from replaybank.compat.checks import check_int
from replaybank.compat.pytorchrl.buffers import EREBuffer
from replaybank.compat.pytorchrl.keys import (
    RHS,
    RHS2,
    to_numpy,
    tree_map,
)
from replaybank.compat.pytorchrl.storage import Sent
from replaybank.compat.pytorchrl.streams import Stream, Streams
from replaybank.errors import ArgumentError, ConfigError, ShapeError, describe
from replaybank.spec import UNSET, Spec, collect_fields

__all__ = ["HERBuffer", "identity_her"]

#: The core's standard fields (the rest of a recorded step are extras).
_STANDARD = ("obs", "action", "reward", "next_obs", "terminated")


def identity_her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
                 final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    """pytorchrl's default ``her_function``: the transition unchanged."""
    return o, rhs, o2, rhs2, r


class HERBuffer(EREBuffer):
    """Storage class for Off-Policy algorithms using HER, combinable with ERE, PER and
    n-step.

    Args:
        size: Storage capacity along time axis (rows per env, for the real steps and
            again for their hindsight copies).
        device: As :class:`~replaybank.compat.pytorchrl.ReplayBuffer`.
        actor: As :class:`~replaybank.compat.pytorchrl.ReplayBuffer`.
        algorithm: As :class:`~replaybank.compat.pytorchrl.ReplayBuffer`.
        envs: As :class:`~replaybank.compat.pytorchrl.ReplayBuffer`.
        her_function: ``(obs, rhs, obs2, rhs2, rew, initial_state, final_state) -> (obs,
            rhs, obs2, rhs2, rew)``, arrays ``[1, *shape]``; ``initial_state`` and
            ``final_state`` are the observations of the episode's first and last step.
            What it returns must keep the shapes it was given (``rew``: one number).
        n_step: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        epsilon: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        alpha: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        beta: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        default_error: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        eta: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        cmin: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.
        seed: As :class:`~replaybank.compat.pytorchrl.EREBuffer`.

    Raises:
        ArgumentError: ``her_function`` is not callable (or another argument is bad, as
            :class:`~replaybank.compat.pytorchrl.EREBuffer`).

    Example:
        >>> HERBuffer.create_factory(10)("cpu", None, None, None).her_function is identity_her
        True
    """

    _plans = True
    settable = EREBuffer.settable | {"her_function"}

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 her_function: Callable[..., Any] = identity_her, n_step: int | float = 1,
                 epsilon: float = 0.0, alpha: float = 0.0, beta: float = 1.0,
                 default_error: float = 1000000, eta: float = 1.0, cmin: int = 5000,
                 seed: int | np.random.Generator | None = None) -> None:
        if not callable(her_function):
            raise ArgumentError(f"{type(self).__name__}(her_function="
                                f"{describe(her_function)}): expected a function (obs, rhs, "
                                "obs2, rhs2, rew, initial_state, final_state) -> (obs, rhs, "
                                "obs2, rhs2, rew)")
        super().__init__(size, device, actor, algorithm, envs, n_step=n_step, epsilon=epsilon,
                         alpha=alpha, beta=beta, default_error=default_error, eta=eta,
                         cmin=cmin, seed=seed)
        self.her_function = her_function
        self.relabelled = 0  # hindsight transitions stored so far
        # the running episodes of each stream of continuing slices (one per collector)
        self._streams = Streams(keep_finished=self.recurrent_actor)

    @property
    def _lanes(self) -> int:
        return 2 * self._num_envs

    def _check_parameter(self, name: str, value: Any) -> Any:
        if name == "her_function" and not callable(value):
            raise ArgumentError(f"update_storage_parameter('her_function', "
                                f"{describe(value)}): expected a function (obs, rhs, obs2, "
                                "rhs2, rew, initial_state, final_state) -> (obs, rhs, obs2, "
                                "rhs2, rew)")
        return super()._check_parameter(name, value)

    def _cleared(self) -> None:
        """No episode is under way in any env (a new core buffer, or :meth:`reset`)."""
        self._streams.clear()

    def _stream_of(self, sent: Sent | None) -> tuple[Stream, int]:
        """The stream a write continues (a new one when it continues none), and how many
        leading rows of the write that stream holds already (the overlap a recurrent
        collector re-sends, when the storage kept it: another collector's rows came in
        between).

        A transition, the overlap :meth:`reset` puts back, a slice whose re-sent rows
        the storage dropped and a slice after the storage's own steps (as those rows
        added one by one) continue the rows at the write head. Any other slice
        continues the newest stream whose newest rows it re-sends, else the newest
        stream whose running episodes it continues (its first ``Observation`` is their
        last step's ``NextObservation``), else none."""
        head = self._streams.at(self._span()[1])
        if sent is None or sent.dropped or (head is not None and head.own):
            return head or Stream.new(self._num_envs), 0
        streams = self._streams.newest_first()
        if self.recurrent_actor:
            for stream in streams:
                held = self._resent(sent.data, stream.end)
                if held:
                    return stream, held
        for stream in streams:
            if self._follows(sent.data, stream.end, stream.running()):
                return stream, 0
        return Stream.new(self._num_envs), 0

    def _plan_insert(self, where: str, sample: Any, values: dict[str, Any],
                     steps: int | None, sent: Sent | None) -> Any:
        """The stream the write continues, each env's new steps, and the hindsight rows
        of the episodes this write ends (``her_function`` is called and its results
        checked now, before anything is written)."""
        n = self._num_envs
        stream, held = self._stream_of(sent)
        # a feed-forward actor's hidden states: pytorchrl's one zero row, whatever was sent
        rhs = {k: to_numpy(sample[k]) for k in (RHS, RHS2)
               if k in sample and self.recurrent_actor}
        pending: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        ended = [False] * n  # the env's running episode ended within this write
        writes: list[tuple[int, list[dict[str, Any]]]] = []
        for t in range(held, 1 if steps is None else steps):  # the stream's new steps
            row = values if steps is None else _at(values, t)
            hidden = rhs if steps is None else _at(rhs, t)
            for e in range(n):
                pending[e].append({**_row(row, e), **_row(hidden, e), **self._zeros})
            for e in np.flatnonzero(row["terminated"]).tolist():
                episode = pending[e] if ended[e] else stream.episodes[e] + pending[e]
                rows = self._relabel(where, episode)
                if rows:
                    writes.append((e, rows))
                pending[e], ended[e] = [], True
        own = sent is None  # the storage's own steps, not a slice's
        if not writes:
            return stream, own, pending, ended, []
        spec = self._spec_of(values, steps)
        return stream, own, pending, ended, [(e, self._hindsight(spec, e, rows))
                                             for e, rows in writes]

    def _after_insert(self, plan: Any) -> None:
        stream, own, pending, ended, writes = plan
        for e, steps in enumerate(pending):
            if ended[e]:
                stream.episodes[e] = steps
            else:
                stream.episodes[e].extend(steps)
        stream.own = own
        self._streams.wrote(stream, *self._span())
        for e, (fields, count) in writes:
            self._write_hindsight(e, fields, count)

    def _spec_of(self, values: dict[str, Any], steps: int | None) -> Spec:
        """The core's fields: the table's, or those the first write will set."""
        buf = self._core()
        if buf.allocated:
            return buf.table.spec
        extras = {k: v for k, v in values.items() if k not in _STANDARD}
        lead = (self._num_envs,) if steps is None else (steps, self._num_envs)
        fields = collect_fields(values["obs"], values["action"], values["reward"],
                                values["next_obs"], values["terminated"],
                                np.zeros(lead, dtype=bool), extras)
        return check_call(None, fields, steps is not None, self._env_ids, self._lanes).spec

    def copy_single_tensor(self, key: str, position: int) -> Any:
        """Generates a copy of tensor ``key`` at index ``position``: row ``position`` of
        the storage, every env, as pytorchrl's ``np.copy(data[key][position])``.

        Positions count the stored rows as :attr:`data` and :meth:`get_data_slice` do
        (0: the oldest row, ``-1``: the newest; pytorchrl's are raw ring positions),
        over the real steps (hindsight copies live in lanes of their own). The hidden
        states of a feed-forward actor are its single zero row at every position, as in
        pytorchrl.

        Args:
            key: A storage tensor the storage holds, e.g. ``"Observation"``.
            position: A stored row, ``-size <= position < size``.

        Returns:
            A float32 numpy copy ``[num_envs, ...]`` (a dict of them for a dict
            observation).

        Raises:
            ArgumentError: ``key`` is not a storage tensor the storage holds, or
                ``position`` is not an int.
            ConfigError: ``position`` is outside the stored rows.

        Example:
            >>> import torch
            >>> buf = HERBuffer(10, "cpu", None, None, None)
            >>> for t in range(3):
            ...     buf.insert_transition({
            ...         "Observation": torch.full((2, 1), t), "Action": torch.zeros(2, 1),
            ...         "Reward": torch.zeros(2, 1), "NextObservation": torch.full((2, 1), t + 1),
            ...         "Done": torch.zeros(2, 1), "NextDone": torch.zeros(2, 1)})
            >>> buf.copy_single_tensor("Observation", 1).tolist()
            [[1.0], [1.0]]
        """
        where = f"{type(self).__name__}.copy_single_tensor"
        pos = check_int(where, "position", position, None)
        held = [k for k, v in self._rows(0, 1).items() if v is not None]
        if not isinstance(key, str) or key not in held:
            raise ArgumentError(f"{where}(key={describe(key)}): not a storage tensor this "
                                f"storage holds; pass one of {held}")
        size = self.size
        if not -size <= pos < size:
            raise ConfigError(f"{where}(position={pos}): the storage holds {size} rows per "
                              f"env; pass a position in [{-size}, {size})")
        row = pos + size if pos < 0 else pos
        return tree_map(lambda v: v[0], self._rows(row, row + 1)[key])

    def handle_end_of_episode(self, env: int = 0) -> None:
        """At the end of env ``env``'s episode, generate its hindsight transitions (all
        but the last step's) and add them to its hindsight lane. The episode is the one
        running in the newest rows (those the next transition continues); a learner fed
        by several collectors relabels the others' episodes when their ``NextDone``
        arrives.

        Raises:
            ArgumentError, ConfigError: ``env`` is not an env of the storage.
            ShapeError: ``her_function`` changed a shape (nothing is changed).
        """
        where = f"{type(self).__name__}.handle_end_of_episode"
        e = self._env(where, env)
        oldest, written = self._span()
        stream = self._streams.at(written)
        if stream is None:  # no episode is running in the newest rows
            return
        rows = self._relabel(where, stream.episodes[e])
        hindsight = self._hindsight(self._core().table.spec, e, rows) if rows else None
        stream.episodes[e] = []
        self._streams.wrote(stream, oldest, written)
        if hindsight is not None:
            self._write_hindsight(e, *hindsight)

    def _env(self, where: str, env: Any) -> int:
        e = check_int(where, "env", env, None)
        if not 0 <= e < self._num_envs:
            raise ConfigError(f"{where}(env={e}): the storage holds {self._num_envs} envs; "
                              f"pass an env in [0, {self._num_envs})")
        return e

    def _relabel(self, where: str, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The hindsight rows of an episode's steps (all but the last), each checked to
        keep the shapes of the step it rewrites; nothing is stored."""
        if len(steps) < 2:
            return []
        initial_state = _copy(steps[0]["obs"])
        final_state = _copy(steps[-1]["obs"])
        rows: list[dict[str, Any]] = []
        for s in steps[:-1]:
            out = self.her_function(
                _copy(s["obs"]), _copy(s.get(RHS)), _copy(s["next_obs"]),
                _copy(s.get(RHS2)), _copy(s["reward"]).reshape(1, 1),
                initial_state, final_state)
            if not isinstance(out, (tuple, list)) or len(out) != 5:
                raise ShapeError(f"{where}: her_function returned {describe(out)}; expected "
                                 "a tuple (obs, rhs, obs2, rhs2, rew)")
            o, rhs, o2, rhs2, r = out
            row = dict(s)
            row.update(obs=_same_shape(where, "obs", to_numpy(o), s["obs"]),
                       next_obs=_same_shape(where, "obs2", to_numpy(o2), s["next_obs"]))
            rew = np.asarray(to_numpy(r))
            if rew.size != 1 or rew.dtype.kind not in "biuf":
                raise ShapeError(f"{where}: her_function returned rew={describe(rew)}; "
                                 "expected one number ([1, 1])")
            row["reward"] = rew.astype(np.float32).reshape(1)
            for name, got in (("rhs", rhs), ("rhs2", rhs2)):
                if name in row:
                    row[name] = _same_shape(where, name, to_numpy(got), s[name])
            rows.append(row)
        return rows

    def _hindsight(self, spec: Spec, env: int,
                   rows: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
        """An episode's hindsight rows ``[m]`` as the fields of one core extend to lane
        ``num_envs + env``, checked against the core's fields ``spec`` (nothing is
        written), and ``m``."""
        stored = {name: _stack([r[name] for r in rows]) for name in rows[0]
                  if name not in (RHS, RHS2)}
        truncated = np.zeros((len(rows), 1), dtype=bool)
        truncated[-1] = True  # the copy ends here: windows stop, bootstrapping does not
        extras = {k: v for k, v in stored.items() if k not in _STANDARD}
        fields = collect_fields(stored["obs"], stored.get("action", UNSET),
                                stored["reward"], stored["next_obs"], stored["terminated"],
                                truncated, extras)
        check_call(spec, fields, True, [self._num_envs + env], self._lanes)
        return fields, len(rows)

    def _write_hindsight(self, env: int, fields: dict[str, Any], count: int) -> None:
        """Write an episode's ``count`` hindsight rows (checked :meth:`_hindsight`
        fields) to lane ``num_envs + env``."""
        self._core().extend(env_ids=[self._num_envs + env], priority=self._priority,
                            **fields)
        self.relabelled += count


def _at(value: Any, t: int) -> Any:
    """Step ``t`` of a value ``[steps, ...]`` (of each entry of a dict)."""
    return tree_map(lambda v: v[t], value)


def _same_shape(where: str, name: str, got: Any, given: Any) -> Any:
    """``her_function``'s ``name`` (an array or dict of them) keeps the shapes of what it
    was given."""
    if isinstance(given, dict):
        if not isinstance(got, Mapping) or set(got) != set(given):
            raise ShapeError(f"{where}: her_function returned {name}={describe(got)}; "
                             f"expected a dict with the keys {sorted(given)}")
        return {k: _same_shape(where, f"{name}[{k!r}]", to_numpy(got[k]), given[k])
                for k in given}
    got = np.asarray(got)
    if got.shape != np.shape(given):
        raise ShapeError(f"{where}: her_function returned {name}={describe(got)}; expected "
                         f"the shape it was given, {tuple(np.shape(given))}")
    return got


def _row(value: Any, e: int) -> Any:
    """Env ``e``'s value ``[1, *shape]`` (a copy; of each entry of a dict)."""
    return tree_map(lambda v: np.array(v[e:e + 1]), value)


def _copy(value: Any) -> Any:
    """A copy of a value (of each entry of a dict; None stays None)."""
    return None if value is None else tree_map(np.array, value)


def _stack(values: list[Any]) -> Any:
    """Per-step values ``[1, *shape]`` as one extend argument ``[m, 1, *shape]``."""
    if isinstance(values[0], dict):
        return {k: _stack([v[k] for v in values]) for k in values[0]}
    return np.stack(values)
