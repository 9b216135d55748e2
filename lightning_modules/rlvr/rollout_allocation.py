"""Rollout allocators for GRPO: how many rollouts each prompt of a step gets (uniform, Knapsack RL, DARS).

An allocator is injected into `lightning_modules.rlvr.grpo.GRPO` as ``rollout_allocator``. Per training step GRPO
calls ``plan`` (stage-1 rollouts per prompt), generates and scores, calls ``second_stage`` (extra rollouts per
prompt given the stage-1 number of correct rollouts), generates and scores those, and finally ``observe`` with
every rollout's reward (history). ``metrics`` is logged under ``allocation/*`` and ``state_dict`` travels with
GRPO's checkpoints (plain Python containers only, so weights-only checkpoint loading accepts it).

* `UniformAllocator`: the GRPO baseline, ``n`` rollouts for every prompt.
* `KnapsackAllocator`: "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation"
  (Li et al., arXiv 2509.25849, ICML 2026; code liziniu/KnapsackRL). Each prompt i is an item with the
  success estimate p_i from its history; allocating N_i rollouts is worth
  Value(N, p) = (1 - p^N - (1-p)^N) * p (1-p)^2  (probability of a non-zero GRPO gradient x "InfoGain"),
  and the step maximises sum_i Value(N_i, p_i) s.t. sum_i N_i = B = M n, min_n <= N_i <= max_n. Prompts
  without history (count < 8) get n, prompts with p = 0 / 1 get ``negative_n`` / ``positive_n``, and a
  cost-estimation fallback hands budget that the effective prompts cannot use to the never-solved prompts.
  p comes from the prompt's most recent visit (so one epoch stale on a fixed pool), falling back to the
  last 16 rewards when that visit had fewer than 16 rollouts (the released ``robust_epoch_estimation``).
* `DARSAllocator`: "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration"
  (Yang et al., arXiv 2508.13755, ICML 2026; code yangzhch6/DARS). Stage 1 draws N per prompt; a prompt
  with stage-1 accuracy a < 0.5 gets Δn extra rollouts so that its cumulative |advantage| (N + Δn) S(a)
  reaches A_peak (equal treatment) or 2 (1 - a) A_peak (hardness weighted), capped at N_max - N, with
  S(a) = 2a(1-a), A_peak = N/2 without std and S(a) = 2 sqrt(a(1-a)), A_peak = N with std; a = 0 is
  replaced by 0.5/N. The zero-variance group filter of the DARS trainer is GRPO's own switch
  ``drop_zero_variance_groups`` (set it in the config). DARS-Breadth is a GRPO config, not an allocator.

Deviations and reconstructions (the paper PDFs were not readable; the behaviour follows the released code):

* ``solver="greedy"`` (default) is exact: Value is concave in N (the marginal gain
  p(1-p)^2 [p^N (1-p) + (1-p)^N p] decreases in N), so taking the R largest marginal gains, vectorised
  as a stable sort over all (prompt, extra unit) pairs, solves the knapsack (ties broken by batch order).
  ``solver="dp"`` reproduces the released dynamic program, whose "no extra rollout" choice scores 0
  instead of Value(min_n, p); that quirk makes the first extra unit worth Value(min_n + 1, p) and pushes
  effective prompts to >= 3 rollouts. With ``dp`` the released overflow rule is kept too: budget the
  effective prompts cannot absorb is spread over them even past ``max_n``, and the fallback surplus is
  not capped; ``greedy`` keeps every prompt within [.., max_n] and spreads any leftover over the prompts
  with room (p = 0 first). The released fallback divides by zero when every prompt is effective; here the
  fallback is then skipped.
* The released code treats prompts without history as p = 0 when it hands out fallback surplus (its state
  array is zero-initialised); here only prompts with a valid history and p = 0 receive it.
* A rollout is a success when the reward marks it correct (`RewardFunction.evaluate`: reward > 0.5 for binary
  rewards, the reward's own flag for graded ones such as Multi-RLCR's); an explicit ``success_threshold``
  counts ``reward > success_threshold`` instead, for DARS' stage-1 counts as for the success estimates (the
  released code maps a {-1, 0, 1} reward to max(r, 0)). Δn uses ceil(x - 1e-6) so that float noise in S(a) cannot
  add a rollout.
"""
from __future__ import annotations

import math
from typing import Literal

import torch

from lightning_modules.shared.errors import UserInputError, check_range


# --------------------------------------------------------------------------------------------- base / uniform
class RolloutAllocator:
    """Interface GRPO calls once per step; the base behaviour is the uniform GRPO allocation."""

    success_threshold: float | None = None

    def successes(self, rewards: torch.Tensor, correct: torch.Tensor | None = None) -> torch.Tensor:
        """BoolTensor[R]: the reward's ``correct`` flags, or ``reward > success_threshold`` when that is set
        (and when no flags are given: reward > 0.5 without a threshold)."""
        if self.success_threshold is not None:
            return rewards.detach() > self.success_threshold
        if correct is None:
            return rewards.detach() > 0.5
        return torch.as_tensor(correct).bool()

    def plan(self, prompt_ids: torch.Tensor, rollouts_per_prompt: int) -> torch.Tensor:
        """Stage-1 rollouts per prompt, LongTensor[M] (0 skips a prompt)."""
        return torch.full((len(prompt_ids),), int(rollouts_per_prompt), dtype=torch.long)

    def second_stage(self, prompt_ids: torch.Tensor, counts: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        """Extra rollouts per prompt after stage 1 (``correct`` = stage-1 successes per prompt, `successes`)."""
        return torch.zeros(len(prompt_ids), dtype=torch.long)

    def observe(self, prompt_ids: torch.Tensor, rewards_per_rollout: torch.Tensor,
                group_index: torch.Tensor, correct: torch.Tensor | None = None) -> None:
        """All rollouts' rewards of the step, the prompt position (0..M-1) of each rollout and the reward's
        ``correct`` flag of each (None: reward > 0.5)."""

    def metrics(self) -> dict[str, float]:
        """Scalars of the last step, logged by GRPO under ``allocation/``."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class UniformAllocator(RolloutAllocator):
    """The GRPO baseline: ``rollouts_per_prompt`` rollouts for every prompt, no second stage, no history."""


def _check_plan_inputs(prompt_ids: torch.Tensor, rollouts_per_prompt: int) -> None:
    if prompt_ids.dim() != 1:
        raise UserInputError(f"prompt_ids must be a 1-D tensor of prompt ids, got shape {tuple(prompt_ids.shape)}.")
    if int(rollouts_per_prompt) < 1:
        raise UserInputError(f"rollouts_per_prompt={rollouts_per_prompt} must be >= 1.")


# --------------------------------------------------------------------------------------------- Knapsack RL
def prob_nonzero_gradient(n: torch.Tensor | float, p: torch.Tensor | float) -> torch.Tensor:
    """P(a group of n binary rollouts with success probability p is mixed) = 1 - p^n - (1-p)^n."""
    n, p = torch.as_tensor(n, dtype=torch.float64), torch.as_tensor(p, dtype=torch.float64)
    return 1.0 - p.pow(n) - (1.0 - p).pow(n)


def knapsack_value(n: torch.Tensor | float, p: torch.Tensor | float) -> torch.Tensor:
    """Knapsack RL item value: ProbNonZeroGradient(n, p) * InfoGain(p), InfoGain(p) = p (1-p)^2."""
    p = torch.as_tensor(p, dtype=torch.float64)
    return prob_nonzero_gradient(n, p) * p * (1.0 - p) ** 2


def rollout_cost(p: torch.Tensor, method: Literal["probability", "expectation"] = "probability",
                 alpha: float = 0.9) -> torch.Tensor:
    """Rollouts a prompt needs before its group is likely mixed (used only by the fallback), for 0 < p < 1.

    ``probability``: ln(1 - alpha) / ln max(p, 1 - p) (mixed with probability alpha);
    ``expectation``: 1 / (p (1 - p)) - 1.
    """
    p = torch.as_tensor(p, dtype=torch.float64)
    if method == "probability":
        return math.log(1.0 - alpha) / torch.log(torch.maximum(p, 1.0 - p))
    if method == "expectation":
        return 1.0 / (p * (1.0 - p)) - 1.0
    raise UserInputError(f"cost_estimation={method!r} is unknown; use 'probability' or 'expectation'.")


def _spread(alloc: torch.Tensor, index: torch.Tensor, amount: int, cap: int | None) -> int:
    """Add ``amount`` rollouts over ``alloc[index]`` as evenly as possible (earlier positions get the
    remainder), never above ``cap`` (None: uncapped). Returns what did not fit."""
    amount = int(amount)
    if amount <= 0 or len(index) == 0:
        return amount
    if cap is None:
        alloc[index] += amount // len(index)
        alloc[index[: amount % len(index)]] += 1
        return 0
    while amount > 0:
        room = (cap - alloc[index]).clamp(min=0)
        open_ = index[room > 0]
        if len(open_) == 0:
            break
        share = amount // len(open_)
        if share == 0:
            alloc[open_[:amount]] += 1
            amount = 0
        else:
            give = torch.clamp(room[room > 0], max=share)
            alloc[open_] += give
            amount -= int(give.sum())
    return amount


def greedy_extra_rollouts(p: torch.Tensor, base: int, max_extra: int, budget: int) -> torch.Tensor:
    """Exact maximiser of sum_i Value(base + k_i, p_i) s.t. sum k_i = min(budget, |p| max_extra),
    0 <= k_i <= max_extra: the ``budget`` largest marginal gains (concavity makes the choice prefix-closed)."""
    if len(p) == 0 or budget <= 0 or max_extra <= 0:
        return torch.zeros(len(p), dtype=torch.long)
    p = p.to(torch.float64)
    units = torch.arange(base, base + max_extra + 1, dtype=torch.float64)
    values = knapsack_value(units[None, :], p[:, None])            # [E, max_extra + 1]
    gains = (values[:, 1:] - values[:, :-1]).flatten()               # marginal gain of unit k, row-major
    order = torch.sort(gains, descending=True, stable=True).indices[:budget]
    return torch.bincount(order // max_extra, minlength=len(p))


def released_dp_extra_rollouts(p: torch.Tensor, base: int, max_extra: int, budget: int) -> torch.Tensor:
    """The released ``solve_by_dp``: multiple-choice knapsack where k > 0 extra rollouts score
    Value(base + k, p) and k = 0 scores 0 (the quirk), ties keep the smaller k; leftover budget is spread
    uniformly over the items (also past ``max_extra``), as in the released code."""
    n_items = len(p)
    extra = torch.zeros(n_items, dtype=torch.long)
    if n_items == 0 or budget <= 0:
        return extra
    p = p.to(torch.float64)
    k = torch.arange(max_extra + 1)
    gain = knapsack_value((base + k)[None, :].to(torch.float64), p[:, None])
    gain[:, 0] = 0.0
    w = torch.arange(budget + 1)
    src = w[None, :] - k[:, None]                                    # [K+1, W+1] weight before item
    valid = src >= 0
    dp = torch.full((budget + 1,), -math.inf, dtype=torch.float64)
    dp[0] = 0.0
    choices = torch.zeros(n_items, budget + 1, dtype=torch.long)
    for i in range(n_items):                                         # items are few (prompts of one step)
        cand = torch.where(valid, dp[src.clamp(min=0)], -math.inf) + gain[i][:, None]
        dp, choices[i] = cand.max(dim=0)                             # first maximum = smallest k on ties
    feasible = torch.nonzero(dp > -math.inf).flatten()
    used = int(feasible.max()) if len(feasible) else 0
    w_left = used
    for i in range(n_items - 1, -1, -1):
        extra[i] = choices[i, w_left]
        w_left -= int(extra[i])
    _spread(extra, torch.arange(n_items), budget - used, None)
    return extra


def allocate_budget(p_hat: torch.Tensor, valid: torch.Tensor, n: int, *, budget: int | None = None,
                    min_n: int = 2, max_n: int = 128, negative_n: int | None = None, positive_n: int | None = None,
                    alpha: float = 0.9, cost_estimation: Literal["probability", "expectation"] = "probability",
                    solver: Literal["greedy", "dp"] = "greedy", allow_fallback: bool = True,
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """Knapsack RL's ``sampling_budget_by_knapsack`` for one step of M prompts; returns (N[M], info).

    ``valid`` marks prompts with enough history; the others get ``n``. Sum of N equals ``budget`` (M n).
    """
    p_hat = torch.as_tensor(p_hat, dtype=torch.float64).flatten()
    valid = torch.as_tensor(valid, dtype=torch.bool).flatten()
    m = len(p_hat)
    budget = m * n if budget is None else int(budget)
    negative_n = min_n if negative_n is None else negative_n
    positive_n = min_n if positive_n is None else positive_n
    cap = max_n if solver == "greedy" else None
    effective = valid & (p_hat > 0) & (p_hat < 1)
    zero, one = valid & (p_hat <= 0), valid & (p_hat >= 1)
    alloc = torch.zeros(m, dtype=torch.long)
    alloc[~valid], alloc[effective], alloc[zero], alloc[one] = n, min_n, negative_n, positive_n
    remaining = budget - int(alloc.sum())
    info = {"fallback": 0.0, "fallback_effective_ratio": 1.0}
    eff_idx, zero_idx = torch.nonzero(effective).flatten(), torch.nonzero(zero).flatten()
    if remaining > 0 and len(eff_idx) == 0:
        if len(zero_idx):
            remaining = _spread(alloc, zero_idx, remaining, cap)
        else:
            alloc[:], remaining = n, budget - m * n
    elif remaining > 0:
        if allow_fallback:
            cost = rollout_cost(p_hat[eff_idx], cost_estimation, alpha)
            estimate = int(torch.floor(torch.clamp(cost, max=max_n)).sum())
            candidates = zero_idx if len(zero_idx) else torch.nonzero(~effective).flatten()
            if estimate < remaining and len(candidates):
                info = {"fallback": 1.0, "fallback_effective_ratio": estimate / remaining}
                remaining = estimate + _spread(alloc, candidates, remaining - estimate, cap)
        solve = greedy_extra_rollouts if solver == "greedy" else released_dp_extra_rollouts
        extra = solve(p_hat[eff_idx], min_n, max_n - min_n, remaining)
        alloc[eff_idx] += extra
        remaining -= int(extra.sum())
    if remaining > 0:  # greedy only: every effective prompt is at max_n; fill the others, p = 0 first
        order = torch.cat([zero_idx, torch.nonzero(~zero).flatten()])
        remaining = _spread(alloc, order, remaining, cap)
    if int(alloc.sum()) != budget or remaining != 0:
        raise RuntimeError(f"knapsack allocation lost budget: sum {int(alloc.sum())} != {budget}")
    return alloc, info


class KnapsackAllocator(RolloutAllocator):
    """Knapsack RL budget allocation with per-prompt success history (see the module docstring).

    Args:
        min_n: rollouts for prompts with 0 < p < 1 before the knapsack adds more (paper 2).
        max_n: most rollouts one prompt may get (paper 128; the CPU experiment uses 64).
        negative_n / positive_n: rollouts for prompts with p = 0 / p = 1 (None: min_n).
        total_budget: rollouts per step (None: M * rollouts_per_prompt, the uniform baseline's budget).
        alpha, cost_estimation: the fallback's cost estimate (``probability`` with alpha, or ``expectation``).
        allow_fallback: hand budget the effective prompts cannot use to the p = 0 prompts.
        solver: ``greedy`` (exact) or ``dp`` (the released DP with its k = 0 quirk).
        min_history: rewards a prompt needs before its estimate is used (paper 8).
        buffer_length: the robust fallback window (paper 16).
        epoch_estimation: p = mean of the most recent visit (paper) instead of the mean of the last
            ``buffer_length`` rewards.
        success_threshold: count ``reward > success_threshold`` as a success (None: the reward's correct flag).
    """

    def __init__(self, min_n: int = 2, max_n: int = 128, negative_n: int | None = None,
                 positive_n: int | None = None, total_budget: int | None = None, alpha: float = 0.9,
                 cost_estimation: Literal["probability", "expectation"] = "probability",
                 allow_fallback: bool = True, solver: Literal["greedy", "dp"] = "greedy", min_history: int = 8,
                 buffer_length: int = 16, epoch_estimation: bool = True,
                 success_threshold: float | None = None) -> None:
        check_range("KnapsackAllocator.min_n", min_n, 1)
        check_range("KnapsackAllocator.max_n", max_n, min_n)
        for name, value in (("negative_n", negative_n), ("positive_n", positive_n)):
            if value is not None:
                check_range(f"KnapsackAllocator.{name}", value, 0, max_n)
        if total_budget is not None:
            check_range("KnapsackAllocator.total_budget", total_budget, 1)
        check_range("KnapsackAllocator.alpha", alpha, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        check_range("KnapsackAllocator.min_history", min_history, 0)
        check_range("KnapsackAllocator.buffer_length", buffer_length, 1)
        if cost_estimation not in ("probability", "expectation"):
            raise UserInputError(f"KnapsackAllocator.cost_estimation={cost_estimation!r}: use 'probability' "
                                 "or 'expectation'.")
        if solver not in ("greedy", "dp"):
            raise UserInputError(f"KnapsackAllocator.solver={solver!r}: use 'greedy' (exact) or 'dp' (released).")
        self.min_n, self.max_n, self.negative_n, self.positive_n = min_n, max_n, negative_n, positive_n
        self.total_budget, self.alpha, self.cost_estimation = total_budget, alpha, cost_estimation
        self.allow_fallback, self.solver, self.min_history = allow_fallback, solver, min_history
        self.buffer_length, self.epoch_estimation = buffer_length, epoch_estimation
        self.success_threshold = success_threshold
        # prompt id -> {"p": estimate, "count": rewards seen, "recent": last buffer_length successes}
        self.history: dict[int, dict] = {}
        self._metrics: dict[str, float] = {}

    # -- history
    def estimates(self, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(p_hat, valid, count) of each prompt from its history (p_hat 0 and invalid when unseen)."""
        states = [self.history.get(int(i)) for i in prompt_ids.tolist()]
        p_hat = torch.tensor([s["p"] if s else 0.0 for s in states], dtype=torch.float64)
        count = torch.tensor([s["count"] if s else 0 for s in states], dtype=torch.long)
        return p_hat, count >= self.min_history, count

    def observe(self, prompt_ids, rewards_per_rollout, group_index, correct=None) -> None:
        success = self.successes(rewards_per_rollout.detach().float().cpu(),
                                 None if correct is None else correct.cpu()).float()
        group_index = group_index.detach().cpu().long()
        order = torch.argsort(group_index, stable=True)              # rollouts of one prompt, in order
        sizes = torch.bincount(group_index, minlength=len(prompt_ids)).tolist()
        per_prompt = torch.split(success[order], sizes)
        for pid, visit in zip(prompt_ids.tolist(), per_prompt):
            if len(visit) == 0:
                continue
            state = self.history.setdefault(int(pid), {"p": 0.0, "count": 0, "recent": []})
            visit = visit.tolist()
            state["count"] += len(visit)
            state["recent"] = (state["recent"] + visit)[-self.buffer_length:]
            if self.epoch_estimation and len(visit) >= self.buffer_length:
                state["p"] = sum(visit) / len(visit)
            else:
                state["p"] = sum(state["recent"]) / len(state["recent"])

    # -- allocation
    def plan(self, prompt_ids, rollouts_per_prompt) -> torch.Tensor:
        _check_plan_inputs(prompt_ids, rollouts_per_prompt)
        n = int(rollouts_per_prompt)
        floor_n = max(self.min_n, self.negative_n or self.min_n, self.positive_n or self.min_n)
        if not floor_n <= n <= self.max_n:
            raise UserInputError(f"KnapsackAllocator needs min_n/negative_n/positive_n <= rollouts_per_prompt "
                                 f"<= max_n, got rollouts_per_prompt={n}, min {floor_n}, max_n={self.max_n}: "
                                 "the uniform budget M*n must fit the per-prompt bounds.")
        p_hat, valid, _ = self.estimates(prompt_ids)
        budget = len(prompt_ids) * n if self.total_budget is None else self.total_budget
        alloc, info = allocate_budget(p_hat, valid, n, budget=budget, min_n=self.min_n, max_n=self.max_n,
                                      negative_n=self.negative_n, positive_n=self.positive_n, alpha=self.alpha,
                                      cost_estimation=self.cost_estimation, solver=self.solver,
                                      allow_fallback=self.allow_fallback)
        assert int(alloc.sum()) == budget, "knapsack allocation must spend exactly the uniform budget"
        self._metrics = {"max_budget": float(alloc.max()), "min_budget": float(alloc.min()),
                         "covered_prompts": float((alloc > 0).sum()), "budget_fallback": info["fallback"],
                         "fallback_effective_ratio": info["fallback_effective_ratio"],
                         "valid_prompts": float(valid.float().mean())}
        return alloc

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state_dict(self) -> dict:
        return {"history": {int(k): {"p": float(v["p"]), "count": int(v["count"]), "recent": list(v["recent"])}
                            for k, v in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        if "history" not in state:
            raise UserInputError("KnapsackAllocator.load_state_dict expects {'history': {...}} as written by "
                                 "state_dict(); the checkpoint's allocator state is from another allocator.")
        self.history = {int(k): {"p": float(v["p"]), "count": int(v["count"]), "recent": list(v["recent"])}
                        for k, v in state["history"].items()}


# --------------------------------------------------------------------------------------------- DARS
def cumulative_advantage_per_rollout(a: torch.Tensor, use_std: bool = False) -> torch.Tensor:
    """S(a): mean |advantage| per rollout of a binary group with accuracy a (2a(1-a), or 2 sqrt(a(1-a))
    with the population std), so that a group of N contributes N S(a) in total."""
    a = torch.as_tensor(a, dtype=torch.float64)
    return 2.0 * torch.sqrt(a * (1.0 - a)) if use_std else 2.0 * a * (1.0 - a)


def dars_extra_rollouts(counts: torch.Tensor, correct: torch.Tensor,
                        schedule: Literal["equal_treatment", "hardness_weighted"] = "hardness_weighted",
                        max_rollouts: int = 64, use_std: bool = False) -> torch.Tensor:
    """DARS Δn per prompt from its stage-1 rollouts ``counts`` (N) and successes ``correct``.

    Δn = min(ceil((target - N S(a)) / S(a)), N_max - N) for a < 0.5, else 0; target = A_peak (ET) or
    2 (1 - a) A_peak (HW), A_peak = N/2 (no std) or N (std), a = 0 replaced by 0.5/N.
    """
    n = torch.as_tensor(counts, dtype=torch.float64)
    c = torch.as_tensor(correct, dtype=torch.float64)
    safe_n = n.clamp(min=1.0)
    raw = c / safe_n
    a = torch.where(c <= 0, 0.5 / safe_n, raw)
    s = cumulative_advantage_per_rollout(a, use_std)
    peak = n if use_std else n / 2.0
    if schedule == "equal_treatment":
        target = peak
    elif schedule == "hardness_weighted":
        target = 2.0 * (1.0 - a) * peak
    else:
        raise UserInputError(f"DARS schedule={schedule!r}: use 'equal_treatment' or 'hardness_weighted'.")
    delta = torch.ceil((target - n * s) / s - 1e-6).clamp(min=0.0)
    delta = torch.minimum(delta, (max_rollouts - n).clamp(min=0.0))
    return torch.where((raw < 0.5) & (n > 0), delta, torch.zeros_like(delta)).long()


class DARSAllocator(RolloutAllocator):
    """DARS multi-stage rollouts: N per prompt, then Δn more for prompts with stage-1 accuracy < 0.5.

    Args:
        schedule: ``equal_treatment`` (ET, paper N_max 32) or ``hardness_weighted`` (HW, paper N_max 64).
        max_rollouts: N_max, the cap on N + Δn.
        use_std: S(a) and A_peak of the std-normalised advantage; must match GRPO's ``scale_by_group_std``
            (the paper's runs use no std).
        success_threshold: count ``reward > success_threshold`` as a success, in the stage-1 counts (GRPO asks
            `successes`) and in the stage-2 bookkeeping (``2nd_saved``); None: the reward's correct flag.
    """

    def __init__(self, schedule: Literal["equal_treatment", "hardness_weighted"] = "hardness_weighted",
                 max_rollouts: int = 64, use_std: bool = False,
                 success_threshold: float | None = None) -> None:
        if schedule not in ("equal_treatment", "hardness_weighted"):
            raise UserInputError(f"DARSAllocator.schedule={schedule!r}: use 'equal_treatment' or "
                                 "'hardness_weighted'.")
        check_range("DARSAllocator.max_rollouts", max_rollouts, 1)
        self.schedule, self.max_rollouts, self.use_std = schedule, max_rollouts, use_std
        self.success_threshold = success_threshold
        self._stage1_correct: torch.Tensor | None = None
        self._extra: torch.Tensor | None = None
        self._metrics: dict[str, float] = {}

    def plan(self, prompt_ids, rollouts_per_prompt) -> torch.Tensor:
        _check_plan_inputs(prompt_ids, rollouts_per_prompt)
        if int(rollouts_per_prompt) > self.max_rollouts:
            raise UserInputError(f"DARSAllocator.max_rollouts={self.max_rollouts} is below rollouts_per_prompt="
                                 f"{rollouts_per_prompt}: N_max caps N + Δn, so raise it (paper: 32 ET, 64 HW).")
        self._stage1_correct, self._extra = None, None
        return super().plan(prompt_ids, rollouts_per_prompt)

    def second_stage(self, prompt_ids, counts, correct) -> torch.Tensor:
        extra = dars_extra_rollouts(counts.cpu(), correct.cpu(), self.schedule, self.max_rollouts, self.use_std)
        self._stage1_correct, self._extra = correct.detach().cpu().long(), extra
        return extra

    def observe(self, prompt_ids, rewards_per_rollout, group_index, correct=None) -> None:
        if self._extra is None:
            self._metrics = {}
            return
        success = self.successes(rewards_per_rollout.detach().float().cpu(),
                                 None if correct is None else correct.cpu()).float()
        total_correct = torch.zeros(len(prompt_ids), dtype=torch.float32).index_add_(
            0, group_index.detach().cpu().long(), success)
        resampled = self._extra > 0
        unsolved = (self._stage1_correct == 0) & resampled
        self._metrics = {
            "2nd_rollout": float(self._extra.sum()),
            "2nd_prompts": float(resampled.float().mean()),
            "2nd_saved": float(((total_correct > 0) & unsolved).float().sum() / max(1, int(unsolved.sum()))),
        }

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)
