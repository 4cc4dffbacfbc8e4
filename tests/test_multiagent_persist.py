"""Memmap multi-agent buffers reopened with ``rb.open`` (after ``flush()`` or a crash).

Each scenario runs the same random joint steps (agents ending at different steps,
truncation, several envs with active masks, buffer wrap) into a memmap buffer and an
in-memory twin; the memmap buffer is closed (as when its process ends) and reopened from
its directory. The reopened buffer must hold the twin's steps (checked against the
plain-loop oracle of ``tests/test_multiagent.py``), draw the twin's next sample, keep its
episode bookkeeping, and continue adding exactly as the twin does.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import replaybank as rb
from replaybank.errors import ArgumentError, ConfigError
from replaybank.multiagent import MultiAgentReplayBuffer
from replaybank.persist import ResumeWarning
from tests.test_multiagent import (
    Oracle,
    Scenario,
    _step,
    check_batch,
    make_spec,
    run,
    scenarios,
)


def _memmap(sc: Scenario, path: Path, **kwargs: Any) -> MultiAgentReplayBuffer:
    return MultiAgentReplayBuffer(sc.rows * sc.num_envs, sc.agents, num_envs=sc.num_envs,
                                  seed=sc.seed, storage="memmap", path=path,
                                  spec=make_spec(sc.agents, sc.with_state)
                                  if sc.use_spec else None, **kwargs)


def _fits(oracle: Oracle, env: int) -> bool:
    """The running joint episode of ``env`` still has its first step in the ring."""
    recs = oracle.steps[env]
    start = 0
    for i, r in enumerate(recs):
        if r.joint_terminated or r.joint_truncated:
            start = i + 1
    return start >= len(recs) - oracle.rows


def _same_bookkeeping(back: MultiAgentReplayBuffer, twin: MultiAgentReplayBuffer,
                      oracle: Oracle, exact_origin: bool) -> None:
    got, want = back.state_dict()["multiagent"], twin.state_dict()["multiagent"]
    assert got["agents"] == want["agents"]
    for e in range(oracle.num_envs):
        if _fits(oracle, e):  # what an agent did in overwritten steps is forgotten
            np.testing.assert_array_equal(got["alive"][:, e], want["alive"][:, e])
            np.testing.assert_array_equal(got["ended"][:, e], want["ended"][:, e])
    assert set(got["carry"]) == set(want["carry"])
    for a in want["carry"]:
        np.testing.assert_array_equal(got["carry"][a], want["carry"][a], err_msg=a)
        assert got["carry"][a].dtype == want["carry"][a].dtype
    if exact_origin:
        np.testing.assert_array_equal(got["origin"], want["origin"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(sc=scenarios)
def test_flush_then_open_resumes_exactly(sc: Scenario, tmp_path_factory: Any) -> None:
    d = tmp_path_factory.mktemp("mm")
    twin, oracle = run(sc)
    buf, _ = run(sc, _memmap(sc, d))
    if len(twin) == 0:
        return
    twin.sample(3)
    buf.sample(3)  # the generator moved: flush saves where it is
    buf.flush()
    buf.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        back = rb.open(d)
    assert isinstance(back, MultiAgentReplayBuffer)
    assert back.agents == twin.agents and len(back) == len(twin)
    assert back.num_envs == twin.num_envs and back.spec == twin.spec
    got = back.sample(6)
    assert got.core == twin.sample(6).core
    check_batch(got, oracle)
    _same_bookkeeping(back, twin, oracle, exact_origin=True)
    ep = dict(batch_size=4, max_length=sc.rows, include_running=True)
    try:
        want_ep = twin.sample_episodes(**ep)
    except rb.EmptyBufferError:
        with pytest.raises(rb.EmptyBufferError):
            back.sample_episodes(**ep)
    else:
        assert back.sample_episodes(**ep).core == want_ep.core
    # adds continue identically: who is alive or ended in each running episode is kept
    rest = Scenario(sc.agents, sc.num_envs, sc.rows, 6, sc.seed + 1, sc.with_state, True)
    run(rest, back, copy.deepcopy(oracle))
    run(rest, twin, copy.deepcopy(oracle))
    assert back.sample(6).core == twin.sample(6).core


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(sc=scenarios)
def test_open_without_flush_rebuilds_the_bookkeeping_from_the_files(
        sc: Scenario, tmp_path_factory: Any) -> None:
    d = tmp_path_factory.mktemp("mm")
    twin, oracle = run(sc)
    buf, _ = run(sc, _memmap(sc, d))
    if len(twin) == 0:
        return
    buf.close()  # the process ended without flush()
    back = rb.open(d)
    assert isinstance(back, MultiAgentReplayBuffer) and len(back) == len(twin)
    # a fresh generator from the recorded seed: the twin has not sampled yet either
    got = back.sample(len(back), replace=False)
    assert got.core == twin.sample(len(twin), replace=False).core
    check_batch(got, oracle)
    _same_bookkeeping(back, twin, oracle, exact_origin=False)
    if all(_fits(oracle, e) for e in range(sc.num_envs)):
        rest = Scenario(sc.agents, sc.num_envs, sc.rows, 6, sc.seed + 1, sc.with_state, True)
        run(rest, back, copy.deepcopy(oracle))
        run(rest, twin, copy.deepcopy(oracle))
        assert back.sample(6).core == twin.sample(6).core


def test_an_agent_that_ended_before_the_crash_may_not_act_again(tmp_path: Path) -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], storage="memmap", path=tmp_path, seed=0)
    _step(buf, 0, ["a", "b"], {"b": "term"})
    buf.flush()
    _step(buf, 1, ["a"], {})  # after the last flush: its state no longer fits
    buf.close()
    with pytest.warns(ResumeWarning, match=r"added .* after its last flush"):
        back = rb.open(tmp_path)
    with pytest.raises(ArgumentError, match=r"ended .* earlier in this episode"):
        _step(back, 2, ["a", "b"], {})
    _step(back, 2, ["a"], {"a": "trunc"})  # the joint episode ends (truncated)
    _step(back, 3, ["a", "b"], {})  # a new one: b acts again
    batch = back.sample(4, replace=False)
    order = np.argsort(np.asarray(batch.indices))
    assert batch.active["b"][order].tolist() == [True, False, False, True]
    assert batch.joint_truncated[order].tolist() == [False, False, True, False]
    # b's exact final observation at its end, before the crash
    assert batch.next_obs["b"][order][0].tolist() == [1.0, 1.0, 1.0]


def test_extras_and_state_come_back_without_a_spec(tmp_path: Path) -> None:
    buf = MultiAgentReplayBuffer(8, ["a", "b"], storage="memmap", path=tmp_path, seed=0)
    kw = dict(state=np.zeros(3, np.float32), next_state=np.ones(3, np.float32))
    _step(buf, 0, ["a", "b"], {}, log_prob={"a": -1.0, "b": -2.0}, team=np.float32(5), **kw)
    buf.flush()
    buf.close()
    back = rb.open(tmp_path)
    assert back.layout is not None and back.layout.extras == ("log_prob",)
    assert back.layout.state is not None and back.layout.state.shape == (3,)
    _step(back, 1, ["a"], {}, log_prob={"a": -3.0}, team=np.float32(6), **kw)
    b = back.sample(2, replace=False)
    order = np.argsort(np.asarray(b.indices))
    assert b.extras["log_prob"]["b"][order].tolist() == [-2.0, 0.0]
    assert b.extras["team"][order].tolist() == [5.0, 6.0]
    assert back.config().model_dump()["spec"]["log_prob/a"] == {"shape": [],
                                                               "dtype": "float32"}


def test_prioritized_nstep_resumes_with_its_priorities(tmp_path: Path) -> None:
    def build(**kw: Any) -> MultiAgentReplayBuffer:
        return MultiAgentReplayBuffer(32, ["a", "b"], num_envs=2, n_step=3, gamma=0.5,
                                      sampler=rb.PrioritizedSampler(), seed=3, **kw)

    sc = Scenario(("a", "b"), 2, 16, 30, 11, True, True)
    mm, _ = run(sc, build(storage="memmap", path=tmp_path,
                               spec=make_spec(("a", "b"), True)))
    twin, _ = run(sc, build(spec=make_spec(("a", "b"), True)))
    for b in (mm, twin):
        keys = np.asarray(b.sample(8).indices)
        b.update_priorities(keys, np.arange(8.0) + 1)
    mm.flush()
    mm.close()
    back = rb.open(tmp_path)
    want, got = twin.sample(8), back.sample(8)
    assert got.core == want.core
    assert "discounts/a" in got.core and got.weights is not None


def test_read_only_open_beside_the_writer(tmp_path: Path) -> None:
    sc = Scenario(("a", "b", "c"), 3, 5, 20, 4, True, False)
    buf, oracle = run(sc, _memmap(sc, tmp_path))
    buf.flush()
    reader = rb.open(tmp_path, mode="r")
    assert isinstance(reader, MultiAgentReplayBuffer)
    got = reader.sample(5)
    assert got.core == buf.sample(5).core
    check_batch(got, oracle)
    more = Scenario(sc.agents, sc.num_envs, sc.rows, 1, 5, True, True)
    with pytest.raises(ConfigError, match="read-only"):
        run(more, reader, copy.deepcopy(oracle))


def test_a_buffer_built_from_a_spec_reopens_before_any_add(tmp_path: Path) -> None:
    spec = {"obs": {"a": ((2,), "float32"), "b": ((3,), "float32")},
            "action": {"a": ((), "int64"), "b": ((), "int64")}}
    MultiAgentReplayBuffer(8, ["a", "b"], storage="memmap", path=tmp_path,
                           spec=spec).close()
    back = MultiAgentReplayBuffer.open(tmp_path)
    assert isinstance(back, MultiAgentReplayBuffer) and len(back) == 0
    _step(back, 0, ["a", "b"], {})
    assert len(back) == 1


def test_errors_name_the_call_and_the_fix(tmp_path: Path) -> None:
    mem = MultiAgentReplayBuffer(8, ["a", "b"])
    _step(mem, 0, ["a", "b"], {})
    with pytest.raises(ConfigError, match=r"flush\(\).*storage='memmap'.*save\(dirpath\)"):
        mem.flush()
    buf = MultiAgentReplayBuffer(8, ["a", "b"], storage="memmap", path=tmp_path)
    _step(buf, 0, ["a", "b"], {})
    buf.close()
    with pytest.raises(ConfigError, match=r"storage=.*drop the storage override"):
        rb.open(tmp_path, storage="numpy")
    with pytest.raises(rb.CheckpointError, match=r"saved agents \['x', 'y'\] differ"):
        back = rb.open(tmp_path)
        state = back.resume_state()
        assert state is not None
        state["multiagent"]["agents"] = ["x", "y"]
        back.load_resume_state(state)


# ---------------------------------------------------------------------- episodes cut by a reset
def _episodes(buf: MultiAgentReplayBuffer) -> list[tuple[tuple[float, ...], ...]]:
    """Every joint episode ``sample_episodes`` lists (running ones too), as agent a's
    observations (Clock's ``(t, agent, episode)``), sorted."""
    n = 0
    while True:  # how many there are: the largest batch drawn without replacement
        try:
            buf.sample_episodes(n + 1, 8, replace=False, include_running=True)
        except rb.EmptyBufferError:
            break
        n += 1
    ep = buf.sample_episodes(n, 8, replace=False, include_running=True)
    obs, mask = np.asarray(ep.obs["a"]), np.asarray(ep.mask)
    return sorted(tuple(tuple(o.tolist()) for o in obs[i][mask[i]]) for i in range(n))


#: Clock's episode 0 (two steps: b ended at the second, a runs on), abandoned by the
#: reset of the second collect, then episode 1 (three steps, running).
_CUT = [((0.0, 0.0, 0.0), (1.0, 0.0, 0.0)),
        ((0.0, 0.0, 1.0), (1.0, 0.0, 1.0), (2.0, 0.0, 1.0))]

_CRASHING_COLLECTOR = """
import os, sys
import replaybank as rb
from tests.pettingzoo_leavers import Clock
buf = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0, storage="memmap",
                                path=sys.argv[1])
env = Clock()
rb.collect(env, None, buf, 2, seed=0, progress=False)  # b ended, a runs on
rb.collect(env, None, buf, 3, seed=1, progress=False)  # a reset abandons episode 0
buf.end_episodes()  # ... and episode 1 (b ended in it, a ran on)
os._exit(0)  # killed: no flush, no close
"""


def test_cuts_of_a_reset_survive_flush_and_reopen(tmp_path: Path) -> None:
    """A second rb.collect cuts the joint episode it abandons; after flush() the
    reopened buffer (a new object) lists the same episodes, not the two glued into one."""
    pytest.importorskip("pettingzoo")
    from tests.pettingzoo_leavers import Clock

    buf = MultiAgentReplayBuffer(100, ["a", "b"], seed=0, storage="memmap", path=tmp_path)
    env = Clock()
    rb.collect(env, None, buf, 2, seed=0, progress=False)
    rb.collect(env, None, buf, 3, seed=1, progress=False)
    assert _episodes(buf) == _CUT
    buf.flush()
    buf.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        back = rb.open(tmp_path)
    assert isinstance(back, MultiAgentReplayBuffer)
    assert _episodes(back) == _CUT
    assert back.state_dict()["multiagent"]["cuts"].tolist() == [[0, 1]]


def test_cuts_survive_a_crash_and_the_rebuilt_bookkeeping_honours_them(
        tmp_path: Path) -> None:
    """The collecting process is killed without flush(): the reopened buffer still ends
    the abandoned episodes at their cuts, and its rebuilt bookkeeping knows that no
    episode runs (b, which ended in the cut episode, may act again)."""
    pytest.importorskip("pettingzoo")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", _CRASHING_COLLECTOR, str(tmp_path)], env=env,
                   cwd=root, check=True, timeout=300)
    back = rb.open(tmp_path)
    assert isinstance(back, MultiAgentReplayBuffer) and len(back) == 5
    assert _episodes(back) == _CUT
    obs = {k: np.array([0, i, 2], np.float32) for i, k in enumerate("ab")}
    back.add(obs=obs, action={"a": 0, "b": 0}, reward={"a": 0.0, "b": 0.0}, next_obs=obs,
             terminated={"a": False, "b": False}, truncated={"a": False, "b": False})
    assert sorted(len(e) for e in _episodes(back)) == [1, 2, 3]  # b acted again


def test_files_without_a_cut_record_read_as_no_cuts(tmp_path: Path) -> None:
    """Files of a version before the record: nothing was cut; the first cut adds it."""
    buf = MultiAgentReplayBuffer(16, ["a", "b"], storage="memmap", path=tmp_path, seed=0)
    for t in range(2):
        _step(buf, t, ["a", "b"], {})
    buf.close()
    back = rb.open(tmp_path)
    assert isinstance(back, MultiAgentReplayBuffer)
    assert back.state_dict()["multiagent"]["cuts"].shape == (0, 2)
    back.end_episodes()
    _step(back, 5, ["a", "b"], {})
    back.close()
    again = rb.open(tmp_path)
    assert isinstance(again, MultiAgentReplayBuffer)
    assert again.state_dict()["multiagent"]["cuts"].tolist() == [[0, 1]]
    assert sorted(len(e) for e in _episodes(again)) == [1, 2]


def test_end_episodes_on_a_read_only_buffer_is_refused(tmp_path: Path) -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], storage="memmap", path=tmp_path, seed=0)
    _step(buf, 0, ["a", "b"], {})
    buf.flush()
    reader = rb.open(tmp_path, mode="r")
    assert isinstance(reader, MultiAgentReplayBuffer)
    with pytest.raises(ConfigError, match=r"end_episodes\(\).*read-only"):
        reader.end_episodes()
    assert reader.state_dict()["multiagent"]["cuts"].shape == (0, 2)
