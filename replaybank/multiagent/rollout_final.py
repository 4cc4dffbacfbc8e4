"""True final observations of truncated agents, valued later by one batched ``value_fn``.

A :class:`~replaybank.multiagent.rollout.MultiAgentRolloutBuffer` step where an agent was
truncated (and not terminated) bootstraps from the value of the agent's true final
observation. ``add(final_value=...)`` gives that value at once; ``add(final_obs=...,
final_state=...)`` keeps the observation here instead, and
``compute_returns_and_advantage(value_fn=...)`` values every kept observation in one call.

The call is batched over the *steps* that kept one (a step is ``k = t * num_envs + env``),
in the form a collector's policy sees a vector step:

* ``obs``: ``{agent: [K, *obs_shape]}`` for every agent kept at some of the ``K`` steps,
  zeros in the rows where that agent was not truncated; an agent with dict observations
  gets ``{key: [K, *shape]}`` (one array per key, each with its own dtype), as the
  buffer stores it;
* ``state``: ``[K, *state_shape]`` the global state after each step (``env.state()`` at
  the truncation), or None when the buffer stores no state;
* it returns ``{agent: [K]}`` (per-agent values) or one array ``[K]`` (a centralised
  value, shared by the agents truncated at the step), as the buffer stores values; only
  the rows where an agent was kept are read.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import FieldSpec
    >>> store = FinalObservations(("a", "b"), num_envs=2)
    >>> need = np.array([[True, False], [True, True]])      # [E=2, n=2] at step t=0
    >>> rows = {"a": np.array([[1.0], [2.0]]), "b": np.array([[0.0], [5.0]])}
    >>> store.append(0, need, rows, None)
    >>> fields = {a: FieldSpec(f"obs/{a}", (1,), np.float64) for a in "ab"}
    >>> out = store.values(lambda obs, state: {a: obs[a][:, 0] * 10 for a in obs},
    ...                    central=False, obs_fields=fields, state_field=None)
    >>> [a.tolist() for a in out]                   # steps, agent positions, values
    [[0, 1, 1], [0, 0, 1], [10.0, 20.0, 50.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import DtypeError, ShapeError, describe
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.multiagent.layout import obs_leaf
from replaybank.spec import FieldSpec, real_floats

__all__ = ["FinalObservations", "ValueFn"]

AnyArray = npt.NDArray[Any]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: ``value_fn(obs, state) -> values``: ``obs`` ``{agent: [K, *obs_shape]}`` (``{agent:
#: {key: [K, *shape]}}`` for dict observations), ``state`` ``[K, *state_shape]`` or None;
#: values ``{agent: [K]}`` or ``[K]``.
ValueFn = Callable[[dict[str, Any], Any], Any]

_CALL = "compute_returns_and_advantage"


def _host(x: Any) -> Any:
    return tensor_to_numpy(x) if is_tensor(x) else x


def _leaves(agent: str, names: Any, agents: tuple[str, ...]) -> list[str]:
    """The observation leaves of ``agent`` among ``names`` (``<agent>``, or
    ``<agent>/<key>`` per key of a dict observation), in their order."""
    out = []
    for name in names:
        leaf = obs_leaf(name, agents)
        if leaf is not None and leaf[0] == agent:
            out.append(name)
    return out


class FinalObservations:
    """Final observations (and final global states) kept per (step, env, agent).

    An agent's kept observation is stored per *observation leaf* (the layout's keys of
    ``per_agent["obs"]``: ``<agent>`` for one array, ``<agent>/<key>`` for each key of a
    dict observation), so dict observations keep every key's shape and dtype.

    Args:
        agents: The buffer's agents, in order.
        num_envs: The buffer's envs (a step key is ``t * num_envs + env``).

    Attributes:
        obs: ``{agent: {step key: {leaf: [*shape]}}}``.
        state: ``{step key: [*state_shape]}``.
    """

    def __init__(self, agents: tuple[str, ...], num_envs: int) -> None:
        self.agents = agents
        self.num_envs = num_envs
        self.obs: dict[str, dict[int, dict[str, AnyArray]]] = {a: {} for a in agents}
        self.state: dict[int, AnyArray] = {}

    def __len__(self) -> int:
        """Kept (step, env, agent) observations."""
        return sum(len(rows) for rows in self.obs.values())

    def append(self, t: int, need: BoolArray, obs_rows: Mapping[str, AnyArray],
               state_rows: AnyArray | None) -> None:
        """Keep the final observations of step ``t``.

        Args:
            t: The step.
            need: ``[num_envs, n_agents]`` bool: where a final observation is kept.
            obs_rows: ``{leaf: [num_envs, *shape]}`` per observation leaf (``<agent>``,
                or ``<agent>/<key>`` per key of a dict observation; read where ``need``;
                every leaf of an agent with a True column is present).
            state_rows: ``[num_envs, *state_shape]`` final global states, or None.
        """
        base = t * self.num_envs
        for i, a in enumerate(self.agents):
            envs = np.flatnonzero(need[:, i]).tolist()
            if not envs:
                continue
            leaves = _leaves(a, obs_rows, self.agents)
            for env in envs:
                self.obs[a][base + env] = {leaf: np.array(obs_rows[leaf][env])
                                           for leaf in leaves}
        if state_rows is not None:
            for env in np.flatnonzero(need.any(axis=1)).tolist():
                self.state[base + env] = np.array(state_rows[env])

    def clear(self) -> None:
        """Forget everything kept."""
        self.obs = {a: {} for a in self.agents}
        self.state = {}

    def inputs(self, obs_fields: Mapping[str, FieldSpec], state_field: FieldSpec | None
               ) -> tuple[IntArray, dict[str, Any], AnyArray | None]:
        """The batched ``value_fn`` inputs.

        Args:
            obs_fields: ``{leaf: obs FieldSpec}`` (the layout's ``per_agent["obs"]``).
            state_field: The global state's FieldSpec, or None.

        Returns:
            ``steps`` ``[K]`` (sorted step keys), ``obs`` ``{agent: [K, *obs_shape]}``
            (``{agent: {key: [K, *shape]}}`` for a dict observation) of the agents kept
            somewhere (zeros elsewhere), ``state`` ``[K, *state_shape]`` or None.
        """
        steps = np.array(sorted({k for rows in self.obs.values() for k in rows}),
                         dtype=np.int64)  # [K]
        row_of = {int(k): r for r, k in enumerate(steps.tolist())}
        obs: dict[str, Any] = {}
        for a in self.agents:
            if not self.obs[a]:
                continue
            per_key: dict[str, AnyArray] = {}
            for leaf in _leaves(a, obs_fields, self.agents):
                f = obs_fields[leaf]
                arr = np.zeros((len(steps), *f.shape), f.dtype)  # [K, *shape]
                for k, rows in self.obs[a].items():
                    arr[row_of[k]] = rows[leaf]
                if leaf == a:  # one array
                    obs[a] = arr
                else:
                    per_key[leaf[len(a) + 1:]] = arr
            if per_key:
                obs[a] = per_key
        state = None
        if state_field is not None:
            state = np.zeros((len(steps), *state_field.shape), state_field.dtype)
            for k, row in self.state.items():
                state[row_of[k]] = row
        return steps, obs, state

    def values(self, value_fn: ValueFn | None, central: bool,
               obs_fields: Mapping[str, FieldSpec], state_field: FieldSpec | None
               ) -> tuple[IntArray, IntArray, FloatArray]:
        """Call ``value_fn`` once on every kept observation.

        Args:
            value_fn: ``value_fn(obs, state) -> values`` (module doc).
            central: The buffer stores one value per env (``value_fn`` returns ``[K]``).
            obs_fields: ``{leaf: obs FieldSpec}`` (the layout's ``per_agent["obs"]``).
            state_field: The global state's FieldSpec, or None.

        Returns:
            ``(steps, agent_index, value)``, three ``[N]`` arrays, one entry per kept
            (step, agent), ordered by step then agent.

        Raises:
            ShapeError: ``value_fn`` is None, or returned the wrong form or shape.
            DtypeError: ``value_fn`` returned other than real numbers, or a value that is
                needed is NaN or infinite.
        """
        n = len(self)
        if value_fn is None:
            k = min(k for rows in self.obs.values() for k in rows)
            t, env = divmod(k, self.num_envs)
            raise ShapeError(
                f"{_CALL}(value_fn=None): {n} truncated agent-steps (first: step {t}, env "
                f"{env}) were added with final_obs and need the value of that observation; "
                "pass value_fn(obs, state) -> values ({agent: [K]}, or [K] for a "
                "centralised critic), or pass final_value= at add instead")
        steps, obs, state = self.inputs(obs_fields, state_field)
        k_rows = len(steps)
        out = _host(value_fn(obs, state))
        got = f"value_fn returned {describe(out)}"
        if central:
            if isinstance(out, Mapping):
                raise ShapeError(f"{_CALL}: {got}, a dict, but this buffer stores one "
                                 f"centralised value per env; return one array [{k_rows}]")
            vals = self._column(out, got, k_rows)
            columns = dict.fromkeys(obs, vals)
        else:
            if not isinstance(out, Mapping):
                raise ShapeError(
                    f"{_CALL}: {got}, but this buffer stores one value per agent; return "
                    f"{{agent: [{k_rows}]}} for the agents in obs ({list(obs)})")
            missing = [a for a in obs if a not in out]
            if missing:
                raise ShapeError(f"{_CALL}: {got}, with no value for agent(s) {missing}; "
                                 f"return {{agent: [{k_rows}]}} for every agent in obs")
            columns = {a: self._column(_host(out[a]), f"{got} ({a!r})", k_rows)
                       for a in obs}
        row_of = {int(k): r for r, k in enumerate(steps.tolist())}
        entries = sorted((k, i) for i, a in enumerate(self.agents) for k in self.obs[a])
        ks = np.array([k for k, _ in entries], dtype=np.int64)  # [N]
        idx = np.array([i for _, i in entries], dtype=np.int64)  # [N]
        vals_n = np.array([columns[self.agents[i]][row_of[k]] for k, i in entries],
                          dtype=np.float64)  # [N]
        bad = ~np.isfinite(vals_n)
        if bad.any():  # a value problem, as RolloutBuffer's and HER's (DtypeError)
            j = int(np.flatnonzero(bad)[0])
            t, env = divmod(int(ks[j]), self.num_envs)
            raise DtypeError(
                f"{_CALL}: {got}: the value of agent {self.agents[int(idx[j])]!r}'s final "
                f"observation at step {t}, env {env} (row {row_of[int(ks[j])]}) is "
                f"{vals_n[j]} ({int(bad.sum())} of {len(vals_n)} values are NaN or "
                "infinite); return finite values")
        return ks, idx, vals_n

    @staticmethod
    def _column(out: Any, got: str, k_rows: int) -> FloatArray:
        arr = real_floats(out, f"{_CALL}: {got}", f"return {k_rows} values as numbers, "
                          "one per row of obs")
        if arr.shape != (k_rows,):
            hint = "; squeeze the trailing dim" if arr.shape == (k_rows, 1) else ""
            raise ShapeError(f"{_CALL}: {got}: expected shape ({k_rows},), one value per "
                             f"row of obs, got {arr.shape}{hint}")
        return arr

    # ------------------------------------------------------------------ state
    def arrays(self) -> dict[str, AnyArray]:
        """Copies for a state dict: ``final_obs/index/<agent>`` ``[k_a]`` int64 and
        ``final_obs/rows/<leaf>`` ``[k_a, *shape]`` per observation leaf of each agent with
        kept rows (``final_obs/rows/<agent>`` for one array, ``final_obs/rows/<agent>/<key>``
        per key of a dict observation), ``final_state/index`` ``[m]`` and
        ``final_state/rows`` ``[m, *state_shape]`` when states are kept."""
        out: dict[str, AnyArray] = {}
        for a, rows in self.obs.items():
            if rows:
                keys = sorted(rows)
                out[f"final_obs/index/{a}"] = np.array(keys, dtype=np.int64)
                for leaf in rows[keys[0]]:
                    out[f"final_obs/rows/{leaf}"] = np.stack([rows[k][leaf] for k in keys])
        if self.state:
            keys = sorted(self.state)
            out["final_state/index"] = np.array(keys, dtype=np.int64)
            out["final_state/rows"] = np.stack([self.state[k] for k in keys])
        return out

    def parsed(self, arrays: Mapping[str, Any], obs_fields: Mapping[str, FieldSpec] | None,
               state_field: FieldSpec | None, steps: int
               ) -> tuple[dict[str, dict[int, dict[str, AnyArray]]], dict[int, AnyArray]]:
        """Checked ``(obs, state)`` of a state dict's arrays (see :meth:`arrays`); apply
        with :meth:`load`.

        Args:
            arrays: The state dict's arrays.
            obs_fields: ``{leaf: obs FieldSpec}`` (the layout's ``per_agent["obs"]``), or
                None when the state has no layout.
            state_field: The global state's FieldSpec, or None.
            steps: The state's ``pos`` (step keys lie in ``[0, steps * num_envs)``).

        Returns:
            ``(obs, state)`` in the form of :attr:`obs` and :attr:`state`.

        Raises:
            ValueError: A misshaped array or a step key outside ``[0, steps * num_envs)``.
            KeyError: A missing array.
        """
        obs: dict[str, dict[int, dict[str, AnyArray]]] = {a: {} for a in self.agents}
        state: dict[int, AnyArray] = {}
        limit = steps * self.num_envs
        for a in self.agents:
            ikey = f"final_obs/index/{a}"
            if ikey not in arrays:
                continue
            if obs_fields is None:
                raise ValueError(f"{ikey} is present but the state has no layout")
            for leaf in _leaves(a, obs_fields, self.agents):
                rows = self._rows(arrays[ikey], arrays[f"final_obs/rows/{leaf}"],
                                  obs_fields[leaf], limit, ikey)
                for k, row in rows.items():
                    obs[a].setdefault(k, {})[leaf] = row
        if "final_state/index" in arrays:
            if state_field is None:
                raise ValueError("final_state/index is present but the state stores no "
                                 "global state")
            state = self._rows(arrays["final_state/index"], arrays["final_state/rows"],
                               state_field, limit, "final_state/index")
        return obs, state

    @staticmethod
    def _rows(index: Any, rows: Any, field: FieldSpec, limit: int,
              name: str) -> dict[int, AnyArray]:
        keys = [int(k) for k in np.asarray(index).reshape(-1)]
        if len(set(keys)) != len(keys) or any(not 0 <= k < limit for k in keys):
            raise ValueError(f"{name} {keys} must be distinct steps in [0, {limit})")
        arr = np.array(rows, dtype=field.dtype).reshape((len(keys), *field.shape))
        return {k: arr[j] for j, k in enumerate(keys)}

    def load(self, obs: dict[str, dict[int, dict[str, AnyArray]]],
             state: dict[int, AnyArray]) -> None:
        """Replace the kept rows with :meth:`parsed`'s."""
        self.obs, self.state = obs, state
