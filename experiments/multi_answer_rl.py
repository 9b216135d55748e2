"""Multi-answer RL at toy scale: ``python -m experiments.multi_answer_rl`` (~6 min on a shared 2-core machine).

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (arXiv 2603.24844).
Claim: training ONE generation to hold K distinct candidates (Multi-RLVR) covers more of the valid answers than
a single-answer RLVR model sampled K times, with fewer duplicates and fewer tokens per answer, and adding the
Brier term on stated confidences (Multi-RLCR) gives calibrated set-level confidences (lowest set Brier).

Setup (the method card's CPU experiment, scaled down to fit the budget; everything through the collection's
`ManyAnswerDataModule`, `SupervisedWarmup`, `MultiAnswerGRPO` and a Lightning `Trainer` on CPU):

* task: "name a non-trivial divisor of n" for the 68 composite n in [12, 99] (1 to 10 valid answers); training
  and evaluation on this fixed prompt pool (the question is how much of the answer set a policy covers);
* policy: TinyGPT (3 layers, d 96, 4 heads: 0.34M parameters), character vocabulary of 16 ids;
* scaled down to the budget: 3 seeds, 100 GRPO steps per arm (the card suggests "a few thousand"), 8 rollouts
  per prompt (the paper: 32), K = 3;
* per seed, two format warm-ups (`--sft-steps` AdamW steps, batch 64, lr 1e-3) on the SAME candidate
  distribution (each candidate gold with probability 0.7, else a distractor): ``multi`` targets
  ``a1@c1;a2@c2;a3@c3`` (uninformative confidence digits 0..3) and ``single`` targets (one answer);
* arms (GRPO from the warm-up of their format; same seed, steps, prompts per step and rollouts per prompt):
  ``single-answer RLVR (K samples)`` (exact-match reward 0/1, evaluated on K = 3 independent samples),
  ``Multi-RLVR (any)`` (0.5 format + 0.5 any-correct, the code's default), ``Multi-RLVR (count)``
  (0.5 format + 0.5 |distinct correct| / K), ``Multi-RLCR`` (any-correct + 0.5 (1 - mean Brier), uniqueness and
  Sum p <= 1 gates), and two RLCR variants: ``Multi-RLCR (count accuracy)`` and the ablation without the
  Sum p <= 1 gate (on this task several candidates can be right at once, which that gate penalises); both
  warm-ups are also evaluated (step 0);
* GRPO: `--rl-steps` steps of 16 prompts x 8 rollouts, temperature 1, A = r - mean (no std scaling, as the
  paper), token-mean loss, eps 0.2, Adam lr `--lr`, one on-policy update per step;
* evaluation: `--eval-sets` answer sets per prompt at temperature 1 (a set = one multi-answer generation, or K
  single-answer samples): coverage = |distinct correct| / min(K, |gold|), distinct correct per set, duplicate
  rate, pass@1 / pass@K within one generation (RLCR ranked by confidence; single-answer: unbiased estimator),
  format rate, set Brier (SUM over the K candidates, eval scale) and 10-bin ECE for the confidence-bearing arms,
  tokens per answer and per distinct correct answer. Mean ± std over seeds.

Outputs: markdown table on stdout, ``results/multi_answer_rl.json`` (``{"paper", "seeds", "wall_s", "arms": {arm:
{metric: {"mean", "std"}}}, "curves": ..., "config": ...}``) and ``results/multi_answer_rl.png`` (coverage,
duplicate rate and set Brier against RL steps).
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import os
import time
import warnings

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from tqdm import tqdm

from datamodules.many_answer_tasks import ManyAnswerDataModule
from lightning_modules.grpo import ExactMatchReward
from lightning_modules.multi_answer_rl import MultiAnswerGRPO, MultiAnswerReward
from lightning_modules.sft import SupervisedWarmup
from lightning_modules.tiny_gpt import TinyGPT

PAPER = "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models (arXiv 2603.24844)"
K = 3
SINGLE = "single-answer RLVR (K samples)"
ARMS = {  # arm -> (answer format, reward mode or None for exact match, extra reward arguments)
    SINGLE: ("single", None, {}),
    "Multi-RLVR (any)": ("multi", "rlvr_any", {}),
    "Multi-RLVR (count)": ("multi", "rlvr_count", {}),
    "Multi-RLCR": ("multi", "rlcr", {}),
    "Multi-RLCR (count accuracy)": ("multi", "rlcr", {"accuracy": "count"}),
    "Multi-RLCR, no sum(p)<=1 gate (ablation)": ("multi", "rlcr", {"confidence_sum_constraint": False}),
}
METRICS = ("coverage", "distinct_correct", "duplicate_rate", "pass@1", f"pass@{K}", "format", "set_brier", "ece",
           "tokens_per_answer", "tokens_per_correct_answer")
MAX_NEW_TOKENS = {"multi": 16, "single": 6}


def _trainer(max_steps: int, callbacks=(), clip: float | None = None) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                   num_sanity_val_steps=0, callbacks=list(callbacks), gradient_clip_val=clip, deterministic=True)


def _datamodule(fmt: str, seed: int, split: str) -> ManyAnswerDataModule:
    return ManyAnswerDataModule(source="divisors", target_format=fmt, task_num_candidates=K, with_confidence=True,
                                train_split=split, sft_samples_per_prompt=64, sft_valid_prob=0.7, sft_batch_size=64,
                                batch_size=16, eval_batch_size=128, seed=seed)


def _reward(mode: str | None, extra: dict | None = None):
    if mode is None:
        return ExactMatchReward(extract=False)
    return MultiAnswerReward(mode=mode, num_candidates=K, with_confidence=True, **(extra or {}))


def _module(policy, fmt: str, mode: str | None, args, seed: int, extra: dict | None = None) -> MultiAnswerGRPO:
    # Evaluating a multi-answer warm-up: rank like the RLVR arms (listed order); RLCR ranks by confidence.
    return MultiAnswerGRPO(policy=policy, reward=_reward(mode, extra), num_candidates=K, answer_format=fmt,
                           rollouts_per_prompt=args.rollouts, max_new_tokens=MAX_NEW_TOKENS[fmt], temperature=1.0,
                           scale_by_group_std=False, loss_aggregation="token_mean", clip_low=0.2, clip_high=0.2,
                           kl_coef=0.0, eval_samples=args.eval_sets, eval_temperature=1.0, rollout_seed=seed,
                           optimizer=functools.partial(torch.optim.Adam, lr=args.lr))


@torch.no_grad()
def evaluate(module: MultiAnswerGRPO, dm: ManyAnswerDataModule, sets: int, seed: int) -> dict[str, float]:
    """Set metrics over the whole prompt pool (fixed sampling seed)."""
    was_training = module.training
    module.eval()
    module.set_tokenizer(dm.tokenizer)
    accumulator = module.new_accumulator()
    generator = torch.Generator().manual_seed(10_000 + seed)
    for batch in dm.train_pool_loader():
        module.score_sets(batch, accumulator, sets, 1.0, generator)
    module.train(was_training)
    return accumulator.compute()


class Curve(Callback):
    """Evaluates the set metrics every `every` RL steps (fewer sets than the final evaluation)."""

    def __init__(self, dm, every: int, sets: int, seed: int) -> None:
        self.dm, self.every, self.sets, self.seed = dm, every, sets, seed
        self.points: list[dict] = []

    def on_train_start(self, trainer, pl_module):
        self.points.append({"step": 0, **evaluate(pl_module, self.dm, self.sets, self.seed)})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = pl_module.rollout_batches
        if step % self.every == 0:
            self.points.append({"step": step, **evaluate(pl_module, self.dm, self.sets, self.seed)})


def warm_up(fmt: str, seed: int, args) -> TinyGPT:
    seed_everything(seed, workers=True, verbose=False)
    dm = _datamodule(fmt, seed, "sft")
    policy = TinyGPT(vocab_size=dm.tokenizer.vocab_size, n_layer=args.n_layer, d_model=args.d_model, n_head=4,
                     context_length=24)
    sft = SupervisedWarmup(policy=policy, max_new_tokens=MAX_NEW_TOKENS[fmt], eval_samples=0,
                           optimizer=functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.0))
    _trainer(args.sft_steps, clip=1.0).fit(sft, datamodule=dm)
    return sft.policy


def run_seed(seed: int, args) -> tuple[dict, dict]:
    results, curves = {}, {}
    warm = {fmt: warm_up(fmt, seed, args) for fmt in ("single", "multi")}
    for fmt, mode, name in (("single", None, "SFT warm-up, single (K samples)"),
                            ("multi", "rlvr_any", "SFT warm-up, multi")):
        module = _module(copy.deepcopy(warm[fmt]), fmt, mode, args, seed)
        results[name] = evaluate(module, _datamodule(fmt, seed, "rl"), args.eval_sets, seed)
    for arm, (fmt, mode, extra) in ARMS.items():
        if args.arms and arm not in args.arms:
            continue
        seed_everything(seed, workers=True, verbose=False)
        dm = _datamodule(fmt, seed, "rl")
        module = _module(copy.deepcopy(warm[fmt]), fmt, mode, args, seed, extra)
        curve = Curve(dm, args.curve_every, args.curve_sets, seed)
        start = time.time()
        _trainer(args.rl_steps, [curve]).fit(module, datamodule=dm)
        results[arm] = {**evaluate(module, dm, args.eval_sets, seed), "rl_wall_s": time.time() - start}
        curves[arm] = curve.points
    return results, curves


def summarise(per_seed: list[dict]) -> dict:
    arms = {}
    for arm in per_seed[0]:
        arms[arm] = {}
        for metric in (*METRICS, "rl_wall_s"):
            values = [r[arm][metric] for r in per_seed if metric in r[arm] and np.isfinite(r[arm][metric])]
            if values:
                arms[arm][metric] = {"mean": float(np.mean(values)), "std": float(np.std(values))}
    return arms


def markdown_table(arms: dict) -> str:
    lines = ["| arm | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for arm, metrics in arms.items():
        cells = [f"{metrics[m]['mean']:.3f} ± {metrics[m]['std']:.3f}" if m in metrics else "n/a" for m in METRICS]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_curves(all_curves: list[dict]) -> dict:
    out = {}
    for arm in all_curves[0]:
        steps = [p["step"] for p in all_curves[0][arm]]
        out[arm] = {"step": steps}
        for metric in ("coverage", "duplicate_rate", "set_brier", "format"):
            series = [[p.get(metric, float("nan")) for p in c[arm]] for c in all_curves]
            out[arm][metric] = np.nanmean(np.array(series, dtype=float), axis=0).tolist() if series[0] else []
    return out


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for index, (arm, c) in enumerate(curves.items()):
        for ax, metric in zip(axes, ("coverage", "duplicate_rate", "set_brier")):
            values = np.array(c[metric], dtype=float)
            if np.isfinite(values).any():  # one colour per arm in every panel
                ax.plot(c["step"], values, marker="o", color=f"C{index}", label=arm)
    for ax, title in zip(axes, ("coverage |distinct correct| / min(K, |gold|)", "duplicate rate",
                                "set Brier (sum over K, lower = better)")):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle("Multi-answer RL on the divisor task (mean over seeds; step 0 = SFT warm-up)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=800)
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--n-layer", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--eval-sets", type=int, default=8)
    parser.add_argument("--curve-every", type=int, default=25)
    parser.add_argument("--curve-sets", type=int, default=2)
    parser.add_argument("--arms", nargs="*", default=None, help=f"subset of {list(ARMS)} (default: all)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    unknown = set(args.arms or ()) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {list(ARMS)}")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    start = time.time()
    per_seed, all_curves = [], []
    for seed in tqdm(range(args.seeds), desc="seeds"):
        results, curves = run_seed(seed, args)
        per_seed.append(results)
        all_curves.append(curves)
    arms = summarise(per_seed)
    curves = mean_curves(all_curves)
    result = {"paper": PAPER, "seeds": args.seeds, "wall_s": time.time() - start, "arms": arms, "curves": curves,
              "config": vars(args), "per_seed": per_seed}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "multi_answer_rl.json"), "w") as f:
        json.dump(result, f, indent=2)
    plot(curves, os.path.join(args.out, "multi_answer_rl.png"))
    print(markdown_table(arms))
    print(f"\nwall {result['wall_s']:.0f} s (seeds {args.seeds}, SFT {args.sft_steps} steps, GRPO {args.rl_steps} "
          f"steps x 16 prompts x {args.rollouts} rollouts)")
    return result


if __name__ == "__main__":
    main()
