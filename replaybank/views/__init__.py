"""Views: what a sampled item key becomes (transition, n-step, frame stack, HER)."""

from __future__ import annotations

from typing import Any

from replaybank.errors import ConfigError
from replaybank.views.base import View
from replaybank.views.transition import TransitionView

__all__ = ["make_view"]


def make_view(n_step: int = 1, gamma: float = 0.99, frame_stack: int = 1) -> View:
    """Compose the view for the common constructor arguments.

    ``n_step > 1`` gives :class:`~replaybank.views.nstep.NStepView`; ``frame_stack > 1``
    wraps the inner view in :class:`~replaybank.views.framestack.FrameStackView`.

    Example:
        >>> type(make_view()).__name__
        'TransitionView'
    """
    for name, value in (("n_step", n_step), ("frame_stack", frame_stack)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r}: must be an int >= 1")
    if not isinstance(gamma, (int, float)) or not 0.0 <= float(gamma) <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: must be a float in [0, 1]")
    view: Any = TransitionView()
    if n_step > 1:
        from replaybank.views.nstep import NStepView

        view = NStepView(n_step, float(gamma))
    if frame_stack > 1:
        from replaybank.views.framestack import FrameStackView

        view = FrameStackView(frame_stack, inner=view)
    return view  # type: ignore[no-any-return]
