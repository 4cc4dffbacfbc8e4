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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.replay import ReplayBuffer
from replaybank.compat.base import Checkpointed, Core, FrontEnd
from replaybank.compat.checks import check_bool, check_int, check_type
from replaybank.errors import ArgumentError, CheckpointError, ConfigError, describe
from replaybank.samplers.base import Sampler
from replaybank.views.base import StepView

if TYPE_CHECKING:
    from replaybank.spec import Spec
    from replaybank.storage.backends.base import ArrayBackend
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
            :class:`ReplayBuffer` does not take), or ``n_step``/``frame_stack``/``view``:
            they shape one-step samples only, and the windows :meth:`sample` returns hold
            the stored steps (one-step rewards, one frame per step).

    Example:
        >>> buf = SequenceReplayBuffer(capacity=64, num_envs=2, sequence_length=8,
        ...                            episode_boundary="cross")
        >>> buf.capacity, buf.num_envs, len(buf)
        (64, 2, 0)
    """

    _repr_fields = ("capacity", "num_envs", "size=len", "sequence_length", "episode_boundary",
                    "burn_in")
    buffer: ReplayBuffer[Any]
    sequence_length: int | None
    episode_boundary: str
    strict: bool
    burn_in: int
    state_fields: str | Sequence[str] | None

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
        options = _options("SequenceReplayBuffer", {
            "sequence_length": sequence_length, "episode_boundary": episode_boundary,
            "strict": strict, "burn_in": burn_in, "state_fields": state_fields})
        check_type("SequenceReplayBuffer", "sampler", sampler, (Sampler, type(None)),
                   "a Sampler (e.g. replaybank.PrioritizedSampler()) or None")
        unknown = sorted(set(buffer_kwargs) - _BUFFER_ARGUMENTS)
        if unknown:
            raise ArgumentError(f"SequenceReplayBuffer() got keyword arguments {unknown} that "
                                f"ReplayBuffer does not take; use some of "
                                f"{sorted(_BUFFER_ARGUMENTS)}")
        _check_one_step(buffer_kwargs)
        self._own(ReplayBuffer(capacity, num_envs=num_envs, seed=seed, spec=spec,
                               sampler=sampler, **buffer_kwargs), options)

    def _own(self, buffer: ReplayBuffer[Any], options: dict[str, Any]) -> None:
        """Take ``buffer`` and the checked sequence options. Persistent storage records
        this wrapper, not the inner buffer, as its owner: ``ReplayBuffer.open(path)``
        then rebuilds a SequenceReplayBuffer."""
        self.buffer = buffer
        self.__dict__.update(options)
        buffer.storage_owner = self
        buffer.record_owner()

    @classmethod
    def from_buffer(cls, buffer: ReplayBuffer[Any], **options: Any) -> SequenceReplayBuffer:
        """Wrap an existing buffer (e.g. one restored with ``ReplayBuffer.load``).

        Example:
            >>> seq = SequenceReplayBuffer.from_buffer(ReplayBuffer(8), sequence_length=2)
            >>> seq.sequence_length
            2
        """
        check_type("SequenceReplayBuffer.from_buffer", "buffer", buffer, ReplayBuffer,
                   "a replaybank.ReplayBuffer")
        if not isinstance(buffer.view, StepView):
            raise ConfigError(
                f"SequenceReplayBuffer.from_buffer(buffer=...): the buffer's view "
                f"({type(buffer.view).__name__}) shapes one-step samples only; sequence "
                "windows hold the stored steps, so a SequenceReplayBuffer would ignore it; "
                "wrap a buffer built without n_step/frame_stack/view, or call "
                "buffer.sample_sequences() (its windows hold the stored steps too)")
        unknown = sorted(set(options) - set(_DEFAULTS))
        if unknown:
            raise ArgumentError(f"SequenceReplayBuffer.from_buffer: unknown options {unknown}; "
                                f"use some of {list(_DEFAULTS)}")
        checked = _options("SequenceReplayBuffer.from_buffer", {**_DEFAULTS, **options})
        out = cls.__new__(cls)
        out._own(buffer, checked)
        return out

    # ------------------------------------------------------------------ delegation
    capacity: Core[int] = Core("Total steps over all lanes.")
    num_envs: Core[int] = Core("Lanes.")
    spec: Core[Spec | None] = Core("Stored fields.")
    table: Core[StepTable] = Core("The step table.")
    sampler: Core[Sampler] = Core("The window-start sampler.")
    add: Core[Callable[..., None]] = Core("Add one step per lane; see :meth:`ReplayBuffer.add`.")
    extend: Core[Callable[..., None]] = Core("Add many steps; see :meth:`ReplayBuffer.extend`.")
    clear: Core[Callable[[], None]] = Core("Drop every stored step.")
    flush: Core[Callable[[], None]] = Core(
        "Sync a memmap buffer and save its resume state; see :meth:`ReplayBuffer.flush`.")
    close: Core[Callable[[], None]] = Core(
        "Release durable storage; see :meth:`ReplayBuffer.close`.")

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

    sample_transitions: Core[Callable[..., Batch]] = Core(
        "One-step transitions, as :meth:`ReplayBuffer.sample`.", "sample")
    update_priorities: Core[Callable[[Any, Any], int]] = Core(
        "Set priorities of window starts directly; see :meth:`ReplayBuffer.update_priorities`.")
    update_sequence_priorities: Core[Callable[..., int]] = Core(
        "R2D2 priorities; see :func:`~replaybank.buffers.sequences.update_sequence_priorities`.")

    # ------------------------------------------------------------------ state
    # state_dict, load_state_dict, save, load, config: Checkpointed (the core's state plus
    # {"sequence": the options})
    def _own_state(self) -> dict[str, Any]:
        return {"sequence": self._options()}

    def _checked_own_state(self, state: Any) -> Callable[[], None]:
        seq = state.get("sequence") if isinstance(state, dict) else None
        if seq is None:
            return lambda: None
        bad = "the state's sequence options are damaged; restore them from a checkpoint"
        if not isinstance(seq, dict) or not set(_DEFAULTS) <= set(seq):
            raise CheckpointError(f"load_state_dict: sequence={describe(seq)} lacks some of "
                                  f"{list(_DEFAULTS)}; {bad}")
        options = _options("load_state_dict", seq, error=CheckpointError,
                           kind_error=CheckpointError, fix=bad)
        return lambda: self.__dict__.update(options)

    def _options(self) -> dict[str, Any]:
        """The sequence options, JSON-able."""
        out = {name: getattr(self, name) for name in _DEFAULTS}
        fields = out["state_fields"]
        out["state_fields"] = fields if fields is None or isinstance(fields, str) else list(fields)
        return out

    def init_config(self) -> dict[str, Any]:
        """Constructor values that rebuild this buffer empty: the inner buffer's and the
        sequence options."""
        return {**self.buffer.init_config(), **self._options()}

    def metadata(self) -> dict[str, Any]:
        """The inner buffer's description, with this type's name."""
        return {**self.buffer.metadata(), "type": type(self).__name__}

    # ------------------------------------------------------------------ memmap resume
    backend: Core[ArrayBackend] = Core("Where the inner buffer's arrays live.")

    resume_state: Core[Callable[[], dict[str, Any] | None]] = Core(
        "The inner buffer's resume state (:func:`replaybank.persist.flush`).")
    reopened: Core[Callable[[], None]] = Core(
        "The inner buffer's storage was reopened from its files.")

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore the inner buffer's resume state.

        Raises:
            CheckpointError: Not a resume state, or one that does not fit (nothing is
                changed).
        """
        check_type("load_resume_state", "state", state, dict, "the dict of resume_state()",
                   CheckpointError)
        self.buffer.load_resume_state(state)


def _check_one_step(kwargs: Mapping[str, Any]) -> None:
    """Refuse the :class:`ReplayBuffer` options that shape one-step samples only:
    :meth:`SequenceReplayBuffer.sample` returns windows of the stored steps, so they would
    apply to ``sample_transitions`` alone while the sequences silently lack them.

    Raises:
        ConfigError: ``n_step`` or ``frame_stack`` other than 1, or a ``view`` other than a
            one-step transition view (:class:`~replaybank.views.base.StepView`).

    Example:
        >>> _check_one_step({"n_step": 1, "storage": "numpy"})
        >>> _check_one_step({"frame_stack": 4})
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: SequenceReplayBuffer(frame_stack=4): sequence windows hold one stored frame per step ([B, L, *frame]), so the stacks would only reach sample_transitions(); drop frame_stack and let the recurrent model's memory span the frames (burn_in= gives it the history), or use rb.ReplayBuffer(frame_stack=4) for stacked one-step transitions
    """  # noqa: E501
    n_step = kwargs.get("n_step", 1)
    if n_step != 1:
        raise ConfigError(
            f"SequenceReplayBuffer(n_step={n_step!r}): sequence windows hold the stored "
            "one-step rewards, so n-step returns would only reach sample_transitions(); "
            "drop n_step and compute n-step targets over each window in the learner (as "
            f"R2D2 does), or use rb.ReplayBuffer(n_step={n_step!r}, gamma=...) for n-step "
            "transitions")
    frames = kwargs.get("frame_stack", 1)
    if frames != 1:
        raise ConfigError(
            f"SequenceReplayBuffer(frame_stack={frames!r}): sequence windows hold one "
            "stored frame per step ([B, L, *frame]), so the stacks would only reach "
            "sample_transitions(); drop frame_stack and let the recurrent model's memory "
            "span the frames (burn_in= gives it the history), or use "
            f"rb.ReplayBuffer(frame_stack={frames!r}) for stacked one-step transitions")
    view = kwargs.get("view")
    if view is not None and not isinstance(view, StepView):
        raise ConfigError(
            f"SequenceReplayBuffer(view={type(view).__name__}): sequence windows hold the "
            "stored steps, so the view would only reach sample_transitions(); drop view, "
            "or use rb.ReplayBuffer(view=...) for its one-step samples")


#: The keyword arguments of :class:`ReplayBuffer` a SequenceReplayBuffer passes on.
_BUFFER_ARGUMENTS = frozenset(inspect.signature(ReplayBuffer.__init__).parameters) - {
    "self", "capacity", "num_envs", "seed", "spec", "sampler"}
#: The sequence options and their defaults.
_DEFAULTS: dict[str, Any] = {"sequence_length": None, "episode_boundary": "stop",
                             "strict": True, "burn_in": 0, "state_fields": None}


def _options(call: str, values: Mapping[str, Any], *, error: type[Exception] = ConfigError,
             kind_error: type[Exception] = ArgumentError,
             fix: str | None = None) -> dict[str, Any]:
    """The sequence options of a constructor call or of a state dict, checked.

    Args:
        call: The call, for messages (``"SequenceReplayBuffer"``, ``"load_state_dict"``).
        values: The five options by name.
        error: Raised for an option out of range.
        kind_error: Raised for an option of the wrong kind.
        fix: The fix every message ends with (default: an example of a legal value).

    Raises:
        ArgumentError: (``kind_error``) An option of the wrong kind.
        ConfigError: (``error``) An option out of range.
    """
    boundary, length, fields = (values["episode_boundary"], values["sequence_length"],
                                values["state_fields"])
    then = "" if fix is None else f"; {fix}"
    if boundary not in ("stop", "cross"):
        raise error(f"{call}(episode_boundary={describe(boundary)}): use 'stop' or "
                    f"'cross'{then}")
    if length is not None:
        length = check_int(call, "sequence_length", length, error=error, kind_error=kind_error,
                           fix=fix or "pass e.g. sequence_length=8, or None")
    burn_in = check_int(call, "burn_in", values["burn_in"], 0, error=error,
                        kind_error=kind_error, fix=fix)
    strict = check_bool(call, "strict", values["strict"],
                        f" (True: only full windows; False: zero-padded windows){then}",
                        error=kind_error)
    if fields is not None and not isinstance(fields, str) and not (
            isinstance(fields, Sequence) and all(isinstance(f, str) for f in fields)):
        raise kind_error(f"{call}(state_fields={describe(fields)}): expected a field "
                         f"name, a list of them, or None{then}")
    return {"sequence_length": length, "episode_boundary": boundary, "strict": strict,
            "burn_in": burn_in, "state_fields": fields}
