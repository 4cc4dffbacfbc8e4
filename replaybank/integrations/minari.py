"""Offline datasets: Minari in (:func:`from_minari`) and out (:func:`to_minari`).

A Minari episode of ``n`` steps holds ``n + 1`` observations, ``n`` actions, rewards,
terminations and truncations. :func:`from_minari` writes it as ``n`` transitions
``(obs[:-1], action, reward, obs[1:], terminated, truncated)``: each observation is stored
once and the final observation is kept exactly (also for a truncated episode), with the
termination and truncation flags as the dataset has them. :func:`to_minari` does the
reverse: every *complete* episode a buffer holds (its first step and its ended last step
both still stored) becomes one Minari episode whose last observation is the exact
``next_obs`` of its last step.

Lanes. With ``L`` lanes, :func:`from_minari` writes episode ``i`` (in dataset order) to lane
``i % L`` (round robin), and :func:`to_minari` lists the complete episodes by their rank
in their lane, lanes in order at each rank (the 1st episode of lanes 0, 1, ..., L - 1, then
the 2nd of each, ...): a dataset loaded into any number of lanes and written back keeps its
episode order.

Which stored episodes are complete. A lane's oldest stored step starts an episode only when
it is the first step written to the lane, ever or since its last ``clear()`` (nothing was
evicted before it);
after that, an episode starts after each step that ended one (terminated or truncated), and
after a step whose next observation was not the next step's observation (data that did not
continue: an episode cut without a flag). An episode is complete when it ends with a
terminated or truncated step. Running episodes and the partial episode left by eviction are
not written. Extra stored fields (``log_prob``, hidden states, ...) are not written either.

Example:
    >>> import warnings
    >>> import pytest
    >>> minari = pytest.importorskip("minari")
    >>> import gymnasium as gym
    >>> from minari import DataCollector
    >>> getfixture("monkeypatch").setenv("MINARI_DATASETS_PATH",
    ...                                  str(getfixture("tmp_path")))
    >>> env = DataCollector(gym.make("CartPole-v1", max_episode_steps=20))
    >>> for seed in range(3):
    ...     _ = env.reset(seed=seed)
    ...     done = False
    ...     while not done:
    ...         *_, term, trunc, _ = env.step(env.action_space.sample())
    ...         done = term or trunc
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     ds = env.create_dataset("cartpole/doc-v0", algorithm_name="random")
    >>> buf = from_minari(ds, num_envs=1)
    >>> len(buf) == ds.total_steps, buf.episodes_seen
    (True, 3)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     out = to_minari(buf, "cartpole/doc-copy-v0", env="CartPole-v1")
    >>> out.total_episodes, out.total_steps == ds.total_steps
    (3, True)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from replaybank.buffers.replay import ReplayBuffer
from replaybank.errors import (
    ConfigError,
    EmptyBufferError,
    MissingDependencyError,
    SpecError,
    describe,
)
from replaybank.integrations.spaces import spec_from_spaces, to_fields
from replaybank.spec import FieldSpec, Spec

if TYPE_CHECKING:  # the type of ReplayBuffer.table, for annotations only
    from replaybank.storage.table import StepTable

__all__ = ["MinariBuffer", "from_minari", "to_minari"]

IntArray = npt.NDArray[np.int64]
Fields = dict[str, Any]  # flat field name ("obs/observation", "action") -> [n, *shape]
_FLAGS = ("reward", "terminated", "truncated")


class MinariBuffer(Protocol):
    """What :func:`from_minari` and :func:`to_minari` use of a buffer (a
    :class:`~replaybank.ReplayBuffer`, :class:`~replaybank.HerReplayBuffer` or
    :class:`~replaybank.SequenceReplayBuffer`)."""

    @property
    def num_envs(self) -> int: ...

    @property
    def spec(self) -> Spec | None: ...

    @property
    def table(self) -> StepTable: ...

    def extend(self, **fields: Any) -> None: ...


# ---------------------------------------------------------------------------- helpers
def _import(module: str) -> Any:
    """Import minari (or a part of it) on first use, so that this module imports (and its
    doctests collect) without it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module} is required to read and write Minari datasets but is not installed; "
            'run: pip install "minari[create,hdf5]"'
        ) from exc


def _dataset(dataset: Any) -> Any:
    """A MinariDataset from a dataset or a dataset id (loaded from local storage)."""
    minari = _import("minari")
    if isinstance(dataset, str):
        _check_id("from_minari", "dataset", dataset)
        if not (_datasets_root() / dataset / "data").is_dir():
            raise ConfigError(
                f"from_minari(dataset={dataset!r}): no such dataset under {_datasets_root()} "
                "(MINARI_DATASETS_PATH, else ~/.minari/datasets); download a remote one "
                "first (minari.download_dataset(id)), or check the id with "
                "minari.list_local_datasets()")
        return minari.load_dataset(dataset)
    if not isinstance(dataset, minari.MinariDataset):
        raise ConfigError(f"from_minari(dataset={describe(dataset)}): pass a "
                          "minari.MinariDataset or the id of a local dataset")
    return dataset


#: A Minari dataset id: ``(namespace/)name-vN`` (the namespace may hold ``/``).
_DATASET_ID = re.compile(r"(?:[-\w][-\w/]*[-\w]/)?[-\w]+?-v\d+")


def _check_id(where: str, arg: str, dataset_id: Any) -> None:
    """Raise a ConfigError unless ``dataset_id`` (argument ``arg`` of ``where``) is a
    Minari dataset id."""
    if not isinstance(dataset_id, str) or not _DATASET_ID.fullmatch(dataset_id):
        raise ConfigError(
            f"{where}({arg}={describe(dataset_id)}): not a Minari dataset id; ids read "
            "'namespace/name-vN' (letters, digits, '-', '_'; the namespace is optional and "
            "may hold '/'), e.g. 'cartpole/random-v0'")


def _datasets_root() -> Path:
    """Where Minari keeps local datasets: ``$MINARI_DATASETS_PATH``, else
    ``~/.minari/datasets``."""
    root = os.environ.get("MINARI_DATASETS_PATH")
    return Path(root) if root is not None else Path.home() / ".minari" / "datasets"


def _episode_indices(given: Iterable[int], held: Any) -> IntArray:
    """``given`` (``from_minari``'s ``episode_indices``) as an int64 array, checked: the
    ids of episodes the dataset holds (``held``)."""
    try:
        arr = np.asarray(list(given))
    except TypeError as exc:
        raise ConfigError(f"from_minari(episode_indices={describe(given)}): pass an "
                          "iterable of episode ids (ints)") from exc
    if (arr.size and arr.dtype.kind not in "iu") or arr.ndim > 1:
        raise ConfigError(f"from_minari(episode_indices={describe(given)}): episode ids "
                          f"are ints; got {arr.dtype} values of shape {arr.shape}")
    arr = arr.astype(np.int64).reshape(-1)
    missing = arr[~np.isin(arr, held)]
    if missing.size:
        held = np.asarray(held)
        where = (f"ids {int(held.min())}..{int(held.max())}" if held.size
                 and np.array_equal(held, np.arange(held.min(), held.max() + 1)) else
                 f"{held.size} episodes (dataset.episode_indices)")
        raise ConfigError(f"from_minari(episode_indices=...): episode {int(missing[0])} is "
                          f"not in the dataset, which holds {where}; pass ids it holds")
    return arr


def _flatten(tree: Any, prefix: str, out: Fields) -> Fields:
    """Nested dicts of arrays -> ``{"prefix/key/...": array}``."""
    if isinstance(tree, Mapping):
        for key, sub in tree.items():
            _flatten(sub, f"{prefix}/{key}", out)
    else:
        out[prefix] = tree
    return out


def _nest(flat: Mapping[str, Any], prefix: str) -> Any:
    """The inverse of :func:`_flatten` for the names under ``prefix``."""
    if prefix in flat:
        return flat[prefix]
    out: dict[str, Any] = {}
    start = prefix + "/"
    for name, value in flat.items():
        if name.startswith(start):
            node = out
            *parents, leaf = name[len(start):].split("/")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    return out


def _space_value(space: Any, flat: Mapping[str, Any], name: str) -> Any:
    """Arrays of the flat fields under ``name`` arranged as Minari stores a ``space``
    (a dict for Dict spaces, a tuple for Tuple spaces)."""
    gym = _import("gymnasium")
    if isinstance(space, gym.spaces.Dict):
        return {k: _space_value(sub, flat, f"{name}/{k}") for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_space_value(sub, flat, f"{name}/{i}") for i, sub in enumerate(space.spaces))
    return flat[name]


#: What :func:`_check_spec` names the expected spec after, and the fix it offers, by caller.
_FROM_DATASET = ("the dataset", "build the buffer with the dataset's spec "
                 "(from_minari(dataset) with buffer=None does)")
_FROM_SPACES = ("the spaces", "pass the env the data came from (env=), or its "
                "observation_space= and action_space=")


def _check_spec(stored: Spec, expected: Spec, where: str, extras: bool,
                source: tuple[str, str]) -> None:
    """Raise a SpecError unless ``stored`` has the obs/action fields of ``expected`` with
    the same shapes, and the flags (and no other field unless ``extras``). ``source``:
    what ``expected`` came from and the fix (:data:`_FROM_DATASET`, :data:`_FROM_SPACES`)."""
    them, fix = source
    data = [n for n in expected if n not in _FLAGS]
    extra = [] if extras else [n for n in stored if n not in expected]
    missing = [n for n in expected if n not in stored]
    if extra or missing:
        raise SpecError(
            f"{where}: the buffer's fields {sorted(stored)} do not match those of {them} "
            f"{sorted(expected)} (missing: {missing}, not in {them}: {extra}); {fix}"
        )
    for n in data:
        if stored[n].shape != expected[n].shape:
            raise SpecError(
                f"{where}: field {n!r} has shape {stored[n].shape} in the buffer but "
                f"{expected[n].shape} in {them}; {fix}"
            )


def _cast(name: str, value: Any, field: FieldSpec, episode: int) -> Any:
    """``value`` as ``field.dtype`` (a same-kind cast, e.g. float64 rewards to float32)."""
    arr = np.asarray(value)
    if arr.dtype == field.dtype:
        return arr
    if not np.can_cast(arr.dtype, field.dtype, casting="same_kind"):
        raise SpecError(
            f"from_minari: episode {episode} field {name!r} holds {arr.dtype} values but the "
            f"buffer stores {field.dtype}; build the buffer with the dataset's spec"
        )
    return arr.astype(field.dtype)


def _episode_fields(ep: Any, obs_space: Any, act_space: Any, spec: Spec | None) -> Fields:
    """One Minari episode as flat transition fields ``[n, *shape]`` (``next_obs...`` too)."""
    n = len(ep.rewards)
    obs = _flatten(to_fields(obs_space, ep.observations), "obs", {})
    act = _flatten(to_fields(act_space, ep.actions), "action", {})
    for name, arr in (*obs.items(), *act.items()):
        want = n + 1 if name.startswith("obs") else n
        if len(arr) != want:
            raise SpecError(
                f"from_minari: episode {ep.id} has {n} rewards but {len(arr)} entries of "
                f"{name!r}; a Minari episode of n steps has n + 1 observations and n actions"
            )
    out: Fields = {}
    for name, arr in obs.items():
        out[name] = arr[:-1]
        out["next_" + name] = arr[1:]
    out.update(act)
    out["reward"] = np.asarray(ep.rewards)
    out["terminated"] = np.asarray(ep.terminations, dtype=bool)
    out["truncated"] = np.asarray(ep.truncations, dtype=bool)
    if spec is not None:
        for name, value in out.items():
            field = spec[name[5:] if name.startswith("next_") else name]
            out[name] = _cast(name, value, field, int(ep.id))
    return out


def _extend(buffer: MinariBuffer, parts: list[Fields], lane: int | None) -> None:
    """Write the concatenated episodes ``parts`` to ``lane`` (None: the only lane)."""
    flat = {name: np.concatenate([p[name] for p in parts]) if len(parts) > 1
            else parts[0][name] for name in parts[0]}
    if lane is not None:  # [n, 1, *shape] for env_ids=[lane]
        flat = {name: value[:, None] for name, value in flat.items()}
    where: dict[str, Any] = {"env_ids": [lane]} if lane is not None else {}
    buffer.extend(obs=_nest(flat, "obs"), next_obs=_nest(flat, "next_obs"),
                  action=_nest(flat, "action"), reward=flat["reward"],
                  terminated=flat["terminated"], truncated=flat["truncated"], **where)


# ---------------------------------------------------------------------------- in
def from_minari(dataset: Any, buffer: MinariBuffer | None = None, *, num_envs: int | None = None,
                capacity: int | None = None, seed: int | np.random.Generator | None = None,
                episode_indices: Iterable[int] | None = None, reward_dtype: Any = None,
                chunk_steps: int = 65_536, **buffer_kwargs: Any) -> Any:
    """Fill a buffer with a Minari dataset, episode by episode.

    Each episode of ``n`` steps becomes ``n`` transitions with ``next_obs`` the exact next
    observation (the true final one at the end) and the dataset's terminations and
    truncations. Episode ``i`` goes to lane ``i % num_envs``; a lane's episodes are written
    with one ``extend`` per ``chunk_steps`` steps.

    Args:
        dataset: A ``minari.MinariDataset`` or the id of a local dataset.
        buffer: The buffer to fill (any type with ``extend``: ReplayBuffer, HerReplayBuffer
            for a goal-conditioned dataset, SequenceReplayBuffer, ...). Its spec, when set,
            must have the dataset's observation and action fields with the same shapes;
            values are cast to its dtypes. None: a new :class:`~replaybank.ReplayBuffer`
            with the spec of the dataset's spaces.
        num_envs: Lanes of the new buffer (default 1); with ``buffer``, None or its lanes.
        capacity: Capacity of the new buffer. None: room for every episode (the steps of
            the fullest lane times ``num_envs``).
        seed: Sampling seed of the new buffer.
        episode_indices: The episodes to load, in this order (default: all).
        reward_dtype: Reward dtype of the new buffer. None: the dataset's (float64 in
            datasets recorded by Minari's DataCollector), so a round trip is exact; pass
            ``np.float32`` to halve the reward memory.
        chunk_steps: Steps gathered per ``extend`` call of a lane.
        **buffer_kwargs: Further arguments of the new ReplayBuffer (``n_step``,
            ``sampler``, ``storage``, ...).

    Returns:
        The filled buffer (``buffer`` itself when given). When the data do not fit, a
        lane keeps its newest steps, as any ring does.

    Raises:
        SpecError: The buffer's fields or shapes do not match the dataset's spaces, or an
            episode's lengths are inconsistent.
        ConfigError: A bad argument (``num_envs`` that differs from the buffer's, buffer
            arguments given with a buffer, a non-dataset, the id of no local dataset,
            ``episode_indices`` the dataset does not hold).

    Example:
        See the module docstring.
    """
    ds = _dataset(dataset)
    obs_space, act_space = ds.observation_space, ds.action_space
    expected = spec_from_spaces(obs_space, act_space)
    indices = np.asarray(ds.episode_indices, np.int64) if episode_indices is None \
        else _episode_indices(episode_indices, ds.episode_indices)
    if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
        raise ConfigError(f"from_minari(chunk_steps={chunk_steps!r}): must be an int >= 1")
    if buffer is None:
        lanes = 1 if num_envs is None else num_envs
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise ConfigError(f"from_minari(num_envs={num_envs!r}): must be an int >= 1")
        if capacity is None:
            lengths = np.array([int(m["total_steps"]) for m in
                                ds.storage.get_episode_metadata(indices.tolist())], np.int64)
            per_lane = np.bincount(np.arange(len(lengths)) % lanes, weights=lengths,
                                   minlength=lanes)
            capacity = max(1, int(per_lane.max(initial=0))) * lanes
        if reward_dtype is None:
            reward_dtype = np.float32
            if len(indices):
                first = next(iter(ds.storage.get_episodes([int(indices[0])])))
                reward_dtype = np.asarray(first["rewards"]).dtype
        fields = [f if f.name != "reward" else FieldSpec("reward", (), np.dtype(reward_dtype))
                  for f in expected.values()]
        buffer = ReplayBuffer(capacity, num_envs=lanes, seed=seed, spec=Spec(fields),
                              **buffer_kwargs)
    else:
        given = {k: v for k, v in (("capacity", capacity), ("seed", seed),
                                   ("reward_dtype", reward_dtype)) if v is not None}
        given.update(buffer_kwargs)
        if given:
            raise ConfigError(f"from_minari(buffer=..., {', '.join(given)}=...): these build a "
                              "new buffer; pass them to the buffer you give, or buffer=None")
        lanes = buffer.num_envs
        if num_envs is not None and num_envs != lanes:
            raise ConfigError(f"from_minari(num_envs={num_envs!r}): the buffer has {lanes} "
                              "lanes; leave num_envs out or pass the buffer's")
        if buffer.spec is not None:
            _check_spec(buffer.spec, expected, "from_minari", extras=False,
                        source=_FROM_DATASET)
    spec = buffer.spec
    pending: list[list[Fields]] = [[] for _ in range(lanes)]
    sizes = [0] * lanes
    for i, ep in enumerate(ds.iterate_episodes(indices.tolist())):
        lane = i % lanes
        pending[lane].append(_episode_fields(ep, obs_space, act_space, spec))
        sizes[lane] += len(ep.rewards)
        if sizes[lane] >= chunk_steps:
            _extend(buffer, pending[lane], lane if lanes > 1 else None)
            spec = buffer.spec
            pending[lane], sizes[lane] = [], 0
    for lane in range(lanes):
        if pending[lane]:
            _extend(buffer, pending[lane], lane if lanes > 1 else None)
    return buffer


# ---------------------------------------------------------------------------- out
def _lane_episodes(table: StepTable, lane: int) -> list[Fields]:
    """The complete episodes stored in ``lane``, oldest first, as flat fields with
    ``obs...`` of length ``n + 1`` (the last one the exact final observation)."""
    written, count = int(table.written[lane]), int(table.counts[lane])
    if count == 0:
        return []
    keys: IntArray = np.arange(written - count, written, dtype=np.int64) * table.lanes + lane
    steps = table.gather_transitions(keys)  # {name: [count, *shape]}, next_<obs> too
    done = np.asarray(steps["terminated"], bool) | np.asarray(steps["truncated"], bool)
    cut = np.asarray(table.is_boundary(keys), bool) & ~done  # data did not continue
    ends = np.flatnonzero(done | cut)  # [e]
    starts = np.concatenate([[0], ends[:-1] + 1])
    # the lane's oldest step starts an episode only when it is its first step ever, or
    # the first after its last clear() (as in a fresh buffer, the steps before it do not
    # exist); else the steps before it were evicted
    known = np.ones(len(ends), bool)
    if len(known) and written - count != int(table.cleared[lane]):
        known[0] = False
    keep = known & done[ends]  # started and ended in the stored steps
    episodes = []
    for s, e in zip(starts[keep].tolist(), ends[keep].tolist(), strict=True):
        ep: Fields = {}
        for name in table.spec:
            if name in table.obs_fields:
                ep[name] = np.concatenate([steps[name][s:e + 1], steps["next_" + name][e:e + 1]])
            else:
                ep[name] = steps[name][s:e + 1]
        episodes.append(ep)
    return episodes


def _episodes(table: StepTable) -> Iterator[Fields]:
    """Complete episodes of every lane, by rank in their lane, lanes in order per rank."""
    per_lane = [_lane_episodes(table, lane) for lane in range(table.lanes)]
    for rank in range(max((len(e) for e in per_lane), default=0)):
        for eps in per_lane:
            if rank < len(eps):
                yield eps[rank]


def to_minari(buffer: MinariBuffer, dataset_id: str, *, env: Any = None,
              observation_space: Any = None, action_space: Any = None,
              **dataset_kwargs: Any) -> Any:
    """Write the complete episodes of a buffer as a new Minari dataset.

    Each complete episode (see the module docstring) of ``n`` stored steps becomes a Minari
    episode with ``n + 1`` observations (the last one its exact final observation), ``n``
    actions, rewards, terminations and truncations. Written with
    ``minari.create_dataset_from_buffers`` into ``MINARI_DATASETS_PATH``.

    Args:
        buffer: A ReplayBuffer, HerReplayBuffer or SequenceReplayBuffer storing transitions.
        dataset_id: Id of the new dataset (``namespace/env_name/dataset_name-vN``); it
            must not exist yet.
        env: The env the data came from (an id, ``EnvSpec`` or env), recorded in the
            dataset; its spaces are used unless given.
        observation_space: The observation space (needed when ``env`` is None).
        action_space: The action space (needed when ``env`` is None).
        **dataset_kwargs: Passed to ``minari.create_dataset_from_buffers``
            (``algorithm_name``, ``author``, ``author_email``, ``code_permalink``,
            ``description``, ``eval_env``, ``ref_min_score``, ``data_format``, ...).

    Returns:
        The new ``minari.MinariDataset``.

    Raises:
        SpecError: The buffer's fields do not match the spaces, or it stores rows.
        ConfigError: Neither ``env`` nor both spaces given; ``dataset_id`` is not a Minari
            id (``namespace/name-vN``) or names a dataset that exists.
        EmptyBufferError: The buffer holds no complete episode (nothing is written).

    Example:
        See the module docstring.
    """
    gym, minari = _import("gymnasium"), _import("minari")
    episode_buffer = _import("minari.data_collector").EpisodeBuffer
    _check_id("to_minari", "dataset_id", dataset_id)
    if (_datasets_root() / dataset_id).exists():
        raise ConfigError(
            f"to_minari(dataset_id={dataset_id!r}): a dataset with this id exists under "
            f"{_datasets_root()}; pick another name or version, or delete it first "
            "(minari.delete_dataset(id))")
    table = buffer.table
    if not table.obs_fields:
        raise SpecError("to_minari: the buffer stores rows (next_obs=False), not transitions; "
                        "Minari episodes need each step's next observation")
    if observation_space is None or action_space is None:
        if env is None:
            raise ConfigError("to_minari(env=None): pass the env (an id, EnvSpec or env) "
                              "or both observation_space= and action_space=")
        made = env if isinstance(env, gym.Env) else gym.make(env)
        try:
            if observation_space is None:
                observation_space = made.observation_space
            if action_space is None:
                action_space = made.action_space
        finally:
            if made is not env:
                made.close()
    expected = spec_from_spaces(observation_space, action_space)
    _check_spec(table.spec, expected, "to_minari", extras=True, source=_FROM_SPACES)
    episodes = [
        episode_buffer(
            observations=_space_value(observation_space, ep, "obs"),
            actions=_space_value(action_space, ep, "action"),
            rewards=ep["reward"], terminations=ep["terminated"], truncations=ep["truncated"],
            infos={})
        for ep in _episodes(table)
    ]
    if not episodes:
        raise EmptyBufferError(
            f"to_minari: the buffer holds no complete episode ({int(table.counts.sum())} steps "
            "stored; "
            "an episode is written when its first step is still stored and its last step "
            "is terminated or truncated); collect until an episode ends")
    return minari.create_dataset_from_buffers(
        dataset_id, episodes, env=env, observation_space=observation_space,
        action_space=action_space, **dataset_kwargs)
