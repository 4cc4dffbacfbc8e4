"""The on-policy rollout buffer (PPO/A2C) with GAE."""
