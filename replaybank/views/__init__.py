"""Views: what a sampled item key becomes (transition, n-step, frame stack, HER)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.errors import ConfigError
from replaybank.views.base import View
from replaybank.views.transition import TransitionView

__all__ = ["make_view", "view_numbers"]


def view_numbers(n_step: Any, gamma: Any, frame_stack: Any) -> tuple[int, float, int]:
    """``n_step``, ``gamma`` and ``frame_stack`` checked and as Python numbers (numpy
    scalars such as ``np.int64(3)`` or ``np.float32(0.99)`` are taken, as the views take
    them), so that every later check and a recorded config see plain ints and floats.

    Raises:
        ConfigError: ``n_step`` or ``frame_stack`` is not an int >= 1, or ``gamma`` not a
            number in [0, 1].

    Example:
        >>> view_numbers(np.int64(3), np.float32(0.5), 1)
        (3, 0.5, 1)
    """
    for name, value in (("n_step", n_step), ("frame_stack", frame_stack)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value < 1:
            raise ConfigError(f"{name}={value!r}: must be an int >= 1; pass e.g. {name}=3")
    if isinstance(gamma, (bool, np.bool_)) \
            or not isinstance(gamma, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(gamma) <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: must be a float in [0, 1]; pass e.g. gamma=0.99")
    return int(n_step), float(gamma), int(frame_stack)


def make_view(n_step: int = 1, gamma: float = 0.99, frame_stack: int = 1) -> View:
    """Compose the view for the common constructor arguments.

    ``n_step > 1`` gives :class:`~replaybank.views.nstep.NStepView`; ``frame_stack > 1``
    wraps the inner view in :class:`~replaybank.views.framestack.FrameStackView`.

    Ints and floats may be numpy scalars (``np.int64(3)``, ``np.float32(0.99)``), as the
    views themselves take them (:func:`view_numbers`).

    Example:
        >>> type(make_view()).__name__
        'TransitionView'
        >>> make_view(n_step=np.int64(3), gamma=np.float32(0.5)).config()
        {'type': 'nstep', 'n': 3, 'gamma': 0.5}
    """
    n_step, gamma, frame_stack = view_numbers(n_step, gamma, frame_stack)
    view: Any = TransitionView()
    if n_step > 1:
        from replaybank.views.nstep import NStepView

        view = NStepView(n_step, float(gamma))
    if frame_stack > 1:
        from replaybank.views.framestack import FrameStackView

        view = FrameStackView(frame_stack, inner=view)
    return view  # type: ignore[no-any-return]
