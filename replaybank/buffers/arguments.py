"""Checks of the buffers' constructor arguments: seeds, positive ints, capacities and the
replay buffer's choice of sampler and view.

Each check either returns the value to use or raises an error that names the argument,
the bad value and a fix; none of them changes a valid argument.

Example:
    >>> positive_int("num_envs", 4)
    4
    >>> check_capacity(100, 4)
    (100, 4)
    >>> int(make_rng(0).integers(10)) == int(make_rng(0).integers(10))
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.errors import ArgumentError, CapacityError, ConfigError, describe
from replaybank.samplers.base import Sampler
from replaybank.samplers.uniform import UniformSampler
from replaybank.views import make_view
from replaybank.views.base import LaneSpanView, View

__all__ = ["check_capacity", "check_lane_spans", "check_rows", "make_rng",
           "positional_values", "positive_int", "replay_sampler", "replay_view",
           "unit_number"]


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """numpy's ``default_rng`` convention: an int seed, a Generator (used as is) or None."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise ConfigError(
            f"seed={seed!r}: expected a non-negative int, a numpy Generator or None; "
            "pass e.g. seed=0"
        )
    return np.random.default_rng(seed)


def unit_number(name: str, value: Any, example: float) -> float:
    """A number in [0, 1] (a discount, a GAE lambda), a Python or numpy number, as a float.

    Raises:
        ConfigError: Not a number (a bool included), NaN, or outside [0, 1]; the message
            names the argument, the value and ``example``.

    Example:
        >>> unit_number("gamma", np.float32(0.5), 0.99)
        0.5
        >>> unit_number("gae_lambda", 1.5, 0.95)
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: gae_lambda=1.5: must be a number in [0, 1]; pass e.g. gae_lambda=0.95
    """  # noqa: E501
    if isinstance(value, (bool, np.bool_)) \
            or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0 <= value <= 1:
        raise ConfigError(f"{name}={value!r}: must be a number in [0, 1]; pass e.g. "
                          f"{name}={example}")
    return float(value)


def positive_int(name: str, value: Any) -> int:
    """Validate a positive integer argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive int; pass e.g. {name}=1")
    return int(value)


def check_capacity(capacity: Any, num_envs: Any) -> tuple[int, int]:
    """A replay buffer's ``capacity`` and ``num_envs``: positive ints, the first a
    multiple of the second.

    Args:
        capacity: Total transitions over all lanes.
        num_envs: Number of lanes.

    Returns:
        ``(capacity, num_envs)`` as ints.

    Raises:
        CapacityError: capacity is not a positive int or does not divide by num_envs.
        ConfigError: num_envs is not a positive int.

    Example:
        >>> check_capacity(8, 2)
        (8, 2)
        >>> check_capacity(6, 4)
        Traceback (most recent call last):
        ...
        replaybank.errors.CapacityError: capacity=6 does not divide by num_envs=4: each env gets capacity // num_envs rows; use a multiple of num_envs, e.g. 4 or 8
    """  # noqa: E501
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
            or capacity <= 0:
        # (a whole float, e.g. 1e6 written as configs often do: the int it means)
        whole = isinstance(capacity, (float, np.floating)) and float(capacity).is_integer() \
            and 0 < capacity < 2**63
        fix = f"capacity=int({capacity!r}) (= {int(capacity):_})" if whole \
            else "e.g. capacity=100_000"
        raise CapacityError(
            f"capacity={capacity!r}: must be a positive int (total transitions over all "
            f"envs); pass {fix}"
        )
    num_envs = positive_int("num_envs", num_envs)
    if capacity % num_envs:
        raise CapacityError(
            f"capacity={capacity} does not divide by num_envs={num_envs}: each env gets "
            f"capacity // num_envs rows; use a multiple of num_envs, e.g. "
            f"{(capacity // num_envs) * num_envs} or {(capacity // num_envs + 1) * num_envs}"
        )
    return int(capacity), num_envs


def replay_sampler(sampler: Sampler | None, lane_split: str | None) -> Sampler:
    """The sampler a replay buffer uses: ``sampler``, a ``LaneSplitSampler`` for
    ``lane_split="random"``, or a :class:`UniformSampler` when neither is given.

    Raises:
        ConfigError: lane_split is not ``"random"``, or both it and a sampler are given.

    Example:
        >>> type(replay_sampler(None, "random")).__name__
        'LaneSplitSampler'
    """
    if lane_split is not None:
        if lane_split != "random" or sampler is not None:
            raise ConfigError(
                f"lane_split={lane_split!r}: use lane_split='random' (fishyrl's "
                "IndependentVectorizedBuffer) without a sampler=, or pass "
                "sampler=LaneSplitSampler() yourself"
            )
        from replaybank.samplers.lane_split import LaneSplitSampler

        sampler = LaneSplitSampler()
    if sampler is None:
        return UniformSampler()
    checked: Sampler = check_part("sampler", sampler)
    return checked


#: What to pass instead of a part's name (a config file's ``{"type": name}`` builds these).
_PART_CLASSES = {"uniform": "UniformSampler()", "prioritized": "PrioritizedSampler(alpha=0.6)",
                 "recent": "RecentSampler()", "lane_split": "LaneSplitSampler()",
                 "transition": "TransitionView()", "nstep": "NStepView(n=3, gamma=0.99)",
                 "framestack": "FrameStackView(k=4)"}


def check_part(arg: str, part: Any) -> Any:
    """``part`` when it is a :class:`~replaybank.samplers.base.Sampler` (``arg="sampler"``)
    or a :class:`~replaybank.views.base.View` (``arg="view"``).

    Raises:
        ConfigError: Anything else (a name, a class instead of an instance), naming the
            argument and what to pass.

    Example:
        >>> check_part("sampler", "prioritized")
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: sampler='prioritized' is not a sampler object; pass an instance, e.g. sampler=rb.PrioritizedSampler(alpha=0.6) (a config file names it {"type": "prioritized"})
    """  # noqa: E501
    protocol: type = Sampler if arg == "sampler" else View
    if isinstance(part, protocol) and not isinstance(part, type):
        return part
    kind = "a sampler" if arg == "sampler" else "a view"
    if isinstance(part, str):
        known = _PART_CLASSES.get(part)
        example = known or ("UniformSampler()" if arg == "sampler" else "NStepView(n=3)")
        raise ConfigError(
            f"{arg}={part!r} is not {kind} object; pass an instance, e.g. {arg}=rb.{example}"
            + (f' (a config file names it {{"type": "{part}"}})' if known else "")
        )
    if isinstance(part, type) and isinstance(part, protocol):
        raise ConfigError(f"{arg}={part.__name__}: a class, not an instance; pass "
                          f"{arg}={part.__name__}(...)")
    raise ConfigError(f"{arg}={describe(part)} is not {kind}: it lacks the {kind[2:]} "
                      f"protocol's methods; pass e.g. {arg}=rb."
                      f"{'UniformSampler()' if arg == 'sampler' else 'TransitionView()'}")


def replay_view(view: View | None, n_step: int, gamma: float, frame_stack: int,
                rows: int | None = None) -> View:
    """The view a replay buffer uses: ``view``, or one built from ``n_step``, ``gamma``
    and ``frame_stack`` (:func:`replaybank.views.make_view`).

    Args:
        view: A view, or None to build one.
        n_step, gamma, frame_stack: The constructor's view arguments.
        rows: Rows per lane (``capacity // num_envs``); ``n_step`` and ``frame_stack``
            may not exceed it (a window longer than a lane never fits).

    Raises:
        ConfigError: Both a view and n_step/frame_stack other than 1 are given.
        CapacityError: n_step or frame_stack exceeds the rows per lane.

    Example:
        >>> type(replay_view(None, 3, 0.9, 1)).__name__
        'NStepView'
    """
    if view is not None and (n_step != 1 or frame_stack != 1):
        raise ConfigError(
            f"view={type(view).__name__} and n_step={n_step}/frame_stack={frame_stack} "
            "both given; pass either a view or n_step/frame_stack"
        )
    built = make_view(n_step, gamma, frame_stack) if view is None \
        else check_part("view", view)
    if rows is not None:
        check_lane_spans(built, rows, None if view is None else "view")
    checked: View = built
    return checked


def check_lane_spans(view: View, rows: int, arg: str | None = "view") -> None:
    """Refuse a view that reads more steps of a lane than a lane holds: an n-step window
    or a frame stack longer than ``rows`` (``capacity // num_envs``) never fits, whether it
    comes from ``n_step=``/``frame_stack=``, ``view=`` or a ``buf.view = ...`` swap.

    Args:
        view: The view to check (one that reads one step per key always passes).
        rows: Rows per lane.
        arg: How the caller passed the view (``"view"``), named in the error; None when
            it was built from the constructor's numbers.

    Raises:
        CapacityError: A span exceeds ``rows``; nothing is changed.

    Example:
        >>> from replaybank.views.nstep import NStepView
        >>> check_lane_spans(NStepView(3), 4)
        >>> check_lane_spans(NStepView(5), 4)
        Traceback (most recent call last):
        ...
        replaybank.errors.CapacityError: view=NStepView: n_step=5 exceeds the 4 rows per lane (capacity // num_envs); a window of n_step steps never fits in a lane: lower n_step or raise capacity
    """  # noqa: E501
    spans = view.lane_spans() if isinstance(view, LaneSpanView) else {}
    for name, value in spans.items():
        if value > rows:
            given = f"{name}={value}:" if arg is None \
                else f"{arg}={type(view).__name__}: {name}={value}"
            raise CapacityError(
                f"{given} exceeds the {rows} rows per lane (capacity // num_envs); "
                f"a window of {name} steps never fits in a lane: lower {name} or raise "
                "capacity"
            )


def check_rows(next_obs: Any, view: View | None, n_step: int, frame_stack: int,
               autoreset_mode: str | None) -> bool:
    """Whether a replay buffer stores rows (``next_obs=False``: every key an ordinary
    field, no next observation linked), checked against the options that need next
    observations.

    Args:
        next_obs: The constructor's ``next_obs`` (a bool).
        view, n_step, frame_stack: The constructor's view arguments.
        autoreset_mode: The checked ``autoreset_mode``.

    Returns:
        True for a rows buffer.

    Raises:
        ConfigError: ``next_obs`` is not a bool, or ``next_obs=False`` comes with a view,
            ``n_step``/``frame_stack`` other than 1 or ``autoreset_mode="next_step"``.

    Example:
        >>> check_rows(False, None, 1, 1, None)
        True
        >>> check_rows(False, None, 1, 4, None)
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: next_obs=False with frame_stack=4: a rows buffer stores no next observations to stack or bootstrap from; use next_obs=True (transitions) or drop frame_stack
    """  # noqa: E501
    if next_obs is not True and next_obs is not False and not isinstance(next_obs, np.bool_):
        raise ConfigError(f"next_obs={next_obs!r}: must be a bool (False: store rows, "
                          "every key an ordinary field)")
    if next_obs:
        return False
    for name, value, default in (("frame_stack", frame_stack, 1), ("n_step", n_step, 1),
                                 ("view", view, None),
                                 ("autoreset_mode", autoreset_mode, "next_step")):
        bad = value == "next_step" if name == "autoreset_mode" else value != default
        if bad:
            shown = type(value).__name__ if name == "view" else repr(value)
            raise ConfigError(
                f"next_obs=False with {name}={shown}: a rows buffer stores no next "
                f"observations to stack or bootstrap from; use next_obs=True (transitions) "
                f"or drop {name}"
            )
    return True


def positional_values(call: str, args: tuple[Any, ...]) -> ArgumentError:
    """The error of values passed to ``add``/``extend`` by position: every writer of a
    buffer (the buffer, a shared-memory writer, a service client) takes keyword
    arguments only and raises this, so a call refused by one is refused by all.

    Args:
        call: The refused call's name (``"add"``, ``"extend"``; a writer's own prefix,
            ``"SharedWriter.add"``, is fine).
        args: The positional values.

    Returns:
        The error to raise.

    Example:
        >>> str(positional_values("add", (1.0,))).startswith("add() takes keyword")
        True
    """
    return ArgumentError(
        f"{call}() takes keyword arguments only, got {len(args)} positional value"
        f"{'s' if len(args) != 1 else ''} ({', '.join(describe(a) for a in args[:3])}"
        f"{', ...' if len(args) > 3 else ''}); pass {call}(obs=..., action=..., reward=..., "
        "next_obs=..., terminated=..., truncated=...). SB3's positional add(obs, next_obs, "
        "action, reward, done, infos) is replaybank.integrations.sb3.ReplayBuffer"
    )
