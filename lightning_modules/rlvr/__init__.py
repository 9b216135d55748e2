"""Reinforcement learning with verifiable rewards, shared by DARS (``configs/dars``), Knapsack RL
(``configs/knapsack_rl``) and plain GRPO (``configs/grpo``): GRPO, its SFT warm-up, and the rollout allocators that
attach to it.

- ``answers``: Answer checking shared by the RL-with-verifiable-rewards papers.
- ``grpo``: GRPO for RL with verifiable rewards (RLVR), with variable group sizes.
- ``rollout_allocation``: Rollout allocators for GRPO.
- ``rollouts``: Rollout generation for RLVR.
- ``sft``: Supervised warm-up (SFT) of an RLVR policy.
- ``token_logprobs``: Chosen-token log-probs and entropies of a causal LM's completions without a full-vocabulary
  log-softmax.

Import from the files (``lightning_modules.rlvr.<file>``); this package imports nothing eagerly.
"""
