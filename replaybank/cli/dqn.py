"""A small DQN agent (torch MLP) for the demo: double DQN on n-step, optionally
prioritized, replay.

The loss is the Huber loss between ``Q(s, a)`` and the target
``G + discount * (1 - terminated) * Q_target(s', argmax_a Q(s', a))`` where ``G`` and
``discount = gamma ** L`` come from the buffer's n-step view (``L = 1``, ``discount =
gamma`` for one-step replay). Prioritized replay weights the loss by ``batch.weights``
and gets ``|td error|`` back as new priorities.

Example:
    >>> import numpy as np
    >>> agent = DQNAgent(obs_dim=4, n_actions=2, seed=0)
    >>> agent.act(np.zeros((3, 4), np.float32), epsilon=0.0).shape
    (3,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import require_extra

__all__ = ["DQNAgent", "DQNConfig"]


@dataclass
class DQNConfig:
    """Hyper-parameters of :class:`DQNAgent` and of the demo's training loop.

    Attributes:
        hidden: Width of the two hidden layers.
        lr: Adam learning rate.
        gamma: Discount factor.
        n_step: Steps of the n-step return.
        batch_size: Transitions per gradient step.
        target_tau: Polyak factor of the target network (per gradient step).
        max_grad_norm: Gradient clipping norm.
        double: Double DQN targets.
    """

    hidden: int = 128
    lr: float = 1e-3
    gamma: float = 0.99
    n_step: int = 3
    batch_size: int = 128
    target_tau: float = 0.01
    max_grad_norm: float = 10.0
    double: bool = True


class DQNAgent:
    """Double DQN with a two-layer MLP Q-network and a Polyak-averaged target network.

    Args:
        obs_dim: Size of the (flat float) observation.
        n_actions: Number of discrete actions.
        config: Hyper-parameters (defaults tuned for CartPole-v1).
        seed: Seed of the weights and of epsilon-greedy exploration.

    Example:
        >>> import numpy as np
        >>> agent = DQNAgent(4, 2, seed=0)
        >>> int(agent.act(np.zeros((1, 4), np.float32), epsilon=1.0)[0]) in (0, 1)
        True
    """

    def __init__(self, obs_dim: int, n_actions: int, config: DQNConfig | None = None,
                 seed: int = 0) -> None:
        torch = require_extra("torch", "torch")
        nn = torch.nn
        self.torch = torch
        self.config = cfg = config if config is not None else DQNConfig()
        self.n_actions = int(n_actions)
        torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)

        def mlp() -> Any:
            return nn.Sequential(nn.Linear(obs_dim, cfg.hidden), nn.ReLU(),
                                 nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
                                 nn.Linear(cfg.hidden, n_actions))

        self.q = mlp()
        self.target = mlp()
        self.target.load_state_dict(self.q.state_dict())
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, foreach=True)
        self._params = list(self.q.parameters())
        self._target_params = list(self.target.parameters())
        self.updates = 0

    def greedy(self, obs: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Greedy actions ``[N]`` for observations ``[N, obs_dim]``."""
        torch = self.torch
        with torch.no_grad():
            q = self.q(torch.as_tensor(np.asarray(obs, dtype=np.float32)))
        return np.asarray(q.argmax(dim=1).numpy(), dtype=np.int64)

    def act(self, obs: npt.NDArray[Any], epsilon: float) -> npt.NDArray[np.int64]:
        """Epsilon-greedy actions ``[N]``."""
        actions = self.greedy(obs)
        explore = self.rng.random(len(actions)) < epsilon
        if explore.any():
            actions[explore] = self.rng.integers(0, self.n_actions, int(explore.sum()))
        return actions

    def update(self, batch: Any) -> tuple[float, npt.NDArray[np.float64]]:
        """One gradient step on a replay batch.

        Args:
            batch: A replaybank Batch with ``obs, action, reward, next_obs, terminated``
                and optionally ``discount`` (n-step) and ``weights`` (prioritized).

        Returns:
            ``(loss, |td error|)``, the latter ``[B]`` for ``update_priorities``.
        """
        torch, cfg = self.torch, self.config
        b = batch.to_torch()
        obs = b.obs.float()
        nxt = b.next_obs.float()
        action = b.action.long().reshape(-1, 1)
        reward = b.reward.float()
        discount = b.discount.float() if "discount" in batch else torch.full_like(reward, cfg.gamma)
        not_term = 1.0 - b.terminated.float()
        with torch.no_grad():
            if cfg.double:
                a_next = self.q(nxt).argmax(dim=1, keepdim=True)
                q_next = self.target(nxt).gather(1, a_next).squeeze(1)
            else:
                q_next = self.target(nxt).max(dim=1).values
            target = reward + discount * not_term * q_next
        q = self.q(obs).gather(1, action).squeeze(1)
        td = target - q
        loss_each = torch.nn.functional.smooth_l1_loss(q, target, reduction="none")
        loss = (b.weights.float() * loss_each).mean() if "weights" in batch else loss_each.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():  # Polyak: target += tau * (online - target)
            torch._foreach_lerp_(self._target_params, self._params, cfg.target_tau)
        self.updates += 1
        return float(loss.item()), td.detach().abs().double().numpy()
