"""A small progress bar over rich that turns into a no-op when disabled or unavailable.

Example:
    >>> with ProgressBar(10, "collect", enabled=False) as bar:
    ...     bar.update(5, ret=1.0)
    >>> bar.completed
    5
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, TextIO

__all__ = ["ProgressBar", "progress_enabled"]


def progress_enabled(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether a script should show a progress bar: not with ``--quiet``, and not when
    its output is not a terminal (a pipe, a file, a test's captured output).

    Args:
        quiet: The script's ``--quiet`` flag.
        stream: The output to check (default: ``sys.stdout``).

    Example:
        >>> import io
        >>> progress_enabled(quiet=False, stream=io.StringIO())
        False
    """
    if quiet:
        return False
    return bool((sys.stdout if stream is None else stream).isatty())


class ProgressBar:
    """Progress over ``total`` steps with steps/s and free-form fields (e.g. return, loss).

    Args:
        total: Steps expected.
        description: Text left of the bar.
        enabled: Show the bar (needs rich; silently off without it).
        fields: Names of the extra values shown after the rate, in order.

    Example:
        >>> bar = ProgressBar(3, enabled=False)
        >>> bar.update(1); bar.completed
        1
    """

    def __init__(self, total: int, description: str = "steps", enabled: bool = True,
                 fields: tuple[str, ...] = ()) -> None:
        self.total = int(total)
        self.description = description
        self.completed = 0
        self.fields = fields
        self._progress: Any = None
        self._task: Any = None
        if enabled:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:  # rich is optional: no bar
                return
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                transient=False,
            )

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total,
                                                 rate="", info="")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, advance: int = 0, **values: Any) -> None:
        """Advance by ``advance`` steps and show ``values`` (floats get 4 significant digits)."""
        self.completed += int(advance)
        if self._progress is None or self._task is None:
            return
        task = self._progress.tasks[0]
        speed = task.speed
        rate = f"{speed:>7.0f} steps/s" if speed else ""
        info = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in values.items() if v is not None)
        self._progress.update(self._task, advance=advance, rate=rate, info=info)
