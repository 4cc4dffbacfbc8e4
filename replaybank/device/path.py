"""Sampling on the device for device storage: keys drawn there, one gather per dtype group.

A buffer with ``storage="torch"`` keeps its field data in device tensors (packed per dtype:
:meth:`~replaybank.device.backend.TorchBackend.allocate_fields`) and its
bookkeeping on the host. The host path of :meth:`ReplayBuffer.sample
<replaybank.buffers.replay.ReplayBuffer.sample>` draws keys with the buffer's numpy
generator and sends index arrays to the device on every call. :class:`DevicePath` instead:

1. brings the device mirror of the bookkeeping up to date
   (:class:`~replaybank.device.mirror.DeviceMirror`: a host-to-device copy of what a
   write changed, nothing when no write happened since the last sample);
2. draws keys on the device with a ``torch.Generator`` of its own
   (:func:`~replaybank.device.draws.uniform_keys`);
3. reads each dtype group with one ``index_select`` of ``[B]`` rows (groups holding an
   observation field read ``[2B]`` rows: the steps and their next steps), hands out each
   field as a view of its columns, and patches next observations kept aside (episode
   ends, discontinuities, each lane's newest step) from the side store with
   ``torch.where``.

Nothing in it reads a device value on the host: no ``.item()``, ``.cpu()``, ``nonzero``
or boolean indexing, so a sample queues work on the device and returns (and a fixed batch
size can be captured in a CUDA graph: :meth:`DevicePath.sample_fn`).

Which calls take it (else the host path serves the call, unchanged):

* a sampler with exactly uniform draws (:class:`~replaybank.samplers.base.UniformDraws`:
  the default ``UniformSampler``) and a one-step view (:class:`~replaybank.views.base.
  StepView`), ``replace=True`` and no options. Same distribution as the host path
  (uniform over the live steps), *not* the same keys: the device generator is not the
  buffer's numpy generator.
* a :class:`~replaybank.samplers.prioritized.PrioritizedSampler` with a one-step view,
  ``replace=True`` (``beta=`` allowed): the sampler draws on the host, exactly as for
  numpy storage (its compiled tree is the record of every priority: the same keys,
  probabilities and weights as numpy storage under the same seed), and the keys, their
  next steps' slots, the weights and the probabilities reach the device in one packed
  copy (:func:`~replaybank.transfer.to_device`) for the grouped gather. A device sum tree
  was tried and dropped: at a batch of 256 its descent and updates took about 70 kernel
  launches, 1.26 ms a call on an H200 against 0.10 ms for the host tree
  (``docs/benchmarks.md``).
* everything else (n-step, frame stacks, recent, lane split, sequences, ``replace=False``)
  draws on the host exactly as numpy storage does (the same keys and samples as numpy
  storage under the same seed) and gathers on the device.

The device generator is seeded from the buffer's numpy generator when the path first
samples, and its state is saved with the buffer (``state_dict()["device_rng"]``), so
save -> load -> sample gives the identical next batch.

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(64, num_envs=2, storage="torch", device="cpu", seed=0)
    >>> for t in range(10):
    ...     buf.add(obs=np.full((2, 3), t, np.float32), action=[0, 1], reward=[1.0, 0.0],
    ...             next_obs=np.full((2, 3), t + 1, np.float32), terminated=[False, False],
    ...             truncated=[False, False])
    >>> b = buf.sample(8)
    >>> type(b.indices).__name__, bool((b.next_obs == b.obs + 1).all())
    ('Tensor', True)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from replaybank.buffers.sampling_parts import Parts
from replaybank.device.draws import lane_keys, lockstep_keys, uniform_keys
from replaybank.device.mirror import DeviceMirror
from replaybank.ops import ring
from replaybank.samplers.base import LaneView
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.sample_args import LARGE_BATCH
from replaybank.storage.table import StepTable
from replaybank.transfer import to_device
from replaybank.views.base import next_name

__all__ = ["DeviceArrays", "DevicePath", "device_path"]


@runtime_checkable
class DeviceArrays(Protocol):
    """A backend whose arrays are torch tensors on ``device`` and which lets the buffer draw
    keys there (``device_draws``; False: host draws, the same samples as numpy storage)."""

    device: Any
    device_draws: bool
    host_numpy: bool


def device_path(backend: Any) -> DevicePath | None:
    """The device path of a buffer on ``backend`` (None: not device storage, or device
    draws turned off)."""
    if isinstance(backend, DeviceArrays) and backend.device_draws and not backend.host_numpy:
        return DevicePath(backend.device)
    return None


@dataclass
class _Group:
    """Fields sharing one tensor: its flat ``[T * lanes, width]`` view and each member's
    ``(name, columns, field shape, next name)``: its column (a scalar field) or slice of
    columns, and ``next_<name>`` for an observation field (else None)."""

    flat: Any
    members: list[tuple[str, int | slice, tuple[int, ...], str | None]] = field(
        default_factory=list)
    has_obs: bool = False


class DevicePath:
    """Device draws and grouped gathers for one buffer (see the module docs).

    Args:
        device: The storage's ``torch.device``.
    """

    def __init__(self, device: Any) -> None:
        self.torch = sys.modules["torch"]  # device storage imported it
        self.device = device
        self.generator: Any = None  # seeded from the host generator on first use
        self._mirror: DeviceMirror | None = None
        self._plan: tuple[StepTable, tuple[Any, ...], list[_Group]] | None = None
        self._static: dict[int, _Static] = {}
        # (lanes, [[0], [lanes]] on the device): the offsets of a slot and of its next step
        self._next_offsets: tuple[int, Any] | None = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``{"generator": uint8 state}`` once seeded, else ``{}``."""
        if self.generator is None:
            return {}
        return {"generator": self.generator.get_state().numpy().copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (``{}``: reseed from the host generator on next use)."""
        gen = state.get("generator")
        if gen is None:
            self.generator = None
            return
        g = self.torch.Generator(device=self.device)
        g.set_state(self.torch.from_numpy(np.ascontiguousarray(gen, dtype=np.uint8)))
        self.generator = g

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the generator as its state; plans and graphs are rebuilt."""
        return {"device": str(self.device), "state": self.state_dict()}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.__init__(sys.modules["torch"].device(saved["device"]))  # type: ignore[misc]
        self.load_state_dict(saved["state"])

    # ------------------------------------------------------------------ sampling
    def serves(self, parts: Parts, replace: Any, kwargs: dict[str, Any]) -> bool:
        """Whether this call draws on the device (see the module docs)."""
        if replace is not True or parts.step is None or parts.transform is not None:
            return False
        if parts.traits.uniform is not None:
            return not kwargs
        return self._prioritized(parts) is not None and set(kwargs) <= {"beta"}

    def serves_static(self, parts: Parts) -> bool:
        """Whether :meth:`sample_fn` serves these parts (uniform one-step draws)."""
        return parts.traits.uniform is not None and self.serves(parts, True, {})

    @staticmethod
    def _prioritized(parts: Parts) -> PrioritizedSampler | None:
        """The buffer's sampler when it is a plain proportional PER sampler."""
        sampler = parts.traits.sampler
        return sampler if isinstance(sampler, PrioritizedSampler) else None

    def sample(self, table: StepTable | None, parts: Parts, rng: np.random.Generator,
               batch_size: Any, replace: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """A batch drawn and gathered on the device, or None: the host path serves this
        call (another sampler or view, options, or arguments the host path rejects with
        its errors: a bad batch size, an empty buffer, a zero total priority)."""
        if table is None or type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH \
                or not self.serves(parts, replace, kwargs) or table.size == 0:
            return None
        per = self._prioritized(parts)
        if per is None:
            return self._draw_gather(table, rng, batch_size)
        if not per.total > 0.0:  # the host path raises its error
            return None
        return self._host_draw_gather(table, per, rng, batch_size, kwargs)

    def _host_draw_gather(self, table: StepTable, sampler: PrioritizedSampler,
                          rng: np.random.Generator, batch_size: int,
                          kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keys, probabilities and weights drawn by ``sampler`` on the host (as the host
        path's draw: the same call, the same generator), sent with the ``[2B]`` slots of
        the steps and their next steps in one packed copy, then gathered."""
        lanes = LaneView(table.T, table.lanes, table.written, table.counts)
        res = sampler.sample(batch_size, lanes, rng, replace=True, **kwargs)
        n = table.T * table.lanes
        slots = ring.key_to_slot(res.keys, table.T, table.lanes)
        host: dict[str, Any] = {"pairs": np.concatenate([slots, (slots + table.lanes) % n]),
                                "indices": res.keys}
        if res.weights is not None:
            host["weights"] = res.weights.astype(np.float32)
        if res.probabilities is not None:
            host["probabilities"] = res.probabilities
        dev: dict[str, Any] | None = None
        if self.device.type != "cpu":  # one packed copy (on the CPU: the arrays themselves)
            dev = to_device(self.torch, host, self.device, pin=self.device.type == "cuda")
        if dev is None:
            dev = {k: self.torch.from_numpy(v).to(self.device) for k, v in host.items()}
        self.mirror(table).sync(table)
        out = self.gather(table, dev.pop("pairs"))
        out.update(dev)
        return out

    def _seed(self, rng: np.random.Generator) -> None:
        if self.generator is None:
            self.generator = self.torch.Generator(device=self.device)
            self.generator.manual_seed(int(rng.integers(0, 2**63 - 1)))

    def _draw_gather(self, table: StepTable, rng: np.random.Generator, batch_size: int,
                     sync: bool = True, eager: bool = True) -> dict[str, Any]:
        """Draw ``batch_size`` keys and gather them. ``eager``: lanes holding the same steps
        draw in one kernel from the host's counters (:func:`lockstep_keys`), others in four
        from the host's live count and the mirror's lane tables (:func:`lane_keys`); a CUDA
        graph (``eager=False``) draws from the device counters alone
        (:func:`uniform_keys`)."""
        mirror = self.mirror(table)
        if sync:  # host-to-device copies: never inside a graph capture
            mirror.sync(table)
        self._seed(rng)
        if eager:
            keys = lockstep_keys(self.torch, self.generator, self.device, table.written,
                                 table.counts, batch_size)
            if keys is None:
                keys = lane_keys(self.torch, self.generator, int(table.counts.sum()),
                                 mirror.cum, mirror.key_base, batch_size)
            keys_or_slots = keys  # a key modulo T * lanes is its slot
        else:
            keys, keys_or_slots = uniform_keys(self.torch, self.generator, mirror.written,
                                               mirror.counts, table.T, batch_size)
        out = self.gather(table, self._pairs(table, keys_or_slots))
        out["indices"] = keys
        return out

    def _pairs(self, table: StepTable, keys: Any) -> Any:
        """``[2B]`` slots: those of ``keys`` ``[B]`` (item keys or slots), then the slots
        of their next steps: two kernels."""
        lanes = table.lanes
        held = self._next_offsets
        if held is None or held[0] != lanes:
            held = self._next_offsets = (lanes, self.torch.tensor(
                [[0], [lanes]], dtype=self.torch.int64, device=self.device))
        return ((keys.unsqueeze(0) + held[1]) % (table.T * lanes)).view(-1)

    def mirror(self, table: StepTable) -> DeviceMirror:
        """The device mirror of ``table``'s bookkeeping (made on first use)."""
        m = self._mirror
        if m is None or m.link.shape[0] != table.T * table.lanes:
            m = self._mirror = DeviceMirror(self.torch, self.device, table)
        return m

    def _groups(self, table: StepTable) -> list[_Group]:
        """The dtype groups of ``table``'s fields (rebuilt when an array is replaced)."""
        arrays = tuple(table.arrays.values())
        plan = self._plan
        if plan is not None and plan[0] is table and len(plan[1]) == len(arrays) \
                and all(a is b for a, b in zip(plan[1], arrays, strict=True)):
            return plan[2]
        by_base: dict[int, _Group] = {}
        n = table.T * table.lanes
        for name, arr in table.arrays.items():
            base = arr if arr._base is None else arr._base  # packed: views of one tensor
            g = by_base.get(id(base))
            if g is None:
                g = by_base[id(base)] = _Group(base.reshape(n, -1))
            shape = tuple(arr.shape[2:])
            width = int(np.prod(shape, dtype=np.int64))
            col = arr.storage_offset() - base.storage_offset()
            obs = name in table.obs_fields
            g.members.append((name, col if not shape else slice(col, col + width), shape,
                              next_name(name) if obs else None))
            g.has_obs |= obs
        groups = list(by_base.values())
        self._plan = (table, arrays, groups)
        return groups

    def gather(self, table: StepTable, pairs: Any) -> dict[str, Any]:
        """Every stored field ``[B, *shape]`` and ``next_<obs field>`` of the device slots
        ``pairs[:B]`` (``pairs``: ``[2B]``, the slots then their next steps' slots, see
        :meth:`_pairs`): one ``index_select`` per dtype group, views per field."""
        torch = self.torch
        mirror = self.mirror(table)
        B = int(pairs.shape[0]) // 2  # noqa: N806
        slots = pairs[:B]
        lk = mirror.link.index_select(0, slots)  # [B] side slot + 1 or 0
        aside = lk > 0
        side_slot = (lk - 1).clamp_(min=0)
        out: dict[str, Any] = {}
        # each view made in one indexing call (on a GPU machine a view op costs the host
        # microseconds too): columns of the first B rows; the next B rows for next obs
        for g in self._groups(table):
            rows = g.flat.index_select(0, pairs if g.has_obs else slots)  # [2B or B, width]
            head = slice(0, B) if g.has_obs else slice(None)
            for name, cols, shape, nxt in g.members:
                v = rows[head, cols]
                out[name] = v.view(B, *shape) if len(shape) > 1 else v
                if nxt is not None:
                    nx = rows[B:, cols]
                    if len(shape) > 1:
                        nx = nx.view(B, *shape)
                    kept = table.side.arrays[name].index_select(0, side_slot)  # [B, *shape]
                    out[nxt] = torch.where(aside.view(B, *([1] * len(shape))), kept, nx)
        return out

    # ------------------------------------------------------------------ fixed batches
    def sample_fn(self, table: StepTable, rng: np.random.Generator,
                  batch_size: int) -> dict[str, Any]:
        """Draw and gather ``batch_size`` into static tensors (the same tensors every call
        for this batch size) and return them. On CUDA the draw and gather are captured
        once as a CUDA graph and replayed (recaptured when the side store grows); on
        other devices they run eagerly and are copied into the static tensors."""
        st = self._static.get(batch_size)
        if st is None or not st.fits(table):  # new, or recaptured into the same outputs
            st = self._static[batch_size] = _Static(self, table, rng, batch_size,
                                                    None if st is None else st.out)
        self.mirror(table).sync(table)
        st.run()
        return st.out


class _Static:
    """One fixed batch size of :meth:`DevicePath.sample_fn`: static output tensors and,
    on CUDA, the graph that fills them."""

    def __init__(self, path: DevicePath, table: StepTable, rng: np.random.Generator,
                 batch_size: int, out: dict[str, Any] | None = None) -> None:
        self.path, self.table, self.rng, self.batch_size = path, table, rng, batch_size
        self.side = tuple(table.side.arrays.values())
        if out is None:
            first = path._draw_gather(table, rng, batch_size, eager=False)
            out = {k: v.clone() for k, v in first.items()}
        self.out = out
        self.graph: Any = None
        torch = path.torch
        if path.device.type == "cuda":  # pragma: no cover - needs a GPU
            stream = torch.cuda.Stream(device=path.device)
            stream.wait_stream(torch.cuda.current_stream(path.device))
            with torch.cuda.stream(stream):
                self._fill()  # warm up outside the graph
            torch.cuda.current_stream(path.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(path.generator)
            with torch.cuda.graph(graph):
                self._fill()
            self.graph = graph

    def fits(self, table: StepTable) -> bool:
        """The captured tensors are still the table's (the side store may have grown)."""
        return table is self.table and all(
            a is b for a, b in zip(self.side, table.side.arrays.values(), strict=True))

    def _fill(self) -> None:
        got = self.path._draw_gather(self.table, self.rng, self.batch_size, sync=False,
                                     eager=False)
        for k, v in got.items():
            self.out[k].copy_(v)

    def run(self) -> None:
        if self.graph is None:
            self._fill()
        else:  # pragma: no cover - needs a GPU
            self.graph.replay()
