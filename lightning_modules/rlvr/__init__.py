"""Reinforcement learning with verifiable rewards: the GRPO module, its SFT warm-up, rollouts, token log-probs,
answer checking and the rollout allocators (Knapsack RL, DARS) that attach to it.

Import from the module files (``lightning_modules.rlvr.<file>``); this package imports nothing eagerly."""
