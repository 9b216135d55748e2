"""GRPO for RL with verifiable rewards (RLVR), with variable group sizes: the shared core of Knapsack-RL and DARS.

Group Relative Policy Optimization (Shao et al., "DeepSeekMath", arXiv 2402.03300) in the forms of the official
verl and TRL implementations, plus Dr. GRPO (Liu et al., arXiv 2503.20783). TRL's ``GRPOTrainer`` forms
groups by ``view(-1, num_generations)`` and cannot express per-prompt group sizes, so the step is written here.
One file: the step below is one algorithm whose parts (advantages, loss aggregation, sharded generation) are read
together; rollouts, log-probs, answers and allocation already live beside it in `lightning_modules.rlvr`.

One training step (one batch of M prompts, everything vectorised over ONE padded batch of rollouts):

1. Plan: N_j rollouts for prompt j (``rollout_allocator.plan``; uniform ``rollouts_per_prompt`` without one).
2. Generate all rollouts at ``temperature`` with the KV-cache sampler (`lightning_modules.rlvr.rollouts`); score them
   with the injected ``reward`` (a `RewardFunction`); optional stage 2 (``second_stage``, DARS): extra rollouts
   for some prompts, same group ids, statistics recomputed over all of a prompt's rollouts.
3. Advantages per prompt group (`group_advantages`, verl ``compute_grpo_outcome_advantage``):
   Â_i = (r_i − mean_g) / (std_g + 1e-6) with Bessel-corrected std (``scale_by_group_std``), or r_i − mean_g
   (Dr. GRPO). Broadcast over the completion's tokens.
4. Optional zero-variance filter (``drop_zero_variance_groups``, DAPO/DARS: groups whose rewards are all equal).
5. ``ppo_epochs`` passes over the rollouts, each split into ``ppo_mini_batches`` optimiser steps (manual
   optimisation), each optionally accumulated over micro-batches of ``micro_batch_size`` rollouts.
   Per-token loss (`policy_loss`, verl "vanilla" = TRL): ρ = exp(logπ_θ − logπ_old),
   ℓ = max(−Â ρ, −Â clip(ρ, 1 − ε_low, 1 + ε_high)) (+ optional dual clip ``clip_ratio_c`` for Â < 0)
   + β · k3, k3 = exp(logπ_ref − logπ_θ) − (logπ_ref − logπ_θ) − 1 to a frozen copy of the initial policy.
   Aggregation (m = completion mask) over the optimiser step's rollouts:
   ``token_mean``  Σ ℓ m / Σ m (verl token-mean, TRL bnpo/dapo),
   ``sequence_mean`` mean_i Σ_t ℓ m / Σ_t m (TRL grpo, verl seq-mean-token-mean),
   ``constant``  Σ ℓ m / C (verl seq-mean-token-sum-norm with a constant ``loss_scale_factor``; DARS'
   Σ ℓ m / L_max; TRL dr_grpo is C = B · max_completion_length). C = ``constant_normalizer`` (default
   ``max_new_tokens``, as DARS). With a constant C extra rollouts add gradient mass (DARS' re-weighting).
   An optional entropy bonus (``entropy_coef``) is aggregated the same way. Log-probs use logits / temperature
   (TRL, verl). When one on-policy step is taken (1 epoch, 1 mini-batch) the old
   log-probs are the detached current ones (ρ = 1, clipping inactive), as in TRL with ``num_iterations=1``.
6. ``rollout_allocator.observe`` with every rollout's reward (history for Knapsack).

Logged every step (``train/``): reward, effective_ratio_response (fraction of rollouts whose group has non-zero
reward variance, i.e. 0 < c < N for binary rewards: the Knapsack paper's response-level ratio),
effective_ratio_prompt (fraction of prompts), solve_none / solve_partial / solve_all (prompts with 0, some, all
rollouts correct; correct is the reward's flag, `RewardFunction.evaluate`, i.e. reward > 0.5 for binary rewards),
rollouts (this step, both stages), cumulative_rollouts, entropy (token-mean policy entropy on the rollouts),
completion_length, loss (under data parallelism this rank's share), clip_fraction, kl, and the allocator's
``allocation/*`` metrics. `GRPO.last_rollouts` keeps the step's per-rollout tensors for experiment callbacks.

Evaluation (``val/`` and ``test/``): ``eval_samples`` samples per prompt at ``eval_temperature``; pass@k for every
k in ``eval_k`` with the unbiased estimator (Chen et al. 2021, `pass_at_k`), mean accuracy (= pass@1, "Avg@n"),
greedy accuracy, and per-tier pass@1 / greedy / pass@max-k. ``predict_step`` returns the greedy completions
(deterministic). Training rollouts are seeded from (``rollout_seed`` or the run's seed, step counter), so runs
repeat exactly and a resumed run continues the same stream. Evaluation samples are always keyed by (seed, stage,
prompt id, sample index) (`lightning_modules.rlvr.rollouts.rollout_keys`), whatever ``rollout_seeding`` says,
and the metrics are computed once per epoch from every rank's prompts, each counted once
(`lightning_modules.shared.example_rng.gather_examples` drops the sampler's padding copies): validation and test
report the same numbers with any number of processes (`TransformersGenerate`, which samples with transformers'
own RNG, is the exception).

Deviations / choices (documented, configurable where it matters):

* A group of size 1 gets advantage 0 (TRL: NaN -> 0). verl gives it μ = 0, σ = 1, i.e. Â = r (no baseline).
* ``max_steps`` of the Trainer counts optimiser steps (Lightning's manual optimisation): a step with
  ``ppo_epochs=2`` and ``ppo_mini_batches=4`` is 8 "steps"; a step whose rollouts are all filtered out takes none.
  Bound such runs with ``max_epochs`` or ``limit_train_batches``.
* Gradient clipping (``max_grad_norm``, verl's 1.0) is done here, as Lightning's ``gradient_clip_val`` does not
  apply under manual optimisation. The entropy bonus is off by default (verl 0; DARS uses 0.001).
* The k3 log-ratio is clamped to ±20 and k3 to ≤ 10 (verl ``low_var_kl``); TRL does not clamp.
* Data parallel (DDP): ranks keep different numbers of rollouts (zero-variance filter, DARS' second stage), so
  `GRPO.update` agrees across ranks on the number of optimiser steps and micro-batches and pads with
  zero-gradient backward passes; loss denominators are totals over ranks (times W against DDP's averaging), so the
  update equals one process's on all ranks' rollouts (tested with 2 gloo processes).
* Fully sharded (FSDP2 through Lightning's ``ModelParallelStrategy``, configs/trainer/fsdp.yaml; fsdp_cpu.yaml for
  2 CPU processes): ``configure_model`` shards every transformer block of the policy and of the frozen reference,
  then each root (`lightning_modules.shared.tiny_gpt.fully_shard_model`). A sharded forward all-gathers parameters over
  the ranks, so every rank runs the same forward passes: generation keeps calling the policy on padding until all
  ranks are done (`lightning_modules.rlvr.rollouts`, ``synced``), DARS' second stage runs on every rank when any rank
  needs one, the old-policy and reference log-probs and the micro-batch passes are padded to the largest count of
  any rank, and a padding backward runs a forward on one dummy row with a zero loss. FSDP1 (``FSDPStrategy``),
  DeepSpeed and tensor parallelism are refused. Checkpoints are distributed-checkpoint folders that resume.
* ``rollout_seeding: example`` draws each rollout from a key of (seed, step, prompt id, rollout index)
  (`lightning_modules.rlvr.rollouts.keyed_uniforms`) instead of one generator for the whole batch, so a run whose
  prompts are split over ranks samples the rollouts one process samples (the default ``batch`` keeps
  ``torch.multinomial`` with the step's generator). With it, a 2-process run equals one process (tests/test_fsdp.py).

Length: one paper family's core read top to bottom (rewards, advantage/loss math, the module with its data-parallel
update and evaluation); the log-prob kernel lives in `token_logprobs.py`, rollout engines in `rollouts.py`.
"""
from __future__ import annotations

import copy
import math
from typing import Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.rlvr.answers import answers_match
from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import TokenizedData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import distributed, gather_examples
from lightning_modules.rlvr.rollout_allocation import RolloutAllocator
from lightning_modules.rlvr.rollouts import KVCacheSampler, RolloutEngine, TransformersGenerate, rollout_keys
from lightning_modules.rlvr.token_logprobs import completion_logprobs
from lightning_modules.shared.tiny_gpt import (check_policy_vocabulary, fully_shard_model, is_sharded,
                                     picklable_hyperparameters, sharding_mesh)



# --------------------------------------------------------------------------------------------- rewards
class RewardFunction:
    """Base class of verifiable rewards: one float per completion plus metrics to log (means).

    ``evaluate`` also says which completions are *correct* (what solve rates, pass@k, greedy accuracy and the
    rollout allocators' success estimates count). The default treats the reward as binary (correct = reward > 0.5);
    a graded reward (e.g. Multi-RLCR's format + accuracy + Brier, where a well-formed wrong set scores above 0.5)
    overrides ``evaluate`` with its own flag.
    """

    def __call__(self, completions: list[str], answers: list[list[str]]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def evaluate(self, completions: list[str], answers: list[list[str]],
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(rewards [R], correct BoolTensor[R], metrics)."""
        rewards, metrics = self(completions, answers)
        rewards = torch.as_tensor(rewards, dtype=torch.float32)
        return rewards, rewards > 0.5, metrics


class ExactMatchReward(RewardFunction):
    """1 when the completion matches any acceptable answer after normalisation (numbers and short text), else 0.

    Args:
        extract: take the final answer out of the completion first (last ``\\boxed{}``, ``####``, "answer is").
        wrong_reward: reward of a wrong completion (0; -1 gives the DAPO-style ±1 reward).
    """

    def __init__(self, extract: bool = True, wrong_reward: float = 0.0) -> None:
        check_range("ExactMatchReward.wrong_reward (a wrong completion must score below the 0.5 that marks a "
                    "correct one)", wrong_reward, high=0.5, high_inclusive=False)
        self.extract, self.wrong_reward = extract, wrong_reward

    def __call__(self, completions, answers):
        correct = torch.tensor([answers_match(c, a, self.extract) for c, a in zip(completions, answers)],
                               dtype=torch.bool)
        rewards = torch.where(correct, 1.0, float(self.wrong_reward))
        return rewards, {"accuracy": correct.float().mean().item() if len(completions) else 0.0}


# --------------------------------------------------------------------------------------------- math
def group_statistics(rewards: torch.Tensor, group_index: torch.Tensor, num_groups: int,
                     threshold: float = 0.5, correct: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per group: ``count``, ``correct`` (rollouts flagged ``correct``; without flags reward > threshold),
    ``mixed`` (non-zero reward variance), ``mean``."""
    count = torch.zeros(num_groups, dtype=torch.long, device=rewards.device).index_add_(
        0, group_index, torch.ones_like(group_index))
    flags = rewards > threshold if correct is None else correct.to(rewards.device).bool()
    correct = torch.zeros_like(count).index_add_(0, group_index, flags.long())
    rewards = rewards.float()
    # explicit float32: under bf16-true Lightning makes bfloat16 the default dtype inside the step
    floats = {"dtype": torch.float32, "device": rewards.device}
    total = torch.zeros(num_groups, **floats).index_add_(0, group_index, rewards)
    high = torch.full((num_groups,), -math.inf, **floats).scatter_reduce_(0, group_index, rewards, "amax")
    low = torch.full((num_groups,), math.inf, **floats).scatter_reduce_(0, group_index, rewards, "amin")
    return {"count": count, "correct": correct, "mixed": (count > 0) & (high > low),
            "mean": total / count.clamp(min=1)}


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, scale_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages with any group size: (r − group mean) [/ (Bessel std + eps)]; singleton groups get 0."""
    rewards = rewards.float()
    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    floats = {"dtype": torch.float32, "device": rewards.device}  # not the default dtype (bfloat16 under bf16-true)
    count = torch.zeros(num_groups, **floats).index_add_(0, group_index, torch.ones_like(rewards))
    mean = torch.zeros(num_groups, **floats).index_add_(0, group_index, rewards) / count.clamp(min=1)
    centred = rewards - mean[group_index]
    if scale_by_std:
        squares = torch.zeros(num_groups, **floats).index_add_(0, group_index, centred ** 2)
        std = (squares / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std[group_index] + eps)
    return torch.where(count[group_index] > 1, centred, torch.zeros_like(centred))


def pass_at_k(n, c, k: int) -> torch.Tensor:
    """Unbiased pass@k = 1 − C(n−c, k) / C(n, k) per problem (1 when n − c < k); n, c ints or tensors.

    Product form (numerically stable, exact 0 when c = 0): 1 − Π_{i=n−c+1}^{n} (1 − k/i), evaluated as a
    difference of cumulative sums of log(1 − k/i).
    """
    n = torch.as_tensor(n, dtype=torch.long)
    c = torch.as_tensor(c, dtype=torch.long)
    n, c = torch.broadcast_tensors(n, c)
    if bool((n < k).any()):
        raise UserInputError(f"pass@{k} needs at least k={k} samples per problem (got n={int(n.min())}).")
    if bool(((c < 0) | (c > n)).any()):
        raise UserInputError("pass@k: the number of correct samples must lie in [0, n].")
    i = torch.arange(1, int(n.max()) + 1, dtype=torch.float64)
    terms = torch.where(i > k, torch.log1p(-k / i), torch.zeros_like(i))
    cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(terms, 0)])
    log_product = cumulative[n] - cumulative[n - c]
    return torch.where(n - c < k, torch.ones_like(log_product), 1.0 - torch.exp(log_product))


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.28,
                aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean",
                constant_normalizer: float | None = None, ref_logprobs: torch.Tensor | None = None,
                kl_coef: float = 0.0, clip_ratio_c: float | None = None, num_sequences: int | None = None,
                num_tokens: float | None = None, entropy: torch.Tensor | None = None,
                entropy_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss on [B, T] token log-probs, aggregated as in the module docstring.

    ``advantages`` is [B] (one per sequence) or [B, T]. ``num_sequences`` / ``num_tokens`` override the
    denominators of ``sequence_mean`` / ``token_mean`` (micro-batches of one optimiser step pass the step's totals).
    ``entropy`` [B, T] with ``entropy_coef`` > 0 subtracts an entropy bonus, aggregated like the loss (verl).
    Returns the loss and detached metrics (clip_fraction, kl, ratio).
    """
    mask = mask.float()
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:  # verl dual clip, for negative advantages only
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -advantages * clip_ratio_c), per_token)
    metrics = {"clip_fraction": ((clipped > unclipped).float() * mask).sum() / mask.sum().clamp(min=1),
               "ratio": (ratio * mask).sum() / mask.sum().clamp(min=1)}
    if ref_logprobs is not None:
        delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        kl = (torch.exp(delta) - delta - 1.0).clamp(max=10.0)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = (kl * mask).sum() / mask.sum().clamp(min=1)
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    if aggregation == "token_mean":
        loss = (per_token * mask).sum() / (num_tokens if num_tokens is not None else mask.sum().clamp(min=1))
    elif aggregation == "sequence_mean":
        per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        loss = per_sequence.sum() / (num_sequences if num_sequences is not None else per_token.shape[0])
    elif aggregation == "constant":
        if constant_normalizer is None:
            raise UserInputError("loss aggregation 'constant' needs constant_normalizer (e.g. max_new_tokens).")
        loss = (per_token * mask).sum() / constant_normalizer
    else:
        raise UserInputError(f"loss_aggregation={aggregation!r}: choose token_mean, sequence_mean or constant.")
    return loss, {k: v.detach() for k, v in metrics.items()}


def decode_completions(tokens: torch.Tensor, mask: torch.Tensor, tokenizer) -> list[str]:
    """Completion strings (EOS and padding dropped)."""
    rows = []
    for ids, keep in zip(tokens.tolist(), mask.tolist()):
        rows.append(tokenizer.decode([t for t, k in zip(ids, keep) if k and t != tokenizer.eos_id]))
    return rows


def completion_fields(completions: torch.Tensor, batch: dict, tokenizer) -> dict:
    """The fields a prediction file holds for generated completions [M, T] of a prompt batch."""
    fields = {"prompt_id": batch["prompt_ids"],
              "prompt": decode_completions(batch["prompt_tokens"], batch["prompt_mask"], tokenizer),
              "completion": decode_completions(completions, completions != tokenizer.pad_id, tokenizer)}
    if "answers" in batch:
        fields["answers"] = [list(a) for a in batch["answers"]]
    fields["completion_tokens"] = completions
    return fields


class SpecialTokens:
    """pad/eos ids restored from a checkpoint: enough to generate (not to decode) without a datamodule."""

    def __init__(self, pad_id: int, eos_id: int | None, bos_id: int | None = None) -> None:
        self.pad_id, self.eos_id, self.bos_id = pad_id, eos_id, bos_id


def _pad_cat(a: torch.Tensor, b: torch.Tensor, value) -> torch.Tensor:
    width = max(a.shape[1], b.shape[1])
    a = nn.functional.pad(a, (0, width - a.shape[1]), value=value)
    b = nn.functional.pad(b, (0, width - b.shape[1]), value=value)
    return torch.cat([a, b], 0)


# --------------------------------------------------------------------------------------------- module
class GRPO(PaperModule):
    """GRPO with variable group sizes, Dr. GRPO options, PPO clipping, k3 KL and multi-pass updates.

    Args:
        policy: the network (`lightning_modules.shared.tiny_gpt.TinyGPT` or `HFCausalLM`), kept at ``self.policy``.
        reward: a `RewardFunction` (default `ExactMatchReward`).
        rollout_allocator: rollouts per prompt (``plan``) and DARS' second stage; None = uniform.
        rollout_engine: how rollouts are generated (default `KVCacheSampler`).
        rollouts_per_prompt: N of uniform GRPO (the allocator's base N).
        max_new_tokens, temperature: rollout length and sampling temperature (also divides the logits of the loss).
        scale_by_group_std: divide by the group std (GRPO) or not (Dr. GRPO, DARS).
        loss_aggregation, constant_normalizer: see the module docstring (C defaults to max_new_tokens).
        clip_low, clip_high, clip_ratio_c: PPO clip range [1 − clip_low, 1 + clip_high]; optional dual clip.
        kl_coef: weight of the k3 KL to a frozen copy of the initial policy (0: no reference model).
        ppo_epochs, ppo_mini_batches, micro_batch_size: passes, optimiser steps per pass, rollouts per forward.
        drop_zero_variance_groups: train only on groups with non-zero reward variance.
        entropy_coef: entropy bonus weight (verl ``entropy_coeff``; 0 by default, 0.001 in DARS).
        advantage_clip: clamp advantages to [-c, c] (verl ``adv_clip_value``, 5 in the Knapsack-RL script).
        max_grad_norm: gradient clipping (None: off).
        eval_samples, eval_k, eval_temperature: validation samples per prompt, the k of pass@k, temperature.
        rollout_seed: seed of the rollout streams (None: the run's seed, ``torch.initial_seed()``).
        rollout_seeding: ``batch`` (one generator per step for the whole batch) or ``example`` (per-rollout keys
            from the prompt id, so the rollouts do not depend on how prompts are split over ranks).
    """

    def __init__(self, policy: nn.Module, reward: RewardFunction | None = None,
                 rollout_allocator: RolloutAllocator | None = None, rollout_engine: RolloutEngine | None = None,
                 rollouts_per_prompt: int = 8, max_new_tokens: int = 8, temperature: float = 1.0,
                 scale_by_group_std: bool = True,
                 loss_aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean",
                 constant_normalizer: float | None = None, clip_low: float = 0.2, clip_high: float = 0.28,
                 clip_ratio_c: float | None = None, kl_coef: float = 0.0, ppo_epochs: int = 1,
                 ppo_mini_batches: int = 1, micro_batch_size: int | None = None,
                 drop_zero_variance_groups: bool = False, advantage_clip: float | None = None,
                 entropy_coef: float = 0.0,
                 max_grad_norm: float | None = 1.0, eval_samples: int = 8,
                 eval_k: list[int] | None = None, eval_temperature: float = 1.0, rollout_seed: int | None = None,
                 rollout_seeding: Literal["batch", "example"] = "batch",
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        self.save_hyperparameters()
        for name, value in (("rollouts_per_prompt", rollouts_per_prompt), ("max_new_tokens", max_new_tokens),
                            ("ppo_epochs", ppo_epochs), ("ppo_mini_batches", ppo_mini_batches),
                            ("eval_samples", eval_samples)):
            check_range(name, value, low=1)
        check_range("temperature", temperature, low=0.0, low_inclusive=False)
        check_range("eval_temperature", eval_temperature, low=0.0)
        check_range("clip_low", clip_low, 0.0, 1.0)
        check_range("clip_high", clip_high, low=0.0)
        check_range("kl_coef", kl_coef, low=0.0)
        check_range("entropy_coef", entropy_coef, low=0.0)
        if clip_ratio_c is not None:
            check_range("clip_ratio_c", clip_ratio_c, low=1.0, low_inclusive=False)
        if advantage_clip is not None:
            check_range("advantage_clip", advantage_clip, low=0.0, low_inclusive=False)
        if micro_batch_size is not None:
            check_range("micro_batch_size", micro_batch_size, low=1)
        if constant_normalizer is not None:
            check_range("constant_normalizer", constant_normalizer, low=0.0, low_inclusive=False)
        if loss_aggregation not in ("token_mean", "sequence_mean", "constant"):
            raise UserInputError(f"loss_aggregation={loss_aggregation!r}: choose token_mean, sequence_mean or "
                                 "constant.")
        if rollout_seeding not in ("batch", "example"):
            raise UserInputError(f"rollout_seeding={rollout_seeding!r}: choose batch or example.")
        if rollout_seeding == "example" and isinstance(rollout_engine, TransformersGenerate):
            raise UserInputError("rollout_seeding: example needs an engine that takes per-rollout seeds; "
                                 "TransformersGenerate samples with transformers' own RNG: use KVCacheSampler.")
        self.eval_k = sorted(set(eval_k)) if eval_k else sorted({1, eval_samples})
        if any(k < 1 or k > eval_samples for k in self.eval_k):
            raise UserInputError(f"eval_k={eval_k}: every k must lie in [1, eval_samples={eval_samples}].")
        self.automatic_optimization = False
        self.policy = policy
        self.reward = reward if reward is not None else ExactMatchReward()
        self.rollout_allocator = rollout_allocator
        self.rollout_engine = rollout_engine if rollout_engine is not None else KVCacheSampler()
        self.ref_policy = copy.deepcopy(policy).requires_grad_(False) if kl_coef > 0 else None
        self.base_seed = int(rollout_seed if rollout_seed is not None else torch.initial_seed()) % (2**62)
        self.rollout_batches = 0  # training steps taken (seeds the rollout stream), saved in checkpoints
        self.cumulative_rollouts = 0
        self.last_rollouts: dict | None = None
        self._tokenizer = None
        self._special = None
        self._eval_rows: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
        self._first_rollout_index: torch.Tensor | None = None  # per prompt, during DARS' second stage

    # ------------------------------------------------------------------ plumbing
    @property
    def tokenizer(self):
        data_tokenizer = self.data(TokenizedData).tokenizer
        if self._tokenizer is None and data_tokenizer is not None:
            self.set_tokenizer(data_tokenizer)
        if self._tokenizer is None and self._special is not None:
            return self._special
        if self._tokenizer is None:
            raise UserInputError("GRPO has no tokenizer: attach a datamodule with a `.tokenizer` (or call "
                                 "set_tokenizer) before generating.")
        return self._tokenizer

    def set_tokenizer(self, tokenizer) -> None:
        check_policy_vocabulary(self.policy, tokenizer.vocab_size)
        self._tokenizer = tokenizer

    def load_initial_weights(self):
        report = super().load_initial_weights()
        if self.ref_policy is not None:  # the KL anchor is the policy we start from (the SFT checkpoint)
            self.ref_policy.load_state_dict(self.policy.state_dict())
        return report

    def setup(self, stage: str) -> None:
        sharding_mesh(self._trainer, "GRPO")  # refuses FSDP1, DeepSpeed and tensor parallelism with one line
        data_tokenizer = self.data(TokenizedData).tokenizer
        if data_tokenizer is not None:  # refuse a mismatch now, not while decoding the first validation samples
            check_policy_vocabulary(self.policy, data_tokenizer.vocab_size)
        super().setup(stage)

    def configure_model(self) -> None:
        """FSDP2 under ModelParallelStrategy: shard the policy and the frozen reference (blocks, then each root)."""
        mesh = sharding_mesh(self._trainer, "GRPO")
        if mesh is None:
            return
        fully_shard_model(self.policy, mesh)
        if self.ref_policy is not None:
            fully_shard_model(self.ref_policy, mesh)

    @property
    def sharded(self) -> bool:
        """Whether the policy is sharded (FSDP2): forward passes are collective and must be kept in step."""
        return is_sharded(self.policy)

    def _any_rank(self, flag: bool) -> bool:
        """``flag`` OR-ed over the ranks (the local flag in one process)."""
        return bool(self._agree([float(flag)]).max() > 0)

    def _generator(self, stream: int, counter: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed((self.base_seed * 1_000_003 + stream * 7_919 + counter) % (2**62))
        return generator

    def generate(self, batch: dict, counts: torch.Tensor, temperature: float, generator: torch.Generator,
                 keyed: bool | None = None):
        """Rollouts for `batch`'s prompts, counts[j] of prompt j (engine call; see rollouts.sample_completions).

        ``keyed`` (default: ``rollout_seeding == "example"``) draws each rollout from its key of (the generator's
        seed, prompt id, rollout index) instead of the generator's one stream."""
        training = self.policy.training
        self.policy.eval()  # no dropout while sampling
        options = {"synced": True} if self.sharded else {}
        if keyed is None:
            keyed = self.hparams.rollout_seeding == "example"
        if keyed:  # keys: (step seed, prompt id, rollout index of the prompt)
            options["row_seeds"] = rollout_keys(generator.initial_seed(), batch["prompt_ids"], counts,
                                                self._first_rollout_index)
        try:
            return self.rollout_engine.generate(self.policy, batch["prompt_tokens"], batch["prompt_mask"], counts,
                                                self.hparams.max_new_tokens, temperature, self.tokenizer, generator,
                                                **options)
        finally:
            self.policy.train(training)

    def score(self, tokens, mask, group_index, answers) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(rewards [R], correct BoolTensor[R], reward metrics) of the rollouts (`RewardFunction.evaluate`)."""
        completions = decode_completions(tokens, mask, self.tokenizer)
        rewards, correct, metrics = self.reward.evaluate(completions, [answers[int(g)] for g in group_index.tolist()])
        return (torch.as_tensor(rewards, dtype=torch.float32, device=self.device),
                torch.as_tensor(correct, dtype=torch.bool, device=self.device), metrics)

    def _successes(self, rewards: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        """What the allocator counts as a success (its own ``success_threshold`` when set, else ``correct``)."""
        successes = getattr(self.rollout_allocator, "successes", None)
        return correct if successes is None else successes(rewards, correct).to(correct.device)

    # ------------------------------------------------------------------ training
    def training_step(self, batch: dict, batch_idx: int):
        h = self.hparams
        prompt_ids, num_prompts = batch["prompt_ids"], batch["prompt_ids"].shape[0]
        generator = self._generator(0, self.rollout_batches)
        self.rollout_batches += 1
        if self.rollout_allocator is not None:
            counts = torch.as_tensor(self.rollout_allocator.plan(prompt_ids.cpu(), h.rollouts_per_prompt),
                                     dtype=torch.long).to(self.device)
        else:
            counts = torch.full((num_prompts,), h.rollouts_per_prompt, dtype=torch.long, device=self.device)
        tokens, mask, group_index = self.generate(batch, counts, h.temperature, generator)
        rewards, correct, reward_metrics = self.score(tokens, mask, group_index, batch["answers"])
        first_stage = rewards.numel()
        if self.rollout_allocator is not None:
            stats = group_statistics(rewards, group_index, num_prompts, correct=self._successes(rewards, correct))
            extra = torch.as_tensor(self.rollout_allocator.second_stage(prompt_ids.cpu(), counts.cpu(),
                                                                        stats["correct"].cpu()), dtype=torch.long)
            second = int(extra.sum()) > 0
            if self.sharded:  # sharded generation is collective: every rank runs it when any rank needs it
                second = self._any_rank(second)
            if second:
                self._first_rollout_index = counts
                try:
                    tokens2, mask2, group2 = self.generate(batch, extra.to(self.device), h.temperature, generator)
                finally:
                    self._first_rollout_index = None
                rewards2, correct2, metrics2 = self.score(tokens2, mask2, group2, batch["answers"])
                n1, n2 = rewards.numel(), rewards2.numel()
                reward_metrics = {k: (v * n1 + metrics2.get(k, v) * n2) / max(n1 + n2, 1)
                                  for k, v in reward_metrics.items()}
                tokens, mask = _pad_cat(tokens, tokens2, self.tokenizer.pad_id), _pad_cat(mask, mask2, False)
                group_index, rewards = torch.cat([group_index, group2]), torch.cat([rewards, rewards2])
                correct = torch.cat([correct, correct2])
                order = torch.argsort(group_index, stable=True)  # keep each prompt's rollouts contiguous
                tokens, mask, group_index, rewards = tokens[order], mask[order], group_index[order], rewards[order]
                correct = correct[order]
        stats = group_statistics(rewards, group_index, num_prompts, correct=correct)
        advantages = group_advantages(rewards, group_index, h.scale_by_group_std)
        if h.advantage_clip is not None:
            advantages = advantages.clamp(-h.advantage_clip, h.advantage_clip)
        keep = stats["mixed"][group_index] if h.drop_zero_variance_groups else torch.ones_like(rewards, dtype=bool)
        if self.rollout_allocator is not None:
            self.rollout_allocator.observe(prompt_ids.cpu(), rewards.cpu(), group_index.cpu(), correct=correct.cpu())
        self.cumulative_rollouts += rewards.numel()
        self.last_rollouts = {"prompt_ids": prompt_ids.cpu(), "group_index": group_index.cpu(),
                              "rewards": rewards.cpu(), "tier": batch["tier"].cpu(), "counts": stats["count"].cpu(),
                              "correct": stats["correct"].cpu(), "correct_per_rollout": correct.cpu(),
                              "advantages": advantages.cpu()}
        update = self.update(batch, tokens[keep], mask[keep], group_index[keep], advantages[keep], generator)
        self._log_step(stats, rewards, mask, reward_metrics, update, first_stage, num_prompts)

    # -- data parallelism: every rank must take the same number of synchronised backward passes
    def _world_size(self) -> int:
        trainer = self._trainer
        return int(trainer.world_size) if trainer is not None else 1

    def _agree(self, values: list[float]) -> torch.Tensor:
        """[world, len(values)]: every rank's values (one all-gather; the local row alone in one process)."""
        local = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self._world_size() == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return local[None]
        gathered = [torch.zeros_like(local) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(gathered, local)
        return torch.stack(gathered)

    def _padding_backward(self, dummy: tuple[torch.Tensor, torch.Tensor, int]) -> None:
        """A backward pass whose gradient is exactly zero on every trainable parameter: it adds nothing but makes
        the data-parallel reducer fire, so ranks with fewer (or no) rollouts keep in step with the others. Sharded,
        it is a forward pass on the ``dummy`` row (its all-gathers and reduce-scatters are collective) times 0."""
        if self.sharded:
            logp, _ = completion_logprobs(self.policy, dummy[0], dummy[1], dummy[2], self.hparams.temperature)
            self.manual_backward(logp.sum() * 0.0)
            return
        params = [p for p in self.parameters() if p.requires_grad]
        self.manual_backward(torch.stack([p.sum() for p in params]).sum() * 0.0)

    def _logprobs_in_step(self, model, sequences, attention, prompt_length: int, micro: int, dummy, passes: int):
        """No-grad completion log-probs of ``model`` in micro-batches; sharded, padded with forward passes on the
        ``dummy`` row up to ``passes`` (the most any rank runs), whose outputs are dropped."""
        rows = sequences.shape[0]
        chunks = [completion_logprobs(model, sequences[i:i + micro], attention[i:i + micro], prompt_length,
                                      self.hparams.temperature)[0] for i in range(0, rows, micro)]
        for _ in range(passes - len(chunks) if self.sharded else 0):
            completion_logprobs(model, dummy[0], dummy[1], dummy[2], self.hparams.temperature)
        return torch.cat(chunks) if chunks else None

    def update(self, batch, tokens, mask, group_index, advantages, generator) -> dict[str, torch.Tensor]:
        """ppo_epochs x ppo_mini_batches optimiser steps on the given rollouts; returns averaged metrics.

        Data parallel (world size W > 1): the ranks agree on the number of optimiser steps (the most mini-batches
        any rank has; none when no rank kept a rollout) and, per step, on the number of micro-batches; a rank with
        fewer pads with zero-gradient backward passes, so every rank runs the same synchronised backward passes
        (DDP all-reduces on each). The loss denominators of a step (tokens for ``token_mean``, sequences for
        ``sequence_mean``) are totals over all ranks, and each rank's loss is multiplied by W to undo DDP's
        gradient averaging, so the update equals one process's update on all ranks' rollouts (exactly so with
        one mini-batch per epoch; with several, each rank splits its own rollouts).
        """
        h = self.hparams
        world = self._world_size()
        rollouts = tokens.shape[0]
        micro = h.micro_batch_size or max(rollouts, 1)
        local_steps = len(torch.chunk(torch.arange(rollouts), min(h.ppo_mini_batches, rollouts))) if rollouts else 0
        agreed = self._agree([rollouts, local_steps])
        if world > 1:
            if int(agreed[:, 0].sum()) == 0:
                return {}
            num_steps = int(agreed[:, 1].max())
        elif rollouts == 0:
            return {}
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        prompt_length = batch["prompt_tokens"].shape[1]
        sequences = torch.cat([batch["prompt_tokens"][group_index], tokens], dim=1)
        attention = torch.cat([batch["prompt_mask"][group_index], mask], dim=1)
        on_policy = h.ppo_epochs == 1 and h.ppo_mini_batches == 1
        # one prompt and one pad token: the row of the padding forward passes a sharded policy needs
        dummy = (torch.cat([batch["prompt_tokens"][:1], torch.full_like(batch["prompt_tokens"][:1, :1],
                                                                        self.tokenizer.pad_id)], 1),
                 torch.cat([batch["prompt_mask"][:1], torch.ones_like(batch["prompt_mask"][:1, :1])], 1),
                 prompt_length)
        passes = int(self._agree([-(-rollouts // micro)]).max()) if self.sharded else 0
        old_logprobs = ref_logprobs = None
        with torch.no_grad():
            if not on_policy:
                old_logprobs = self._logprobs_in_step(self.policy, sequences, attention, prompt_length, micro,
                                                      dummy, passes)
            if self.ref_policy is not None:
                ref_logprobs = self._logprobs_in_step(self.ref_policy, sequences, attention, prompt_length, micro,
                                                      dummy, passes)
        normalizer = h.constant_normalizer or h.max_new_tokens
        sums: dict[str, float] = {}
        steps = local_taken = 0
        for _ in range(h.ppo_epochs):
            order = torch.randperm(rollouts, generator=torch.Generator().manual_seed(
                int(torch.randint(2**62, (1,), generator=generator, device=generator.device))))
            chunks = list(torch.chunk(order.to(self.device), min(h.ppo_mini_batches, rollouts))) if rollouts else []
            if world > 1:
                chunks += [order[:0].to(self.device)] * (num_steps - len(chunks))
            for rows in chunks:
                optimizer.zero_grad()
                step_tokens, step_sequences = mask[rows].sum(), rows.numel()
                passes = -(-rows.numel() // micro)
                scale = 1.0
                if world > 1:  # global denominators and the micro-batch count every rank runs
                    totals = self._agree([float(step_tokens), float(step_sequences), passes])
                    step_tokens = totals[:, 0].sum().to(mask.device)
                    step_sequences = int(totals[:, 1].sum())
                    passes, scale = int(totals[:, 2].max()), float(world)
                for index in range(passes):
                    r = rows[index * micro:(index + 1) * micro]
                    if r.numel() == 0:
                        self._padding_backward(dummy)
                        continue
                    logp, entropy = completion_logprobs(self.policy, sequences[r], attention[r], prompt_length,
                                                        h.temperature, True, entropy_grad=h.entropy_coef > 0)
                    loss, metrics = policy_loss(
                        logp, logp.detach() if old_logprobs is None else old_logprobs[r], advantages[r], mask[r],
                        h.clip_low, h.clip_high, h.loss_aggregation, normalizer,
                        None if ref_logprobs is None else ref_logprobs[r], h.kl_coef, h.clip_ratio_c,
                        num_sequences=step_sequences, num_tokens=step_tokens.clamp(min=1), entropy=entropy,
                        entropy_coef=h.entropy_coef)
                    self.manual_backward(loss * scale if scale != 1.0 else loss)
                    weight = r.numel() / rows.numel()
                    metrics["loss"] = loss.detach() * (rows.numel() / r.numel())
                    metrics["entropy"] = (entropy.detach() * mask[r]).sum() / mask[r].sum().clamp(min=1)
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + float(value) * weight
                if h.max_grad_norm is not None:
                    self.clip_gradients(optimizer, gradient_clip_val=h.max_grad_norm, gradient_clip_algorithm="norm")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)  # no gradient memory held through the next generation
                if scheduler is not None:
                    scheduler.step()
                steps += 1
                local_taken += bool(rows.numel())
        out = {k: torch.tensor(v / local_taken, dtype=torch.float32) for k, v in sums.items()}
        if world > 1:
            # non-empty: this rank took part in an update
            out["optimizer_steps"] = torch.tensor(float(steps), dtype=torch.float32)
        return out

    def _log_step(self, stats, rewards, mask, reward_metrics, update, first_stage, num_prompts) -> None:
        present = stats["count"] > 0
        prompts = present.sum().clamp(min=1).float()
        partial = present & (stats["correct"] > 0) & (stats["correct"] < stats["count"])
        values = {
            "reward": rewards.mean(),
            "effective_ratio_response": (stats["mixed"].float() * stats["count"]).sum() / stats["count"].sum().clamp(
                min=1),
            "effective_ratio_prompt": stats["mixed"][present].float().sum() / prompts,
            "solve_none": (present & (stats["correct"] == 0)).float().sum() / prompts,
            "solve_partial": partial.float().sum() / prompts,
            "solve_all": (present & (stats["correct"] == stats["count"])).float().sum() / prompts,
            "rollouts": float(rewards.numel()),
            "rollouts_second_stage": float(rewards.numel() - first_stage),
            "cumulative_rollouts": float(self.cumulative_rollouts),
            "completion_length": mask.sum(1).float().mean(),
            "skipped_update": float(not update),
            **{f"reward_{k}": v for k, v in reward_metrics.items()},
            **update,
        }
        self.log_dict({f"train/{k}": torch.as_tensor(v, dtype=torch.float32) for k, v in values.items()},
                      on_step=True, on_epoch=False, batch_size=num_prompts)
        if self.rollout_allocator is not None:
            allocation = {f"allocation/{k}": float(v) for k, v in self.rollout_allocator.metrics().items()}
            if allocation:
                self.log_dict(allocation, on_step=True, on_epoch=False, batch_size=num_prompts)

    # ------------------------------------------------------------------ evaluation
    MAX_TIER = 16

    @property
    def keyed_evaluation(self) -> bool:
        """Whether evaluation samples are keyed per prompt (every engine but `TransformersGenerate`)."""
        return not isinstance(self.rollout_engine, TransformersGenerate)

    def evaluation_generator(self, batch_idx: int, stream: int) -> torch.Generator:
        """The generator of an evaluation batch: keyed sampling takes only its seed (the same for every batch: the
        prompt id, not the rank-dependent batch index, tells the samples apart); otherwise its stream."""
        return self._generator(stream, 0 if self.keyed_evaluation else batch_idx)

    def evaluate_batch(self, batch: dict, batch_idx: int, stream: int) -> dict[str, torch.Tensor]:
        """pass@k (sampled), mean accuracy and greedy accuracy of each prompt of the batch."""
        h = self.hparams
        num_prompts = batch["prompt_ids"].shape[0]
        out = {}
        samples = torch.full((num_prompts,), h.eval_samples, dtype=torch.long, device=self.device)
        tokens, mask, group_index = self.generate(batch, samples, h.eval_temperature,
                                                  self.evaluation_generator(batch_idx, stream),
                                                  keyed=self.keyed_evaluation)
        rewards, correct, _ = self.score(tokens, mask, group_index, batch["answers"])
        correct = group_statistics(rewards, group_index, num_prompts, correct=correct)["correct"]
        for k in self.eval_k:
            out[f"pass@{k}"] = pass_at_k(h.eval_samples, correct.cpu(), k).float().to(self.device)
        out["accuracy"] = correct.float() / h.eval_samples
        ones = torch.ones(num_prompts, dtype=torch.long, device=self.device)
        greedy, greedy_mask, greedy_group = self.generate(batch, ones, 0.0, self._generator(stream, batch_idx))
        out["greedy_accuracy"] = self.score(greedy, greedy_mask, greedy_group, batch["answers"])[1].float()
        return out

    def _evaluation_step(self, batch, batch_idx, prefix: str, stream: int) -> None:
        per_prompt = self.evaluate_batch(batch, batch_idx, stream)
        self._eval_rows.append((batch["prompt_ids"].to(self.device), batch["tier"].to(self.device), per_prompt))

    def _log_evaluation(self, prefix: str) -> None:
        """Means over all ranks' prompts (each once, in prompt-id order) overall and per tier (< ``MAX_TIER``)."""
        rows, self._eval_rows = self._eval_rows, []
        if not rows and not distributed():
            return
        # a rank without prompts (fewer prompts than ranks) still takes part in the gather
        names = list(rows[0][2]) if rows else [f"pass@{k}" for k in self.eval_k] + ["accuracy", "greedy_accuracy"]
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        ids = torch.cat([r[0] for r in rows]) if rows else empty
        tier = torch.cat([r[1] for r in rows]) if rows else empty
        values = torch.stack([torch.cat([r[2][name].float() for r in rows]) for name in names], 1) if rows \
            else torch.zeros(0, len(names), device=self.device)  # [N, metrics]
        _, tier, values = gather_examples(ids, tier, values)
        if not len(values):
            return
        for column, name in enumerate(names):
            self.log(f"{prefix}/{name}", values[:, column].mean(), sync_dist=True)  # the same value on every rank
            for t in range(self.MAX_TIER):
                chosen = tier == t
                if bool(chosen.any()):
                    self.log(f"{prefix}/{name}_tier{t}", values[chosen, column].mean(), sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluation_step(batch, batch_idx, "val", stream=1)

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def test_step(self, batch, batch_idx):
        self._evaluation_step(batch, batch_idx, "test", stream=2)

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def predict_step(self, batch, batch_idx=0):
        """Greedy completions [M, max_new_tokens] (padded with pad_id): deterministic."""
        ones = torch.ones(batch["prompt_ids"].shape[0], dtype=torch.long, device=self.device)
        tokens, _, _ = self.generate(batch, ones, 0.0, self._generator(3, batch_idx))
        return nn.functional.pad(tokens, (0, self.hparams.max_new_tokens - tokens.shape[1]),
                                 value=self.tokenizer.pad_id)

    def prediction_fields(self, outputs, batch) -> dict:
        """Prompt and greedy completion as text (one JSONL line each), with the reference answers."""
        return completion_fields(outputs, batch, self.tokenizer)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        picklable_hyperparameters(checkpoint)
        tokenizer = self._tokenizer
        checkpoint["grpo"] = {
            "rollout_batches": self.rollout_batches, "cumulative_rollouts": self.cumulative_rollouts,
            "base_seed": self.base_seed,
            "special_tokens": None if tokenizer is None else [tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id],
            "allocator": None if self.rollout_allocator is None else self.rollout_allocator.state_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("grpo")
        if not state:
            return
        self.rollout_batches, self.cumulative_rollouts = state["rollout_batches"], state["cumulative_rollouts"]
        self.base_seed = state["base_seed"]
        if state.get("special_tokens") is not None:
            self._special = SpecialTokens(*state["special_tokens"])
        if self.rollout_allocator is not None and state.get("allocator") is not None:
            self.rollout_allocator.load_state_dict(state["allocator"])
