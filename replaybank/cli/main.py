"""The ``replaybank`` command line.

Subcommands: ``demo`` (train DQN on CartPole-v1 from prioritized n-step replay),
``inspect`` (summarize a checkpoint or a memmap buffer directory) and ``bench`` (time
replaybank against the installed peer libraries).
``replaybank --version`` prints the installed version, then which of the optional C modules
this install built (:func:`build_line`: without them every call still works, from pure
Python and numba, slower). ``python -m replaybank`` runs the same command line as the
``replaybank`` script.

Example:
    >>> main(["--help"])  # doctest: +ELLIPSIS
    usage: replaybank ...
    0
"""

from __future__ import annotations

import importlib
import os
import sys

from replaybank.errors import MissingDependencyError

__all__ = ["C_MODULES", "EXTRAS", "build_line", "main"]

#: The optional C modules (built at install where a C compiler and the Python headers are
#: there) and what each serves.
C_MODULES = (("_lane", "the writer"), ("_sampling", "sampling kernels"),
             ("_windows", "window gathers"))

#: The extra that installs every optional package a command needs.
EXTRAS = {"demo": "demo", "inspect": "cli", "bench": "cli"}

USAGE = """usage: replaybank <command> [options]
       replaybank --version

commands:
  demo     train a DQN agent on CartPole-v1 from prioritized 3-step replay
           (replaybank demo --help for its options)
  inspect  summarize a checkpoint or memmap buffer directory: fields, fill, episodes,
           returns, priorities, data age, sizes (--json, --plot out.png)
  bench    time add / extend / sample / PER against installed peers (cpprb, sb3,
           tianshou, torchrl), each in its own process (--scale, --cases, --json)
"""


def main(argv: list[str] | None = None) -> int:
    """Run the ``replaybank`` command line.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status; 1 when the reader of the output went away (``replaybank inspect
        --json | head``: the rest is dropped quietly, without a traceback), or when an
        optional package the command needs is not installed (one line naming the extra
        that installs it, not a traceback).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except MissingDependencyError as exc:
        command = args[0] if args else ""
        extra = EXTRAS.get(command)
        whole = (f" (everything replaybank {command} needs: pip install "
                 f'"replaybank[{extra}]")') if extra and f"[{extra}]" not in str(exc) else ""
        print(f"replaybank {command}: error: {exc}{whole}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # whatever is still buffered goes nowhere: the interpreter's final flush of stdout
        # would fail again and print "Exception ignored"
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    return status


def _run(args: list[str]) -> int:
    """The command named by ``args[0]`` run with the rest: its exit status."""
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] in ("-V", "--version", "version"):
        from replaybank import __version__

        print(f"replaybank {__version__}\n{build_line()}")
        return 0
    command, rest = args[0], args[1:]
    if command == "demo":
        from replaybank.cli.demo import main as demo_main

        return demo_main(rest)
    if command == "inspect":
        from replaybank.cli.inspect import main as inspect_main

        return inspect_main(rest)
    if command == "bench":
        from replaybank.cli.bench import main as bench_main

        return bench_main(rest)
    print(f"replaybank: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


def build_line() -> str:
    """One line saying which optional C modules this install has and uses: built, not
    built (which, and how to get them), or switched off by ``REPLAYBANK_PURE_PYTHON``.

    Example:
        >>> build_line().startswith("C modules: ")
        True
    """
    from replaybank.ops.jit import pure_python

    if pure_python():
        return ("C modules: switched off (REPLAYBANK_PURE_PYTHON is set): pure Python and "
                "numba serve every call")
    missing = []
    for name, what in C_MODULES:
        try:
            importlib.import_module(f"replaybank.{name}")
        except ImportError:
            missing.append(f"{name} ({what})")
    if not missing:
        return "C modules: built (" + ", ".join(n for n, _ in C_MODULES) + ")"
    return ("C modules: not built: " + ", ".join(missing) + "; pure Python and numba serve "
            "those calls, slower (a one-step add about 5x); install a C compiler and the "
            "Python headers (e.g. apt install build-essential python3-dev) and reinstall "
            "replaybank")
