"""Multi-answer RL at toy scale on held-out prompts: ``python -m experiments.multi_answer_rl`` (minutes on 2 cores).

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (arXiv 2603.24844).
Claim: training ONE generation to hold K distinct candidates (Multi-RLVR) covers more of the valid answers than
a single-answer RLVR model sampled K times, with fewer duplicates and fewer tokens per answer, and adding the
Brier term on stated confidences (Multi-RLCR) gives calibrated set-level confidences (lowest set Brier).

Setup (the paper's RL recipe scaled down to a CPU budget; everything through the collection's
`ManyAnswerDataModule`, `SupervisedWarmup`, `MultiAnswerGRPO` and a Lightning `Trainer` on CPU, each built from
``configs/multi_answer_rl/sft_quick.yaml`` / ``quick.yaml`` with only the experiment's settings overridden):

* task: "name a non-trivial divisor of n" for the 147 composite n in [12, `--n-max` = 199] (1 to 10 valid
  answers), split per seed into three disjoint prompt sets (`split_prompts`): TRAIN (half, 73 prompts, about the
  size of the 68-prompt pool n <= 99 on which this experiment used to train AND evaluate), VALIDATION (37) and
  TEST (37). Both warm-ups and every GRPO run see only the training prompts (the datamodule's
  ``val_fraction`` hold-out, whose SFT targets and RL batches come from the training pool only); the learning
  curves are measured on the validation prompts, and every reported metric on the test prompts, which no arm
  trained on or was selected on. The training-prompt coverage and set Brier are reported as well
  (``train_coverage``, ``train_set_brier``) to show the generalisation gap;
* selection: none. Every arm runs the same fixed settings (`--lr`, `--rl-steps`, rollouts, prompts per step)
  and is evaluated at its last step; no hyper-parameter or checkpoint is chosen for any arm, so no arm is tuned
  on any split (the validation prompts are there for the curves and for anyone who adds selection);
* policy: TinyGPT (3 layers, d 96, 4 heads: 0.34M parameters), character vocabulary of 16 ids;
* scaled down to the budget: 3 seeds, 100 GRPO steps per arm (a few thousand would be closer to the paper),
  8 rollouts per prompt (the paper: 32), K = 3;
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
* evaluation (test prompts): `--eval-sets` answer sets per prompt at temperature 1 (a set = one multi-answer
  generation, or K single-answer samples): coverage = |distinct correct| / min(K, |gold|), distinct correct per
  set, duplicate rate, pass@1 / pass@K within one generation (RLCR ranked by confidence; single-answer: unbiased
  estimator), format rate, set Brier (SUM over the K candidates, eval scale) and 10-bin ECE for the
  confidence-bearing arms, tokens per answer and per distinct correct answer. Mean ± std over seeds.

Outputs: markdown table on stdout, ``<out>/multi_answer_rl.json`` (the kit's schema plus ``curves`` on the
validation prompts and ``prompt_splits``, the prompt ids of each split per seed) and ``<out>/multi_answer_rl.png``
(validation coverage, duplicate rate and set Brier against RL steps).
"""
from __future__ import annotations

import copy
import os
import time

import numpy as np
import torch
from lightning.pytorch import Callback, seed_everything

from torch.utils.data import DataLoader

from datamodules.many_answer_tasks import ManyAnswerDataModule
from datamodules.verifiable_tasks import ListDataset, PromptCollator
from experiments.kit import (experiment_parser, from_config, markdown_table, progress, quiet_single_thread,
                             quiet_trainer, summarise, write_result)
from lightning_modules.rlvr.grpo import ExactMatchReward
from lightning_modules.multi_answer_rl.multi_answer_rl import MultiAnswerGRPO

PAPER = "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models (arXiv 2603.24844)"
SFT_CONFIG, RL_CONFIG = "configs/multi_answer_rl/sft_quick.yaml", "configs/multi_answer_rl/quick.yaml"
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
SMOKE_ARMS = (SINGLE, "Multi-RLCR")
METRICS = ("coverage", "distinct_correct", "duplicate_rate", "pass@1", f"pass@{K}", "format", "set_brier", "ece",
           "tokens_per_answer", "tokens_per_correct_answer")
TRAIN_METRICS = ("train_coverage", "train_set_brier")  # on the training prompts, for the generalisation gap
MAX_NEW_TOKENS = {"multi": 16, "single": 6}


HELD_OUT = 0.5  # share of prompts held out of training; split evenly into validation and test prompts


def _data_overrides(fmt: str, seed: int, n_max: int) -> list[str]:
    return [f"--data.init_args.target_format={fmt}", f"--data.init_args.task_num_candidates={K}",
            "--data.init_args.with_confidence=true", f"--data.init_args.seed={seed}",
            f"--data.init_args.divisor_n_max={n_max}", f"--data.init_args.val_fraction={HELD_OUT}"]


def split_prompts(dm: ManyAnswerDataModule, seed: int) -> dict[str, list]:
    """``{"train", "validation", "test"}`` prompt pools: the datamodule's training pool (all that SFT and GRPO
    read) and its held-out pool split in two by a generator seeded with ``seed`` (disjoint by construction)."""
    held_out = sorted(dm.val_pool, key=lambda e: e.id)
    order = torch.randperm(len(held_out), generator=torch.Generator().manual_seed(20_000 + seed)).tolist()
    half = len(held_out) // 2
    return {"train": list(dm.train_pool), "validation": [held_out[i] for i in sorted(order[:half])],
            "test": [held_out[i] for i in sorted(order[half:])]}


def pool_loader(dm: ManyAnswerDataModule, pool: list) -> DataLoader:
    """The prompts of ``pool`` in fixed order, batched like the datamodule's evaluation loader."""
    return DataLoader(ListDataset(dm.rl_examples(pool)), batch_size=dm.hparams.eval_batch_size, shuffle=False,
                      collate_fn=PromptCollator(dm.tokenizer))


def _policy_overrides(args) -> list[str]:
    return [f"--model.init_args.policy.init_args.n_layer={args.n_layer}",
            f"--model.init_args.policy.init_args.d_model={args.d_model}"]


def _reward_overrides(mode: str | None, extra: dict | None = None) -> list[str]:
    if mode is None:  # exact match on the single answer
        return [f"--model.init_args.reward={ExactMatchReward.__module__}.ExactMatchReward",
                "--model.init_args.reward.init_args.extract=false"]
    return [f"--model.init_args.reward.init_args.mode={mode}",
            f"--model.init_args.reward.init_args.num_candidates={K}",
            "--model.init_args.reward.init_args.with_confidence=true",
            *(f"--model.init_args.reward.init_args.{k}={str(v).lower() if isinstance(v, bool) else v}"
              for k, v in (extra or {}).items())]


def rl_module(state: dict, fmt: str, mode: str | None, args, seed: int, extra: dict | None = None):
    """``(MultiAnswerGRPO, RL-split datamodule)`` from quick.yaml with the warm-up's weights.

    Evaluating a multi-answer warm-up: rank like the RLVR arms (listed order); RLCR ranks by confidence.
    """
    module, dm = from_config(
        RL_CONFIG, f"--seed_everything={seed}", "--model.init_args.init_from=null", *_policy_overrides(args),
        *_reward_overrides(mode, extra), f"--model.init_args.num_candidates={K}",
        f"--model.init_args.answer_format={fmt}", f"--model.init_args.rollouts_per_prompt={args.rollouts}",
        f"--model.init_args.max_new_tokens={MAX_NEW_TOKENS[fmt]}", f"--model.init_args.eval_samples={args.eval_sets}",
        f"--model.init_args.rollout_seed={seed}", f"--model.init_args.optimizer.init_args.lr={args.lr}",
        *_data_overrides(fmt, seed, args.n_max))
    module.policy.load_state_dict(state)
    seed_everything(seed, workers=True, verbose=False)  # as before building: the fresh policy drew from the RNG
    return module, dm


@torch.no_grad()
def evaluate(module: MultiAnswerGRPO, dm: ManyAnswerDataModule, pool: list, sets: int,
             seed: int) -> dict[str, float]:
    """Set metrics over the prompts of ``pool`` (fixed sampling seed)."""
    was_training = module.training
    module.eval()
    module.set_tokenizer(dm.tokenizer)
    accumulator = module.new_accumulator()
    generator = torch.Generator().manual_seed(10_000 + seed)
    for batch in pool_loader(dm, pool):
        module.score_sets(batch, accumulator, sets, 1.0, generator)
    module.train(was_training)
    return accumulator.compute()


class Curve(Callback):
    """Evaluates the set metrics on ``pool`` (the validation prompts) every `every` RL steps (fewer sets than the
    final evaluation)."""

    def __init__(self, dm, pool: list, every: int, sets: int, seed: int) -> None:
        self.dm, self.pool, self.every, self.sets, self.seed = dm, pool, every, sets, seed
        self.points: list[dict] = []

    def _point(self, step: int, module) -> None:
        self.points.append({"step": step, **evaluate(module, self.dm, self.pool, self.sets, self.seed)})

    def on_train_start(self, trainer, pl_module):
        self._point(0, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = pl_module.rollout_batches
        if step % self.every == 0:
            self._point(step, pl_module)


def warm_up(fmt: str, seed: int, args) -> dict:
    """The format warm-up of ``fmt`` (sft_quick.yaml, `--sft-steps` steps); returns the policy's state_dict."""
    sft, dm = from_config(SFT_CONFIG, f"--seed_everything={seed}", *_policy_overrides(args),
                          f"--model.init_args.max_new_tokens={MAX_NEW_TOKENS[fmt]}",
                          *_data_overrides(fmt, seed, args.n_max))
    quiet_trainer(max_steps=args.sft_steps, limit_val_batches=0, gradient_clip_val=1.0,
                  deterministic=True).fit(sft, datamodule=dm)
    return copy.deepcopy(sft.policy.state_dict())


def final_metrics(module: MultiAnswerGRPO, dm: ManyAnswerDataModule, pools: dict, args, seed: int) -> dict:
    """Every metric on the TEST prompts, plus coverage and set Brier on the training prompts (``train_*``)."""
    on_train = evaluate(module, dm, pools["train"], args.eval_sets, seed)
    return {**evaluate(module, dm, pools["test"], args.eval_sets, seed),
            **{f"train_{m}": on_train[m] for m in ("coverage", "set_brier") if m in on_train}}


def run_seed(seed: int, args) -> tuple[dict, dict, dict]:
    results, curves = {}, {}
    warm = {fmt: warm_up(fmt, seed, args) for fmt in ("single", "multi")}
    pools = None
    for fmt, mode, name in (("single", None, "SFT warm-up, single (K samples)"),
                            ("multi", "rlvr_any", "SFT warm-up, multi")):
        module, dm = rl_module(warm[fmt], fmt, mode, args, seed)
        pools = split_prompts(dm, seed)
        results[name] = final_metrics(module, dm, pools, args, seed)
    for arm, (fmt, mode, extra) in progress(ARMS.items(), f"seed {seed} arms"):
        if args.arms and arm not in args.arms:
            continue
        module, dm = rl_module(warm[fmt], fmt, mode, args, seed, extra)
        curve = Curve(dm, pools["validation"], args.curve_every, args.curve_sets, seed)
        start = time.time()
        quiet_trainer([curve], max_steps=args.rl_steps, limit_val_batches=0,
                      deterministic=True).fit(module, datamodule=dm)
        results[arm] = {**final_metrics(module, dm, pools, args, seed), "rl_wall_s": time.time() - start}
        curves[arm] = curve.points
    split = {name: [e.id for e in pool] for name, pool in pools.items()}
    return results, curves, split


def table_rows(per_seed: list[dict]) -> list[dict]:
    """The summarised metrics of every arm per seed (non-finite values, e.g. no confidences, left out)."""
    return [{arm: {m: row[m] for m in (*METRICS, *TRAIN_METRICS, "rl_wall_s") if m in row and np.isfinite(row[m])}
             for arm, row in results.items()} for results in per_seed]


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
    fig.suptitle("Multi-answer RL on the divisor task, validation prompts (mean over seeds; step 0 = SFT warm-up)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--sft-steps", type=int, default=800)
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--n-layer", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--n-max", type=int, default=199, help="prompts: the composite n in [12, n-max]")
    parser.add_argument("--eval-sets", type=int, default=8)
    parser.add_argument("--curve-every", type=int, default=25)
    parser.add_argument("--curve-sets", type=int, default=2)
    parser.add_argument("--arms", nargs="*", default=None, help=f"subset of {list(ARMS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.arms or ()) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {list(ARMS)}")
    if args.smoke:
        args.sft_steps, args.rl_steps, args.rollouts, args.eval_sets = 3, 2, 2, 1
        args.curve_every, args.curve_sets, args.arms = 1, 1, args.arms or list(SMOKE_ARMS)
    quiet_single_thread()

    start = time.time()
    per_seed, all_curves, splits = [], [], []
    for seed in progress(range(args.seeds), "seeds"):
        results, curves, split = run_seed(seed, args)
        per_seed.append(results)
        all_curves.append(curves)
        splits.append(split)
        # written after every seed (``seeds`` = the seeds done so far), so a long run leaves its finished seeds
        arms = summarise(table_rows(per_seed))
        curves = mean_curves(all_curves)
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        result = write_result(PAPER, seeds=len(per_seed), wall_s=time.time() - start, config=settings, arms=arms,
                              per_seed=per_seed, out=args.out, name="multi_answer_rl", curves=curves,
                              prompt_splits=splits)
        plot(curves, os.path.join(args.out, "multi_answer_rl.png"))
    print("test prompts (held out of training):")
    print(markdown_table(arms, (*METRICS, *TRAIN_METRICS)))
    print(f"\nwall {result['wall_s']:.0f} s (seeds {args.seeds}, SFT {args.sft_steps} steps, GRPO {args.rl_steps} "
          f"steps x 16 prompts x {args.rollouts} rollouts)")
    return result


if __name__ == "__main__":
    main()
