"""A session-scoped local Ray cluster for the distributed tests (start-up paid once).

The root ``conftest.py`` registers this module as a plugin, so the fixtures
``ray_cluster`` and ``services`` (what :func:`start` starts, shut down after the test)
are there for every test, and every test using them is marked ``ray``; ray is imported
only when a test uses them.
The cluster has 2 CPUs (this machine's), no dashboard, and its temp dir under the
session's tmp path; it is shut down at the end of the session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

#: CPUs each test shard reserves, so that two services' worth fit the 2-CPU cluster.
SHARD_CPUS = 0.25


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts the local cluster is marked ``ray`` (``-m "not ray"``
    leaves them out: the README's fast subset)."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``ray`` with a local cluster running (started once per session)."""
    ray = pytest.importorskip("ray")
    started = False
    if not ray.is_initialized():
        tmp = tmp_path_factory.mktemp("ray")
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(tmp),
                 log_to_driver=False, configure_logging=False)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def services(ray_cluster: Any) -> Iterator[list[Any]]:
    """Services a test starts (through :func:`start`); all shut down after it."""
    started: list[Any] = []
    yield started
    for s in started:
        s.shutdown()


def start(services: list[Any], *args: Any, **kwargs: Any) -> Any:
    """A ``ReplayService`` sized for the test cluster, shut down after the test."""
    from replaybank.distributed import ReplayService

    kwargs.setdefault("num_cpus", SHARD_CPUS)
    kwargs.setdefault("timeout", 30.0)
    svc = ReplayService(*args, **kwargs)
    services.append(svc)
    return svc


def steps(lanes: int, t0: int, t1: int, ids: bool = True) -> dict[str, Any]:
    """Values of ``extend`` for steps ``t0..t1`` of ``lanes`` lanes: ``obs[..., 0]`` is
    ``1000 * lane + t`` (a unique id of the step), ``next_obs`` the next one's."""
    t = np.arange(t0, t1)[:, None] + np.zeros((1, lanes))
    lane = np.arange(lanes)[None, :] + np.zeros((t1 - t0, 1))
    oid = (1000 * lane + t).astype(np.float32)
    obs = np.stack([oid, np.ones_like(oid)], axis=-1)
    nxt = np.stack([oid + 1, np.ones_like(oid)], axis=-1)
    n = (t1 - t0, lanes)
    return {"obs": obs, "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
            "next_obs": nxt, "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
