"""Reproduce TREW's central claim at small scale: ``python -m experiments.trew`` (digits, CPU, ~5 min).

Claim (arXiv 2506.20893): class-unlearning methods leave the forget class's inputs with a predictive
distribution unlike a retrained model's, which a neighbour-class attack (CMIA) detects; TREW, which matches
a similarity-tilted version of the original distribution, gets closest to retraining.

Protocol per seed (the real modules, built from the configs the CLI runs and trained with Lightning):
1. the original ``ImageClassifier`` (MLP 64-128-10, Adam 1e-3, 40 epochs) on all digits:
   ``configs/trew/classifier_quick.yaml``;
2. three retrained references without the forget class (``configs/trew/retrain_quick.yaml``, the same recipe):
   R (the reference every arm is compared to), R2 (a second retrain: the *floor* any method can hope for),
   A (the CMIA attacker's shadow model);
3. unlearning arms from the original, 5 epochs each (``ClassUnlearning`` from ``configs/trew/quick.yaml``,
   ``init_from`` the original; the experiment sets the method and the TREW callback's arguments per arm):
   FT, NegGrad+, RL, TREW at the
   paper default (beta 10, T 0.1), TREW with (beta, T) chosen on the *validation* forget inputs by TV to R
   (for the paper's weight similarity and for the confusion similarity, beta = 0 among the candidates),
   and the beta = 0 ablation;
4. metrics on held-out data: forget / retain test accuracy, forget-train accuracy, MIA efficacy, TV to R
   on test forget inputs, CMIA detection rate and its gap to R.

Writes ``results/trew.json`` and ``results/trew.png``, prints a markdown table (mean ± std over seeds).
Every run of a seed is seeded as before the move to the configs (``--seed_everything`` = seed, seed + 1000,
+ 2000, + 3000 for the classifiers; seed for every unlearning arm), so the numbers are those of the README.
"""
from __future__ import annotations

import itertools
import logging
import os
import tempfile
import time

import torch

from callbacks.trew import TREWReweighting
from experiments import kit
from lightning_modules.trew import CMIAttack, mia_efficacy, neighbour_classes, predict_probabilities, total_variation

CLASSIFIER_CONFIG = "configs/trew/classifier_quick.yaml"   # stage 1: the original
RETRAIN_CONFIG = "configs/trew/retrain_quick.yaml"         # the same without the forget class: R, R2, A
UNLEARN_CONFIG = "configs/trew/quick.yaml"                 # stage 2: ClassUnlearning from the original

BETA_GRID = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
TEMPERATURE_GRID = (0.1, 0.3, 1.0, 3.0)
METRICS = ("forget_acc", "retain_acc", "forget_train_acc", "mia_efficacy", "tv_to_retrain", "cmia_rate",
           "cmia_gap")


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
    """All held-out outputs needed for the metrics, with the retrained reference R and the CMIA attack."""

    def __init__(self, data, reference: torch.nn.Module, shadow: torch.nn.Module,
                 forget_class: int, seed: int) -> None:
        self.data, self.forget_class, self.seed = data, forget_class, seed
        self.reference = self.outputs(reference)
        shadow_test = self.outputs(shadow)["test"]
        neighbours = neighbour_classes(shadow_test[0][shadow_test[1] == forget_class], forget_class, 3)
        self.attack = CMIAttack(forget_class, neighbours, seed).fit(*shadow_test)
        self.reference_rate = self.attack.detection_rate(*self.reference["test"])

    def outputs(self, model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        data = self.data
        return {
            "test": predict_probabilities(model, data.test_dataloader()),
            "val_forget": predict_probabilities(model, data.forget_dataloader("val")),
            "test_forget": predict_probabilities(model, data.forget_dataloader("test")),
            "train_forget": predict_probabilities(model, data.forget_dataloader("train")),
            "train_retain": predict_probabilities(model, data.retain_dataloader("train")),
            "test_retain": predict_probabilities(model, data.retain_dataloader("test")),
        }

    def validation_tv(self, model) -> float:
        return total_variation(predict_probabilities(model, self.data.forget_dataloader("val"))[0],
                               self.reference["val_forget"][0])

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
        }


def unlearn(method: str, checkpoint: str, data, forget_class: int, epochs: int, seed: int,
            forget_weight: float = 1.0, **trew_args):
    """``configs/trew/quick.yaml``'s ClassUnlearning with this arm's method, from `checkpoint`, trained on `data`
    (the config's TREW callback is replaced by one with this arm's beta, T and similarity)."""
    model, _ = kit.from_config(UNLEARN_CONFIG, f"--seed_everything={seed}", f"--model.init_args.method={method}",
                               f"--model.init_args.forget_class={forget_class}",
                               f"--model.init_args.forget_weight={forget_weight}",
                               f"--model.init_args.init_from={checkpoint}",
                               f"--data.init_args.forget_class={forget_class}", f"--data.init_args.seed={seed}")
    callbacks = [TREWReweighting(**trew_args)] if method == "trew" else []
    return fit(model, data, epochs, callbacks)


def run_seed(seed: int, args) -> dict[str, dict[str, float]]:
    f, epochs = args.forget_class, args.original_epochs
    original, data_all = train_classifier(seed, seed, f, epochs, retain_only=False)
    reference, _ = train_classifier(seed + 1000, seed, f, epochs, retain_only=True)
    second_retrain, _ = train_classifier(seed + 2000, seed, f, epochs, retain_only=True)
    shadow, _ = train_classifier(seed + 3000, seed, f, epochs, retain_only=True)
    evaluator = Evaluator(data_all, reference, shadow, f, seed)

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "original.ckpt")
        torch.save({"state_dict": original.state_dict()}, checkpoint)
        results = {"original": evaluator.metrics(original),
                   "retrain (2nd seed, floor)": evaluator.metrics(second_retrain)}

        def run(method: str, **kwargs):
            return unlearn(method, checkpoint, data_all, f, args.unlearn_epochs, seed, **kwargs)

        results["FT"] = evaluator.metrics(run("finetune"))
        results["NegGrad+"] = evaluator.metrics(run("neggrad_plus", forget_weight=args.neggrad_weight))
        results["RL"] = evaluator.metrics(run("random_labels"))
        # (similarity source, beta, T) -> (validation TV to R, model); beta = 0 ignores the similarity
        grid = {("weights", 0.0, 1.0): None}
        grid.update({(source, beta, temperature): None for source in ("weights", "confusion")
                     for beta, temperature in itertools.product(args.beta_grid[1:], args.temperature_grid)})
        for source, beta, temperature in grid:
            model = run("trew", beta=beta, temperature=temperature, similarity=source)
            grid[(source, beta, temperature)] = (evaluator.validation_tv(model), model)
        results["diagnostic: similarity vs retrained"] = similarity_diagnostic(original, evaluator, f)
        results["TREW paper default (beta 10, T 0.1)"] = evaluator.metrics(grid[("weights", 10.0, 0.1)][1])
        for source in ("weights", "confusion"):
            candidates = [key for key in grid if key[0] == source or key[1] == 0.0]
            best = min(candidates, key=lambda key: grid[key][0])
            results[f"TREW {source} similarity, val-selected"] = {
                **evaluator.metrics(grid[best][1]), "beta": best[1], "temperature": best[2]}
        results["TREW beta 0 (ablation)"] = evaluator.metrics(grid[("weights", 0.0, 1.0)][1])
    return results


def similarity_diagnostic(original, evaluator: Evaluator, forget_class: int) -> dict[str, float]:
    """Does TREW's weight similarity point where a retrained model sends forget inputs?

    Spearman correlation over j != f between s (T = 1) and R's mean probability on test forget inputs, and
    whether their top classes agree. Also the TV between R's and the renormalised original's *mean*
    distributions: how much the beta = 0 target already knows.
    """
    from scipy.stats import spearmanr

    from lightning_modules.classifier import final_linear
    from lightning_modules.trew import class_similarity

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
        cells = [f"{metrics[m]['mean']:.3f} ± {metrics[m]['std']:.3f}" if m == "tv_to_retrain"
                 else f"{metrics[m]['mean']:.1f} ± {metrics[m]['std']:.1f}" for m in METRICS]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(arms: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [a for a in arms if a != "original" and not a.startswith("diagnostic")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric, label in zip(axes, ("tv_to_retrain", "cmia_gap", "retain_acc"),
                                 ("TV to retrained model (lower = closer)", "CMIA gap to retrained, points",
                                  "retain test accuracy, %")):
        means = [arms[a][metric]["mean"] for a in names]
        stds = [arms[a][metric]["std"] for a in names]
        ax.barh(names, means, xerr=stds, color="tab:blue")
        ax.set_xlabel(label)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    axes[2].set_yticklabels([])
    fig.suptitle("TREW vs class-unlearning baselines on digits (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=5)
    parser.add_argument("--forget-class", type=int, default=8)
    parser.add_argument("--original-epochs", type=int, default=40)
    parser.add_argument("--unlearn-epochs", type=int, default=5)
    parser.add_argument("--neggrad-weight", type=float, default=0.1)
    args = parser.parse_args(argv)
    args.beta_grid, args.temperature_grid = BETA_GRID, TEMPERATURE_GRID
    if args.smoke:  # the pipeline in seconds: 1-epoch models, a 3-point TREW grid (beta 0; beta 10, T 0.1)
        args.original_epochs, args.unlearn_epochs = 1, 1
        args.beta_grid, args.temperature_grid = (0.0, 10.0), (0.1,)
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)  # init_from reports, once per arm

    start = time.time()
    per_seed = [run_seed(seed, args) for seed in kit.progress(range(args.seeds), "seeds")]
    arms = kit.summarise(per_seed)
    config = {"classifier_config": CLASSIFIER_CONFIG, "retrain_config": RETRAIN_CONFIG,
              "unlearn_config": UNLEARN_CONFIG, "forget_class": args.forget_class,
              "original_epochs": args.original_epochs, "unlearn_epochs": args.unlearn_epochs,
              "neggrad_weight": args.neggrad_weight, "beta_grid": args.beta_grid,
              "temperature_grid": args.temperature_grid, "smoke": args.smoke}
    result = kit.write_result("TREW / CMIA (arXiv 2506.20893)", seeds=args.seeds, wall_s=time.time() - start,
                              config=config, arms=arms, per_seed=per_seed, out=args.out, name="trew")
    plot(arms, os.path.join(args.out, "trew.png"))
    print(markdown_table(arms))
    diagnostic = arms["diagnostic: similarity vs retrained"]
    print(f"\nwall {result['wall_s']:.0f} s")
    for source in ("weights", "confusion"):
        arm = f"TREW {source} similarity, val-selected"
        print(f"{arm}: (beta, T) per seed {[(s[arm]['beta'], s[arm]['temperature']) for s in per_seed]}")
    print("similarity diagnostic (mean ± std): " + ", ".join(
        f"{k} {v['mean']:.2f} ± {v['std']:.2f}" for k, v in diagnostic.items()))
    return result


if __name__ == "__main__":
    main()
