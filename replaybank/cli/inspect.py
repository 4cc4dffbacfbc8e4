"""``replaybank inspect PATH``: what a saved or disk-backed buffer holds.

``PATH`` is a checkpoint directory (``rb.save``: ``<prefix>metadata.json`` +
``<prefix>state.safetensors``, loaded and verified exactly as ``rb.load`` does, so a
state file whose manifest is missing or from another save is recovered with load's
warning) or a memmap buffer directory
(``storage="memmap"``: ``replaybank_memmap.json``), opened read-only (``mode="r"``: no
writer lock is taken and the files are mapped lazily, so a process writing the buffer
keeps working). The summary (:func:`summarize`) has the buffer type, fields (shape,
dtype, bytes), capacity, fill, lanes, episodes, episode return and length statistics
(per complete episode, from the stored rewards and episode ends), priority statistics
(prioritized samplers), data age per lane, and disk and memory size. It prints as a
table, or as JSON with ``--json``; ``--plot out.png`` draws histograms of episode returns
and lengths, stored priorities and the age of sampled data. Arguments are checked before
anything is read or printed (:mod:`replaybank.cli.args`): a ``--plot`` file in a missing or
unwritable directory, or of a format matplotlib cannot write, and a negative ``--draws``
are usage errors (status 2); a plot that still fails to write (a full disk) exits with
status 2 and the fix after the summary. Where ``PATH`` holds something else a user saves,
the error (status 2) says how to inspect it: a checkpoint saved with another ``prefix``
(``--prefix``), a ``ReplayService`` checkpoint (one of its ``shard-NNN`` folders), the
velora front end's own ``save`` (velora's format: load it, ``rb.save(buf.core, DIR)``).

Inspection never runs code named in the files: a hindsight buffer's ``reward_fn`` and
``terminated_fn`` are replaced by a stub (nothing is relabelled; ages are drawn from the
sampler, not through the view); the view's config shows them as the files name them.

JSON keys (``"format": "replaybank.inspect"``, ``"version": 1``; statistics are
``{"count", "nonfinite", "mean", "std", "min", "max"}``, or null when there is nothing to
count: ``nonfinite`` counts the NaN and infinite values (a stored NaN reward makes its
episode's return NaN), which mean, std, min, max and the plot's histograms leave out and
the table names, so the JSON never holds ``NaN`` or ``Infinity``; a key
that does not apply to the buffer type is null, and the table leaves its row out):

* ``path``, ``source`` (``"checkpoint"`` or ``"memmap"``), ``buffer_type``, ``storage``
  (``"numpy"`` for a rollout or path buffer, which keep numpy arrays)
* ``capacity`` (a rollout's ``num_steps x num_envs``), ``fill`` (live transitions; a
  rollout's stored steps, ``pos x num_envs``), ``fill_fraction``, ``lanes``,
  ``rows_per_lane``
* ``fields``: ``[{"name", "shape", "dtype", "bytes"}]`` (bytes of the stored array
  ``[rows_per_lane, lanes, *shape]``; empty before a buffer's first add)
* ``episodes``: ``{"ended", "ended_per_lane", "complete", "in_buffer"}``: episodes that
  ended since the buffer was built, per lane, those wholly in the buffer (their first and
  last step are live), and episode ends among the live steps; for a
  :class:`~replaybank.RolloutBuffer`, the ends among its stored steps (reset steps left
  out) and the episodes wholly in them. A
  :class:`~replaybank.SequenceReplayBuffer` is summarized from the replay buffer that
  stores its steps. Null where the buffer keeps no episode ends of its own (a
  :class:`~replaybank.multiagent.MultiAgentRolloutBuffer`'s joint steps: see ``agents``)
* ``returns``, ``lengths``: statistics over the complete episodes (returns: sums of the
  stored per-step ``reward``; null when the buffer has no scalar reward or no episode end)
* ``priorities``: ``{"count", "min", "mean", "max", "sum", "total"}`` of the stored
  priorities ``(p + eps) ** alpha`` of the live steps (``total``: the sampler's whole sum
  tree); null for samplers without priorities
* ``age``: ``[{"lane", "oldest", "newest", "count"}]``: per lane, the step numbers
  (counted from the lane's first step) of its oldest and newest live step
* ``sampled_age``: statistics of ``newest - step`` over ``draws`` keys drawn from the
  sampler with a fresh generator (the buffer's generator is not touched), with ``draws``
* ``sampler``, ``view``: their configs (null for a rollout)
* ``disk_bytes`` (files in ``PATH``), ``memory_bytes`` (the storage arrays: what the
  buffer takes in RAM once loaded), ``notes`` (warnings met while reading)
* ``agents`` (multi-agent buffers only): ``{agent: {...}}`` per-agent statistics of the
  stored steps (:mod:`replaybank.multiagent.summary`): ``fields`` (``[{"name", "core",
  "shape", "dtype", "bytes"}]``), ``active_steps``, ``active_per_lane``,
  ``active_fraction``, ``terminated``, ``truncated`` (the agent's ends), ``reward`` (per
  active step), ``episodes``, ``returns``, ``lengths`` (the agent's own whole episodes).
  The other keys describe the joint steps (for a
  :class:`~replaybank.multiagent.MultiAgentReplayBuffer`: the core's fields
  ``obs/<agent>``, ..., joint episodes and the joint reward; a
  :class:`~replaybank.multiagent.MultiAgentRolloutBuffer` has its sizes and fields only
  there)

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(8, seed=0)
    >>> for t in range(5):
    ...     buf.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.ones(2),
    ...             terminated=t == 2, truncated=False)
    >>> d = tempfile.mkdtemp()
    >>> _ = rb.save(buf, d)
    >>> s = summarize(d)
    >>> s.summary["fill"], s.summary["episodes"]["complete"], s.summary["returns"]["mean"]
    (5, 1, 3.0)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.buffers.replay import ReplayBuffer
from replaybank.cli.args import non_negative_int, writable_file
from replaybank.compat.base import FrontEnd
from replaybank.distributed.checkpoint import FORMAT as SERVICE_FORMAT
from replaybank.distributed.checkpoint import MANIFEST as SERVICE_MANIFEST
from replaybank.errors import (
    CheckpointError,
    ConfigError,
    ReplayBankError,
    os_error_fix,
    require_extra,
)
from replaybank.io.manifest import checkpoint_paths
from replaybank.multiagent.layout import AgentLayout
from replaybank.multiagent.summary import AgentSteps, agent_summary, layout_fields, stats
from replaybank.ops import ring
from replaybank.ops.segments import segment_sums
from replaybank.samplers.base import LaneView, SampleResult
from replaybank.storage.backends.memmap import MANIFEST

__all__ = ["FORMAT", "Inspection", "build_parser", "check_plot_path", "episode_stats", "main",
           "open_buffer", "plot", "render_table", "summarize"]

FORMAT = "replaybank.inspect"
VERSION = 1
#: Keys drawn from the sampler for the age of sampled data.
DRAWS = 4096
#: Config entries that name functions: never resolved by inspect (no code from files runs).
_FUNCTION_KEYS = ("reward_fn", "terminated_fn")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@runtime_checkable
class _StoredPriorities(Protocol):
    """A sampler that keeps a priority per slot (a sum tree)."""

    @property
    def total(self) -> float:
        """Sum of every stored priority."""
        ...

    def priorities(self, slots: IntArray) -> FloatArray:
        """Stored priorities of ``slots``."""
        ...


@runtime_checkable
class _AgentReplay(Protocol):
    """Joint steps of named agents kept in a core :class:`ReplayBuffer`
    (:class:`~replaybank.multiagent.MultiAgentReplayBuffer`)."""

    buffer: ReplayBuffer

    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names."""
        ...

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields."""
        ...


@runtime_checkable
class _AgentRollout(Protocol):
    """A multi-agent rollout: time-aligned per-agent arrays
    (:class:`~replaybank.multiagent.MultiAgentRolloutBuffer`)."""

    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names."""
        ...

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields."""
        ...

    @property
    def data(self) -> dict[str, npt.NDArray[Any]]:
        """Stored fields ``[pos, num_envs, *shape]`` by flat name."""
        ...


#: Where each buffer keeps an agent's step outcomes (``<prefix>/<agent>``).
_REPLAY_NAMES = {"active": "active", "reward": "rewards", "terminated": "terminations",
                 "truncated": "truncations"}
_ROLLOUT_NAMES = {"active": "active", "reward": "reward", "terminated": "terminated",
                  "truncated": "truncated"}


@dataclass
class Inspection:
    """What :func:`summarize` found.

    Attributes:
        summary: The JSON-able summary (keys in the module docstring).
        arrays: Per-item values for plots: ``returns``, ``lengths`` (complete episodes),
            ``priorities`` (live steps), ``sampled_age`` (drawn keys).
    """

    summary: dict[str, Any]
    arrays: dict[str, npt.NDArray[Any]] = field(default_factory=dict)


def _no_relabel(*args: Any, **kwargs: Any) -> Any:
    """Stands in for a hindsight buffer's functions: inspection never relabels."""
    raise ReplayBankError("replaybank inspect opened this buffer without its reward "
                          "function; it cannot relabel goals")


#: How a config names the stand-in (``module:attr``): what a reopened view's config says.
_STUB_NAME = f"{__name__}:{_no_relabel.__qualname__}"


def _stubs(config: Any) -> dict[str, Any]:
    """Overrides that replace every function a config names with :func:`_no_relabel`."""
    if not isinstance(config, dict):
        return {}
    return {k: _no_relabel for k in _FUNCTION_KEYS
            if k in config and (k == "reward_fn" or config[k] is not None)}


def _as_saved(config: Any, saved: dict[str, Any]) -> Any:
    """``config`` (a sampler's or view's, nested ones included) with each stand-in for a
    function written back as the files name it (``saved``: key -> the saved value).

    Example:
        >>> _as_saved({"type": "her", "reward_fn": _STUB_NAME, "k": 4},
        ...           {"reward_fn": "goal_reward"})
        {'type': 'her', 'reward_fn': 'goal_reward', 'k': 4}
    """
    if isinstance(config, dict):
        return {k: saved.get(k) if k in _FUNCTION_KEYS and v == _STUB_NAME
                else _as_saved(v, saved) for k, v in config.items()}
    if isinstance(config, list):
        return [_as_saved(v, saved) for v in config]
    return config


def _source(path: Path, prefix: str) -> str:
    """``"checkpoint"`` where :func:`~replaybank.persist.load` would read one (either of
    its files is there: load recovers a state file whose manifest is missing, and names
    a missing state file), else ``"memmap"`` where a memmap buffer's manifest is."""
    meta, state = checkpoint_paths(path, prefix)
    if meta.exists() or state.exists():
        _refuse_velora(meta)
        return "checkpoint"
    if (path / MANIFEST).exists():
        return "memmap"
    if path.is_file():
        where = path.parent
        if _prefixes(where) or (where / MANIFEST).exists():
            raise CheckpointError(f"{path}: that is a file; pass the directory that holds "
                                  f"it: replaybank inspect {where}")
        raise CheckpointError(f"{path}: that is a file, not a checkpoint directory (rb.save) "
                              "or a memmap buffer directory; pass one of those")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    what = f"{path}: neither a checkpoint ({meta.name}) nor a memmap buffer ({MANIFEST}) is there"
    others = _prefixes(path)
    if others:  # rb.save(..., prefix=...) with another prefix
        raise CheckpointError(f"{what}; it holds a checkpoint saved with prefix "
                              f"{', '.join(map(repr, others))}: replaybank inspect {path} "
                              f"--prefix {others[0]}")
    shards = sorted(d.name for d in path.glob("shard-[0-9][0-9][0-9]") if d.is_dir())
    if _json_object(path / SERVICE_MANIFEST).get("format") == SERVICE_FORMAT and shards:
        raise CheckpointError(f"{what}; it is a ReplayService checkpoint of {len(shards)} "
                              "shards, each an rb.save checkpoint: inspect them one by one, "
                              f"e.g. replaybank inspect {path / shards[0]}")
    raise CheckpointError(what)


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` ({} when it is missing, unreadable or not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _prefixes(path: Path) -> list[str]:
    """Prefixes of the checkpoints (``<prefix>metadata.json`` beside
    ``<prefix>state.safetensors``) in the directory ``path``, sorted."""
    found = []
    for m in path.glob("*metadata.json"):
        prefix = m.name[: -len("metadata.json")]
        if checkpoint_paths(path, prefix)[1].exists():
            found.append(prefix)
    return sorted(found)


#: What the velora front end's ``save`` writes in ``<prefix>metadata.json`` (velora's
#: format, not a replaybank checkpoint manifest).
_VELORA_KEYS = frozenset({"capacity", "state_dim", "action_dim", "hidden_dim", "position",
                          "size"})


def _refuse_velora(meta: Path) -> None:
    """Name the way to inspect the velora front end's own files (``buf.save``): they have
    rb.save's file names but velora's format, which keeps no replaybank manifest.

    Raises:
        CheckpointError: ``meta`` is velora's metadata file.
    """
    data = _json_object(meta)
    if "format" not in data and set(data) >= _VELORA_KEYS:
        state = checkpoint_paths(meta.parent, meta.name[: -len("metadata.json")])[1]
        raise CheckpointError(
            f"{meta} is the velora front end's save (velora's format), not an rb.save "
            "checkpoint; load it and save its core: buf = replaybank.compat.velora."
            f"ReplayBuffer.load({str(state)!r}, json.load(open({str(meta)!r}))); "
            "rb.save(buf.core, DIR); then replaybank inspect DIR")


def open_buffer(path: Any, prefix: str = "buffer_") -> tuple[Any, str, list[str]]:
    """Load the checkpoint or open the memmap buffer (read-only) at ``path``.

    A checkpoint is read as :func:`replaybank.load` reads it
    (:func:`~replaybank.persist.load_overriding`): a state file whose
    ``<prefix>metadata.json`` is missing or belongs to another save is recovered from the
    manifest embedded in it, with load's warning (a note), and the functions to stub are
    those of the config load rebuilds.

    Returns:
        ``(buffer, source, notes)``: source is ``"checkpoint"`` or ``"memmap"``; notes are
        the warnings met (e.g. a memmap buffer with steps added after its last flush).

    Raises:
        CheckpointError: Nothing to inspect at ``path``, or damaged files.
    """
    buf, source, notes, _ = _open(Path(path), prefix)
    return buf, source, notes


def _open(p: Path, prefix: str) -> tuple[Any, str, list[str], dict[str, Any]]:
    """:func:`open_buffer`, and the function entries of the config it rebuilt from, as
    the files name them (what the stubs stand in for)."""
    source = _source(p, prefix)
    saved: dict[str, Any] = {}

    def stubs(config: Any) -> dict[str, Any]:
        over = _stubs(config)
        saved.update({k: config[k] for k in over})
        return over

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if source == "checkpoint":
            buf = persist.load_overriding(p, prefix, stubs)
        else:
            buf = persist.open(p, mode="r", **stubs(_owner_config(p)))
    return buf, source, [str(w.message) for w in caught], saved


def _owner_config(path: Path) -> Any:
    """The owner record of a memmap manifest (None when unreadable: open reports it)."""
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data.get("config") if isinstance(data, dict) else None


def episode_stats(reward: npt.NDArray[Any] | None, done: npt.NDArray[np.bool_],
                  first_is_start: bool) -> tuple[FloatArray, IntArray]:
    """Returns and lengths of the complete episodes of one lane's live steps.

    Args:
        reward: Per-step rewards in time order ``[n]`` (None: returns are not computed).
        done: Episode ends (terminated or truncated) in time order ``[n]``.
        first_is_start: The first step began an episode (the lane's first step, ever or
            since its last clear: nothing was evicted before it).

    Returns:
        ``(returns [m], lengths [m])`` of the episodes whose first and last step are live
        (``returns`` is empty when ``reward`` is None).

    Example:
        >>> r, n = episode_stats(np.ones(6), np.array([0, 1, 0, 0, 1, 0], bool), False)
        >>> r.tolist(), n.tolist()
        ([3.0], [3])
    """
    ends = np.flatnonzero(done).astype(np.int64)
    if ends.size == 0:
        return np.zeros(0), np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    if not first_is_start:
        starts, ends = starts[1:], ends[1:]
    lengths = ends - starts + 1
    if reward is None:
        return np.zeros(0), lengths
    # each episode summed on its own: a NaN reward spoils its episode's return only
    return segment_sums(reward, starts, ends), lengths


def _disk_bytes(path: Path, source: str, prefix: str) -> int:
    files = checkpoint_paths(path, prefix) if source == "checkpoint" else path.iterdir()
    return sum(f.stat().st_size for f in files if f.is_file())


def summarize(path: Any, prefix: str = "buffer_", draws: int = DRAWS,
              seed: int = 0) -> Inspection:
    """Inspect the checkpoint or memmap buffer at ``path`` (see the module docstring).

    Args:
        path: Checkpoint directory or memmap buffer directory.
        prefix: File name prefix of a checkpoint.
        draws: Keys drawn from the sampler for the age of sampled data.
        seed: Seed of the generator those keys are drawn with.

    Raises:
        CheckpointError: Nothing to inspect at ``path``, or damaged files.
    """
    p = Path(path)
    buf, source, notes, saved = _open(p, prefix)
    meta = buf.metadata()
    s: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "path": str(p), "source": source,
        "buffer_type": type(buf).__name__, "storage": meta.get("storage"),
        "capacity": _capacity(meta), "fill": len(buf),
    }
    inspection = Inspection(s)
    joint = buf if isinstance(buf, _AgentReplay) else None
    # a multi-agent buffer and a front end (SequenceReplayBuffer) keep their steps in a
    # core ReplayBuffer
    inner = joint.buffer if joint is not None else buf.buffer if isinstance(
        buf, FrontEnd) else None
    core = buf if isinstance(buf, ReplayBuffer) else inner if isinstance(
        inner, ReplayBuffer) else None
    if core is not None and core.spec is not None:
        _table_summary(core, s, inspection.arrays, draws, seed)
        if joint is not None:
            s["agents"] = _replay_agents(joint, core, s["age"])
    elif core is not None:
        _unwritten_summary(core, s)
    else:
        _metadata_summary(meta, s)
        if isinstance(buf, _AgentRollout):
            s["agents"] = _rollout_agents(buf)
            s["fill"] = int(meta.get("pos", 0)) * int(meta.get("num_envs", 1))
            notes.append(f"{type(buf).__name__} keeps no joint episodes: its metadata and "
                         "per-agent statistics are shown")
        elif isinstance(buf, _Rollout):
            _rollout_episodes(buf, s, inspection.arrays)
        else:
            notes.append(f"{type(buf).__name__} is not a step-table buffer: only its "
                         "metadata is shown")
    s["fill_fraction"] = s["fill"] / s["capacity"] if s["capacity"] else 0.0
    # the view reopened here holds stand-ins: report the functions the files name
    s["sampler"], s["view"] = _as_saved(s["sampler"], saved), _as_saved(s["view"], saved)
    s["disk_bytes"] = _disk_bytes(p, source, prefix)
    s["notes"] = notes
    return inspection


def _capacity(meta: dict[str, Any]) -> int:
    """Steps a buffer holds when full: ``capacity``, a rollout's ``num_steps`` (or
    ``n_steps``) x ``num_envs``, or a path buffer's ``size``.

    Example:
        >>> _capacity({"type": "RolloutBuffer", "num_steps": 4, "num_envs": 2, "pos": 4})
        8
    """
    if "capacity" in meta:
        return int(meta["capacity"])
    steps = meta.get("num_steps", meta.get("n_steps"))
    if steps is not None:
        return int(steps) * int(meta.get("num_envs", 1))
    return int(meta.get("size", 0))


def _unwritten_summary(core: ReplayBuffer, s: dict[str, Any]) -> None:
    """A replay buffer that was never written (no spec, no arrays yet): its lanes and
    components, nothing stored."""
    lanes = int(core.num_envs)
    ended = int(core.episodes_seen)
    s.update(lanes=lanes, rows_per_lane=int(core.capacity) // lanes, fields=[],
             episodes={"ended": ended, "ended_per_lane": [0] * lanes if not ended else None,
                       "complete": 0, "in_buffer": 0},
             returns=None, lengths=None,
             priorities=_no_priorities(core.sampler) if isinstance(
                 core.sampler, _StoredPriorities) else None,
             age=[{"lane": lane, "oldest": None, "newest": None, "count": 0}
                  for lane in range(lanes)],
             sampled_age=None, sampler=core.sampler.config(), view=core.view.config(),
             memory_bytes=int(core.nbytes()))


def _metadata_summary(meta: dict[str, Any], s: dict[str, Any]) -> None:
    """What a buffer without a step table says of itself: lanes, rows and fields (bytes of
    its ``[rows, lanes, *shape]`` arrays); no sampler, view or episodes (null)."""
    steps = meta.get("num_steps", meta.get("n_steps"))
    rows = steps if steps is not None else meta.get("size")
    lanes = meta.get("num_envs", 1 if rows is not None else None)
    spec = meta.get("spec") or {}

    def nbytes(f: dict[str, Any]) -> int | None:
        if rows is None or lanes is None:
            return None
        return int(np.dtype(f["dtype"]).itemsize * math.prod(f["shape"]) * rows * lanes)

    fields = [{"name": n, "shape": list(f["shape"]), "dtype": f["dtype"], "bytes": nbytes(f)}
              for n, f in spec.items()]
    sizes = [f["bytes"] for f in fields]
    s.update(lanes=lanes, rows_per_lane=rows, fields=fields, episodes=None, returns=None,
             lengths=None, priorities=None, age=[], sampled_age=None,
             sampler=meta.get("sampler"), view=meta.get("view"),
             memory_bytes=None if rows is None or None in sizes else sum(sizes))
    if s["storage"] is None and rows is not None:
        s["storage"] = "numpy"  # rollouts and path buffers keep numpy arrays


@runtime_checkable
class _Rollout(Protocol):
    """An on-policy rollout (:class:`~replaybank.RolloutBuffer`): ``[pos, num_envs]``
    steps, some masked as NEXT_STEP reset steps."""

    @property
    def data(self) -> dict[str, npt.NDArray[Any]]:
        """Stored fields ``[pos, num_envs, *shape]`` by flat name."""
        ...

    @property
    def valid(self) -> npt.NDArray[np.bool_]:
        """``[pos, num_envs]``: False at reset steps."""
        ...


@runtime_checkable
class _EpisodeStarts(Protocol):
    """A rollout that says where its envs' first steps begin episodes
    (:attr:`~replaybank.RolloutBuffer.first_done`)."""

    @property
    def first_done(self) -> npt.NDArray[np.bool_]:
        """``[num_envs]``: each env's step 0 begins an episode."""
        ...


def _rollout_episodes(buf: _Rollout, s: dict[str, Any],
                      arrays: dict[str, npt.NDArray[Any]]) -> None:
    """Episodes of a rollout's steps, env by env (reset steps left out): those that ended
    in it, and the returns and lengths of those wholly in it."""
    data = buf.data
    if not all(k in data for k in ("terminated", "truncated")):
        s["episodes"] = {"ended": 0, "ended_per_lane": [0] * int(s["lanes"] or 0),
                         "complete": 0, "in_buffer": 0}
        return
    valid = np.asarray(buf.valid, bool)
    done = np.asarray(data["terminated"], bool) | np.asarray(data["truncated"], bool)
    reward = data.get("reward")
    scalar = reward is not None and reward.ndim == 2
    # whether each env's first step began an episode (the rollout before it ended one)
    first = np.asarray(buf.first_done, bool) if isinstance(buf, _EpisodeStarts) else \
        np.zeros(done.shape[1], bool)
    rets: list[FloatArray] = []
    lens: list[IntArray] = []
    ended = []
    for env in range(done.shape[1]):
        keep = valid[:, env]
        d = done[keep, env]
        ended.append(int(d.sum()))
        r = np.asarray(reward[keep, env]) if scalar and reward is not None else None
        ret, n = episode_stats(r, d, first_is_start=bool(first[env]))
        rets.append(ret)
        lens.append(n)
    returns = np.concatenate(rets) if rets else np.zeros(0)
    lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    arrays.update(returns=returns, lengths=lengths)
    s["episodes"] = {"ended": sum(ended), "ended_per_lane": ended,
                     "complete": int(lengths.size), "in_buffer": sum(ended)}
    s["returns"] = stats(returns) if scalar else None
    s["lengths"] = stats(lengths)


def _table_summary(buf: ReplayBuffer, s: dict[str, Any], arrays: dict[str, npt.NDArray[Any]],
                   draws: int, seed: int) -> None:
    t = buf.table
    T, lanes = t.T, t.lanes  # noqa: N806
    # one snapshot of the counters: a live writer may move them while we read
    written = np.array(t.written, dtype=np.int64)
    counts = np.array(t.counts, dtype=np.int64)
    episodes = np.array(t.episodes, dtype=np.int64)
    cleared = np.array(t.cleared, dtype=np.int64)  # where each lane began after a clear
    s["fill"] = int(counts.sum())
    s["lanes"], s["rows_per_lane"] = lanes, T
    s["fields"] = [{"name": n, "shape": list(f.shape), "dtype": str(np.dtype(f.dtype)),
                    "bytes": int(t.arrays[n].nbytes)} for n, f in t.spec.items()]
    rewards = t.arrays.get("reward")
    scalar_reward = rewards is not None and rewards.ndim == 2
    flags = [t.arrays[n] for n in ("terminated", "truncated") if n in t.arrays]
    rets: list[FloatArray] = []
    lens: list[IntArray] = []
    in_buffer = 0
    age = []
    for lane in range(lanes):
        w, c = int(written[lane]), int(counts[lane])
        age.append({"lane": lane, "oldest": w - c if c else None,
                    "newest": w - 1 if c else None, "count": c})
        if not c or not flags:
            continue
        rows = np.arange(w - c, w, dtype=np.int64) % T  # [c], oldest first
        done = np.zeros(c, bool)
        for f in flags:
            done |= np.asarray(f[rows, lane], bool)
        in_buffer += int(done.sum())
        r = np.asarray(rewards[rows, lane]) if scalar_reward and rewards is not None else None
        ret, n = episode_stats(r, done, first_is_start=w - c == int(cleared[lane]))
        rets.append(ret)
        lens.append(n)
    returns = np.concatenate(rets) if rets else np.zeros(0)
    lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    arrays.update(returns=returns, lengths=lengths)
    s["episodes"] = {"ended": int(episodes.sum()), "ended_per_lane": episodes.tolist(),
                     "complete": int(lengths.size),
                     "in_buffer": in_buffer if flags else None}
    s["returns"] = stats(returns) if scalar_reward else None
    s["lengths"] = stats(lengths) if flags else None
    s["age"] = age
    s["priorities"] = _priorities(buf, written, counts, arrays)
    s["sampled_age"] = _sampled_age(buf, written, counts, draws, seed, arrays)
    s["sampler"], s["view"] = buf.sampler.config(), buf.view.config()
    s["memory_bytes"] = buf.nbytes()


def _replay_agents(buf: _AgentReplay, core: ReplayBuffer,
                   age: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-agent statistics of the live joint steps, lane by lane (``age``: the
    counters the table summary read)."""
    t = core.table

    def columns(name: str) -> list[npt.NDArray[Any]]:
        arr = t.arrays[name]
        return [np.asarray(arr[np.arange(a["oldest"], a["newest"] + 1) % t.T, a["lane"]])
                if a["count"] else np.zeros(0, arr.dtype) for a in age]

    first = [bool(a["count"]) and a["oldest"] == 0 for a in age]
    return {a: agent_summary(AgentSteps.of(columns, a, _REPLAY_NAMES), first,
                             layout_fields(buf.layout, a, lambda n: int(t.arrays[n].nbytes)))
            for a in buf.agents}


def _rollout_agents(buf: _AgentRollout) -> dict[str, Any]:
    """Per-agent statistics of a rollout's rows ``[0, pos)``, env by env."""
    data = buf.data

    def columns(name: str) -> list[npt.NDArray[Any]]:
        arr = data[name]
        return [np.asarray(arr[:, lane]) for lane in range(arr.shape[1])]

    def nbytes(name: str) -> int | None:
        return int(data[name].nbytes) if name in data else None

    if not data:
        return {a: agent_summary(AgentSteps([], [], [], []), [], layout_fields(
            buf.layout, a, nbytes)) for a in buf.agents}
    return {a: agent_summary(AgentSteps.of(columns, a, _ROLLOUT_NAMES),
                             [True] * next(iter(data.values())).shape[1],
                             layout_fields(buf.layout, a, nbytes))
            for a in buf.agents}


def _live_slots(written: IntArray, counts: IntArray, T: int) -> IntArray:  # noqa: N803
    lanes = len(written)
    seq = np.concatenate([np.arange(written[i] - counts[i], written[i]) for i in range(lanes)])
    lane = np.concatenate([np.full(int(counts[i]), i) for i in range(lanes)])
    return ring.seq_to_slot(seq.astype(np.int64), lane.astype(np.int64), T, lanes)


def _priorities(buf: ReplayBuffer, written: IntArray, counts: IntArray,
                arrays: dict[str, npt.NDArray[Any]]) -> dict[str, Any] | None:
    sampler = buf.sampler
    if not isinstance(sampler, _StoredPriorities):
        return None
    if not int(counts.sum()):
        return _no_priorities(sampler)
    prio = np.asarray(sampler.priorities(_live_slots(written, counts, buf.table.T)),
                      np.float64)
    arrays["priorities"] = prio
    return {"count": int(prio.size), "min": float(prio.min()), "mean": float(prio.mean()),
            "max": float(prio.max()), "sum": float(prio.sum()), "total": float(sampler.total)}


def _no_priorities(sampler: _StoredPriorities) -> dict[str, Any]:
    """The priorities of a prioritized buffer that holds no step (never written, or
    cleared): none counted, the sum tree's total."""
    return {"count": 0, "min": None, "mean": None, "max": None, "sum": 0.0,
            "total": float(sampler.total)}


def _sampled_age(buf: ReplayBuffer, written: IntArray, counts: IntArray, draws: int, seed: int,
                 arrays: dict[str, npt.NDArray[Any]]) -> dict[str, Any] | None:
    if draws <= 0 or not int(counts.sum()):
        return None
    # the snapshot's counters: ages stay >= 0 while a live writer moves on
    lanes = LaneView(buf.table.T, buf.table.lanes, written, counts)
    try:
        res: SampleResult = buf.sampler.sample(draws, lanes, np.random.default_rng(seed))
    except (ReplayBankError, ValueError, TypeError):
        return None  # a sampler that needs more than a batch size (e.g. sequence windows)
    seq, lane = ring.key_to_seq(np.asarray(res.keys, np.int64), buf.table.lanes)
    ages = (written[lane] - 1 - seq).astype(np.int64)
    arrays["sampled_age"] = ages
    age_stats = stats(ages)
    return None if age_stats is None else {**age_stats, "draws": int(ages.size)}


# ---------------------------------------------------------------------- output
def _fmt_bytes(n: Any) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"  # pragma: no cover


def _fmt_stats(st: dict[str, Any] | None, digits: int = 3) -> str:
    """One table cell of statistics (:func:`~replaybank.multiagent.summary.stats`)."""
    if not st:
        return "-"
    out = f"n={st['count']}"
    if st["mean"] is not None:
        out += (f"  mean={st['mean']:.{digits}g}  std={st['std']:.{digits}g}  "
                f"min={st['min']:.{digits}g}  max={st['max']:.{digits}g}")
    if st.get("nonfinite"):
        out += f"  ({st['nonfinite']} NaN/inf, left out)"
    return out


def render_table(summary: dict[str, Any], file: Any = None) -> None:
    """Print ``summary`` as rich tables (to ``file``, default stdout)."""
    require_extra("rich", "cli")
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout)
    s = summary
    t = Table(title=f"replaybank inspect: {s['path']}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    storage = f" ({s['storage']} storage)" if s["storage"] is not None else ""
    rows = [
        ("buffer type", str(s["buffer_type"])),
        ("source", f"{s['source']}{storage}"),
        ("capacity", f"{s['capacity']:,}"),
        ("fill", f"{s['fill']:,} ({100 * s['fill_fraction']:.1f}%)"),
    ]
    if s["lanes"] is not None:
        rows.append(("lanes", f"{s['lanes']} x {s['rows_per_lane']:,} rows"
                     if s.get("rows_per_lane") else str(s["lanes"])))
    # rows that do not apply to this buffer (null in the summary) are left out
    ep = s["episodes"]
    if ep is not None:
        counts = [f"{ep[k]:,} {what}" for k, what in (("ended", "ended"),
                  ("complete", "complete in buffer")) if ep.get(k) is not None]
        rows += [("episodes", ", ".join(counts) or "-"),
                 ("episode return", _fmt_stats(s["returns"])),
                 ("episode length", _fmt_stats(s["lengths"]))]
    pr = s["priorities"]
    if pr is not None:
        rows.append(("priorities", "-" if not pr["count"] else
                     f"min={pr['min']:.4g}  mean={pr['mean']:.4g}  max={pr['max']:.4g}  "
                     f"sum={pr['sum']:.6g}"))
    if s["sampler"] is not None:
        rows += [("sampled age", _fmt_stats(s["sampled_age"])),
                 ("sampler", json.dumps(s["sampler"]))]
    if s["view"] is not None:
        rows.append(("view", json.dumps(s["view"])))
    rows.append(("disk size", _fmt_bytes(s["disk_bytes"])))
    if s["memory_bytes"] is not None:
        rows.append(("memory size", _fmt_bytes(s["memory_bytes"])))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if s["fields"]:  # none before a buffer's first add
        f = Table(title="fields")
        for col in ("name", "shape", "dtype", "bytes"):
            f.add_column(col, justify="right" if col == "bytes" else "left")
        for fd in s["fields"]:
            f.add_row(fd["name"], str(tuple(fd["shape"])), fd["dtype"],
                      _fmt_bytes(fd["bytes"]))
        console.print(f)
    if s["age"]:
        a = Table(title="data age (step numbers per lane)")
        for col in ("lane", "oldest", "newest", "count"):
            a.add_column(col, justify="right")
        for row in s["age"]:
            a.add_row(*(("-" if row[k] is None else str(row[k]))
                        for k in ("lane", "oldest", "newest", "count")))
        console.print(a)
    if s.get("agents"):
        for table in _agents_table(s["agents"]):
            console.print(table)
    for note in s["notes"]:
        console.print(f"note: {note}", style="yellow", markup=False)


def _agents_table(agents: dict[str, Any]) -> list[Any]:
    """The per-agent tables of a multi-agent buffer (rich): statistics, then fields."""
    from rich.table import Table

    def mean(st: dict[str, Any] | None) -> str:
        if not st or st["mean"] is None:
            return "-" if not st or not st.get("nonfinite") else "NaN/inf"
        return f"{st['mean']:.4g}" + (" (+NaN/inf)" if st.get("nonfinite") else "")

    t = Table(title="agents (own episodes)")
    for col in ("agent", "active", "term/trunc", "reward/step", "episodes", "return",
                "length"):
        t.add_column(col, justify="left" if col == "agent" else "right")
    f = Table(title="agent fields")
    for col in ("agent", "field", "shape", "dtype", "bytes"):
        f.add_column(col, justify="right" if col == "bytes" else "left")
    for name, a in agents.items():
        t.add_row(name, f"{a['active_steps']:,} ({100 * a['active_fraction']:.0f}%)",
                  f"{a['terminated']}/{a['truncated']}", mean(a["reward"]),
                  str(a["episodes"]), mean(a["returns"]), mean(a["lengths"]))
        for fd in a["fields"]:
            f.add_row(name, fd["name"], str(tuple(fd["shape"])), fd["dtype"],
                      _fmt_bytes(fd["bytes"]))
    return [t, f]


def plot(inspection: Inspection, out: Any) -> Path:
    """Histograms of episode returns and lengths, stored priorities and the age of sampled
    data, written as a PNG (matplotlib, Agg backend).

    Returns:
        The path written.
    """
    require_extra("matplotlib", "cli")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("returns", "episode return"), ("lengths", "episode length (steps)"),
              ("priorities", "stored priority"), ("sampled_age", "age of sampled data (steps)")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        values = inspection.arrays.get(key, np.zeros(0))
        # NaN and infinite values have no bin: drawn without them, and said so
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            ax.text(0.5, 0.5, "only NaN/inf values" if values.size else "no data",
                    ha="center", va="center", transform=ax.transAxes)
        else:
            ax.hist(finite, bins=min(50, max(1, int(math.sqrt(finite.size)) + 1)))
        if finite.size < values.size:
            label += f" ({values.size - finite.size} NaN/inf left out)"
        ax.set_xlabel(label)
        ax.set_ylabel("count")
    fig.suptitle(f"{inspection.summary['buffer_type']}: {inspection.summary['path']}")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``replaybank inspect``."""
    p = argparse.ArgumentParser(
        prog="replaybank inspect",
        description="Summarize a buffer checkpoint (rb.save) or a memmap buffer directory "
                    "(opened read-only, beside a writer).")
    p.add_argument("path", help="checkpoint directory or memmap buffer directory")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON (keys: see replaybank.cli.inspect)")
    p.add_argument("--plot", metavar="OUT.png", default=None,
                   type=writable_file("--plot", "inspect.png"),
                   help="write histograms of returns, lengths, priorities and sampled age")
    p.add_argument("--prefix", default="buffer_", help="checkpoint file name prefix")
    p.add_argument("--draws", type=non_negative_int("--draws", str(DRAWS)), default=DRAWS,
                   help="keys drawn from the sampler for the age of sampled data (0: none)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    return p


def check_plot_path(path: Path) -> None:
    """Refuse a ``--plot`` file matplotlib cannot write, before anything is read.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        ConfigError: Its suffix names no format the Agg backend writes.

    Example:
        >>> check_plot_path(Path("out.png"))
        >>> try:
        ...     check_plot_path(Path("out.xyz"))
        ... except ConfigError as exc:
        ...     print(str(exc).split(";")[0])
        --plot out.xyz: matplotlib cannot write '.xyz' files
    """
    require_extra("matplotlib", "cli")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = sorted(FigureCanvasAgg.get_supported_filetypes())
    suffix = path.suffix.lower().lstrip(".")
    if suffix and suffix not in formats:
        raise ConfigError(f"--plot {path}: matplotlib cannot write {path.suffix!r} files; use "
                          f"one of {', '.join('.' + f for f in formats)} (e.g. --plot "
                          f"{path.with_suffix('.png')})")


def main(argv: list[str] | None = None) -> int:
    """Run ``replaybank inspect``; returns the exit status (2 for bad arguments, unreadable
    files or a plot that cannot be written)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): a status, not an exit
        return exc.code if isinstance(exc.code, int) else 2
    progress = not (args.quiet or args.json) and sys.stdout.isatty()
    try:
        if args.plot is not None:
            check_plot_path(args.plot)
        if progress:
            require_extra("rich", "cli")
            from rich.console import Console

            with Console(stderr=True).status(f"reading {args.path}"):
                inspection = summarize(args.path, args.prefix, args.draws)
        else:
            inspection = summarize(args.path, args.prefix, args.draws)
    except (ReplayBankError, OSError) as exc:
        print(f"replaybank inspect: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(inspection.summary, indent=2, sort_keys=True))
    else:
        render_table(inspection.summary)
    if args.plot is not None:
        try:
            out = plot(inspection, args.plot)
        except (ReplayBankError, OSError, ValueError) as exc:
            fix = f"; {os_error_fix(exc)}" if isinstance(exc, OSError) else ""
            print(f"replaybank inspect: error: --plot {args.plot}: cannot write it ({exc})"
                  f"{fix}", file=sys.stderr)
            return 2
        if not args.quiet and not args.json:
            print(f"plot written to {os.fspath(out)}")
    return 0
