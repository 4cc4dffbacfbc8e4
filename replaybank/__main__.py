"""``python -m replaybank``: the same command line as the ``replaybank`` script."""

from replaybank.cli.main import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
