"""The shared machinery of the pytorchrl front ends: one core buffer behind pytorchrl's API.

A :class:`Storage` owns a :class:`~replaybank.buffers.replay.ReplayBuffer` (one lane
per env, built at the first transition) and translates:

* ``insert_transition(sample)``: pytorchrl's key names and ``[num_envs, 1]`` scalars
  become one core ``add`` (``NextDone`` is ``terminated``; pytorchrl has no truncation
  flag). The core stores each observation once and serves n-step returns, priorities
  and recent-experience windows at sample time.
* ``generate_batches``: core batches become dicts of float32 tensors ``[B, ...]`` on
  ``device`` under pytorchrl's names, with the scheme's extra keys (``n_step``,
  ``per_weights``, ``idxs``, ``ck``).
* The data-transfer calls a pytorchrl collector and learner make
  (``get_all_buffer_data`` -> ``reset`` -> ``insert_data_slice``) keep pytorchrl's
  counters: ``size`` (rows stored per env) and ``step`` (rows added since the last
  ``reset``: the slice ``get_all_buffer_data`` returns); ``reset`` sets both to zero,
  as pytorchrl's reference says. For a recurrent actor a slice that does not begin by
  re-sending the newest stored rows starts a segment that no window crosses
  (:mod:`~replaybank.compat.pytorchrl.segments`): with several collectors, windows
  never join two trajectories. A HER storage keeps each collector's running episodes
  apart the same way (:mod:`~replaybank.compat.pytorchrl.streams`).

Every public call checks its arguments first (:mod:`~replaybank.compat.checks`)
and raises a :class:`~replaybank.errors.ReplayBankError` naming the argument, the bad
value and the fix; a rejected call changes nothing.

Example:
    >>> import torch
    >>> from replaybank.compat.pytorchrl import ReplayBuffer
    >>> buf = ReplayBuffer(size=100, device="cpu", actor=None, algorithm=None, envs=None)
    >>> for t in range(10):
    ...     buf.insert_transition({"Observation": torch.full((2, 3), t),
    ...                            "Action": torch.zeros(2, 1), "Reward": torch.ones(2, 1),
    ...                            "NextObservation": torch.full((2, 3), t + 1),
    ...                            "Done": torch.zeros(2, 1), "NextDone": torch.zeros(2, 1)})
    >>> buf.size, buf.step
    (10, 10)
    >>> batch = next(buf.generate_batches(num_mini_batch=1, mini_batch_size=4))
    >>> batch["Observation"].shape, batch["Reward"].shape, batch["NextDone"].dtype
    (torch.Size([4, 3]), torch.Size([4, 1]), torch.float32)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple, NoReturn

import numpy as np

from replaybank.batch import SequenceBatch
from replaybank.buffers.arguments import make_rng
from replaybank.buffers.replay import ReplayBuffer as CoreBuffer
from replaybank.compat.base import FrontEnd, restored_on_error
from replaybank.compat.checks import (
    check_bool,
    check_int,
    check_mapping,
    check_number,
    check_type,
    numbers,
)
from replaybank.compat.devices import checked_device, torch_module
from replaybank.compat.pytorchrl.keys import (
    ACT,
    CORE_NAMES,
    DONE,
    DONE2,
    FIELDS,
    OBS,
    OBS2,
    REW,
    RHS,
    RHS2,
    STORAGE_TENSORS,
    tensor_of,
    to_numpy,
    tree_map,
)
from replaybank.compat.pytorchrl.segments import Segments
from replaybank.errors import (
    ArgumentError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    SpecError,
    describe,
)
from replaybank.host import is_tensor
from replaybank.ops.windows import valid_starts
from replaybank.samplers.base import Sampler
from replaybank.spec import Spec, flatten, unflatten

__all__ = ["PARAMETERS", "Sent", "Storage", "get_priority", "get_sequence_priority",
           "magnitudes"]

#: Extras stored only for recurrent actors (pytorchrl keeps one zero row otherwise).
_RECURRENT_KEYS = (RHS, RHS2)
#: The keys every transition needs.
_REQUIRED = (OBS, ACT, REW, OBS2, DONE2)
#: Storage tensors a transition may carry besides the required ones.
_OPTIONAL = (DONE, "IntrinsicReward", "ActionProbs")
#: What a transition dict holds, for error messages.
_TRANSITION = ("pytorchrl's transition: 'Observation', 'Action', 'Reward', "
               "'NextObservation', 'NextDone' -> [num_envs, ...] tensors")
#: The rule of each storage parameter, ``check(call, name, value)``: the constructors and
#: :meth:`Storage.update_storage_parameter` check a value with it (the latter names the
#: value ``new_parameter_value`` for those of :data:`_VALUE_NAMED`, else the parameter).
PARAMETERS: dict[str, Callable[[str, str, Any], Any]] = {
    "max_size": check_int,
    "gamma": lambda c, n, v: check_number(c, n, v, 0.0, 1.0, example=0.99),
    "n_step": lambda c, n, v: check_int(c, n, v, allow_float=True),
    # PER: the PER paper's ranges (pytorchrl documents them as floats)
    "epsilon": lambda c, n, v: check_number(c, n, v, lo=0.0, example=1e-6),
    "alpha": lambda c, n, v: check_number(c, n, v, lo=0.0, example=0.6),
    "beta": lambda c, n, v: check_number(c, n, v, 0.0, 1.0, example=0.4),
    "default_error": lambda c, n, v: check_number(c, n, v, lo=0.0, example=1000000),
    # ERE: eta in (0, 1] (1: uniform over the buffer), cmin an int >= 1
    "eta": lambda c, n, v: check_number(c, n, v, 0.0, 1.0, lo_open=True, example=0.996),
    "cmin": check_int,
}
_VALUE_NAMED = ("max_size", "gamma", "n_step")
#: Why an attribute of a storage cannot change with ``update_storage_parameter``.
_FIXED = {
    "size": "the number of rows stored, counted by the storage",
    "step": "the number of rows added since the last reset(), counted by the storage",
    "num_envs": "the number of envs, fixed by the first transition",
    "data": "a copy of the stored rows (insert_data_slice adds rows, reset() drops them)",
    "buffer": "the core buffer holding the data (replacing it would drop every row)",
    "storage_tensors": "pytorchrl's documented key names",
    "staged_overlap": "the overlap slice get_all_buffer_data(data_to_cpu=True) staged",
    "recurrent_actor": "fixed by the actor when the storage was built (the stored "
                       "windows and the batches' layout follow it)",
    "sequence_length": "fixed by algorithm.update_every when the storage was built",
    "overlap_length": "fixed by actor.sequence_overlap when the storage was built",
    "non_overlap_length": "fixed by actor.sequence_overlap when the storage was built",
    "actor": "the actor the storage was built for",
    "algo": "the algorithm the storage was built for (set its gamma instead)",
    "envs": "the envs the storage was built for",
    "seed": "the seed the core buffer was built with",
    "n_step": "1 in a ReplayBuffer, whose batches carry no n-step discounts (use "
              "NStepReplayBuffer)",
    "prioritized": "whether PER is on (set alpha)",
    "initial_eta": "ERE's lower bound of the adaptive eta, fixed when the storage was "
                   "built (set eta for the current one)",
    "relabelled": "the number of hindsight copies stored, counted by the storage",
}


def get_priority(error: Any, epsilon: float, alpha: float, call: str = "get_priority") -> Any:
    """``(error + epsilon) ** alpha``: the proportional priority of TD errors.

    A torch tensor gives a tensor on its device (and dtype, float for integer errors),
    anything else a numpy array, as pytorchrl's ``(error + self.epsilon) ** self.alpha``
    does.

    Args:
        error: TD error magnitudes ``|delta|``: a tensor, array, list or number.
        epsilon: PER epsilon.
        alpha: PER alpha.
        call: The call for error messages.

    Raises:
        DtypeError: ``error`` holds no numbers, or a value that is negative, NaN or
            infinite (pass ``abs(td_error)``).

    Example:
        >>> import torch
        >>> get_priority(torch.tensor([3.0, 0.0]), 1.0, 0.5)
        tensor([2., 1.])
        >>> get_priority([3.0], 1.0, 0.5)
        array([2.])
    """
    data = _real(call, "error", error, "TD errors (a tensor, array or number)")
    magnitudes(call, "error", data, "finite TD error magnitudes >= 0 (e.g. td_error.abs())")
    if is_tensor(data):
        return (data + epsilon) ** alpha
    return np.power(data.astype(np.float64, copy=False) + epsilon, alpha)


def magnitudes(call: str, name: str, data: Any, fix: str) -> None:
    """The check ``get_priority``, ``get_sequence_priority`` and PER's
    ``after_gradients`` share: every value of ``data`` (a tensor, on its device, or a
    numeric array) is finite and >= 0.

    Raises:
        DtypeError: Naming ``name``, up to five bad values and what to pass (``fix``).
    """
    if is_tensor(data):
        torch = sys.modules["torch"]
        if bool(torch.all(torch.isfinite(data) & (data >= 0))):  # one device sync
            return
        data = to_numpy(data.detach())
    elif not data.size or (np.isfinite(data).all() and data.min() >= 0):
        return
    flat = np.asarray(data, dtype=np.float64).reshape(-1)
    bad = flat[~(np.isfinite(flat) & (flat >= 0))][:5].tolist()
    raise DtypeError(f"{call}: {name} holds {bad}, negative, NaN or infinite; pass {fix}")


def get_sequence_priority(sequence_data: Any, eta: float = 0.9,
                          call: str = "get_sequence_priority") -> Any:
    """R2D2's ``eta * max + (1 - eta) * mean`` over axis 0 of ``sequence_data``
    (a tensor gives a tensor, anything else a numpy array).

    Raises:
        ArgumentError, ConfigError: ``eta`` is not a number in ``[0, 1]``.
        DtypeError: ``sequence_data`` holds no numbers, or a value that is negative, NaN
            or infinite (priorities are ``get_priority`` of error magnitudes), as
            :func:`get_priority` refuses them.
        ShapeError: ``sequence_data`` has no axis 0 or nothing along it.

    Example:
        >>> get_sequence_priority([[1.0, 4.0], [3.0, 0.0]], eta=0.5).tolist()
        [2.5, 3.0]
    """
    eta = check_number(call, "eta", eta, 0.0, 1.0, example=0.9)
    data = _real(call, "sequence_data", sequence_data,
                 "priorities (a tensor or array) [steps, ...]")
    if data.ndim == 0 or data.shape[0] == 0:
        raise ShapeError(f"{call}(sequence_data={describe(sequence_data)}): expected one or "
                         "more steps along axis 0")
    magnitudes(call, "sequence_data", data,
                "finite priorities >= 0 (e.g. get_priority(td_errors.abs()))")
    if is_tensor(data):
        x = data if data.is_floating_point() else data.double()
        return eta * x.max(dim=0).values + (1 - eta) * x.mean(dim=0)
    return eta * np.max(data, axis=0) + (1 - eta) * np.mean(data, axis=0)


def _real(call: str, name: str, value: Any, expected: str) -> Any:
    """``value`` of a priority helper as real numbers: a tensor as it is (on its device),
    anything else as a numeric host array.

    Raises:
        DtypeError: ``value`` holds no real numbers (None, text, a dict, a complex or
            bool tensor); the message says what is ``expected``.
    """
    if is_tensor(value):
        if value.is_complex() or value.dtype == sys.modules["torch"].bool:
            raise DtypeError(f"{call}({name}={describe(value)}): expected real numbers; pass "
                             "a float tensor")
        return value
    if value is None or isinstance(value, (str, bytes, dict)):
        raise DtypeError(f"{call}({name}={describe(value)}): expected {expected}")
    return numbers(to_numpy(value), f"{call}: {name}")


def _numbers(where: str, key: str, value: Any) -> Any:
    """A sample value as numpy (a dict of them for dict observations)."""
    if isinstance(value, Mapping):
        return {k: _numbers(where, f"{key}[{k!r}]", v) for k, v in value.items()}
    if value is None or isinstance(value, (str, bytes)):
        raise DtypeError(f"{where}: sample[{key!r}]={describe(value)} holds no numbers; "
                         "pass a tensor or array [num_envs, ...]")
    return to_numpy(value)


def _layout(lead: tuple[int, ...]) -> str:
    """The leading dims ``lead`` in words, for messages."""
    if len(lead) == 1:
        return f"[num_envs={lead[0]}, ...]"
    return f"[rows={lead[0]}, num_envs={lead[1]}, ...]"


def _check_lead(where: str, key: str, value: Any, lead: tuple[int, ...]) -> None:
    """Every leaf of ``value`` has the leading dims ``lead``."""
    if isinstance(value, dict):
        if not value:
            raise ShapeError(f"{where}: sample[{key!r}] is an empty dict; a dict observation "
                             "needs one or more entries")
        for k, v in value.items():
            _check_lead(where, f"{key}[{k!r}]", v, lead)
        return
    if value.shape[:len(lead)] != lead:
        numbers(value, f"{where}: sample[{key!r}]")
        raise ShapeError(f"{where}: sample[{key!r}]={describe(value)}: expected leading dims "
                         f"{list(lead)} ({_layout(lead)}); reshape it or pass the storage's "
                         "envs")


def _entries(fields: Mapping[str, Any], field: str) -> list[str]:
    """The entries of a dict observation from its flat fields (``obs/a/b`` -> ``a/b``);
    ``[]`` for an array observation."""
    return sorted(f[len(field) + 1:] for f in fields if f != field)


def _real_leaves(where: str, key: str, value: Any) -> None:
    """Every leaf of a first transition's ``value`` holds real numbers (bool, int or
    float): the storage's rows and batches are float32, where a complex value would lose
    its imaginary part.

    Raises:
        DtypeError: Naming ``sample[key]`` (and the entry of a dict observation).
    """
    if isinstance(value, dict):
        for k, v in value.items():
            _real_leaves(where, f"{key}[{k!r}]", v)
        return
    numbers(value, f"{where}: sample[{key!r}]",
            "pass real numbers (the storage's rows and batches are float32)")


def _bad_scalars(where: str, key: str, value: Any, lead: tuple[int, ...]) -> NoReturn:
    """Raise the error of a per-env scalar that is not ``[*lead]`` or ``[*lead, 1]``."""
    if isinstance(value, np.ndarray):
        numbers(value, f"{where}: sample[{key!r}]")
    raise ShapeError(f"{where}: sample[{key!r}]={describe(value)}: expected one number per "
                     f"env, shape {[*lead, 1]} ({_layout(lead)})")


#: The values a done flag may hold (``0.0 == 0`` and ``True == 1`` are in it; NaN is not).
_FLAG_VALUES = frozenset((0, 1))
_BOOL = np.dtype(bool)


def _bad_flags(where: str, key: str, value: Any) -> NoReturn:
    """Raise the error of done flags that are not all 0 or 1."""
    numbers(value, f"{where}: sample[{key!r}]")
    bad = [x for x in value.ravel().tolist() if x not in _FLAG_VALUES][:3]
    raise DtypeError(f"{where}: sample[{key!r}] holds {bad}; done flags are 0 or 1")


class Sent(NamedTuple):
    """A slice as :meth:`Storage.insert_data_slice` received it, for the scheme that plans
    the write of its rows (HER follows each collector's episodes across slices).

    Attributes:
        data: The checked slice, pytorchrl's layout ``{key: [rows, num_envs, ...]}``
            (the storage tensors it holds).
        dropped: Its leading rows not written because they repeat the newest stored
            rows (the overlap a recurrent collector re-sends); the write holds the rest.
    """

    data: dict[str, Any]
    dropped: int


class Storage(FrontEnd):
    """pytorchrl's off-policy storage API over one core replay buffer.

    Subclasses fix the signature and the scheme (n-step, PER, ERE, HER); this class
    holds no algorithm of its own, it checks, translates and calls the core.

    Args:
        size: Rows per env (pytorchrl's capacity along the time axis), an int >= 1.
        device: Torch device of the batches (a ``torch.device``, a string such as
            ``"cpu"``, or None).
        actor: pytorchrl actor (``is_recurrent``, ``sequence_overlap`` in ``[0, 1)`` are
            read), or None.
        algorithm: pytorchrl algorithm (``gamma`` in ``[0, 1]``, the discount of
            n-step returns, and for a recurrent actor ``update_every`` are read), or
            None. There is no default discount: n-step returns (``n_step > 1``) need
            ``algorithm.gamma``, as pytorchrl reads it.
        envs: Vector env (not read: the envs are counted at the first transition), or
            None.
        seed: Seed or Generator of the core buffer's draws (an addition of this front
            end; pytorchrl draws from numpy's global generator).

    Raises:
        ArgumentError, ConfigError: An argument of the wrong kind or out of range.

    Example:
        >>> Storage(10, "cpu", None, None, None).storage_tensors[-1]
        'ActionProbs'
    """

    storage_tensors = STORAGE_TENSORS
    #: The attributes :meth:`update_storage_parameter` may change (each scheme adds its
    #: own): the rest is the storage's state or fixed when it was built.
    settable: ClassVar[frozenset[str]] = frozenset(("max_size", "gamma", "device"))
    _repr_fields = ("max_size", "size", "step", "num_envs", "core=buffer")
    buffer: CoreBuffer | None  # built by init_tensors (needs num_envs)
    #: The scheme plans writes beyond the core's (HER): :meth:`_plan_insert` is called.
    _plans = False

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 seed: int | np.random.Generator | None = None) -> None:
        where = type(self).__name__
        self.max_size = check_int(where, "size", size)
        make_rng(seed)  # checks it (the core buffer, built later, takes it as given)
        self.recurrent_actor = bool(getattr(actor, "is_recurrent", False))
        # None: the algorithm has no discount (an error where n-step returns need one)
        self.gamma: float | None = None if not hasattr(algorithm, "gamma") else \
            PARAMETERS["gamma"](where, "algorithm.gamma", algorithm.gamma)
        if self.recurrent_actor:
            if not hasattr(algorithm, "update_every"):
                raise ArgumentError(f"{where}(algorithm={describe(algorithm)}): a recurrent "
                                    "actor needs algorithm.update_every (the sequence "
                                    "length)")
            self.sequence_length = check_int(where, "algorithm.update_every",
                                               algorithm.update_every)
            overlap = check_number(where, "actor.sequence_overlap",
                                   getattr(actor, "sequence_overlap", None), 0.0, 1.0,
                                   example=0.5)
            self.overlap_length = int(overlap * self.sequence_length)
            self.non_overlap_length = self.sequence_length - self.overlap_length
            if self.non_overlap_length < 1:
                raise ConfigError(f"{where}(actor.sequence_overlap={overlap!r}): leaves no "
                                  f"step of a {self.sequence_length}-step sequence to train "
                                  "on; pass a sequence_overlap below 1")
        self.actor = actor
        self.device = device
        self.algo = algorithm
        self.envs = envs
        self.seed = seed
        self.n_step = 1
        self.staged_overlap: dict[str, Any] | None = None
        self.buffer = None
        self._set_layout(0, (), {})  # no envs before the first transition
        self._where_insert = f"{type(self).__name__}.insert_transition"
        # (device, torch.device, checked to exist on this machine)
        self._torch_device: tuple[Any, Any, bool] | None = None
        self._fresh = 0  # rows added since the last reset
        # where inserted slices do not continue the stored rows (recurrent windows never
        # cross one)
        self._segments = Segments()
        self._priority: float | None = None  # the initial priority of a new step (PER)
        torch = sys.modules.get("torch")
        if torch is not None:  # else checked by the first generate_batches
            self._device(torch)

    # ------------------------------------------------------------------ scheme hooks
    def _sampler(self) -> Sampler | None:
        """The core sampler of this scheme (None: uniform)."""
        return None

    def _new_priority(self) -> float | None:
        """The priority a new step gets (None: the sampler has none)."""
        return None

    def _sample_kwargs(self, k: int, num_mini_batch: int) -> dict[str, Any]:
        """Core sample options of mini batch ``k`` of ``num_mini_batch``."""
        return {}

    def _batch_info(self, out: dict[str, Any], batch: Any, k: int, num_mini_batch: int,
                    torch: Any) -> None:
        """Add the scheme's extra batch keys (``n_step``, ``per_weights``, ...)."""

    def _plan_insert(self, where: str, sample: Mapping[str, Any], values: dict[str, Any],
                     steps: int | None, sent: Sent | None) -> Any:
        """Prepare what a write of checked ``values`` needs besides the core write (HER
        relabels the episodes it ends); may raise, nothing is changed yet. ``sent`` is
        the slice the rows come from (None: a transition, or the overlap ``reset``
        puts back), which continues the rows at the write head or not."""
        return None

    def _after_insert(self, plan: Any) -> None:
        """Carry out :meth:`_plan_insert`'s plan once the core write succeeded."""

    def _cleared(self) -> None:
        """The stored rows were dropped by :meth:`reset`, or a new core buffer holds none
        (HER forgets its episodes)."""

    @property
    def _lanes(self) -> int:
        """Core lanes per env (HER keeps its relabelled copies in lanes of their own)."""
        return self._num_envs

    # ------------------------------------------------------------------ counters
    @property
    def num_envs(self) -> int:
        """Envs of the stored data (0 before the first transition)."""
        return self._num_envs

    @property
    def size(self) -> int:
        """Rows stored per env (at most ``max_size``)."""
        if self.buffer is None or not self.buffer.allocated:
            return 0
        return int(self.buffer.table.counts[0])

    @property
    def step(self) -> int:
        """Rows added since the last :meth:`reset` (what :meth:`get_all_buffer_data`
        returns), at most :attr:`size`."""
        return min(self._fresh, self.size)

    @property
    def data(self) -> dict[str, Any]:
        """Every stored row, oldest first, as pytorchrl lays it out: ``{key: [size,
        num_envs, ...] float32}`` (``None`` for keys not stored). A copy."""
        return self._rows(0, self.size)

    # ------------------------------------------------------------------ writing
    def init_tensors(self, sample: dict[str, Any]) -> None:
        """Lazy initialization from a sample: build the core buffer for its envs and
        remember which of the storage tensors it carries (the core allocates its arrays
        at the first add; fields keep their dtype, batches are float32). Stored data is
        dropped, as pytorchrl's re-allocation does.

        Args:
            sample: Data sample (containing all tensors of an environment transition).

        Raises:
            ArgumentError: ``sample`` is not a dict.
            SpecError: The sample lacks one of ``Observation``, ``Action``, ``Reward``,
                ``NextObservation``, ``NextDone``.
            ShapeError, DtypeError: ``NextDone`` is not ``[num_envs, 1]`` numbers.
        """
        self._init(f"{type(self).__name__}.init_tensors", sample)

    def _init(self, where: str, sample: Any) -> None:
        check_mapping(where, "sample", sample, _TRANSITION)
        missing = [k for k in _REQUIRED if k not in sample]
        if missing:
            raise SpecError(f"{where}: the sample lacks {missing}; a transition needs "
                            f"{list(_REQUIRED)}")
        done2 = _numbers(where, DONE2, sample[DONE2])
        if isinstance(done2, dict) or done2.ndim == 0 or done2.shape[0] < 1:
            raise ShapeError(f"{where}: sample[{DONE2!r}]={describe(done2)}: expected "
                             "[num_envs, 1] with num_envs >= 1 (it counts the envs)")
        n = int(done2.shape[0])
        extras = [k for k in _OPTIONAL if k in sample]
        for k in (*_REQUIRED, *extras):  # the core would store complex values as they are
            _real_leaves(where, k, _numbers(where, k, sample[k]))
        zeros: dict[str, Any] = {}
        for k in _RECURRENT_KEYS:
            if k in sample:
                if self.recurrent_actor:
                    extras.append(k)
                else:  # pytorchrl keeps a single zero row of the hidden states
                    zeros[k] = tree_map(lambda v: np.zeros(np.shape(v[:1]), np.float32),
                                        _numbers(where, k, sample[k]))
        self._set_layout(n, tuple(extras), zeros)
        self._priority = self._new_priority()
        self.buffer = CoreBuffer(self.max_size * self._lanes, num_envs=self._lanes,
                                 seed=self.seed, sampler=self._sampler(),
                                 view=self._view(), autoreset_mode="same_step")
        self._fresh = 0
        self._segments.clear()
        self._cleared()

    def _set_layout(self, n: int, extras: tuple[str, ...], zeros: dict[str, Any]) -> None:
        """What the checks and writes of a transition need to know of the stored data:
        ``n`` envs, the pytorchrl keys stored as core ``extras`` and the ``zeros`` that a
        feed-forward actor's batches hold for the hidden states it sent."""
        self._num_envs = n
        self._extras = extras  # pytorchrl keys stored as core extras
        self._stored = _REQUIRED + extras  # the keys every transition needs
        self._known = frozenset(self._stored) | (  # keys a transition may carry
            frozenset() if self.recurrent_actor else frozenset(_RECURRENT_KEYS))
        self._keys_seen: frozenset[str] = frozenset()  # the last key set found fine
        self._scalar_shapes = ((n,), (n, 1))  # a per-env scalar of one step
        self._zeros = zeros  # RHS/RHS2 placeholders of a feed-forward actor
        self._zero_tensors: tuple[Any, dict[str, Any]] | None = None
        self._false = np.zeros(n, dtype=bool)
        # the real lanes when the core has more
        self._env_ids = None if self._lanes == n else np.arange(n, dtype=np.int64)

    def _view(self) -> Any:
        """The core view (n-step returns when ``n_step > 1``)."""
        from replaybank.views.nstep import NStepView

        if self.n_step == 1:
            return None
        return NStepView(int(self.n_step), self._discount(type(self).__name__))

    def _discount(self, where: str) -> float:
        """``gamma``, which n-step returns need.

        Raises:
            ArgumentError: The algorithm gave none (pytorchrl reads ``algorithm.gamma``;
                it documents no default).
        """
        if self.gamma is None:
            raise ArgumentError(
                f"{where}(algorithm={describe(self.algo)}): n_step={self.n_step} needs "
                "algorithm.gamma, the discount of the n-step returns (pytorchrl reads it; "
                "there is no default); pass an algorithm with gamma, e.g. gamma=0.99")
        return float(self.gamma)

    def _values(self, where: str, sample: Any, steps: int | None) -> dict[str, Any]:
        """The checked core add (``steps`` None: values ``[num_envs, ...]``) or extend
        (values ``[steps, num_envs, ...]``) arguments of pytorchrl-keyed data.

        Raises:
            ArgumentError: ``sample`` is not a dict.
            SpecError: A key the storage holds is missing, or a storage tensor it does
                not hold appeared after the first transition.
            ShapeError: A value's leading dims are not the storage's envs.
            DtypeError: A value holds no numbers, or ``NextDone`` is not 0 or 1.
        """
        if not isinstance(sample, Mapping):
            check_mapping(where, "sample", sample, _TRANSITION)
        n = self._num_envs
        lead = (n,) if steps is None else (steps, n)
        values: dict[str, Any] = {}
        try:  # to_numpy keeps what holds no numbers as an array the checks below refuse
            for k in self._stored:
                v = sample[k]
                if type(v) is not np.ndarray:  # a CPU tensor that needs no grad: zero-copy
                    try:
                        v = v.numpy()
                    except (AttributeError, TypeError, RuntimeError):
                        v = to_numpy(v)
                values[k] = v
        except KeyError:
            missing = [k for k in self._stored if k not in sample]
            raise SpecError(f"{where}: the sample lacks {missing}; this storage holds "
                            f"{list(self._stored)} (the keys of its first transition): pass "
                            "them every step") from None
        keys = sample.keys()
        if keys != self._keys_seen:  # a new key set: check it once
            unknown = [k for k in keys - self._known if k in STORAGE_TENSORS]
            if unknown:
                raise SpecError(f"{where}: the sample has {sorted(unknown)}, which the "
                                f"first transition did not ({list(self._stored)}): a storage "
                                "tensor cannot join later; pass it from the first "
                                "transition on")
            self._keys_seen = frozenset(keys)
        # the other values' leading dims are checked by the core's add, against its lanes
        shapes = self._scalar_shapes if steps is None else (lead, (*lead, 1))
        reward, done = values[REW], values[DONE2]
        if type(reward) is not np.ndarray or reward.shape not in shapes:
            _bad_scalars(where, REW, reward, lead)
        if type(done) is not np.ndarray or done.shape not in shapes:
            _bad_scalars(where, DONE2, done, lead)
        if done.dtype is not _BOOL and not _FLAG_VALUES.issuperset(done.ravel().tolist()):
            _bad_flags(where, DONE2, done)
        out = {"obs": values[OBS], "action": values[ACT], "reward": reward.reshape(lead),
               "next_obs": values[OBS2], "terminated": done.reshape(lead) != 0}
        for key in self._extras:
            out[CORE_NAMES[key]] = values[key]
        return out

    def insert_transition(self, sample: dict[str, Any]) -> None:
        """Store new transition sample.

        Args:
            sample: Data sample (containing all tensors of an environment transition):
                pytorchrl's keys, values ``[num_envs, ...]`` (torch tensors or arrays),
                ``Reward`` and ``NextDone`` ``[num_envs, 1]``; keys that are not storage
                tensors are ignored.

        Raises:
            ArgumentError: ``sample`` is not a dict.
            SpecError: Keys missing, or a storage tensor the first transition lacked.
            ShapeError, DtypeError: A value of the wrong shape or kind (``NextDone``
                not 0 or 1). The storage is then unchanged.
        """
        self._insert(self._where_insert, sample, None)

    def _insert(self, where: str, sample: Any, steps: int | None,
                sent: Sent | None = None) -> None:
        """Check, then write one step (``steps`` None) or ``steps`` steps (of the slice
        ``sent``, when :meth:`insert_data_slice` writes them). The first write builds the
        core buffer from its (first) step; a failure of either leaves the storage as it
        was (not built)."""
        if self.buffer is None:
            with restored_on_error(self, "__dict__"):
                self._init(where, sample if steps is None else tree_map(lambda v: v[0], sample))
                self._insert(where, sample, steps, sent)
            return
        buf = self.buffer
        values = self._values(where, sample, steps)
        try:
            plan = self._plan_insert(where, sample, values, steps, sent) if self._plans else None
            if steps is None:
                buf.add(truncated=self._false, env_ids=self._env_ids,
                        priority=self._priority, **values)
            else:
                buf.extend(truncated=np.zeros((steps, self._num_envs), dtype=bool),
                           env_ids=self._env_ids, priority=self._priority, **values)
        except ReplayBankError:  # nothing was written; name the pytorchrl key if we can
            self._name_refused(where, values, steps)
            raise
        self._fresh += 1 if steps is None else steps
        if self._plans:
            self._after_insert(plan)

    def _name_refused(self, where: str, values: dict[str, Any], steps: int | None) -> None:
        """Raise the error of the value a write was refused for, naming it by pytorchrl's
        key (``sample['Observation']['pos']``), where the core would name its own field
        (``obs/pos``), which a pytorchrl user never wrote; return when every value fits
        (the core's error then stands).

        The values are checked against the stored fields (before the first write: the
        ``NextObservation`` against the ``Observation``) with the core's own rules:
        leading dims, then the entries of a dict observation, the field shape and the
        cast of the dtype.

        Raises:
            ShapeError: A value of the wrong shape.
            SpecError: A dict observation with other entries than the stored ones.
            DtypeError: A value the stored field's dtype does not take.
        """
        lead = (self._num_envs,) if steps is None else (steps, self._num_envs)
        pairs = (("obs", OBS), ("action", ACT), ("next_obs", OBS2), ("reward", REW),
                 *((CORE_NAMES[k], k) for k in self._extras))
        for name, key in pairs:
            _check_lead(where, key, values[name], lead)
        buf = self._core()
        # what each value must fit: the stored fields, or what the first write stores
        spec = buf.table.spec if buf.allocated else Spec.infer({"obs": values["obs"]}, lead)
        for name, key in pairs:
            field = "obs" if name == "next_obs" else name  # next_obs is stored as obs
            given = flatten({field: values[name]})
            held = {f: spec[f] for f in spec if f == field or f.startswith(field + "/")}
            if not held:  # a field the first write sets from this very value
                continue
            if given.keys() != held.keys():
                raise SpecError(
                    f"{where}: sample[{key!r}] has the entries {_entries(given, field)}; "
                    f"the storage holds {_entries(held, field)} (those of its first "
                    "transition): pass the same entries every step")
            for f, value in given.items():
                label = f"{where}: sample[{key!r}]" + "".join(
                    f"[{part!r}]" for part in f.split("/")[1:])
                held[f].cast(label, value, lead)

    # ------------------------------------------------------------------ batches
    def before_gradients(self) -> None:
        """Steps required before updating actor policy model (nothing: the core keeps
        priorities current as data arrives)."""

    def after_gradients(self, batch: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        """Steps required after updating actor policy model.

        Args:
            batch: Data batch used to compute the gradients.
            info: Additional relevant info from gradient computation.

        Returns:
            info, updated with relevant info from the storage.

        Raises:
            ArgumentError: ``batch`` or ``info`` is not a dict.
        """
        where = f"{type(self).__name__}.after_gradients"
        check_mapping(where, "batch", batch, "a batch of generate_batches")
        check_mapping(where, "info", info, "the algorithm's info, e.g. {'Algorithm': {...}}")
        return info

    def generate_batches(self, num_mini_batch: int, mini_batch_size: int,
                         num_epochs: int = 1) -> Iterator[dict[str, Any]]:
        """Returns a batch iterator to update actor.

        Args:
            num_mini_batch: Number of mini batches per epoch (one is drawn per batch),
                an int >= 1.
            mini_batch_size: Number of samples contained in each mini batch, an int >= 1.
            num_epochs: Number of epochs, an int >= 1: the iterator yields
                ``num_epochs * num_mini_batch`` batches, the ``num_mini_batch`` of each
                epoch drawn afresh (ERE's window schedule runs over each epoch's mini
                batches). pytorchrl's off-policy algorithms pass 1.

        Returns:
            An iterator of one dict per mini batch: every storage tensor as float32 ``[B,
            ...]`` on ``device`` (``{}`` for keys not stored; ``Reward``, ``NextDone``,
            ``Done`` ``[B, 1]``); for a recurrent actor ``mini_batch_size //
            sequence_length + 1`` windows of ``sequence_length`` steps flattened to ``[S *
            sequence_length, ...]`` with the hidden states of each window's first step
            ``[S, ...]``, each window inside one segment (rows that continue each
            other: see :meth:`insert_data_slice`).

        Raises:
            ArgumentError, ConfigError: An argument of the wrong kind or below 1, or a
                ``device`` torch does not know or this machine lacks (raised by this
                call, not at the first ``next``).
            EmptyBufferError: Nothing stored (raised by this call); at ``next``, the
                scheme draws no stored step (PER: every priority is 0), or, for a
                recurrent actor, no env holds ``update_every`` consecutive rows, no window
                lies inside one segment, or the sampler kept drawing windows that cross one.
        """
        where = f"{type(self).__name__}.generate_batches"
        count = check_int(where, "num_mini_batch", num_mini_batch)
        size = check_int(where, "mini_batch_size", mini_batch_size)
        epochs = check_int(where, "num_epochs", num_epochs)
        torch = torch_module()
        self._device(torch, available=True)
        if self.size == 0:
            raise EmptyBufferError(f"{where}: nothing stored; insert transitions first")
        return self._batches(count, size, epochs, torch)

    def _batches(self, num_mini_batch: int, mini_batch_size: int, num_epochs: int,
                 torch: Any) -> Iterator[dict[str, Any]]:
        batch = self._sequence_batch if self.recurrent_actor else self._batch
        for _ in range(num_epochs):
            for k in range(num_mini_batch):  # mini batch k of the epoch
                yield batch(k, num_mini_batch, mini_batch_size, torch)

    def _device(self, torch: Any, available: bool = False) -> Any:
        """``device`` as a torch.device (parsed once: a string costs a parse per tensor).

        A storage may be built for a device this machine lacks (pytorchrl builds one per
        worker from a factory); ``available`` (:meth:`generate_batches`, which puts
        tensors there) also requires it here, once.

        Raises:
            ConfigError: torch does not know ``device``, or, with ``available``, this
                machine lacks it (torch would raise a bare ``AssertionError``: "Torch
                not compiled with CUDA enabled").
        """
        cached = self._torch_device
        if cached is None or cached[0] is not self.device or (available and not cached[2]):
            dev = checked_device(self.device, type(self).__name__, available=available)
            cached = self._torch_device = (self.device, dev, available)
        return cached[1]

    def _core(self) -> CoreBuffer:
        if self.buffer is None:
            raise EmptyBufferError(f"{type(self).__name__}: nothing stored yet; insert "
                                   "transitions first")
        return self.buffer

    def _batch(self, k: int, num_mini_batch: int, mini_batch_size: int,
               torch: Any) -> dict[str, Any]:
        core = self._core()
        options = self._sample_kwargs(k, num_mini_batch)
        try:
            b = core.sample(mini_batch_size, **options)
        except EmptyBufferError:  # the core's message names its own arguments
            raise EmptyBufferError(f"{type(self).__name__}.generate_batches(mini_batch_size="
                                   f"{mini_batch_size}): {self._no_draws()}") from None
        return self._tensor_batch(b, b.__getitem__, k, num_mini_batch, torch)

    def _no_draws(self) -> str:
        """Why the scheme's sampler drew no step from a storage that holds some, and the
        fix, in this front end's terms (each scheme that can refuse says why)."""
        return (f"the sampling scheme can draw none of the {self.size} rows per env stored; "
                "insert more transitions")

    def _tensor_batch(self, batch: Any, field: Callable[[str], Any], k: int,
                      num_mini_batch: int, torch: Any) -> dict[str, Any]:
        """pytorchrl's batch dict of a core ``batch`` (``field(core name)``: its data):
        float32 tensors on ``device``, then the scheme's extra keys."""
        dev = self._device(torch)
        out = self._translated(field, lambda v: tensor_of(v, torch, dev),
                               {key: {} for key in self.storage_tensors})
        if self._zeros:
            zeros = self._zero_tensors
            if zeros is None or zeros[0] != dev:  # made once per device, then shared
                zeros = self._zero_tensors = (dev, tensor_of(self._zeros, torch, dev))
            out.update(zeros[1])
        self._batch_info(out, batch, k, num_mini_batch, torch)
        return out

    def _sequence_batch(self, k: int, num_mini_batch: int, mini_batch_size: int,
                        torch: Any) -> dict[str, Any]:
        """Windows of ``overlap`` burn-in + ``non_overlap`` steps, flattened, each inside
        one segment (:meth:`_windows`)."""
        windows = mini_batch_size // self.sequence_length + 1
        state = [CORE_NAMES[key] for key in _RECURRENT_KEYS if key in self._extras]
        core = self._core()
        options = self._sample_kwargs(k, num_mini_batch)

        def draw(n: int) -> SequenceBatch:
            try:
                return core.sample_sequences(
                    n, self.non_overlap_length, burn_in=self.overlap_length,
                    episode_boundary="cross", strict=True, state_fields=state, **options)
            except EmptyBufferError:  # the core's message names its own arguments
                raise EmptyBufferError(self._no_sequences()) from None

        sb = self._windows(draw, windows)
        nested = sb.to_dict()

        def field(name: str) -> Any:
            if name in state:  # the hidden states of each window's first step [S, ...]
                return nested["initial"][name]
            # [S, W, ...] -> [S * W, ...]
            return tree_map(lambda v: v.reshape(-1, *v.shape[2:]), nested[name])

        return self._tensor_batch(sb, field, k, num_mini_batch, torch)

    def _windows(self, draw: Callable[[int], SequenceBatch], count: int) -> SequenceBatch:
        """``count`` windows of ``draw`` that never join two segments (inserted slices
        that do not continue each other): one draw when the stored rows are one
        segment, else the crossing windows are redrawn (the starts follow the sampler's
        law conditioned on windows inside one segment; a draw that fails puts the
        generator back).

        Raises:
            EmptyBufferError: No window of ``sequence_length`` steps lies inside one
                segment, or the sampler keeps drawing windows that cross one.
        """
        oldest, newest = self._span()
        if not self._segments.separate(oldest, newest):  # every window is inside one
            return draw(count)
        where = f"{type(self).__name__}.generate_batches"
        width = self.sequence_length
        if (self._lanes == self._num_envs and newest - oldest >= width
                and not self._segments.usable(oldest, newest, width)):
            lengths = self._segments.lengths(oldest, newest).tolist()
            raise EmptyBufferError(
                f"{where}: no window of sequence_length={width} steps (update_every) lies "
                f"inside one inserted slice: the stored rows are slices of {lengths} rows "
                "that do not continue each other (another collector's data, or rows after "
                "a gap a collector held back), and a window never joins two of them; "
                f"insert slices of at least {width} rows (whole sequences, as "
                "get_all_buffer_data exports them)")
        core = self._core()
        with restored_on_error(core.rng.bit_generator, "state"):
            return self._segments.inside(draw, count, core.table.lanes, self._num_envs,
                                         width, where)

    def _no_sequences(self) -> str:
        """Why no recurrent batch can be drawn, in this front end's terms (its users pass
        neither the core's window arguments nor its boundary options)."""
        t = self._core().table
        length = self.sequence_length
        usable = len(valid_starts(t.link, t.written, t.counts, length, True, length))
        need = (f"{type(self).__name__}.generate_batches: a recurrent actor trains on "
                f"sequences of algorithm.update_every={length} consecutive rows of one env "
                f"({self.overlap_length} overlapping + {self.non_overlap_length} new)")
        if usable == 0:
            return (f"{need}, and the storage holds none ({self.size} rows per env; a "
                    "sequence never spans rows that do not follow each other); insert more "
                    "transitions")
        return (f"{need}; the storage holds {usable}, but the sampling scheme draws none of "
                "them (their priorities are 0 or too small, or they lie outside the recent "
                "window); insert more transitions")

    def _translated(self, field: Callable[[str], Any], convert: Callable[[Any], Any],
                    out: dict[str, Any]) -> dict[str, Any]:
        """pytorchrl's dict of core data: ``out`` (what keys not stored hold) with
        ``convert(field(core name))`` under each stored key, a per-env scalar as a column
        ``[..., 1]``: the one translation of core names to pytorchrl's keys."""
        for key, name, column in FIELDS:
            value = field(name)
            out[key] = convert(value[..., None] if column else value)
        for key in self._extras:
            out[key] = convert(field(CORE_NAMES[key]))
        return out

    # ------------------------------------------------------------------ slices
    def _rows(self, start: int, stop: int) -> dict[str, Any]:
        """Rows ``[start, stop)`` of every env in oldest-first order (0 = the oldest row
        stored), pytorchrl's layout ``{key: [rows, num_envs, ...] float32}``; a
        feed-forward actor's hidden states are pytorchrl's single zero row ``[1,
        num_envs, ...]`` (none when the slice holds no rows)."""
        out: dict[str, Any] = dict.fromkeys(self.storage_tensors)
        buf = self.buffer
        if buf is None or not buf.allocated:
            return out
        t = buf.table
        n, lanes = self._num_envs, t.lanes
        start, stop = max(0, start), min(stop, self.size)
        rows = max(0, stop - start)
        lane = np.arange(n, dtype=np.int64)
        oldest = t.written[:n] - t.counts[:n]  # [n]
        seq = oldest[None, :] + np.arange(start, start + rows, dtype=np.int64)[:, None]
        keys = (seq * lanes + lane[None, :]).reshape(-1)  # [rows * n]

        def shaped(v: Any) -> Any:
            return np.asarray(v, dtype=np.float32).reshape(rows, n, *np.shape(v)[1:])

        def field(name: str) -> Any:
            if name == "next_obs":  # stored once, as the next step's obs
                return unflatten({f: shaped(t.gather_next(f, keys))
                                  for f in t.obs_fields})["obs"]
            names = [f for f in t.spec if f == name or f.startswith(name + "/")]
            return unflatten({f: shaped(t.gather(f, keys)) for f in names})[name]

        for key, zero in self._zeros.items():  # [1, ...] -> [min(rows, 1), num_envs, ...]
            out[key] = tree_map(lambda z: np.zeros((min(rows, 1), n, *z.shape[1:]),
                                                   np.float32), zero)
        return self._translated(field, lambda v: v, out)

    def get_all_buffer_data(self, data_to_cpu: bool = False) -> dict[str, Any]:
        """Return the rows added since the last :meth:`reset`: ``{key: [step, num_envs,
        ...]}`` float32 numpy, in CPU memory whatever ``data_to_cpu`` says. For a
        recurrent actor only whole sequences; with ``data_to_cpu`` the last
        ``overlap_length`` exported rows and the rows held back (those after the last
        whole sequence) are staged, and :meth:`reset` keeps them at the head of the
        storage, so a learner gets every row (pytorchrl stages the last
        ``overlap_length`` rows added, which loses the held-back rows before them when
        ``step`` is not a multiple of ``sequence_length``).

        Args:
            data_to_cpu: Whether the data will leave this process (stages the recurrent
                overlap slice).

        Returns:
            The data, one-step transitions as added (n-step returns, priorities and
            relabelled HER copies are made again by the storage that inserts them).

        Raises:
            ArgumentError: ``data_to_cpu`` is not a bool.
        """
        to_cpu = check_bool(f"{type(self).__name__}.get_all_buffer_data", "data_to_cpu",
                            data_to_cpu)
        step = self.step
        # a recurrent actor's data: whole sequences only
        idx = step // self.sequence_length * self.sequence_length if self.recurrent_actor else step
        base = self.size - step
        data = self._rows(base, base + idx)
        if self.recurrent_actor and to_cpu:
            self.staged_overlap = self.get_data_slice(idx - self.overlap_length, step)
        return data

    def get_data_slice(self, start_pos: int, end_pos: int) -> dict[str, Any]:
        """Makes a copy of all tensors between steps ``start_pos`` and ``end_pos``.

        Args:
            start_pos: Initial slice position (0: the first row added since the last
                :meth:`reset`, the oldest row stored once the ring wrapped).
            end_pos: Final slice position (exclusive).

        Returns:
            ``{key: [rows, num_envs, ...]}`` float32 copies (rows clipped to what is
            stored).

        Raises:
            ArgumentError: A position is not an int.
        """
        where = f"{type(self).__name__}.get_data_slice"
        start = check_int(where, "start_pos", start_pos, None)
        end = check_int(where, "end_pos", end_pos, None)
        base = self.size - self.step
        return self._rows(base + start, base + end)

    def reset(self) -> None:
        """Set ``size`` and ``step`` to zero: the stored rows are dropped (the next
        batches draw only rows added after this call; the core buffer keeps its
        allocation, its generator and its scheme's settings). If the actor is recurrent
        and :meth:`get_all_buffer_data` staged an overlap slice, that slice is added back
        at the beginning of the storage (``size`` and ``step`` start at its length), as
        pytorchrl's reference says."""
        staged = self.staged_overlap if self.recurrent_actor else None
        self.staged_overlap = None
        if self.buffer is not None:
            self.buffer.clear()
        self._fresh = 0
        self._segments.clear()
        self._cleared()
        if staged is not None:
            data = _stored_keys(staged, self.storage_tensors)
            rows = _length(data[OBS]) if OBS in data else 0
            if rows:
                self._insert(f"{type(self).__name__}.reset", data, rows)

    def insert_data_slice(self, new_data: dict[str, Any]) -> None:
        """Appends ``new_data`` (``{key: [l, num_envs, ...]}``, e.g. another storage's
        :meth:`get_all_buffer_data`) to the stored data, in one core write. For a
        recurrent actor, leading rows that repeat the newest stored rows (the overlap
        slice a collector re-sends) are skipped, and the slice continues them; any
        other slice starts a segment of its own (another collector's data, or rows after
        a gap), which no window of :meth:`generate_batches` crosses: its leading
        ``overlap_length`` rows are the burn-in of its first window, as in pytorchrl,
        which stores every slice whole. A ``HERBuffer`` continues the running episodes
        of the stream of slices this one continues, which need not be the newest rows
        (:mod:`~replaybank.compat.pytorchrl.streams`). A feed-forward actor's hidden states
        are not stored, whatever their length (pytorchrl exports one zero row of them):
        the first write takes their shape, and batches hold one zero row of it, as
        the collector's do.

        Raises:
            ArgumentError: ``new_data`` is not a dict.
            ShapeError: Tensors of different lengths, or of the wrong shape.
            SpecError, DtypeError: As :meth:`insert_transition`; nothing is added.
        """
        where = f"{type(self).__name__}.insert_data_slice"
        check_mapping(where, "new_data", new_data,
                      "{key: [rows, num_envs, ...]}, e.g. get_all_buffer_data()")
        data = {k: _numbers(where, k, v)
                for k, v in _stored_keys(new_data, self.storage_tensors).items()}
        lengths = set()
        for k, v in data.items():
            leaf = _first_leaf(v)
            if leaf.ndim == 0:
                raise ShapeError(f"{where}: new_data[{k!r}]={describe(leaf)}: expected "
                                 "[rows, num_envs, ...]")
            if self.recurrent_actor or k not in _RECURRENT_KEYS:  # else one zero row
                lengths.add(int(leaf.shape[0]))
        if len(lengths) > 1:
            raise ShapeError(f"{where}: tensors of different lengths {sorted(lengths)}; "
                             "every key needs the same number of rows")
        if not lengths:
            return
        rows = lengths.pop()
        first = self._resent(data) if self.recurrent_actor else 0
        if rows <= first:
            return
        seq = self._span()[1]
        self._insert(where, _slice(data, first, rows), rows - first, Sent(data, first))
        if self.recurrent_actor and not first:  # it does not continue the stored rows
            self._segments.start(seq, self._span()[0])

    def _resent(self, data: dict[str, Any], end: int | None = None) -> int:
        """How many leading rows of a slice ``data`` repeat the stored rows before
        ``end`` (a sequence number; None: the newest stored rows), as the overlap a
        recurrent collector re-sends after :meth:`reset` repeats its previous export's
        last rows (compared on every key the storage holds): ``overlap_length``, or 0."""
        n = self.overlap_length
        oldest, written = self._span()
        end = written if end is None else end
        if not n or end - n < oldest:
            return 0
        newest = self._rows(end - n - oldest, end - oldest)
        return n if _same_data(newest, _slice(data, 0, n), self._stored) else 0

    def _follows(self, data: dict[str, Any], end: int, envs: list[int]) -> bool:
        """Whether the first row of a slice ``data`` is the next step of the stored row
        before ``end`` in each env of ``envs``: its ``Observation`` is that row's
        ``NextObservation`` (how a feed-forward collector's next export continues its
        previous one; the envs whose episode ended at that row start another one)."""
        oldest = self._span()[0]
        if not envs or end - 1 < oldest:
            return False
        stored = self._rows(end - 1 - oldest, end - oldest)[OBS2]  # [1, num_envs, ...]
        return _equal(tree_map(lambda v: v[0, envs], stored),
                      tree_map(lambda v: to_numpy(v)[0, envs], data[OBS]))

    def _span(self) -> tuple[int, int]:
        """Sequence numbers ``(oldest, next)`` of the real lanes' rows: the oldest row
        stored and the next row written (every env's lane is written together)."""
        buf = self.buffer
        if buf is None or not buf.allocated:
            return 0, 0
        written = int(buf.table.written[0])
        return written - int(buf.table.counts[0]), written

    def insert_single_tensor_slice(self, tensor_storage: dict[str, Any], tensor_key: str,
                                   tensor_values: Any) -> int:
        """Appends ``tensor_values`` to ``tensor_storage[tensor_key]`` (a caller's dict of
        ``[max_size, ...]`` arrays, allocated float32 when None) at position ``step``,
        circularly.

        Args:
            tensor_storage: Dict holding the array.
            tensor_key: Key to use to store the tensor.
            tensor_values: Tensor values ``[l, ...]``.

        Returns:
            ``l``, the length (time axis) of the tensor added.

        Raises:
            ArgumentError: ``tensor_storage`` is not a dict or ``tensor_key`` not a str.
            ShapeError: ``tensor_values`` has no time axis, or rows of another shape
                than the array it goes to.
            DtypeError: ``tensor_values`` holds no numbers.
        """
        where = f"{type(self).__name__}.insert_single_tensor_slice"
        check_mapping(where, "tensor_storage", tensor_storage, "{key: [max_size, ...] array}")
        check_type(where, "tensor_key", tensor_key, str, "a str key, e.g. 'Observation'")
        values = _numbers(where, tensor_key, tensor_values)
        if isinstance(values, dict) or values.ndim == 0:
            raise ShapeError(f"{where}(tensor_values={describe(tensor_values)}): expected "
                             "an array [l, ...] with a time axis")
        numbers(values, f"{where}: tensor_values")
        length = int(values.shape[0])
        target = tensor_storage.get(tensor_key)
        if target is not None and tuple(np.shape(target)[1:]) != values.shape[1:]:
            raise ShapeError(f"{where}: tensor_values={describe(values)} rows do not fit "
                             f"tensor_storage[{tensor_key!r}]={describe(target)}; pass rows "
                             f"of shape {tuple(np.shape(target)[1:])}")
        if target is None:
            target = tensor_storage[tensor_key] = np.zeros((self.max_size, *values.shape[1:]),
                                                            dtype=np.float32)
        pos = (self.step + np.arange(length)) % len(target)
        target[pos] = values
        return length

    # ------------------------------------------------------------------ parameters
    def update_storage_parameter(self, parameter_name: str, new_parameter_value: Any) -> None:
        """If ``parameter_name`` is an attribute of the storage, change its value to
        ``new_parameter_value`` (and tell the core: ``max_size`` rebuilds an empty
        storage, ``n_step`` and ``gamma`` swap the n-step view, PER/ERE parameters go to
        the sampler). The value is checked as the constructor checks it.

        The parameters that can change are those of :attr:`settable` (``max_size``,
        ``gamma``, ``device``, and each scheme's: ``n_step``; ``epsilon``, ``alpha``,
        ``beta``, ``default_error``; ``eta``, ``cmin``; ``her_function``). The storage's
        other attributes are its state or fixed at construction (``size``, ``num_envs``,
        ``data``, ``buffer``, ``recurrent_actor``, ...): setting one is refused, naming
        it and why. Names that are no attribute are ignored, as in pytorchrl.

        Args:
            parameter_name: Attribute name.
            new_parameter_value: New value for ``parameter_name``.

        Raises:
            ArgumentError: ``parameter_name`` is not a str, or the value is of the wrong
                kind.
            ConfigError: ``parameter_name`` is an attribute that cannot change; the
                value is out of range; ``max_size`` changed while data is stored (the
                core's capacity is fixed; pytorchrl itself only shrinks empty collector
                storages); or ``n_step > 1`` without a ``gamma``. The storage is then
                unchanged.
        """
        check_type("update_storage_parameter", "parameter_name", parameter_name, str,
                   "an attribute name (a str), e.g. 'n_step'")
        if not hasattr(self, parameter_name):
            return
        if parameter_name not in self.settable:
            why = _FIXED.get(parameter_name, "the storage's own state, not a parameter")
            raise ConfigError(
                f"update_storage_parameter({parameter_name!r}, "
                f"{describe(new_parameter_value)}): {parameter_name!r} is {why}, so it "
                f"cannot change; the parameters that can are {sorted(self.settable)} "
                "(build a new storage, e.g. with create_factory(...), for the rest)")
        setattr(self, parameter_name, self._check_parameter(parameter_name, new_parameter_value))
        self._parameters_changed(parameter_name)

    def _check_parameter(self, name: str, value: Any) -> Any:
        """``value`` checked for the attribute ``name`` (subclasses add theirs).

        Raises:
            ArgumentError, ConfigError: A bad value.
        """
        where = f"update_storage_parameter({name!r}, ...)"
        if name == "device" and "torch" in sys.modules:  # else checked by generate_batches
            checked_device(value, None, f"{where}: device", available=False)
        key = "default_error" if name == "error" else name  # PER's attribute for it
        if key not in PARAMETERS:
            return value
        checked = PARAMETERS[key](where, "new_parameter_value" if key in _VALUE_NAMED
                                  else key, value)
        if name == "max_size" and self.size:
            raise ConfigError(
                f"update_storage_parameter('max_size', {value!r}): the storage holds "
                f"{self.size} rows per env; change it while empty")
        if name == "n_step" and checked > 1 and self.gamma is None:
            raise ConfigError(
                f"update_storage_parameter('n_step', {value!r}): n-step returns need a "
                f"discount and the algorithm ({describe(self.algo)}) has no gamma; set it "
                "first with update_storage_parameter('gamma', 0.99)")
        return checked

    def _parameters_changed(self, name: str) -> None:
        if name == "max_size":
            self.buffer = None  # rebuilt at the next transition
        elif name in ("n_step", "gamma") and self.buffer is not None:
            view = self._view()
            if view is None:
                from replaybank.views.transition import TransitionView

                view = TransitionView()
            self.buffer.view = view



# ---------------------------------------------------------------------- helpers
def _first_leaf(value: Any) -> Any:
    """The first array of a value (nested dicts: depth first)."""
    while isinstance(value, dict):
        if not value:
            return np.zeros(())
        value = next(iter(value.values()))
    return value


def _stored_keys(data: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The storage tensors of pytorchrl-layout data that hold something (not None, not
    pytorchrl's ``{}`` of a key not stored)."""
    return {k: v for k, v in data.items()
            if k in keys and v is not None and not (isinstance(v, dict) and not v)}


def _length(value: Any) -> int:
    """Rows of pytorchrl-layout data (of its first array; 0 for an empty dict)."""
    shape = np.shape(to_numpy(_first_leaf(value)))
    return int(shape[0]) if shape else 0


def _slice(data: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows ``[a, b)`` of pytorchrl-layout data."""
    return {k: None if v is None else tree_map(lambda x: to_numpy(x)[a:b], v)
            for k, v in data.items()}


def _same_data(a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Whether two pytorchrl-layout dicts hold the same rows (compared on ``keys``: the
    hidden states too, for a recurrent actor)."""
    return a is b or all(_equal(a.get(key), b.get(key)) for key in keys)


def _equal(x: Any, y: Any) -> bool:
    """Whether two values (arrays, tensors, dicts of them, or None for a key not stored)
    hold the same numbers."""
    if x is None or y is None:
        return x is y
    if isinstance(x, dict) or isinstance(y, dict):
        if not (isinstance(x, dict) and isinstance(y, dict)) or x.keys() != y.keys():
            return False
        return all(_equal(x[k], y[k]) for k in x)
    xa, ya = to_numpy(x), to_numpy(y)
    return bool(xa.shape == ya.shape and np.array_equal(
        xa.astype(np.float32), ya.astype(np.float32), equal_nan=True))


def window_lengths(discount: Any, gamma: float, n: int) -> Any:
    """Each row's window length ``L`` from its discount ``gamma ** L`` ``[B]`` (``n`` where
    gamma is 0 or 1: the discount then does not depend on L)."""
    d = np.asarray(discount, dtype=np.float64)
    if not 0.0 < gamma < 1.0:
        return np.full(d.shape, float(n), dtype=np.float32)
    return np.rint(np.log(d) / math.log(gamma)).astype(np.float32)

