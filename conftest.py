"""Doctest collection of modules that import an optional package at module level: skipped
when that package is missing (``pip install -e .`` without the extra), so ``pytest`` still
collects everything else. The README's test command installs every extra (``.[dev]``)."""

from __future__ import annotations

import importlib.util

_OPTIONAL = {
    "replaybank/integrations/sb3.py": "stable_baselines3",
    "replaybank/envs": "gymnasium",
}

collect_ignore = [path for path, module in _OPTIONAL.items()
                  if importlib.util.find_spec(module) is None]

# the session's local Ray cluster and the services a test starts (tests/distributed_ray.py;
# ray is imported only by a test that uses them)
pytest_plugins = ["tests.distributed_ray"]
