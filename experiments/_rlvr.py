"""Hooks that the two rollout-allocation experiments (``configs/knapsack_rl/experiment.yaml``,
``configs/dars/experiment.yaml``) share; `experiments.runner` runs them.

Task: reversed-digit addition ``a+b=`` -> digits of a+b least significant first, from
`datamodules.verifiable_tasks` (a fixed, tier-stratified RL pool with stable prompt ids and a disjoint held-out
test pool). Per seed S the runner first fits the warm-up arm (``settings.warm_up``, ``row: false``):
``configs/grpo/sft_quick.yaml`` as ``python train.py fit`` runs it (SupervisedWarmup, AdamW, gradient-norm clip 1,
batches drawn with replacement: ``data.init_args.sft_sampling: replacement``), then every GRPO arm of the paper's
config starting from its checkpoint (`prepare`: ``model.init_args.init_from``). One seed drives model and data.

Hooks:

* `prepare`: GRPO arms get ``model.init_args.init_from`` = the warm-up arm's checkpoint and
  ``model.init_args.max_new_tokens`` = the largest digit tier + 2 (the sum has at most max digits + 1, plus EOS).
* `evaluate`: the warm-up arm measures every RL-pool prompt's success rate under the SFT policy (32 samples at
  T = 1): the p-histogram per tier and the "hard" prompts (p below ``settings.hard_below``, 0.1), the same set for
  every arm; it is no row. A GRPO arm summarises the steps that `StepRecorder` (a callback of the arm's
  ``trainer.callbacks+``) recorded from ``GRPO.last_rollouts`` (effective ratios, rollouts, positives on hard
  prompts) and evaluates the final policy on the held-out test pool (`test_pool_metrics`).
"""
from __future__ import annotations

import time

import numpy as np
import torch
from lightning.pytorch import Callback

from lightning_modules.rlvr.grpo import pass_at_k
from lightning_modules.rlvr.rollout_allocation import KnapsackAllocator
from lightning_modules.rlvr.sft import success_rates

EVAL_SAMPLES = 32   # samples per prompt of the pool difficulty and of the test-pool evaluation
POOL_BATCH = 128    # prompts per batch when measuring the pool difficulty (the draws depend on the batching)
HARD_BELOW = 0.1    # default "hard": success rate under the SFT policy below this


class StepRecorder(Callback):
    """Per GRPO step, what ``GRPO.last_rollouts`` holds about the batch's prompts (ids, rollouts N_i, correct
    rollouts) and, under the `KnapsackAllocator`, its plan-time estimate p̂ of each prompt (before the step's
    plan); the fit's wall seconds. Add it to an arm with ``trainer.callbacks+: experiments._rlvr.StepRecorder``."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.fit_s = 0.0
        self._estimate = None
        self._start = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.fit_s = time.perf_counter() - self._start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        allocator = getattr(pl_module, "rollout_allocator", None)
        self._estimate = allocator.estimates(batch["prompt_ids"].cpu()) if isinstance(
            allocator, KnapsackAllocator) else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        last = getattr(pl_module, "last_rollouts", None)
        if last is None:  # not a GRPO module (the warm-up): only the wall time
            return
        step = {"prompt_ids": last["prompt_ids"].clone(), "counts": last["counts"].long().clone(),
                "correct": last["correct"].long().clone()}
        if self._estimate is not None:
            p_hat, valid, _ = self._estimate
            step["p_hat"], step["valid"] = p_hat.clone(), valid.clone()
        self.steps.append(step)


def recorder(run) -> StepRecorder:
    found = [c for c in run.trainer.callbacks if isinstance(c, StepRecorder)]
    if not found:
        from experiments.runner import ExperimentError

        raise ExperimentError(f"arm {run.arm.name!r} has no StepRecorder: add `trainer.callbacks+: "
                              "experiments._rlvr.StepRecorder` to its overrides")
    return found[0]


def step_rows(steps: list[dict], hard_ids: set[int]) -> list[dict]:
    """Per step: rollouts, response- and prompt-level effective ratios, hard-prompt visits / rollouts /
    positives / solved, mean reward."""
    rows = []
    for step in steps:
        count, correct = step["counts"], step["correct"]
        present = count > 0
        mixed = present & (correct > 0) & (correct < count)
        hard = torch.tensor([int(i) in hard_ids for i in step["prompt_ids"].tolist()], dtype=torch.bool)
        rows.append({
            "rollouts": int(count.sum()),
            "effective_ratio_response": float((count * mixed).sum() / count.sum().clamp(min=1)),
            "effective_ratio_prompt": float(mixed.float().sum() / present.float().sum().clamp(min=1)),
            "hard_visits": int(hard.sum()), "hard_rollouts": int(count[hard].sum()),
            "hard_positives": int(correct[hard].sum()),
            "hard_solved": int((correct[hard] > 0).sum()),
            "reward": float(correct.sum() / count.sum().clamp(min=1)),
        })
    return rows


def summarise_steps(rows: list[dict]) -> dict[str, float]:
    half = rows[len(rows) // 2:]
    mean = lambda key, part: float(np.mean([r[key] for r in part]))  # noqa: E731
    hard_visits = sum(r["hard_visits"] for r in rows)
    return {
        "eff_ratio_response_2nd_half": mean("effective_ratio_response", half),
        "eff_ratio_prompt_2nd_half": mean("effective_ratio_prompt", half),
        "eff_ratio_response_all": mean("effective_ratio_response", rows),
        "rollouts_total": float(sum(r["rollouts"] for r in rows)),
        "hard_positives_total": float(sum(r["hard_positives"] for r in rows)),
        "hard_positives_per_visit": float(sum(r["hard_positives"] for r in rows) / max(1, hard_visits)),
        "hard_rollouts_total": float(sum(r["hard_rollouts"] for r in rows)),
        "train_reward_2nd_half": mean("reward", half),
    }


def allocations(steps: list[dict]) -> list[tuple[int, float]]:
    """(N_i, plan-time p̂) of every prompt visit in the second half whose estimate was valid (knapsack arms)."""
    out = []
    for step in steps[len(steps) // 2:]:
        if "p_hat" in step:
            out += [(n, p) for n, p, v in zip(step["counts"].tolist(), step["p_hat"].tolist(),
                                              step["valid"].tolist()) if v]
    return out


# --------------------------------------------------------------------------------------------- measurements
def tiers_of(datamodule) -> list[int]:
    return sorted({int(t) for t in datamodule.digit_tiers})


def new_tokens(tiers: list[int]) -> int:
    return max(tiers) + 2  # the sum has at most max digits + 1, plus EOS


def success_table(policy, loader, tokenizer, samples: int, max_new_tokens: int, seed: int, temperature: float = 1.0):
    out = success_rates(policy.eval(), loader, tokenizer, samples, max_new_tokens, temperature,
                        generator=torch.Generator().manual_seed(seed))
    return out["prompt_ids"], out["tier"], out["p"]


def test_pool_metrics(policy, datamodule, seed: int, max_new_tokens: int) -> dict[str, float]:
    """Test pool: pass@1 per tier (mean over 32 samples at T 1), pass@16/32 on the two hardest tiers, greedy."""
    loader = datamodule.val_dataloader()
    _, tier, p = success_table(policy, loader, datamodule.tokenizer, EVAL_SAMPLES, max_new_tokens, seed + 7)
    _, _, greedy = success_table(policy, loader, datamodule.tokenizer, 1, max_new_tokens, seed, temperature=0.0)
    correct = torch.round(p * EVAL_SAMPLES)
    out = {"pass@1": float(p.mean()), "greedy": float(greedy.mean())}
    tiers = tiers_of(datamodule)
    for t in tiers:
        out[f"pass@1_tier{t}"] = float(p[tier == t].mean())
    for t in tiers[-2:]:
        for k in (16, 32):
            out[f"pass@{k}_tier{t}"] = float(pass_at_k(EVAL_SAMPLES, correct[tier == t], k).mean())
    return out


def eval_keys(tiers: list[int]) -> list[str]:
    tiers = sorted(tiers)
    return ["pass@1", "greedy"] + [f"pass@1_tier{t}" for t in tiers] + [
        f"pass@{k}_tier{t}" for t in tiers[-2:] for k in (16, 32)]


# --------------------------------------------------------------------------------------------- hooks
def warm_up_arm(run) -> str:
    name = run.settings.get("warm_up")
    if not name:
        from experiments.runner import ExperimentError

        raise ExperimentError(f"{run.spec.path}: settings.warm_up must name the SFT arm the GRPO arms start from")
    return name


def prepare(run) -> dict:
    """GRPO arms: ``init_from`` = the warm-up arm's checkpoint of this seed, ``max_new_tokens`` from its tiers."""
    name = warm_up_arm(run)
    if run.arm.name == name:
        return {}
    return {"model.init_args.init_from": run.checkpoint_of(name, "settings.warm_up"),
            "model.init_args.max_new_tokens": new_tokens(tiers_of(run.earlier[name].datamodule))}


def pool_difficulty(run) -> dict:
    """The warm-up arm's measurement (kept in ``run.extra``): per RL-pool prompt its success rate under the SFT
    policy, the hard ids, the p-histogram per tier and the mean p per tier."""
    data = run.datamodule
    tiers = tiers_of(data)
    ids, tier, p = success_table(run.model.policy, data.train_pool_loader(POOL_BATCH), data.tokenizer, EVAL_SAMPLES,
                                 new_tokens(tiers), run.seed + 3)
    below = float(run.settings.get("hard_below", HARD_BELOW))
    return {"seed": run.seed, "tiers": tiers,
            "hard": sorted(int(i) for i, q in zip(ids.tolist(), p.tolist()) if q < below),
            "pool_size": len(ids), "p_below_half_share": float((p < 0.5).float().mean()),
            "histogram": {f"tier{t}": np.histogram(p[tier == t].numpy(), bins=10, range=(0, 1))[0].tolist()
                          for t in tiers},
            "sft_p": {f"sft_p_tier{t}": float(p[tier == t].mean()) for t in tiers},
            "fit_s": recorder(run).fit_s}


def evaluate(run) -> dict[str, float]:
    """Warm-up arm: `pool_difficulty` into ``run.extra``, no row. GRPO arm: the recorded steps' summary, the test
    pool metrics of the final policy and the fit's wall seconds; ``run.extra`` keeps the per-step curve and
    (knapsack) the allocations for the report and the plot."""
    name = warm_up_arm(run)
    if run.arm.name == name:
        run.extra.update(pool_difficulty(run))
        return {}
    hard = set(run.earlier[name].extra["hard"])
    record = recorder(run)
    rows = step_rows(record.steps, hard)
    run.extra.update(curve={"rollouts": [r["rollouts"] for r in rows],
                            "effective_ratio_response": [r["effective_ratio_response"] for r in rows],
                            "hard_positives": [r["hard_positives"] for r in rows]},
                     allocations=allocations(record.steps), fit_s=record.fit_s)
    return {**summarise_steps(rows),
            **test_pool_metrics(run.model.policy, run.datamodule, run.seed, run.model.hparams.max_new_tokens),
            "wall_s": record.fit_s}


# --------------------------------------------------------------------------------------------- report helpers
def seed_records(records: list[dict], arm: str) -> list[dict]:
    """Every seed's ``run.extra`` of ``arm`` (main setting)."""
    return [seed[""][arm] for seed in records if arm in seed.get("", {})]


def curves(records: list[dict], arms: list[str]) -> dict:
    """``{arm: [per seed {rollouts, effective_ratio_response, hard_positives} per step]}``."""
    return {arm: [extra["curve"] for extra in seed_records(records, arm)] for arm in arms}


def allocation_table(records: list[dict], arm: str, bins: int = 20) -> dict:
    """The second-half (N_i, p̂) pairs of ``arm`` over seeds as counts: ``p_edges`` (``bins`` bins of [0, 1]),
    ``n_values`` and ``counts[n][bin]``."""
    pairs = [pair for extra in seed_records(records, arm) for pair in extra["allocations"]]
    edges = np.linspace(0, 1, bins + 1)
    n_values = sorted({n for n, _ in pairs})
    counts = np.zeros((len(n_values), bins), dtype=int)
    for n, p in pairs:
        counts[n_values.index(n), min(int(np.digitize(p, edges)) - 1, bins - 1)] += 1
    return {"p_edges": edges.round(6).tolist(), "n_values": n_values, "counts": counts.tolist()}


def plot_curves(ax, result: dict, colours: dict[str, str], key: str = "effective_ratio_response",
                width: int = 5, label: str = "response-level effective ratio") -> None:
    """Per arm and seed, ``key`` (a ``width``-step mean; shorter in smoke runs) against cumulative rollouts."""
    for arm, runs in (result.get("curves") or {}).items():
        for i, curve in enumerate(runs):
            x = np.cumsum(curve["rollouts"])
            w = max(1, min(width, len(x)))
            y = np.convolve(curve[key], np.ones(w) / w, mode="same")
            ax.plot(x, y, color=colours.get(arm), alpha=0.8, label=arm if i == 0 else None)
    ax.set(xlabel="cumulative rollouts", ylabel=f"{label} ({width}-step mean)")
    ax.legend(fontsize=8)
