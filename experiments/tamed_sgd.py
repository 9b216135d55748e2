"""Reproduce the tamed-SGD claims at small scale: ``python -m experiments tamed_sgd`` (or ``icml26 experiment
tamed_sgd``; ``python -m experiments.tamed_sgd`` still works).

Paper: "Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance under
(L0, L1)-Smoothness", Apidopoulos, Lytras, Mertikopoulos, ICML 2026. The paper is a theory paper whose
experiments (if any) are unknown; only its abstract was readable, so the update rules are the reconstructed
forms documented in ``callbacks/sgd_taming.py``, and the claims checked here are those of the abstract:
tamed schemes converge almost surely under (L0, L1)-smoothness where plain SGD can blow up, and they avoid
strict saddles.

The protocol is ``configs/tamed_sgd/experiment.yaml``, run by `experiments.runner`: its arms are the Lightning runs
of (c), its ``settings`` the sizes of (a) and (b) and the tuned families of (c). This module holds what is not
configuration: `evaluate` (a digits run's metrics), `report` ((a), (b), the selection of (c)'s tuned arms, the
tables) and `plot`. Three parts, every arm on the same noise (common random numbers):

(a) Synthetic benchmark, vectorised over seeds (one tensor row per run): ``f(x, y) = e^x + e^-x + y^4/4 - y^2/2``,
    oracle ``g = (1 + 0.5 xi_0) grad f + 0.1 xi_{1:}`` with Gaussian xi, start (8, 1e-3), ``gamma_n = 0.5 /
    (n + 10)^0.7``, 5000 steps, 100 seeds (the experiment's seeds; computed by `report`, not a run per seed).
    Arms: plain SGD, clipped SGD (norm 1, the earlier fixed setting),
    clipped SGD tuned (threshold chosen from {0.1, 0.3, 1, 3, 10} on 20 VALIDATION seeds 10000-10019, their own
    noise, by the fraction of runs ending within 0.1 of a minimiser, then the fewest mean steps to first get
    there), tamed (q = 1), tamed (q = 0.5), dissipative (r = 2, default; a = 1) and dissipative (r = 1, ablation);
    q is fixed by the method and both dissipative rows are shown (nothing selected among them; the callback's
    default r = 2 was read off this table). Metrics: divergence rate
    (overflow / NaN), fraction within 0.1 of a minimiser (0, +-1), fraction within 0.1 of the saddle (0, 0),
    final ``||grad f||`` and ``f - f*`` over non-diverged runs. The direction functions, the oracle and the noise
    are the ones the Lightning path uses.
(b) The Lightning path (`StochasticOracleModule` + `SGDTaming` + `RobbinsMonroLR` through a `Trainer` in float64,
    built from ``configs/tamed_sgd/paper.yaml`` as the CLI builds it, under a float64 default dtype as
    ``Trainer.init_module()`` would: the same benchmark protocol) against the vectorised path on 3 seeds, 1000 steps
    (``settings.check``): the final iterates must agree to round-off.
(c) A real network, the experiment's arms ``digits/<arm>_lr<lr>``, each built by the runner from
    ``configs/tamed_sgd/digits_quick.yaml`` with its trainer and callbacks (the experiment sets the seed, the lr,
    the callbacks and ``hidden_dim=64``, the 64-64-10 MLP these numbers were measured with; the config's CLI run
    uses 128): `ImageClassifier(backbone="mlp", hidden_dim=64)` (64-64-10, ReLU) on
    `ImageClassificationDataModule(dataset="digits", seed=seed)` (fixed stratified 80/20 test split, 10% of the
    rest held out for validation, read only to select the tuned arms, pixels z-scored with training statistics),
    `torch.optim.SGD` at a constant learning rate large enough that plain SGD blows up (5 and 50), batch 64,
    20 epochs, no validation during training, 3 seeds (``seeds: 3`` on each arm), ``deterministic: true`` on CPU.
    Arms: plain SGD, clipped SGD at max_norm 1 (``trainer.gradient_clip_val: 1.0``, norm, the earlier fixed
    setting), the `SGDTaming` callback (in the arm's ``trainer.callbacks``) with tamed q = 1 and q = 0.5 (q fixed
    by the method), and two TUNED arms with
    five candidates each, selected per learning rate on the VALIDATION split (mean over seeds of the final
    validation accuracy; ties: lower validation loss; the test split is never read for selection): clipped SGD with
    ``max_norm = s / lr``, s in {0.1, 0.3, 1, 3, 10} (the clipped step is at most s long), and dissipative (r, a) in
    {(1, 0), (1, 1e-3), (2, 0), (2, 1e-3), (2, 1e-2)}; plus plain SGD at lr 0.5 as a reference. All arms of a seed
    start from the same weights and see the same minibatches. Per run: the final train loss is the mean minibatch
    loss of the last epoch (recorded by `StepLossRecorder`, a callback of every arm's trainer, from the
    ``training_step`` outputs), test accuracy comes from a direct pass over the test loader; a run is "nonfinite"
    when that loss or any weight is not finite at the end, and "failed" when it is nonfinite or its final train
    loss is not below ln 10 (uniform guessing): with ReLU at a huge step plain SGD mostly ends in dead or exploded
    logits rather than in NaN. A run that reaches NaN keeps training (Lightning does not stop) and is reported as
    such.

Outputs: markdown tables on stdout, ``results/tamed_sgd.json`` (the experiments' schema; ``config`` holds every
arm's CLI arguments and the settings; ``seeds`` counts the runs of (a); fractions are means of 0/1 indicators with
their std; ``*_median`` metrics hold the median in "mean" and the median absolute deviation in "std"; unlike the
other experiments, every "std" here is the SAMPLE standard deviation (ddof = 1), as published; ``per_seed`` holds
each run's values, the digits arms in the first 3 entries, every tuning candidate included; ``paired``: each
synthetic arm minus plain SGD on ``diverged``, plus the pairs of ``settings.paired``), ``lightning_check``,
``synthetic_clip_selection`` and ``digits_selection`` (each tuned arm's split, candidates, their validation
scores, the test accuracy they would have had, and the chosen one) and ``results/tamed_sgd.png``.

Length: one file because (a), (b) and (c) share the arms, the noise and the selection rules, and (b) exists to
check that (a)'s vectorised path and the Lightning path agree; split apart, that check would span three files.
`digits_run` runs one digits arm outside the grid (tests).
"""
from __future__ import annotations

import functools
import logging
import math
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from tqdm import tqdm

from callbacks.sgd_taming import clipped_direction, dissipative_direction, tamed_direction
from datamodules.stochastic_oracle import oracle_noise
from experiments import kit, runner
from lightning_modules.tamed_sgd.tamed_sgd import get_objective, sample_objective, state_metrics

START = (8.0, 1e-3)
SIGMA_MULT, SIGMA_ADD = 0.5, 0.1
BASE_LR, N0, POWER = 0.5, 10.0, 0.7
NEAR = 0.1


# ----------------------------------------------------------------------------- update rules (grad, x, lr) -> d
def plain_rule(grad, x, lr):
    return grad


def clipped_rule(grad, x, lr, max_norm=1.0):
    return clipped_direction(grad, max_norm)


def tamed_rule(grad, x, lr, lr_power=1.0):
    return tamed_direction(grad, lr, lr_power)


def dissipative_rule(grad, x, lr, restoring_coef=1.0, iterate_power=2.0):
    return dissipative_direction(grad, x, lr, restoring_coef, iterate_power)


SYNTHETIC_RULES = {
    "plain_sgd": plain_rule,
    "clipped_sgd": functools.partial(clipped_rule, max_norm=1.0),
    "tamed": functools.partial(tamed_rule, lr_power=1.0),
    "tamed_sqrt_lr": functools.partial(tamed_rule, lr_power=0.5),
    "dissipative_r2": functools.partial(dissipative_rule, restoring_coef=1.0, iterate_power=2.0),
    "dissipative_r1": functools.partial(dissipative_rule, restoring_coef=1.0, iterate_power=1.0),
}
# Clipped SGD's threshold is tuned, not fixed: the candidates below are run on VALIDATION seeds (their own noise
# draws, disjoint from the reported seeds) and the one whose runs most often end within 0.1 of a minimiser is run
# on the reported seeds (ties: the fewest mean steps to first get within 0.1). The dissipative rows are reported
# for both r (a = 1) without selection, and the tamed arms' q is fixed by the method (q = 1 and the q = 0.5 variant).
SYNTHETIC_CLIP_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)
VALIDATION_SEED_OFFSET = 10_000  # validation seeds 10000, 10001, ...; the reported seeds are 0 .. seeds - 1


def validation_seeds(count: int) -> list[int]:
    """The synthetic benchmark's validation seeds: never among the reported seeds ``0 .. seeds - 1``."""
    return [VALIDATION_SEED_OFFSET + i for i in range(count)]


def synthetic_selection_score(result) -> tuple[float, float]:
    """(fraction of runs ending within 0.1 of a minimiser, minus the mean first step within 0.1; diverged or never
    near = ``steps + 1``): larger is better, compared lexicographically."""
    final = result["history"]["dist_to_min"][-1]
    ok = ~result["diverged"]
    hit = (result["history"]["dist_to_min"] < NEAR) & ok
    never = hit.shape[0]
    first = torch.where(hit.any(0), hit.float().argmax(0).double(), torch.full_like(final, float(never)))
    return (ok & (final < NEAR)).double().mean().item(), -first.mean().item()


def tune_synthetic_clipping(num_val_seeds: int, num_steps: int, grid=SYNTHETIC_CLIP_GRID) -> dict:
    """Run every threshold of `grid` on the validation seeds (one vectorised simulation, common noise) and pick
    the best by `synthetic_selection_score`. Reads no reported seed."""
    noise = stack_noise(validation_seeds(num_val_seeds), num_steps)
    rows = noise.shape[0]
    max_norm = torch.tensor(grid, dtype=noise.dtype).repeat_interleave(rows).unsqueeze(-1)
    result = simulate(functools.partial(clipped_rule, max_norm=max_norm), noise.repeat(len(grid), 1, 1, 1),
                      robbins_monro_lrs(num_steps))
    scores = []
    for i in range(len(grid)):
        part = slice(i * rows, (i + 1) * rows)
        distance = result["history"]["dist_to_min"][:, part]
        scores.append(synthetic_selection_score({"diverged": result["diverged"][part],
                                                 "history": {"dist_to_min": distance}}))
    best = max(range(len(grid)), key=lambda i: (scores[i], -i))  # ties: the first (smallest) threshold
    return {"split": f"validation seeds {VALIDATION_SEED_OFFSET}..{VALIDATION_SEED_OFFSET + num_val_seeds - 1}",
            "criterion": "fraction ending within 0.1 of a minimiser, then fewest mean steps to first get there",
            "grid": list(grid), "val_near_minimiser": [s[0] for s in scores],
            "val_mean_first_step_near_minimiser": [-s[1] for s in scores], "chosen": grid[best]}


def robbins_monro_lrs(num_steps: int, base_lr: float = BASE_LR, n0: float = N0, power: float = POWER):
    """``base_lr (n + n0)^-power`` for n = 0..num_steps-1, the same expression as `RobbinsMonroLR`."""
    return [base_lr * (n + float(n0)) ** (-float(power)) for n in range(num_steps)]


def mean_std(values: torch.Tensor) -> dict[str, float] | None:
    """Mean and sample std (ddof = 1) over the runs in `values`; None when empty (the metric is then left out).

    Statistics over the runs of one vectorised arm, not `kit.summarise` over seeds: this experiment's published
    numbers use the sample std and the median / MAD, so both stay."""
    values = values.double()
    if values.numel() == 0:
        return None
    std = values.std().item() if values.numel() > 1 else 0.0
    return {"mean": values.mean().item(), "std": std}


def summarise_median(values: torch.Tensor) -> dict[str, float] | None:
    if values.numel() == 0:
        return None
    median = values.double().median()
    return {"mean": median.item(), "std": (values.double() - median).abs().median().item()}


# ----------------------------------------------------------------------------- (a) synthetic, vectorised
def simulate(rule, noise: torch.Tensor, lrs: list[float], start=START, objective_name: str = "exp_saddle",
             sigma_mult: float = SIGMA_MULT, sigma_add: float = SIGMA_ADD, progress: str | None = None):
    """Run SGD with direction `rule` for every run at once. ``noise``: ``(runs, steps, m, d + 1)`` (float64).

    Mirrors the Lightning path step by step: a run whose sample loss is non-finite is frozen without a step
    (diverged at step n), a run whose iterate becomes non-finite after step n is frozen (diverged at n + 1).
    Returns final iterates, divergence flags/steps and per-step exact metrics ``(steps + 1, runs)``.
    """
    objective = get_objective(objective_name)
    runs, steps = noise.shape[0], noise.shape[1]
    x = torch.as_tensor(start, dtype=noise.dtype).expand(runs, -1).clone()
    diverged = torch.zeros(runs, dtype=torch.bool)
    diverged_at = torch.full((runs,), -1, dtype=torch.long)
    history = {name: torch.empty(steps + 1, runs, dtype=noise.dtype)
               for name in ("f", "grad_norm", "dist_to_min", "dist_to_saddle")}
    trajectory = torch.empty(steps + 1, runs, x.shape[-1], dtype=noise.dtype)

    def record(n):
        for name, value in state_metrics(objective, x).items():
            history[name][n] = value
        trajectory[n] = x

    record(0)
    for n in tqdm(range(steps), desc=progress, disable=progress is None, leave=False):
        lr = lrs[n]
        x_grad = x.detach().requires_grad_(True)
        loss = sample_objective(objective, x_grad, noise[:, n], sigma_mult, sigma_add)
        (grad,) = torch.autograd.grad(loss.sum(), x_grad)
        bad_loss = ~diverged & ~torch.isfinite(loss)
        diverged_at[bad_loss] = n
        stepping = ~diverged & ~bad_loss
        diverged |= bad_loss
        x_next = torch.add(x, rule(grad, x, lr), alpha=-lr)
        x = torch.where(stepping.unsqueeze(-1), x_next, x)
        bad_iterate = stepping & ~torch.isfinite(x).all(-1)
        diverged_at[bad_iterate] = n + 1
        diverged |= bad_iterate
        record(n + 1)
    return {"x": x, "diverged": diverged, "diverged_at": diverged_at, "history": history,
            "trajectory": trajectory}


def stack_noise(seeds, num_steps: int, batch_size: int = 1, dim: int = 2) -> torch.Tensor:
    return torch.stack([oracle_noise(seed, num_steps, batch_size, dim) for seed in seeds])


def synthetic_metrics(result) -> dict[str, dict[str, float]]:
    final = {name: values[-1] for name, values in result["history"].items()}
    ok = ~result["diverged"]
    near_min = ok & (final["dist_to_min"] < NEAR)
    near_saddle = ok & (final["dist_to_saddle"] < NEAR)
    hit = result["history"]["dist_to_min"] < NEAR                        # (steps + 1, runs)
    ever_hit = ok & hit.any(0)
    first_hit = hit.float().argmax(0)[ever_hit]
    metrics = {"diverged": mean_std(result["diverged"].float()),
               "near_minimiser": mean_std(near_min.float()),
               "near_saddle": mean_std(near_saddle.float()),
               "final_grad_norm": mean_std(final["grad_norm"][ok]),
               "final_grad_norm_median": summarise_median(final["grad_norm"][ok]),
               "final_f_gap": mean_std(final["f"][ok] - 1.75),
               "first_step_near_minimiser": mean_std(first_hit.double())}
    return {name: value for name, value in metrics.items() if value is not None}


def run_synthetic(num_seeds: int = 100, num_steps: int = 5000, arms=tuple(SYNTHETIC_RULES), progress=True,
                  tuned_clip: float | None = None):
    """Every arm on the reported seeds ``0 .. num_seeds - 1``; with `tuned_clip`, also ``clipped_sgd_tuned`` (norm
    clipping at that threshold, chosen by `tune_synthetic_clipping` on the validation seeds)."""
    noise = stack_noise(range(num_seeds), num_steps)
    lrs = robbins_monro_lrs(num_steps)
    rules = {arm: SYNTHETIC_RULES[arm] for arm in arms}
    if tuned_clip is not None:
        rules["clipped_sgd_tuned"] = functools.partial(clipped_rule, max_norm=float(tuned_clip))
    results = {}
    for arm, rule in kit.progress(rules.items(), "(a) synthetic arms") if progress else rules.items():
        results[arm] = simulate(rule, noise, lrs, progress=arm if progress else None)
    return results


# ----------------------------------------------------------------------------- (b) Lightning vs vectorised
class float64_default:
    """Build under ``torch.set_default_dtype(torch.float64)``: what ``Trainer.init_module()`` does for ``precision:
    64-true``, so that the start point (8, 1e-3) is a float64 parameter from the start, not float32 rounded up."""

    def __enter__(self):
        self.dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)

    def __exit__(self, *exc) -> None:
        torch.set_default_dtype(self.dtype)


def lightning_final_iterate(config: str, overrides: dict, seed: int, num_steps: int):
    """Train ``config`` (`StochasticOracleModule`, float64) with ``overrides`` (the arm's callbacks) for `num_steps`
    steps on the noise of data seed `seed`, built as the CLI builds it (no validation, no logger or checkpoint);
    return (final x, diverged_at)."""
    flags = ["--config", str(kit.REPO_ROOT / config), *(runner.flag(k, v) for k, v in overrides.items()),
             runner.flag("trainer.max_steps", num_steps), runner.flag("data.init_args.num_steps", num_steps),
             "--trainer.limit_val_batches=0", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
             *runner.QUIET]
    with tempfile.TemporaryDirectory(prefix="tamed_sgd_check_") as root, runner.isolated():
        with float64_default():
            cli = runner.build_cli(flags, seed, Path(root))
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model.x.detach().clone(), int(cli.model.diverged_at_step)


def check_settings(check: dict | None = None) -> dict:
    """experiment.yaml's ``settings.check`` (the full run's when not given): seeds, steps, config, arms."""
    check = dict(check if check is not None else runner.load_spec("tamed_sgd").settings["check"])
    missing = sorted({"seeds", "steps", "config", "arms"} - set(check))
    unknown = sorted(set(check["arms"]) - set(SYNTHETIC_RULES)) if "arms" in check else []
    if missing or unknown:
        raise runner.ExperimentError(f"settings.check: missing {missing} / arms without a vectorised rule {unknown}; "
                                     f"give seeds, steps, config and arms among {sorted(SYNTHETIC_RULES)}")
    return check


def run_lightning_check(seeds=(0, 1, 2), num_steps: int = 1000, arms=None, check: dict | None = None):
    """(b): each arm of ``settings.check`` through Lightning and through `simulate` on the same noise; the largest
    absolute difference of the final iterates (over finite runs) and the divergence steps of both paths."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_modules.tamed_sgd.tamed_sgd"):
        logging.getLogger(name).setLevel(logging.ERROR)
    check = check_settings(check)
    noise = stack_noise(seeds, num_steps)
    lrs = robbins_monro_lrs(num_steps)
    rows = {}
    for arm in arms or list(check["arms"]):
        vectorised = simulate(SYNTHETIC_RULES[arm], noise, lrs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "training_step returned None" after a divergence, deprecations
            lightning = [lightning_final_iterate(check["config"], check["arms"][arm], seed, num_steps)
                         for seed in seeds]
        x_lightning = torch.stack([x for x, _ in lightning])
        finite = torch.isfinite(x_lightning).all(-1) & torch.isfinite(vectorised["x"]).all(-1)
        diff = (x_lightning - vectorised["x"]).abs().amax(-1)[finite]
        rows[arm] = {"max_abs_diff": diff.max().item() if diff.numel() else 0.0,
                     "diverged_steps_lightning": [step for _, step in lightning],
                     "diverged_steps_vectorised": vectorised["diverged_at"].tolist()}
    return rows


# ----------------------------------------------------------------------------- (c) MLP on digits, through Lightning
CHANCE_LOSS = math.log(10.0)
# The arms are experiment.yaml's ``digits/<arm>_lr<lr>``: plain SGD, "clipped_sgd" (Lightning's norm clipping at 1.0
# whatever the lr, the earlier fixed setting, kept as a reference row), tamed q = 1 and q = 0.5 (fixed by the method),
# and the candidates of the two tuned arms (``settings.digits.families``), the same number each, selected per
# learning rate on the VALIDATION split (mean over seeds of the final validation accuracy, ties: lower validation
# loss; the test split is never read): clipped SGD's threshold scales with 1/lr, max_norm = s / lr, so the clipped
# step is at most s long (the tamed q = 1 step is at most 1); the dissipative (r, a) grid holds the two settings
# reported before (r = 2, a = 1e-3 and r = 1, a = 0). At a constant lr the restoring term needs ``lr * a < 2``.
SELECTION_SPLIT = "validation (10% of the training part, disjoint from the test split)"


def select_candidate(results: dict, candidates, lr: float) -> str:
    """The candidate (name without ``_lr``) with the best mean validation accuracy over seeds at this lr; ties go
    to the lower mean validation loss (non-finite counts as +inf), then to the earlier candidate. Reads only
    ``val_accuracy`` and ``val_loss``."""
    def key(i_candidate):
        i, candidate = i_candidate
        result = results[f"{candidate}_lr{lr:g}"]
        loss = torch.nan_to_num(result["val_loss"].double(), nan=math.inf, posinf=math.inf)
        return (-result["val_accuracy"].double().mean().item(), loss.mean().item(), i)

    return min(enumerate(candidates), key=key)[1]


def tune_digits(results: dict, large_lrs, families: dict) -> tuple[dict, dict]:
    """Add ``<family>_lr<lr>`` (the selected candidate's runs) to a copy of `results`; return it and the record
    ``{family: {lr: {"candidates", "val_accuracy", "test_accuracy", "chosen"}}}`` (test accuracy only reported)."""
    tuned, record = dict(results), {}
    for family, candidates in families.items():
        if not all(f"{c}_lr{lr:g}" in results for c in candidates for lr in large_lrs):
            continue
        for lr in large_lrs:
            chosen = select_candidate(results, candidates, lr)
            tuned[f"{family}_lr{lr:g}"] = results[f"{chosen}_lr{lr:g}"]
            record.setdefault(family, {})[f"{lr:g}"] = {
                "split": SELECTION_SPLIT, "candidates": list(candidates), "chosen": chosen,
                "val_accuracy": [results[f"{c}_lr{lr:g}"]["val_accuracy"].mean().item() for c in candidates],
                "test_accuracy": [results[f"{c}_lr{lr:g}"]["test_accuracy"].mean().item() for c in candidates]}
    return tuned, record


class StepLossRecorder(Callback):
    """Records every training step's minibatch loss and its epoch (`ImageClassifier` logs ``train/loss`` on
    step only, so the epoch mean is computed here from the ``outputs`` of ``training_step``)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.epochs: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))
        self.epochs.append(trainer.current_epoch)

    def last_epoch_mean(self) -> float:
        if not self.losses:
            return math.nan
        last = self.epochs[-1]
        return sum(loss for loss, epoch in zip(self.losses, self.epochs) if epoch == last) / self.epochs.count(last)


def digits_metrics(result) -> dict[str, dict[str, float]]:
    loss = result["train_loss"]
    metrics = {"train_loss": mean_std(loss[torch.isfinite(loss)]),
               "val_accuracy": mean_std(result["val_accuracy"]),
               "test_accuracy": mean_std(result["test_accuracy"]),
               "nonfinite": mean_std(result["nonfinite"].float()),
               "failed": mean_std(result["failed"].float())}
    return {name: value for name, value in metrics.items() if value is not None}


# ----------------------------------------------------------------------------- reporting
def fmt(stat: dict[str, float] | None, digits: int = 3) -> str:
    if stat is None:
        return "n/a"
    return f"{stat['mean']:.{digits}g} ± {stat['std']:.{digits - 1}g}"


def table(rows: dict[str, dict[str, dict[str, float]]], columns: list[str]) -> str:
    lines = ["| arm | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {arm} | " + " | ".join(fmt(metrics.get(c)) for c in columns) + " |" for arm, metrics in rows.items()]
    return "\n".join(lines)


def draw(synthetic, digits, path: Path, shown_seeds: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    grid_x, grid_y = torch.meshgrid(torch.linspace(-1.5, 8.5, 300), torch.linspace(-1.6, 1.6, 200), indexing="xy")
    surface = get_objective("exp_saddle").value(torch.stack([grid_x, grid_y], -1).double())
    ax = axes[0, 0]
    ax.contourf(grid_x, grid_y, torch.log(surface - 1.75 + 1e-2), levels=30, cmap="Greys")
    for (arm, color) in (("tamed", "tab:blue"), ("dissipative_r2", "tab:orange"), ("clipped_sgd_tuned", "tab:green")):
        trajectory = synthetic[arm]["trajectory"][:, :shown_seeds]
        for run in range(trajectory.shape[1]):
            ax.plot(trajectory[:, run, 0], trajectory[:, run, 1], color=color, lw=0.8, alpha=0.7,
                    label=arm if run == 0 else None)
    ax.plot([0, 0], [-1, 1], "r*", ms=12, label="minima (0, ±1)")
    ax.plot([0], [0], "kx", ms=10, label="saddle (0, 0)")
    ax.set(xlim=(-1.5, 8.5), ylim=(-1.6, 1.6), xlabel="x", ylabel="y",
           title=f"(a) trajectories from (8, 1e-3), first {shown_seeds} seeds")
    ax.legend(loc="upper right", fontsize=8)
    for ax, (name, title) in zip((axes[0, 1], axes[1, 0]), (("f", "median f(x_n) - f* (non-diverged runs)"),
                                                          ("dist_to_min", "fraction within 0.1 of a minimiser"))):
        for arm, result in synthetic.items():
            history = result["history"][name]
            if name == "f":
                finite = torch.where(torch.isfinite(history), history - 1.75, torch.nan)
                curve = finite.nanmedian(dim=1).values
            else:
                curve = ((history < NEAR) & ~result["diverged"]).double().mean(1)
            ax.plot(curve, label=arm)
        ax.set(xlabel="step n", title=f"(a) {title}", xscale="log")
        if name == "f":
            ax.set(yscale="log", ylim=(1e-7, 1e5), title="(a) median f(x_n) - f*, non-diverged runs")
        ax.legend(fontsize=8)
    ax = axes[1, 1]
    colors = {"plain_sgd": "tab:red", "clipped_sgd": "tab:olive", "clipped_sgd_tuned": "tab:green",
              "tamed": "tab:blue", "tamed_sqrt_lr": "tab:cyan", "dissipative_tuned": "tab:orange"}
    for arm, result in digits.items():
        rule, lr = arm.rsplit("_lr", 1)
        curve = result["curve"].nanmean(dim=1)
        smooth = F.avg_pool1d(curve.view(1, 1, -1), 10, stride=1).flatten()
        style = {"50": "-", "5": "--"}.get(lr, ":")
        ax.plot(smooth, label=arm, lw=1.0, color=colors[rule], linestyle=style)
    ax.set(xlabel="SGD step", ylabel="minibatch train loss (mean over seeds, 10-step average)", yscale="log",
           title="(c) MLP on digits via Lightning: solid lr 50, dashed lr 5, dotted plain lr 0.5")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def per_run_values(synthetic, digits) -> list[dict[str, dict[str, float]]]:
    """``per_seed``: each synthetic run's final values (index = run), and each digits seed's (index = seed)."""
    runs = []
    for arm, result in synthetic.items():
        final = {name: values[-1] for name, values in result["history"].items()}
        hit = result["history"]["dist_to_min"] < NEAR
        for i, diverged in enumerate(result["diverged"].tolist()):
            if i == len(runs):
                runs.append({})
            row = {"diverged": float(diverged)}
            if not diverged:
                row.update(near_minimiser=float(final["dist_to_min"][i] < NEAR),
                           near_saddle=float(final["dist_to_saddle"][i] < NEAR),
                           final_grad_norm=float(final["grad_norm"][i]), final_f_gap=float(final["f"][i] - 1.75))
                if hit[:, i].any():
                    row["first_step_near_minimiser"] = float(hit[:, i].float().argmax())
            runs[i][f"synthetic/{arm}"] = row
    for arm, result in digits.items():
        for j in range(len(result["failed"])):
            if j == len(runs):
                runs.append({})
            row = {name: float(result[name][j]) for name in ("val_accuracy", "test_accuracy", "nonfinite", "failed")}
            if math.isfinite(result["train_loss"][j]):
                row["train_loss"] = float(result["train_loss"][j])
            runs[j][f"digits/{arm}"] = row
    return runs


# ----------------------------------------------------------------------------- the runner's hooks
CHECK_COLUMNS = ["diverged", "near_minimiser", "near_saddle", "final_grad_norm_median", "final_f_gap",
                 "first_step_near_minimiser"]
DIGITS_COLUMNS = ["train_loss", "val_accuracy", "test_accuracy", "nonfinite", "failed"]
_DRAWN: dict = {}  # what `report` computed and `plot` draws (the runner calls plot right after report)


def accuracy_and_loss(model, loader) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` over `loader`."""
    correct = total = 0
    loss = 0.0
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images)
            correct += (logits.argmax(-1) == labels).sum().item()
            loss += F.cross_entropy(logits, labels, reduction="sum").item()
            total += len(labels)
    return correct / total, loss / total


def evaluate(run) -> dict[str, float]:
    """A digits arm after ``fit``: final train loss (the last epoch's mean minibatch loss, from the config's
    `StepLossRecorder`), validation accuracy and loss (what tuning reads), test accuracy (what is reported, by a
    direct pass over the test loader), ``nonfinite`` (that loss or a weight is not finite) and ``failed`` (nonfinite,
    or the final train loss not below ln 10). The step curve is kept for the plot."""
    recorder = next((c for c in run.trainer.callbacks if isinstance(c, StepLossRecorder)), None)
    if recorder is None:
        raise runner.ExperimentError(f"{run.arm.name}: no StepLossRecorder in the trainer's callbacks; keep "
                                     "{class_path: experiments.tamed_sgd.StepLossRecorder} in trainer.callbacks")
    model = run.model.eval()
    val_accuracy, val_loss = accuracy_and_loss(model, run.datamodule.val_dataloader())
    test_accuracy, _ = accuracy_and_loss(model, run.datamodule.test_dataloader())
    train_loss = recorder.last_epoch_mean()
    weights_finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    nonfinite = not (math.isfinite(train_loss) and weights_finite)
    run.extra["curve"] = list(recorder.losses)
    return {"train_loss": train_loss, "test_accuracy": test_accuracy, "val_accuracy": val_accuracy,
            "val_loss": val_loss, "nonfinite": float(nonfinite),
            "failed": float(nonfinite or not train_loss < CHANCE_LOSS)}


def digits_results(spec, records: list[dict], per_seed: list[dict]) -> dict:
    """The digits runs as ``{"<arm>_lr<lr>": {metric: tensor over seeds, "curve": (steps, seeds)}}`` in the order of
    experiment.yaml's arms (the tuning and the table read this form)."""
    results = {}
    for arm in spec.arms:
        seeds = [s for s, row in enumerate(per_seed) if arm.name in row]
        if not arm.name.startswith("digits/") or not seeds:
            continue
        rows = [per_seed[s][arm.name] for s in seeds]
        curve = torch.tensor([records[s][""][arm.name]["curve"] for s in seeds], dtype=torch.float64).T
        results[arm.name.removeprefix("digits/")] = {
            **{name: torch.tensor([row[name] for row in rows], dtype=torch.float64)
               for name in ("train_loss", "test_accuracy", "val_accuracy", "val_loss")},
            **{name: torch.tensor([bool(row[name]) for row in rows]) for name in ("nonfinite", "failed")},
            "curve": torch.where(torch.isfinite(curve), curve, torch.nan)}
    return results


def more_pairs(per_seed: list[dict], blocks: list[dict]) -> dict:
    """``settings.paired``: pairs against further baselines ({baseline, arms, metrics}; arms or a baseline a smoke
    run lacks are left out)."""
    from icml26.paired import paired_block

    known = {arm for row in per_seed for arm in row}
    seen = {m for row in per_seed for cells in row.values() for m in cells}
    pairs = {}
    for block in blocks:
        arms = [a for a in block["arms"] if a in known] if block.get("arms") else None
        metrics = [m for m in block["metrics"] if m in seen] if block.get("metrics") else None
        if block["baseline"] in known and arms != [] and metrics != []:
            pairs.update(paired_block(per_seed, block["baseline"], metrics, arms))
    return pairs


def report(result: dict, records: list[dict], spec) -> dict:
    """(a) the vectorised benchmark on the experiment's seeds (clipped SGD's norm tuned on the validation seeds),
    (b) the Lightning-vs-vectorised check, (c) the tuned digits arms chosen on validation; returns the table
    (``arms``, sample stds and medians as published), ``per_seed`` (each run), ``lightning_check``,
    ``synthetic_clip_selection``, ``digits_selection`` and the ``settings.paired`` pairs; prints the tables."""
    settings = spec.settings
    synthetic_settings, check_setting, digits_settings = (settings[k] for k in ("synthetic", "check", "digits"))
    steps = synthetic_settings["steps"]
    clip_selection = tune_synthetic_clipping(synthetic_settings["val_seeds"], steps,
                                             tuple(synthetic_settings.get("clip_grid", SYNTHETIC_CLIP_GRID)))
    synthetic = run_synthetic(spec.seeds, steps, tuned_clip=clip_selection["chosen"], progress=False)
    check = run_lightning_check(seeds=tuple(range(check_setting["seeds"])), num_steps=check_setting["steps"],
                                check=check_setting)
    digits_runs = digits_results(spec, records, result["per_seed"])
    large_lrs = tuple(float(lr) for lr in digits_settings["large_lrs"])
    families = {family: tuple(candidates) for family, candidates in digits_settings["families"].items()}
    digits_all, digits_selection = tune_digits(digits_runs, large_lrs, families)
    shown = ["plain_sgd", "clipped_sgd", *families, "tamed", "tamed_sqrt_lr"]
    digits = {key: digits_all[key] for key in ("plain_sgd_lr0.5",) if key in digits_all}
    digits.update({f"{arm}_lr{lr:g}": digits_all[f"{arm}_lr{lr:g}"] for lr in large_lrs for arm in shown
                   if f"{arm}_lr{lr:g}" in digits_all})

    arms = {f"synthetic/{arm}": synthetic_metrics(result) for arm, result in synthetic.items()}
    arms.update({f"lightning_check/{arm}": {"max_abs_diff": {"mean": row["max_abs_diff"], "std": 0.0}}
                 for arm, row in check.items()})
    arms.update({f"digits/{arm}": digits_metrics(result) for arm, result in digits.items()})
    per_seed = per_run_values(synthetic, digits_runs)

    print(f"\n## (a) {spec.seeds} seeds, {steps} steps, start (8, 1e-3), gamma_n = 0.5/(n+10)^0.7\n")
    print(f"clipped SGD threshold chosen on {clip_selection['split']}: {clip_selection['chosen']:g} "
          f"(grid {clip_selection['grid']}, validation near-minimiser fractions "
          f"{[round(v, 3) for v in clip_selection['val_near_minimiser']]}, mean first steps "
          f"{[round(v) for v in clip_selection['val_mean_first_step_near_minimiser']]})\n")
    print(table({arm: synthetic_metrics(result) for arm, result in synthetic.items()}, CHECK_COLUMNS))
    print(f"\n## (b) Lightning path vs vectorised path, seeds 0-{check_setting['seeds'] - 1}, "
          f"{check_setting['steps']} steps, float64\n")
    print("| arm | max abs diff of final x | diverged at step (Lightning) | diverged at step (vectorised) |")
    print("|---|---|---|---|")
    for arm, row in check.items():
        print(f"| {arm} | {row['max_abs_diff']:.3g} | {row['diverged_steps_lightning']} | "
              f"{row['diverged_steps_vectorised']} |")
    print("\n## (c) MLP 64-64-10 on digits, constant lr\n")
    print(table({arm: digits_metrics(result) for arm, result in digits.items()}, DIGITS_COLUMNS))
    for family, by_lr in digits_selection.items():
        for lr, row in by_lr.items():
            print(f"{family} at lr {lr}: chose {row['chosen']} on the validation split; candidates "
                  + ", ".join(f"{c} val {v:.3f} (test {t:.3f})" for c, v, t in
                              zip(row["candidates"], row["val_accuracy"], row["test_accuracy"])))
    _DRAWN.update(synthetic=synthetic, digits=digits)
    return {"arms": arms, "per_seed": per_seed, "lightning_check": check, "synthetic_clip_selection": clip_selection,
            "digits_selection": digits_selection, "std": "sample (ddof 1)",
            "paired": more_pairs(per_seed, settings.get("paired") or [])}


def plot(result: dict, path) -> None:
    """``<out>/tamed_sgd.png``: (a) trajectories, median gap and near-minimiser fraction, (c) the step losses."""
    if not _DRAWN:
        raise runner.ExperimentError("tamed_sgd's plot draws what its report computed; run the experiment")
    draw(_DRAWN["synthetic"], _DRAWN["digits"], Path(path))


def digits_run(arm: str, seed: int = 0, overrides: dict | None = None) -> tuple[dict[str, float], list[float]]:
    """One digits arm of experiment.yaml (``arm`` without the ``digits/`` prefix) on ``seed``, with ``overrides``
    after the experiment's, built, fitted and evaluated as the runner does, in a temporary folder: (metrics,
    minibatch loss curve). For a single comparison (tests) without the whole grid."""
    spec = runner.load_spec("tamed_sgd")
    source = next((a for a in spec.arms if a.name == f"digits/{arm}"), None)
    if source is None:
        raise runner.ExperimentError(f"no arm digits/{arm} in configs/tamed_sgd/experiment.yaml")
    spec.set_overrides = dict(overrides or {})
    with tempfile.TemporaryDirectory(prefix="tamed_sgd_run_") as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few batches vs log_every_n_steps, a NaN loss
        run = runner.Run(spec, source, None, seed, Path(root), Path(root))
        metrics = runner.execute(run, evaluate)
    return metrics, run.extra["curve"]


if __name__ == "__main__":  # the older spelling: python -m experiments.tamed_sgd [runner flags]
    import sys

    sys.exit(runner.experiment_command(["tamed_sgd", *sys.argv[1:]]))
