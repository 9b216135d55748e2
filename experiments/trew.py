"""Reproduce TREW's central claim at small scale: ``python -m experiments.trew`` (digits, CPU).

Claim (arXiv 2506.20893): class-unlearning methods leave the forget class's inputs with a predictive
distribution unlike a retrained model's, which a neighbour-class attack (CMIA) detects; TREW, which matches
a similarity-tilted version of the original distribution, gets closest to retraining.

Protocol per seed (the real modules, built from the configs the CLI runs and trained with Lightning):
1. the original ``ImageClassifier`` (MLP 64-128-10, Adam 1e-3, 40 epochs) on all digits:
   ``configs/trew/classifier_quick.yaml``;
2. four retrained models without the forget class (``configs/trew/retrain_quick.yaml``, the same recipe, each
   with its own seed, `MODEL_SEEDS`): R, the reference every test metric compares with; R2, a second retrain
   compared with R (the *floor* any method can hope for); A, the CMIA attacker's shadow model; and S, the
   *selection* model: every arm's hyper-parameters are chosen by the mean total-variation distance to S on the
   validation forget inputs, so that selection reads neither the test inputs nor the model R the test metric
   compares with;
3. unlearning runs from the original (``ClassUnlearning`` from ``configs/trew/quick.yaml``, ``init_from`` the
   original; the experiment sets the method, learning rate, forget weight and the TREW callback's arguments).
   Every run validates after each epoch against S (``reference_from``) and keeps its best epoch, so the number
   of epochs is read off the run. Every selected arm picks from the same number of (configuration, epoch)
   points, 125 at the defaults (`grid_points`):
   TREW, per similarity (the paper's weights; the original model's confusions): beta x T (24 + beta = 0) at
   the config's learning rate 1e-3, epochs 1-5; FT: learning rate (5 values), epochs 1-25 (FT has no other
   knob, so its runs are longer: the same points and the same training epochs); NegGrad+: learning rate x
   ascent weight (5 x 5), epochs 1-5; RL: learning rate x random-label weight (5 x 5), epochs 1-5.
   Fixed arms read off the same runs: FT, NegGrad+ (ascent weight 0.1) and RL as first hand-set (Adam 1e-3,
   5 epochs), TREW at the paper default (weights, beta 10, T 0.1, 5 epochs), and the beta = 0 ablation (its
   epoch read off on validation like every grid point);
4. metrics on held-out data: forget / retain test accuracy, forget-train accuracy, MIA efficacy, TV to R on
   test forget inputs, CMIA detection rate and its gap to R; and the validation criterion (TV to S).

Writes ``results/trew.json`` (with ``chosen``: every selected arm's configuration per seed) and
``results/trew.png``, prints a markdown table (mean ± std over seeds). Classifiers are seeded with seed +
`MODEL_SEEDS` offsets, every unlearning run with seed.
"""
from __future__ import annotations

import copy
import itertools
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

from callbacks.trew import TREWReweighting
from experiments import kit
from lightning_modules.trew.trew import (CMIAttack, mia_efficacy, neighbour_classes, predict_probabilities,
                                         total_variation)

CLASSIFIER_CONFIG = "configs/trew/classifier_quick.yaml"   # stage 1: the original
RETRAIN_CONFIG = "configs/trew/retrain_quick.yaml"         # the same without the forget class: R, R2, A, S
UNLEARN_CONFIG = "configs/trew/quick.yaml"                 # stage 2: ClassUnlearning from the original

# seed offsets of the classifiers trained per seed; every retrained model has its own
MODEL_SEEDS = {"original": 0, "reference": 1000, "floor": 2000, "shadow": 3000, "selection": 4000}
SELECTION_MONITOR = "val/tv_to_reference"   # ClassUnlearning's TV to its `reference_from` (here S) on val forget

BETA_GRID = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
TEMPERATURE_GRID = (0.1, 0.3, 1.0, 3.0)
LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
NEGGRAD_WEIGHT_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
RL_WEIGHT_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)
HAND_SET = {"lr": 1e-3, "neggrad_weight": 0.1, "rl_weight": 1.0}   # the fixed baselines of the first version
METRICS = ("forget_acc", "retain_acc", "forget_train_acc", "mia_efficacy", "tv_to_retrain", "cmia_rate",
           "cmia_gap", "val_tv_to_selection")


def fit(model, datamodule, epochs: int, callbacks=()) -> torch.nn.Module:
    trainer = kit.quiet_trainer(callbacks, max_epochs=epochs, deterministic=True, limit_val_batches=0)
    trainer.fit(model, datamodule=datamodule)
    return model.eval()


def train_classifier(seed: int, data_seed: int, forget_class: int, epochs: int, retain_only: bool):
    """The config's ImageClassifier, seeded with `seed`, on digits split by `data_seed`; returns (model, data).

    ``retain_only`` starts from ``retrain_quick.yaml`` (train without the forget class), as the CLI does."""
    model, data = kit.from_config(RETRAIN_CONFIG if retain_only else CLASSIFIER_CONFIG, f"--seed_everything={seed}",
                                  f"--data.init_args.forget_class={forget_class}", f"--data.init_args.seed={data_seed}")
    data.setup("fit")
    return fit(model, data, epochs), data


class Evaluator:
    """Held-out outputs for the test metrics (against the reference R, with the CMIA attack fit on the shadow A)
    and the validation criterion (against the separate selection model S).

    R's outputs are kept on test inputs only and S's on validation forget inputs only, so the selection
    criterion cannot read R and the test metrics cannot read S.
    """

    def __init__(self, data, reference: torch.nn.Module, shadow: torch.nn.Module, selection: torch.nn.Module,
                 forget_class: int, seed: int) -> None:
        if selection is reference or selection is shadow or shadow is reference:
            raise ValueError("the reference R, the shadow A and the selection model S must be different models")
        self.data, self.forget_class, self.seed = data, forget_class, seed
        self.reference = self.outputs(reference)
        self.selection_val_forget = predict_probabilities(selection, data.forget_dataloader("val"))[0]
        shadow_test = self.outputs(shadow)["test"]
        neighbours = neighbour_classes(shadow_test[0][shadow_test[1] == forget_class], forget_class, 3)
        self.attack = CMIAttack(forget_class, neighbours, seed).fit(*shadow_test)
        self.reference_rate = self.attack.detection_rate(*self.reference["test"])

    def outputs(self, model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        data = self.data
        return {
            "test": predict_probabilities(model, data.test_dataloader()),
            "test_forget": predict_probabilities(model, data.forget_dataloader("test")),
            "train_forget": predict_probabilities(model, data.forget_dataloader("train")),
            "train_retain": predict_probabilities(model, data.retain_dataloader("train")),
            "test_retain": predict_probabilities(model, data.retain_dataloader("test")),
        }

    def validation_tv(self, model) -> float:
        """The selection criterion: mean TV to S on the validation forget inputs."""
        return total_variation(predict_probabilities(model, self.data.forget_dataloader("val"))[0],
                               self.selection_val_forget)

    def metrics(self, model) -> dict[str, float]:
        out = self.outputs(model)

        def accuracy(key: str) -> float:
            probs, labels = out[key]
            return float((probs.argmax(-1) == labels).float().mean())

        rate = self.attack.detection_rate(*out["test"])
        return {
            "forget_acc": 100 * accuracy("test_forget"),
            "retain_acc": 100 * accuracy("test_retain"),
            "forget_train_acc": 100 * accuracy("train_forget"),
            "mia_efficacy": 100 * mia_efficacy(out["train_retain"], out["test_retain"], out["train_forget"],
                                               seed=self.seed),
            "tv_to_retrain": total_variation(out["test_forget"][0], self.reference["test_forget"][0]),
            "cmia_rate": 100 * rate,
            "cmia_gap": 100 * abs(rate - self.reference_rate),
            "val_tv_to_selection": self.validation_tv(model),
        }


class EpochReadOff(kit.KeepBest):
    """`kit.KeepBest` on the lowest validation criterion that also knows the epoch (1-based) of the kept state,
    every epoch's score, and a copy of the state after ``snapshot_epoch`` (a fixed-length arm read off the same
    run)."""

    def __init__(self, monitor: str = SELECTION_MONITOR, snapshot_epoch: int | None = None) -> None:
        super().__init__(monitor, mode="min")
        self.snapshot_epoch = snapshot_epoch
        self.best_epoch: int | None = None
        self.scores: list[float] = []
        self.snapshot: dict[str, torch.Tensor] | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        kept = self.best_state
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch + 1
        self.scores.append(float(trainer.callback_metrics[self.monitor]))
        if self.best_state is not kept:
            self.best_epoch = epoch
        if epoch == self.snapshot_epoch:
            self.snapshot = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()}


@dataclass
class Run:
    """One unlearning run: the model at its best validation epoch, that epoch and score, its configuration."""
    model: torch.nn.Module
    val_tv: float
    epoch: int
    config: dict
    snapshot: dict | None = field(default=None, repr=False)

    def chosen(self) -> dict:
        return {**self.config, "epochs": self.epoch}

    def snapshot_model(self) -> torch.nn.Module:
        model = copy.deepcopy(self.model)
        model.load_state_dict(self.snapshot)
        return model.eval()


def unlearn(method: str, checkpoint: str, selection_checkpoint: str, data, forget_class: int, epochs: int,
            seed: int, lr: float, forget_weight: float = 1.0, snapshot_epoch: int | None = None,
            **trew_args) -> Run:
    """``configs/trew/quick.yaml``'s ClassUnlearning with this run's method, learning rate and forget weight, from
    `checkpoint`, trained on `data` for `epochs` epochs, validated after each against the selection model
    (``reference_from=selection_checkpoint``); the returned model holds the best epoch's weights. The config's
    TREW callback is replaced by one with this run's beta, T and similarity."""
    model, _ = kit.from_config(UNLEARN_CONFIG, f"--seed_everything={seed}", f"--model.init_args.method={method}",
                               f"--model.init_args.forget_class={forget_class}",
                               f"--model.init_args.forget_weight={forget_weight}",
                               f"--model.init_args.optimizer.init_args.lr={lr}",
                               f"--model.init_args.init_from={checkpoint}",
                               f"--model.init_args.reference_from={selection_checkpoint}",
                               f"--data.init_args.forget_class={forget_class}", f"--data.init_args.seed={seed}")
    readoff = EpochReadOff(snapshot_epoch=snapshot_epoch)
    callbacks = [TREWReweighting(**trew_args)] if method == "trew" else []
    trainer = kit.quiet_trainer([*callbacks, readoff], max_epochs=epochs, deterministic=True)
    trainer.fit(model, datamodule=data)
    readoff.restore(model)
    config = {"lr": lr} if method == "finetune" else {"lr": lr, "forget_weight": forget_weight}
    if method == "trew":
        config.update(similarity=trew_args["similarity"], beta=trew_args["beta"],
                      temperature=trew_args["temperature"])
    return Run(model.eval(), readoff.best_score, readoff.best_epoch, config, readoff.snapshot)


def trew_grid(source: str, beta_grid, temperature_grid) -> list[tuple[str, float, float]]:
    """TREW's candidates for one similarity source: beta = 0 (which ignores the similarity and T) and
    every (beta > 0, T)."""
    return [("weights", 0.0, 1.0)] + [(source, beta, t) for beta, t in itertools.product(beta_grid[1:],
                                                                                          temperature_grid)]


def grid_points(args) -> dict[str, int]:
    """(configuration, epoch) points every selected arm chooses from."""
    trew = len(trew_grid("weights", args.beta_grid, args.temperature_grid)) * args.unlearn_epochs
    return {"TREW weights similarity": trew, "TREW confusion similarity": trew,
            "FT": len(args.lr_grid) * args.ft_epochs,
            "NegGrad+": len(args.lr_grid) * len(args.neggrad_weight_grid) * args.unlearn_epochs,
            "RL": len(args.lr_grid) * len(args.rl_weight_grid) * args.unlearn_epochs}


def select(runs: list[Run]) -> Run:
    """The run with the lowest validation TV to S (the first in grid order on ties)."""
    return min(runs, key=lambda run: run.val_tv)


def run_seed(seed: int, args) -> tuple[dict[str, dict[str, float]], dict[str, dict]]:
    """Every arm on one seed: ``({arm: metrics}, {selected arm: chosen configuration})``."""
    f, epochs = args.forget_class, args.original_epochs

    def classifier(role: str):
        return train_classifier(seed + MODEL_SEEDS[role], seed, f, epochs, retain_only=role != "original")[0]

    original, data_all = train_classifier(seed + MODEL_SEEDS["original"], seed, f, epochs, retain_only=False)
    reference, second_retrain, shadow, selection = (classifier(role) for role in
                                                    ("reference", "floor", "shadow", "selection"))
    evaluator = Evaluator(data_all, reference, shadow, selection, f, seed)
    hand, short = HAND_SET, args.unlearn_epochs

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, selection_checkpoint = os.path.join(tmp, "original.ckpt"), os.path.join(tmp, "selection.ckpt")
        torch.save({"state_dict": original.state_dict()}, checkpoint)
        torch.save({"state_dict": selection.state_dict()}, selection_checkpoint)

        def run(method: str, run_epochs: int = short, **kwargs) -> Run:
            result = unlearn(method, checkpoint, selection_checkpoint, data_all, f, run_epochs, seed, **kwargs)
            check = evaluator.validation_tv(result.model)
            if abs(check - result.val_tv) > 1e-4:  # the in-training criterion must be the evaluator's (TV to S)
                raise RuntimeError(f"validation criterion {result.val_tv} != TV to the selection model {check}")
            return result

        results = {"original": evaluator.metrics(original),
                   "retrain (2nd seed, floor)": evaluator.metrics(second_retrain)}
        chosen: dict[str, dict] = {}
        lr_hand = args.lr_grid.index(hand["lr"])
        ft = [run("finetune", args.ft_epochs, lr=lr, snapshot_epoch=short if lr == hand["lr"] else None)
              for lr in kit.progress(args.lr_grid, f"seed {seed} FT grid")]
        neggrad = [run("neggrad_plus", lr=lr, forget_weight=w, snapshot_epoch=short)
                   for lr, w in kit.progress(list(itertools.product(args.lr_grid, args.neggrad_weight_grid)),
                                             f"seed {seed} NegGrad+ grid")]
        rl = [run("random_labels", lr=lr, forget_weight=w, snapshot_epoch=short)
              for lr, w in kit.progress(list(itertools.product(args.lr_grid, args.rl_weight_grid)),
                                        f"seed {seed} RL grid")]
        hand_runs = {
            "FT": ft[lr_hand],
            "NegGrad+": neggrad[lr_hand * len(args.neggrad_weight_grid)
                                + args.neggrad_weight_grid.index(hand["neggrad_weight"])],
            "RL": rl[lr_hand * len(args.rl_weight_grid) + args.rl_weight_grid.index(hand["rl_weight"])],
        }
        for name, runs in (("FT", ft), ("NegGrad+", neggrad), ("RL", rl)):
            results[f"{name} hand-set"] = evaluator.metrics(hand_runs[name].snapshot_model())
            best = select(runs)
            results[f"{name} val-selected"] = evaluator.metrics(best.model)
            chosen[f"{name} val-selected"] = best.chosen()

        keys = dict.fromkeys(key for source in ("weights", "confusion")   # beta = 0 is shared: run once
                             for key in trew_grid(source, args.beta_grid, args.temperature_grid))
        trew = {key: run("trew", lr=hand["lr"], beta=key[1], temperature=key[2], similarity=key[0],
                         snapshot_epoch=short) for key in kit.progress(keys, f"seed {seed} TREW grid")}
        results["diagnostic: similarity vs retrained"] = similarity_diagnostic(original, evaluator, f)
        results["TREW paper default (beta 10, T 0.1)"] = evaluator.metrics(
            trew[("weights", 10.0, 0.1)].snapshot_model())
        for source in ("weights", "confusion"):
            best = select([trew[key] for key in trew_grid(source, args.beta_grid, args.temperature_grid)])
            results[f"TREW {source} similarity, val-selected"] = evaluator.metrics(best.model)
            chosen[f"TREW {source} similarity, val-selected"] = best.chosen()
        beta0 = trew[("weights", 0.0, 1.0)]
        results["TREW beta 0 (ablation)"] = evaluator.metrics(beta0.model)
        chosen["TREW beta 0 (ablation)"] = beta0.chosen()
    return results, chosen


def similarity_diagnostic(original, evaluator: Evaluator, forget_class: int) -> dict[str, float]:
    """Does TREW's weight similarity point where a retrained model sends forget inputs?

    Spearman correlation over j != f between s (T = 1) and R's mean probability on test forget inputs, and
    whether their top classes agree. Also the TV between R's and the renormalised original's *mean*
    distributions: how much the beta = 0 target already knows. (A diagnostic: nothing is selected on it.)
    """
    from scipy.stats import spearmanr

    from lightning_modules.shared.classifier import final_linear
    from lightning_modules.trew.trew import class_similarity

    similarity = class_similarity(final_linear(original.net).weight.detach(), forget_class, temperature=1.0)
    reference_mean = evaluator.reference["test_forget"][0].mean(0)
    original_probs = predict_probabilities(original, evaluator.data.forget_dataloader("test"))[0]
    original_probs[:, forget_class] = 0
    renormalised_mean = (original_probs / original_probs.sum(-1, keepdim=True)).mean(0)
    others = [j for j in range(len(similarity)) if j != forget_class]
    return {
        "spearman": float(spearmanr(similarity[others], reference_mean[others]).statistic),
        "top_class_agrees": float(similarity.argmax() == reference_mean.argmax()),
        "tv_mean_renormalised_original": float(0.5 * (renormalised_mean - reference_mean).abs().sum()),
    }


def markdown_table(arms: dict) -> str:
    header = "| arm | " + " | ".join(METRICS) + " |"
    lines = [header, "|" + "---|" * (len(METRICS) + 1)]
    for arm, metrics in arms.items():
        if arm.startswith("diagnostic"):
            continue
        cells = [f"{metrics[m]['mean']:.3f} ± {metrics[m]['std']:.3f}" if "tv" in m
                 else f"{metrics[m]['mean']:.1f} ± {metrics[m]['std']:.1f}" for m in METRICS]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(arms: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [a for a in arms if a != "original" and not a.startswith("diagnostic")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, metric, label in zip(axes, ("tv_to_retrain", "cmia_gap", "retain_acc"),
                                 ("TV to retrained model R (lower = closer)", "CMIA gap to R, points",
                                  "retain test accuracy, %")):
        means = [arms[a][metric]["mean"] for a in names]
        stds = [arms[a][metric]["std"] for a in names]
        ax.barh(names, means, xerr=stds, color=["tab:orange" if "val-selected" in a else "tab:blue"
                                                 for a in names])
        ax.set_xlabel(label)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    axes[2].set_yticklabels([])
    fig.suptitle("TREW vs class-unlearning baselines on digits (mean ± std over seeds; orange: selected on "
                 "validation TV to a separate retrained model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None):
    """The command line, with every arm's grid attached (tiny grids under ``--smoke``)."""
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=5)
    parser.add_argument("--forget-class", type=int, default=8)
    parser.add_argument("--original-epochs", type=int, default=40)
    parser.add_argument("--unlearn-epochs", type=int, default=5,
                        help="epochs of TREW, NegGrad+ and RL runs (read off on validation); the hand-set length")
    parser.add_argument("--ft-epochs", type=int, default=25,
                        help="epochs of FT runs (FT tunes only the learning rate: same points, same compute)")
    args = parser.parse_args(argv)
    args.beta_grid, args.temperature_grid = BETA_GRID, TEMPERATURE_GRID
    args.lr_grid, args.neggrad_weight_grid, args.rl_weight_grid = LR_GRID, NEGGRAD_WEIGHT_GRID, RL_WEIGHT_GRID
    if args.smoke:  # the pipeline in seconds: 1-epoch models, 2 points per selected arm
        args.original_epochs, args.unlearn_epochs, args.ft_epochs = 1, 1, 2
        args.beta_grid, args.temperature_grid = (0.0, 10.0), (0.1,)
        args.lr_grid, args.neggrad_weight_grid, args.rl_weight_grid = (HAND_SET["lr"],), (0.1, 1.0), (1.0, 3.0)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)  # init_from reports, once per run
    logging.getLogger("callbacks").setLevel(logging.ERROR)

    start = time.time()
    per_seed, chosen = [], {}
    for seed in kit.progress(range(args.seeds), "seeds"):
        metrics, picks = run_seed(seed, args)
        print(f"seed {seed} done, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
        per_seed.append(metrics)
        for arm, pick in picks.items():
            chosen.setdefault(arm, []).append(pick)
    arms = kit.summarise(per_seed)
    config = {"classifier_config": CLASSIFIER_CONFIG, "retrain_config": RETRAIN_CONFIG,
              "unlearn_config": UNLEARN_CONFIG, "forget_class": args.forget_class,
              "original_epochs": args.original_epochs, "unlearn_epochs": args.unlearn_epochs,
              "ft_epochs": args.ft_epochs, "model_seed_offsets": MODEL_SEEDS, "hand_set": HAND_SET,
              "selection": "lowest mean TV to the selection model S (seed + 4000) on validation forget inputs, "
                           "over (configuration, epoch); test metrics compare with R (seed + 1000)",
              "beta_grid": args.beta_grid, "temperature_grid": args.temperature_grid, "lr_grid": args.lr_grid,
              "neggrad_weight_grid": args.neggrad_weight_grid, "rl_weight_grid": args.rl_weight_grid,
              "grid_points": grid_points(args), "smoke": args.smoke}
    result = kit.write_result("TREW / CMIA (arXiv 2506.20893)", seeds=args.seeds, wall_s=time.time() - start,
                              config=config, arms=arms, per_seed=per_seed, out=args.out, name="trew",
                              chosen=chosen)
    plot(arms, os.path.join(args.out, "trew.png"))
    print(markdown_table(arms))
    print(f"\nwall {result['wall_s']:.0f} s")
    for arm, picks in chosen.items():
        print(f"{arm}: chosen per seed {picks}")
    diagnostic = arms["diagnostic: similarity vs retrained"]
    print("similarity diagnostic (mean ± std): " + ", ".join(
        f"{k} {v['mean']:.2f} ± {v['std']:.2f}" for k, v in diagnostic.items()))
    return result


if __name__ == "__main__":
    main()
