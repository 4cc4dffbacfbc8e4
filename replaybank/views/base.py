"""View protocols: what an item key becomes, and the capabilities a view may declare.

A view turns sampled item keys into batch fields. It receives the sampling generator
(views that draw, such as hindsight relabelling, draw from it, so a seeded buffer and a
restored checkpoint give the identical next sample) and saves whatever it learned
(``state_dict``), e.g. the frame-stack layout decided at the first add.

Capabilities beyond :class:`View` are small protocols, checked once when a buffer builds
its sampling plan, never probed per call:

* :class:`FusedView`: checks and gathers in one pass (``gather_valid``);
* :class:`StepView`: serves each key as its own one-step transition (the step's stored
  fields and exact next observation), with a faster gather for keys just drawn;
* :class:`ShiftedView`: the transition of a key ends at another key (n-step windows);
* :class:`InputTransform`: rewrites what users add (frame stacks keep the newest frame);
  :class:`LaneInputTransform` also reads the lanes it writes to (frame stacks check the
  stacks given at an episode start), and :class:`SpecTransform` says which fields a
  declared ``spec=`` of the added values is stored as;
* :class:`FieldsCheckedView`: knows from the stored fields that it could never serve
  them (checked before the storage is made);
* :class:`CallbackView`: calls user functions while it gathers (hindsight rewards), so a
  gather may fail after the sampler drew: the buffer then restores its generator.

Views that serve every live step return ``None`` from ``valid`` and say so with
``every_step = True``, so a buffer need not check their keys.

Example:
    >>> from replaybank.views.transition import TransitionView
    >>> v = TransitionView()
    >>> isinstance(v, View), isinstance(v, FusedView), v.every_step
    (True, False, True)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.spec import Spec
from replaybank.storage.table import StepTable

__all__ = ["CallbackView", "FieldsCheckedView", "FusedView", "InputTransform",
           "LaneInputTransform", "LaneSpanView",
           "ShiftedView", "SpecTransform", "StatelessView", "StepView",
           "View", "next_name"]

IntArray = npt.NDArray[np.int64]


def next_name(obs_field: str) -> str:
    """``obs`` -> ``next_obs``; ``obs/goal`` -> ``next_obs/goal``."""
    return "next_" + obs_field


@runtime_checkable
class View(Protocol):
    """Turns item keys into batch fields."""

    #: ``valid`` is always None: every live step can be served.
    every_step: bool

    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        """Fields of the items ``keys`` ``[B]`` (flat names, ``[B, *shape]``).

        ``rng`` is the buffer's sampling generator, for views that draw.
        """
        ...

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Which keys ``[B]`` this view can serve (None: all of them)."""
        ...

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments with ``"type"``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state learned after construction (``{}`` when none)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...


@runtime_checkable
class FusedView(View, Protocol):
    """A view that checks and gathers keys in one pass."""

    def gather_valid(self, table: StepTable, keys: IntArray,
                     rng: np.random.Generator | None = None) -> dict[str, Any] | None:
        """:meth:`View.gather` when every key can be served, else None (nothing read,
        nothing drawn from ``rng``: a caller may put the generator back by the draws it
        made itself)."""
        ...


@runtime_checkable
class StepView(View, Protocol):
    """A view that serves each key as its one-step transition: the step's stored fields
    and its exact next observation, nothing added (wrapping views take the fields
    directly from the table)."""

    def gather_live(self, table: StepTable, keys: IntArray,
                    rng: np.random.Generator | None = None) -> dict[str, Any]:
        """:meth:`View.gather` of keys a sampler just drew from the live steps."""
        ...


@runtime_checkable
class ShiftedView(View, Protocol):
    """A view whose transition of key ``t`` ends at another step (n-step windows)."""

    def last_keys(self, table: StepTable, keys: IntArray) -> IntArray:
        """Keys ``[B]`` of the last step of each key's transition."""
        ...


@runtime_checkable
class LaneSpanView(View, Protocol):
    """A view whose served key reads several steps of its lane (n-step windows, frame
    stacks): a buffer refuses it when a lane holds fewer rows than it reads, as it refuses
    ``n_step=`` or ``frame_stack=`` numbers above ``capacity // num_envs``."""

    def lane_spans(self) -> dict[str, int]:
        """Steps of one lane a served key reads, by the constructor argument that sets
        them (``{"n_step": n}``, ``{"frame_stack": k}``, or both)."""
        ...


@runtime_checkable
class InputTransform(Protocol):
    """A view that also reshapes what users add (e.g. keeps the newest frame of a stack)."""

    def prepare_inputs(self, fields: dict[str, Any], steps: bool, lanes: int) -> dict[str, Any]:
        """Return the fields to store for one ``add`` (``steps=False``) or ``extend``."""
        ...


@runtime_checkable
class LaneInputTransform(InputTransform, Protocol):
    """An input transform that also reads the lanes it writes to: a frame-stack view
    checks that a stack given at a lane's episode start is padded as it rebuilds it.
    A buffer calls :meth:`prepare_lane_inputs` in place of ``prepare_inputs``."""

    def prepare_lane_inputs(self, fields: dict[str, Any], steps: bool, lanes: IntArray,
                            table: StepTable | None) -> dict[str, Any]:
        """``prepare_inputs`` of one call that writes the lanes ``lanes`` ``[m]`` of
        ``table`` (None before the first write); raises, changing nothing, when the
        values contradict what the view would serve from them."""
        ...


@runtime_checkable
class SpecTransform(Protocol):
    """A view whose stored fields differ from the values added (frame stacks store the
    newest frame of a stacked observation): a buffer built with ``spec=`` (which
    describes the values added, e.g. ``rb.spec_from_env(env)``) stores
    :meth:`stored_spec` of it, and its config records :meth:`added_spec` of its
    stored fields, so that a buffer rebuilt from the config stores the same fields."""

    def stored_spec(self, spec: Spec) -> Spec:
        """The fields stored for values added as ``spec`` describes them."""
        ...

    def added_spec(self, spec: Spec) -> Spec:
        """The spec of the values added, for the stored fields ``spec`` (the inverse)."""
        ...


@runtime_checkable
class FieldsCheckedView(View, Protocol):
    """A view that can tell from the stored fields alone (their names, shapes and dtypes)
    that it could never serve them (hindsight relabelling needs its goal keys, goals of
    one shape and one reward per step). A buffer asks it before it makes its storage (the
    first add, or ``spec=``), so the mistake is named then, not at the first sample after
    thousands of adds."""

    def check_fields(self, spec: Spec) -> None:
        """Raise when fields stored as ``spec`` (observations as ``obs`` or ``obs/<key>``)
        can never be served."""
        ...


@runtime_checkable
class CallbackView(View, Protocol):
    """A view that calls user functions (a hindsight reward function) while it gathers.

    Such a gather may raise after the sampler drew its keys; a buffer then puts its
    generator and beta schedule back, so a failed ``sample`` changes nothing.
    """

    def user_functions(self) -> tuple[Any, ...]:
        """The user callables the view calls."""
        ...


class StatelessView:
    """Shared state methods of views that learn nothing after construction."""

    def state_dict(self) -> dict[str, Any]:
        """No state: ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""
        return None
