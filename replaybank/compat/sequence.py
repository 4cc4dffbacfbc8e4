"""``SequenceReplayBuffer``: a thin front end whose ``sample`` returns sequences.

It owns a :class:`~replaybank.buffers.replay.ReplayBuffer` (composition, not
inheritance) and remembers the sequence options, so that
``buf.sample(batch_size, sequence_length)`` works like fishyrl's
``SequentialBuffer.sample`` and returns a :class:`~replaybank.batch.SequenceBatch`
(see :func:`~replaybank.buffers.sequences.sample_sequences`).

Example:
    >>> import numpy as np
    >>> buf = SequenceReplayBuffer(capacity=100, sequence_length=4, seed=0)
    >>> for t in range(12):
    ...     buf.add(obs=np.full(3, t, np.float32), action=0, reward=0.0,
    ...             next_obs=np.full(3, t + 1, np.float32), terminated=False, truncated=False)
    >>> buf.sample(2).obs.shape
    (2, 4, 3)
    >>> buf.sample(2, 6).mask.shape
    (2, 6)
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.replay import ReplayBuffer
from replaybank.compat.base import Checkpointed, FrontEnd
from replaybank.compat.checks import check_bool, check_int
from replaybank.errors import ArgumentError, CheckpointError, ConfigError, describe
from replaybank.samplers.base import Sampler
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend

if TYPE_CHECKING:
    from collections.abc import Callable

    from replaybank.storage.table import StepTable

__all__ = ["SequenceReplayBuffer"]


class SequenceReplayBuffer(Checkpointed, FrontEnd):
    """Replay buffer for recurrent and world-model agents.

    Args:
        capacity: Total steps over all lanes (divisible by ``num_envs``).
        num_envs: Lanes (parallel environments).
        sequence_length: Default ``L`` of :meth:`sample` (None: must be passed).
        episode_boundary: ``"stop"`` (R2D2) or ``"cross"`` (DreamerV3).
        strict: Only full windows (True) or zero-padded ones (False).
        burn_in: Burn-in steps prepended to each window.
        state_fields: Recurrent-state fields returned as ``initial/<name>``.
        seed: Seed or Generator.
        spec: Field specs (inferred from the first add when None).
        sampler: Window-start sampler (uniform by default, or prioritized).
        **buffer_kwargs: Further :class:`ReplayBuffer` arguments (``storage``, ...).

    Raises:
        ConfigError: Bad sequence options (:class:`~replaybank.errors.ArgumentError`
            for one of the wrong kind, a ``sampler`` that is not a Sampler, or a keyword
            :class:`ReplayBuffer` does not take).

    Example:
        >>> buf = SequenceReplayBuffer(capacity=64, num_envs=2, sequence_length=8,
        ...                            episode_boundary="cross")
        >>> buf.capacity, buf.num_envs, len(buf)
        (64, 2, 0)
    """

    _repr_fields = ("capacity", "num_envs", "size=len", "sequence_length", "episode_boundary",
                    "burn_in")
    buffer: ReplayBuffer

    def __init__(
        self,
        capacity: int,
        num_envs: int = 1,
        sequence_length: int | None = None,
        episode_boundary: str = "stop",
        strict: bool = True,
        burn_in: int = 0,
        state_fields: str | Sequence[str] | None = None,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        sampler: Sampler | None = None,
        **buffer_kwargs: Any,
    ) -> None:
        options = _options("SequenceReplayBuffer", sequence_length, episode_boundary, strict,
                           burn_in, state_fields)
        if sampler is not None and not isinstance(sampler, Sampler):
            raise ArgumentError(f"SequenceReplayBuffer(sampler={describe(sampler)}): expected "
                                "a Sampler (e.g. replaybank.PrioritizedSampler()) or None")
        unknown = sorted(set(buffer_kwargs) - _BUFFER_ARGUMENTS)
        if unknown:
            raise ArgumentError(f"SequenceReplayBuffer() got keyword arguments {unknown} that "
                                f"ReplayBuffer does not take; use some of "
                                f"{sorted(_BUFFER_ARGUMENTS)}")
        self.buffer = ReplayBuffer(capacity, num_envs=num_envs, seed=seed, spec=spec,
                                   sampler=sampler, **buffer_kwargs)
        (self.sequence_length, self.episode_boundary, self.strict, self.burn_in,
         self.state_fields) = options
        self._own_storage()

    def _own_storage(self) -> None:
        """Persistent storage records this wrapper, not the inner buffer, as its owner:
        ``ReplayBuffer.open(path)`` then rebuilds a SequenceReplayBuffer."""
        self.buffer.storage_owner = self
        self.buffer.record_owner()

    @classmethod
    def from_buffer(cls, buffer: ReplayBuffer, **options: Any) -> SequenceReplayBuffer:
        """Wrap an existing buffer (e.g. one restored with ``ReplayBuffer.load``).

        Example:
            >>> seq = SequenceReplayBuffer.from_buffer(ReplayBuffer(8), sequence_length=2)
            >>> seq.sequence_length
            2
        """
        if not isinstance(buffer, ReplayBuffer):
            raise ArgumentError(f"SequenceReplayBuffer.from_buffer(buffer={describe(buffer)}): "
                                "expected a replaybank.ReplayBuffer")
        known = ("sequence_length", "episode_boundary", "strict", "burn_in", "state_fields")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ArgumentError(f"SequenceReplayBuffer.from_buffer: unknown options {unknown}; "
                                f"use some of {list(known)}")
        checked = _options("SequenceReplayBuffer.from_buffer",
                           options.get("sequence_length"),
                           options.get("episode_boundary", "stop"), options.get("strict", True),
                           options.get("burn_in", 0), options.get("state_fields"))
        out = cls.__new__(cls)
        out.buffer = buffer
        (out.sequence_length, out.episode_boundary, out.strict, out.burn_in,
         out.state_fields) = checked
        out._own_storage()
        return out

    # ------------------------------------------------------------------ delegation
    @property
    def capacity(self) -> int:
        """Total steps over all lanes."""
        return self.buffer.capacity

    @property
    def num_envs(self) -> int:
        """Lanes."""
        return self.buffer.num_envs

    @property
    def spec(self) -> Spec | None:
        """Stored fields."""
        return self.buffer.spec

    @property
    def table(self) -> StepTable:
        """The step table."""
        return self.buffer.table

    @property
    def sampler(self) -> Sampler:
        """The window-start sampler."""
        return self.buffer.sampler

    def add(self, **fields: Any) -> None:
        """Add one step per lane; see :meth:`ReplayBuffer.add`."""
        self.buffer.add(**fields)

    def extend(self, **fields: Any) -> None:
        """Add many steps; see :meth:`ReplayBuffer.extend`."""
        self.buffer.extend(**fields)

    def clear(self) -> None:
        """Drop every stored step."""
        self.buffer.clear()

    def flush(self) -> None:
        """Sync a memmap buffer and save its resume state; see :meth:`ReplayBuffer.flush`."""
        self.buffer.flush()

    def close(self) -> None:
        """Release durable storage; see :meth:`ReplayBuffer.close`."""
        self.buffer.close()

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, sequence_length: int | None = None,
               **kwargs: Any) -> SequenceBatch:
        """Sample ``[B, burn_in + L]`` windows with this buffer's options.

        Args:
            batch_size: Windows ``B``.
            sequence_length: ``L`` (default: the constructor's).
            **kwargs: Overrides of the options and sampler arguments (see
                :func:`~replaybank.buffers.sequences.sample_sequences`).

        Raises:
            ConfigError: No sequence length given here or at construction.
        """
        length = sequence_length if sequence_length is not None else self.sequence_length
        if length is None:
            raise ConfigError(
                f"sample(batch_size={batch_size}): no sequence_length; pass one here or to "
                "SequenceReplayBuffer(sequence_length=...)"
            )
        opts: dict[str, Any] = {"episode_boundary": self.episode_boundary,
                                "strict": self.strict, "burn_in": self.burn_in,
                                "state_fields": self.state_fields}
        opts.update(kwargs)
        return self.buffer.sample_sequences(batch_size, length, **opts)

    sample_sequences = sample

    def sample_transitions(self, batch_size: int, **kwargs: Any) -> Batch:
        """One-step transitions, as :meth:`ReplayBuffer.sample`."""
        return self.buffer.sample(batch_size, **kwargs)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set priorities of window starts directly; see :meth:`ReplayBuffer.update_priorities`."""
        return self.buffer.update_priorities(indices, priorities)

    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int:
        """R2D2 priorities; see :func:`~replaybank.buffers.sequences.update_sequence_priorities`."""
        return self.buffer.update_sequence_priorities(starts, td_errors, eta=eta, mask=mask)

    # ------------------------------------------------------------------ state
    # state_dict, load_state_dict, save, load, config: Checkpointed (the core's state plus
    # {"sequence": the options})
    def _own_state(self) -> dict[str, Any]:
        return {"sequence": self._options()}

    def _checked_own_state(self, state: Any) -> Callable[[], None]:
        seq = state.get("sequence") if isinstance(state, dict) else None
        options = None if seq is None else _saved_options(seq)

        def apply() -> None:
            if options is not None:
                (self.sequence_length, self.episode_boundary, self.strict, self.burn_in,
                 self.state_fields) = options

        return apply

    def _options(self) -> dict[str, Any]:
        """The sequence options, JSON-able."""
        return {
            "sequence_length": self.sequence_length,
            "episode_boundary": self.episode_boundary, "strict": self.strict,
            "burn_in": self.burn_in,
            "state_fields": (self.state_fields if self.state_fields is None
                             or isinstance(self.state_fields, str)
                             else list(self.state_fields)),
        }

    def init_config(self) -> dict[str, Any]:
        """Constructor values that rebuild this buffer empty: the inner buffer's and the
        sequence options."""
        return {**self.buffer.init_config(), **self._options()}

    def metadata(self) -> dict[str, Any]:
        """The inner buffer's description, with this type's name."""
        return {**self.buffer.metadata(), "type": type(self).__name__}

    # ------------------------------------------------------------------ memmap resume
    @property
    def backend(self) -> ArrayBackend:
        """Where the inner buffer's arrays live."""
        return self.buffer.backend

    def resume_state(self) -> dict[str, Any] | None:
        """The inner buffer's resume state (:func:`replaybank.persist.flush`)."""
        return self.buffer.resume_state()

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore the inner buffer's resume state.

        Raises:
            CheckpointError: Not a resume state, or one that does not fit (nothing is
                changed).
        """
        if not isinstance(state, dict):
            raise CheckpointError(f"load_resume_state(state={describe(state)}): expected the "
                                  "dict of resume_state()")
        self.buffer.load_resume_state(state)

    def reopened(self) -> None:
        """The inner buffer's storage was reopened from its files."""
        self.buffer.reopened()


#: The keyword arguments of :class:`ReplayBuffer` a SequenceReplayBuffer passes on.
_BUFFER_ARGUMENTS = frozenset(inspect.signature(ReplayBuffer.__init__).parameters) - {
    "self", "capacity", "num_envs", "seed", "spec", "sampler"}


def _options(call: str, length: Any, boundary: Any, strict: Any, burn_in: Any,
             fields: Any) -> tuple[int | None, str, bool, int, Any]:
    """The sequence options of a constructor call, checked.

    Raises:
        ArgumentError: An option of the wrong kind.
        ConfigError: An option out of range.
    """
    if boundary not in ("stop", "cross"):
        raise ConfigError(f"{call}(episode_boundary={describe(boundary)}): use 'stop' or "
                          "'cross'")
    if length is not None:
        length = check_int(call, "sequence_length", length,
                           fix="pass e.g. sequence_length=8, or None")
    burn_in = check_int(call, "burn_in", burn_in, 0)
    strict = check_bool(call, "strict", strict,
                        " (True: only full windows; False: zero-padded windows)")
    if fields is not None and not isinstance(fields, str) and not (
            isinstance(fields, Sequence) and all(isinstance(f, str) for f in fields)):
        raise ArgumentError(f"{call}(state_fields={describe(fields)}): expected a field "
                            "name, a list of them, or None")
    return (None if length is None else int(length), boundary, bool(strict), int(burn_in),
            fields)


def _saved_options(seq: Any) -> tuple[int | None, str, bool, int, Any]:
    """The sequence options of a state dict, checked like the constructor's arguments.

    Raises:
        CheckpointError: An option is missing or out of range.
    """
    bad = "the state's sequence options are damaged; restore them from a checkpoint"
    keys = ("sequence_length", "episode_boundary", "strict", "burn_in", "state_fields")
    if not isinstance(seq, dict) or not set(keys) <= set(seq):
        raise CheckpointError(f"load_state_dict: sequence={describe(seq)} lacks some of "
                              f"{list(keys)}; {bad}")
    length, boundary, strict, burn_in, fields = (seq[k] for k in keys)
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                               or length < 1):
        raise CheckpointError(f"load_state_dict: sequence_length={length!r} is not an int "
                              f">= 1 or None; {bad}")
    if boundary not in ("stop", "cross"):
        raise CheckpointError(f"load_state_dict: episode_boundary={boundary!r} is not 'stop' "
                              f"or 'cross'; {bad}")
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
        raise CheckpointError(f"load_state_dict: burn_in={burn_in!r} is not an int >= 0; {bad}")
    if not isinstance(strict, bool):
        raise CheckpointError(f"load_state_dict: strict={strict!r} is not a bool; {bad}")
    if fields is not None and not isinstance(fields, str) and not (
            isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise CheckpointError(f"load_state_dict: state_fields={fields!r} is not a field name "
                              f"or a list of them; {bad}")
    return length, boundary, strict, burn_in, fields
