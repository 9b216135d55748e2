"""Multi-answer RL at toy scale on held-out prompts: ``python -m experiments multi_answer_rl`` (~40 min, 2 cores).

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (arXiv 2603.24844).
Claim: training ONE generation to hold K distinct candidates (Multi-RLVR) covers more of the valid answers than
a single-answer RLVR model sampled K times, with fewer duplicates and fewer tokens per answer, and adding the
Brier term on stated confidences (Multi-RLCR) gives calibrated set-level confidences (lowest set Brier).

The protocol is configuration, ``configs/multi_answer_rl/experiment.yaml``, run by `experiments.runner` (every arm
built as ``python train.py fit`` builds it from ``configs/multi_answer_rl/sft_quick.yaml`` / ``quick.yaml`` with only
the experiment's settings overridden, trainer and callbacks from the YAML; one seed S drives model and data). This
module holds the hooks: `prepare` (each arm's ``init_from`` = the checkpoint of its format's warm-up,
``settings.init_from``), `evaluate` (the set metrics below; `ValidationCurve`, a callback of the GRPO arms, measures
the curves), `report` (the table's summary, the curves, the prompt splits, the pairs of ``settings.paired``) and
`plot`. Setup (the paper's RL recipe scaled down to a CPU budget):

* task: "name a non-trivial divisor of n" for the 147 composite n in [12, 199] (1 to 10 valid answers), split per
  seed into three disjoint prompt sets (`split_prompts`): TRAIN (half, 73 prompts, about the size of the 68-prompt
  pool n <= 99 on which this experiment used to train AND evaluate), VALIDATION (37) and TEST (37). Both warm-ups
  and every GRPO run see only the training prompts (the datamodule's ``val_fraction`` hold-out, whose SFT targets
  and RL batches come from the training pool only); the learning curves are measured on the validation prompts,
  and every reported metric on the test prompts, which no arm trained on or was selected on. The training-prompt
  coverage and set Brier are reported as well (``train_coverage``, ``train_set_brier``) to show the
  generalisation gap;
* selection: none. Every arm runs the same fixed settings (lr, GRPO steps, rollouts, prompts per step) and is
  evaluated at its last step; no hyper-parameter or checkpoint is chosen for any arm, so no arm is tuned on any
  split (the validation prompts are there for the curves and for anyone who adds selection);
* policy: TinyGPT (3 layers, d 96, 4 heads: 0.34M parameters), character vocabulary of 16 ids;
* scaled down to the budget: 3 seeds, 100 GRPO steps per arm (a few thousand would be closer to the paper),
  8 rollouts per prompt (the paper: 32), K = 3;
* per seed, two format warm-ups (arms ``sft_single`` and ``sft_multi``, no rows: 800 AdamW steps, batch 64, lr
  1e-3, gradient-norm clip 1) on the SAME candidate distribution (each candidate gold with probability 0.7, else a
  distractor): ``multi`` targets ``a1@c1;a2@c2;a3@c3`` (uninformative confidence digits 0..3) and ``single``
  targets (one answer);
* arms (GRPO from the warm-up of their format; same seed, steps, prompts per step and rollouts per prompt):
  ``single-answer RLVR (K samples)`` (exact-match reward 0/1, evaluated on K = 3 independent samples),
  ``Multi-RLVR (any)`` (0.5 format + 0.5 any-correct, the code's default), ``Multi-RLVR (count)``
  (0.5 format + 0.5 |distinct correct| / K), ``Multi-RLCR`` (any-correct + 0.5 (1 - mean Brier), uniqueness and
  Sum p <= 1 gates), and two RLCR variants: ``Multi-RLCR (count accuracy)`` and the ablation without the
  Sum p <= 1 gate (on this task several candidates can be right at once, which that gate penalises); both
  warm-ups are also evaluated (step 0: arms with ``fit: false``);
* GRPO: 100 steps of 16 prompts x 8 rollouts, temperature 1, A = r - mean (no std scaling, as the paper),
  token-mean loss, eps 0.2, Adam lr 1e-3, one on-policy update per step;
* evaluation (test prompts): ``model.init_args.eval_samples`` (8) answer sets per prompt at temperature 1 (a set =
  one multi-answer generation, or K single-answer samples): coverage = |distinct correct| / min(K, |gold|), distinct
  correct per set, duplicate rate, pass@1 / pass@K within one generation (RLCR ranked by confidence; single-answer:
  unbiased estimator), format rate, set Brier (SUM over the K candidates, eval scale) and 10-bin ECE for the
  confidence-bearing arms, tokens per answer and per distinct correct answer. Mean ± std over seeds.

Outputs: markdown table on stdout, ``<out>/multi_answer_rl.json`` (the kit's schema plus ``curves`` on the
validation prompts, ``prompt_splits``, the prompt ids of each split per seed, and ``paired``) and
``<out>/multi_answer_rl.png`` (validation coverage, duplicate rate and set Brier against RL steps).
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader

from datamodules.many_answer_tasks import ManyAnswerDataModule
from datamodules.verifiable_tasks import ListDataset, PromptCollator
from experiments import kit

K = 3
SINGLE = "single-answer RLVR (K samples)"
METRICS = ("coverage", "distinct_correct", "duplicate_rate", "pass@1", f"pass@{K}", "format", "set_brier", "ece",
           "tokens_per_answer", "tokens_per_correct_answer")
TRAIN_METRICS = ("train_coverage", "train_set_brier")  # on the training prompts, for the generalisation gap
CURVE_METRICS = ("coverage", "duplicate_rate", "set_brier", "format")
SPLIT_SEED = 20_000   # the held-out prompts' split into validation and test: generator seed SPLIT_SEED + seed
SAMPLING_SEED = 10_000  # the evaluation's answer sets: generator seed SAMPLING_SEED + seed


def split_prompts(dm: ManyAnswerDataModule, seed: int) -> dict[str, list]:
    """``{"train", "validation", "test"}`` prompt pools: the datamodule's training pool (all that SFT and GRPO
    read) and its held-out pool split in two by a generator seeded with ``seed`` (disjoint by construction)."""
    held_out = sorted(dm.val_pool, key=lambda e: e.id)
    order = torch.randperm(len(held_out), generator=torch.Generator().manual_seed(SPLIT_SEED + seed)).tolist()
    half = len(held_out) // 2
    return {"train": list(dm.train_pool), "validation": [held_out[i] for i in sorted(order[:half])],
            "test": [held_out[i] for i in sorted(order[half:])]}


def pool_loader(dm: ManyAnswerDataModule, pool: list) -> DataLoader:
    """The prompts of ``pool`` in fixed order, batched like the datamodule's evaluation loader."""
    return DataLoader(ListDataset(dm.rl_examples(pool)), batch_size=dm.hparams.eval_batch_size, shuffle=False,
                      collate_fn=PromptCollator(dm.tokenizer))


@torch.no_grad()
def set_metrics(module, dm: ManyAnswerDataModule, pool: list, sets: int, seed: int) -> dict[str, float]:
    """Set metrics over the prompts of ``pool`` (fixed sampling seed)."""
    was_training = module.training
    module.eval()
    module.set_tokenizer(dm.tokenizer)
    accumulator = module.new_accumulator()
    generator = torch.Generator().manual_seed(SAMPLING_SEED + seed)
    for batch in pool_loader(dm, pool):
        module.score_sets(batch, accumulator, sets, 1.0, generator)
    module.train(was_training)
    return accumulator.compute()


def final_metrics(module, dm: ManyAnswerDataModule, pools: dict, sets: int, seed: int) -> dict:
    """Every metric on the TEST prompts, plus coverage and set Brier on the training prompts (``train_*``)."""
    on_train = set_metrics(module, dm, pools["train"], sets, seed)
    return {**set_metrics(module, dm, pools["test"], sets, seed),
            **{f"train_{m}": on_train[m] for m in ("coverage", "set_brier") if m in on_train}}


class ValidationCurve(Callback):
    """The set metrics on the validation prompts (`split_prompts` of the fit's datamodule and its seed) at the start
    of training and every ``every`` RL steps, with ``sets`` answer sets per prompt (fewer than the final
    evaluation); also the fit's wall seconds. Add it to a GRPO arm with ``trainer.callbacks+``."""

    def __init__(self, every: int = 25, sets: int = 2) -> None:
        if every < 1 or sets < 1:
            raise ValueError(f"ValidationCurve: every ({every}) and sets ({sets}) must be at least 1")
        self.every, self.sets = every, sets
        self.points: list[dict] = []
        self.fit_s = 0.0
        self._start = None

    def _point(self, step: int, trainer, module) -> None:
        dm = trainer.datamodule
        seed = int(dm.hparams.seed)
        self.points.append({"step": step, **set_metrics(module, dm, split_prompts(dm, seed)["validation"],
                                                        self.sets, seed)})

    def on_fit_start(self, trainer, pl_module) -> None:
        self._start = time.time()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.fit_s = time.time() - self._start

    def on_train_start(self, trainer, pl_module) -> None:
        self._point(0, trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.rollout_batches
        if step % self.every == 0:
            self._point(step, trainer, pl_module)


# --------------------------------------------------------------------------------------------- hooks
def prepare(run) -> dict:
    """``model.init_args.init_from`` = the final checkpoint of the arm's warm-up (``settings.init_from``), a run
    of the same seed made earlier; the warm-ups start from scratch."""
    parent = (run.settings.get("init_from") or {}).get(run.arm.name)
    if parent is None:
        return {}
    return {"model.init_args.init_from": run.checkpoint_of(parent, "settings.init_from")}


def evaluate(run) -> dict[str, float]:
    """Warm-ups (no rows): nothing. Every other arm: its weights (the warm-up's for ``fit: false`` arms, else the
    last step's; no selection) scored by `final_metrics` with ``eval_samples`` sets per prompt; GRPO arms add
    ``rl_wall_s`` and keep their validation curve in ``run.extra``, every arm the prompt ids of each split."""
    if not run.arm.row:
        return {}
    model, dm = run.model, run.datamodule
    if not run.fitted:
        model.apply_init_from()  # the weights a fit would start from (loaded in setup otherwise)
    pools = split_prompts(dm, run.seed)
    metrics = final_metrics(model, dm, pools, int(model.hparams.eval_samples), run.seed)
    run.extra["split"] = {name: [e.id for e in pool] for name, pool in pools.items()}
    curves = [c for c in run.trainer.callbacks if isinstance(c, ValidationCurve)] if run.fitted else []
    if curves:
        run.extra["curve"] = curves[0].points
        metrics["rl_wall_s"] = curves[0].fit_s
    return metrics


def table_rows(per_seed: list[dict]) -> list[dict]:
    """The summarised metrics of every arm per seed (non-finite values, e.g. no confidences, left out)."""
    return [{arm: {m: row[m] for m in (*METRICS, *TRAIN_METRICS, "rl_wall_s") if m in row and np.isfinite(row[m])}
             for arm, row in results.items()} for results in per_seed]


def mean_curves(all_curves: list[dict]) -> dict:
    """Per arm, the validation curve's metrics averaged over seeds at each recorded step."""
    out = {}
    for arm in all_curves[0]:
        steps = [p["step"] for p in all_curves[0][arm]]
        out[arm] = {"step": steps}
        for metric in CURVE_METRICS:
            series = [[p.get(metric, float("nan")) for p in c[arm]] for c in all_curves]
            out[arm][metric] = np.nanmean(np.array(series, dtype=float), axis=0).tolist() if series[0] else []
    return out


def report(result: dict, records: list[dict], spec) -> dict:
    """The table (`table_rows`: finite values of the reported metrics), the pairs of ``settings.paired`` added to
    the runner's (every arm - the single-answer baseline), the mean validation curves and the prompt splits."""
    from icml26.paired import paired_block

    per_seed = result["per_seed"]
    present = {arm for row in per_seed for arm in row}
    pairs: dict = {}
    seen = {m for row in per_seed for cells in row.values() for m in cells}
    metrics = [m for m in (*METRICS, *TRAIN_METRICS) if m in seen]
    for baseline, arms in (spec.settings.get("paired") or {}).items():
        arms = [arm for arm in arms if arm in present]
        if baseline in present and arms:
            pairs.update(paired_block(per_seed, baseline, metrics, arms=arms))
    seeds = [seed.get("", {}) for seed in records]
    curves = mean_curves([{arm: extra["curve"] for arm, extra in seed.items() if "curve" in extra}
                          for seed in seeds])
    splits = [next(extra["split"] for extra in seed.values() if "split" in extra) for seed in seeds]
    return {"arms": kit.summarise(table_rows(per_seed)), "paired": pairs, "curves": curves, "prompt_splits": splits}


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for index, (arm, c) in enumerate(result["curves"].items()):
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


if __name__ == "__main__":  # ``python -m experiments.multi_answer_rl [--smoke] [--seeds N] [--out DIR] [--check]``
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["multi_answer_rl", *sys.argv[1:]]))
