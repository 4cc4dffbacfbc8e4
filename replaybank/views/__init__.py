"""Views: what a sampled item key becomes (transition, n-step, frame stack, HER)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.errors import ConfigError
from replaybank.views.base import View
from replaybank.views.transition import TransitionView

__all__ = ["make_view"]


def make_view(n_step: int = 1, gamma: float = 0.99, frame_stack: int = 1) -> View:
    """Compose the view for the common constructor arguments.

    ``n_step > 1`` gives :class:`~replaybank.views.nstep.NStepView`; ``frame_stack > 1``
    wraps the inner view in :class:`~replaybank.views.framestack.FrameStackView`.

    Ints and floats may be numpy scalars (``np.int64(3)``, ``np.float32(0.99)``), as the
    views themselves take them.

    Example:
        >>> type(make_view()).__name__
        'TransitionView'
        >>> make_view(n_step=np.int64(3), gamma=np.float32(0.5)).config()
        {'type': 'nstep', 'n': 3, 'gamma': 0.5}
    """
    for name, value in (("n_step", n_step), ("frame_stack", frame_stack)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value < 1:
            raise ConfigError(f"{name}={value!r}: must be an int >= 1; pass e.g. {name}=3")
    if isinstance(gamma, (bool, np.bool_)) \
            or not isinstance(gamma, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(gamma) <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: must be a float in [0, 1]; pass e.g. gamma=0.99")
    n_step, frame_stack, gamma = int(n_step), int(frame_stack), float(gamma)
    view: Any = TransitionView()
    if n_step > 1:
        from replaybank.views.nstep import NStepView

        view = NStepView(n_step, float(gamma))
    if frame_stack > 1:
        from replaybank.views.framestack import FrameStackView

        view = FrameStackView(frame_stack, inner=view)
    return view  # type: ignore[no-any-return]
