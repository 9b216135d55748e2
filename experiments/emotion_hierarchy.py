"""Emotion hierarchies emerge with model size (arXiv 2507.10599, Figs. 2-3 and Sec. 5) at CPU scale.

Three TinyGPT language models (configs/emotion_hierarchy/{quick,lm_medium_quick,lm_large_quick}.yaml: 1x16, 2x32 and
4x128 layers x width) are trained by `SupervisedWarmup` for the same number of steps on the planted-hierarchy
corpus (6 Shaver basic emotions as parents, 4 Shaver children each, surprise 2; label noise leaf .55 / parent .30 /
sibling .10 / random .05; two personas, the "biased" one relabelling 30% of fear-family labels as anger-family).
Each model is probed by `EmotionProbe` (configs/emotion_hierarchy/probe.yaml: the official tree construction,
t = 0.3) on 2,000 held-out contexts with the neutral persona; the large model also with the biased persona. An
untrained large model is the "no tree" reference (the paper's GPT-2 end of the scale).

Arms: ``lm-untrained``, ``lm-small``, ``lm-medium``, ``lm-large``, ``lm-large/persona-neutral`` (the lm-large run
probed with the neutral persona: the same numbers as ``lm-large``), ``lm-large/persona-biased``. Metrics:
``total_path_length``, ``avg_depth``, ``edges``, ``group_purity``, ``edge_precision``, ``edge_recall``,
``acc_fine``, ``acc_basic``, ``planted_confusion`` (rate of fear contexts recognised as anger) and
``planted_confusion_mass`` (their mean renormalised probability on anger words). The paper's claims: tree depth
and path length grow with model size; recognition accuracy grows with tree complexity (the JSON's
``correlation`` holds Pearson's r between total path length and fine accuracy over every trained run); the
persona bias shows up as confusion.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from experiments import kit
from lightning_modules.tiny_gpt import TinyGPT

PAPER = "emotion_hierarchy"
SIZES = ("small", "medium", "large")
METRICS = ("total_path_length", "avg_depth", "edges", "group_purity", "edge_precision", "edge_recall", "acc_fine",
           "acc_basic", "planted_confusion", "planted_confusion_mass")


def probe(policy, seed: int, persona: str, num_test: int, plot_dir: str | None = None) -> dict[str, float]:
    model, data = kit.from_config(f"configs/{PAPER}/probe.yaml", f"--seed_everything={seed}",
                                  f"--data.init_args.seed={seed}", f"--data.init_args.probe_persona={persona}",
                                  f"--data.init_args.num_test={num_test}", "--data.init_args.num_train=1")
    model.policy = policy
    with tempfile.TemporaryDirectory() as scratch:  # the tree PNG/JSON of runs not kept go to a scratch folder
        model.hparams.plot_dir = plot_dir or scratch
        kit.quiet_trainer().test(model, datamodule=data, verbose=False)
    return {k: float(v) for k, v in model.results["metrics"].items() if k in METRICS}


# the small LM is the paper's quick config (what newcomers run first); the two larger ones are its siblings
LM_CONFIGS = {"small": f"configs/{PAPER}/quick.yaml", "medium": f"configs/{PAPER}/lm_medium_quick.yaml",
              "large": f"configs/{PAPER}/lm_large_quick.yaml"}


def train_lm(size: str, seed: int, steps: int, num_train: int, loss_on: str = "all"):
    model, data = kit.from_config(LM_CONFIGS[size], f"--seed_everything={seed}",
                                  f"--data.init_args.loss_on={loss_on}",
                                  f"--data.init_args.seed={seed}", f"--data.init_args.num_train={num_train}",
                                  f"--trainer.max_steps={steps}")
    kit.quiet_trainer(max_steps=steps, limit_val_batches=0).fit(model, datamodule=data)
    return model.policy


def plot(arms: dict, per_seed: list, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["lm-untrained"] + [f"lm-{s}" for s in SIZES]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    x = np.arange(len(names))
    for ax, metrics, title in ((axes[0], ("total_path_length", "edges"), "tree size"),
                               (axes[1], ("avg_depth", "group_purity", "edge_recall", "acc_fine", "acc_basic"),
                                "depth, purity, accuracy")):
        for m in metrics:
            mean = [arms[n][m]["mean"] for n in names]
            std = [arms[n][m]["std"] for n in names]
            ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=m)
        ax.set_xticks(x, names, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=7)
    for seed_row in per_seed:
        pts = [(seed_row[f"lm-{s}"]["total_path_length"], seed_row[f"lm-{s}"]["acc_fine"]) for s in SIZES]
        axes[2].scatter(*zip(*pts), label=f"seed {seed_row['seed']}")
    axes[2].set_xlabel("total path length")
    axes[2].set_ylabel("fine accuracy")
    axes[2].set_title("accuracy vs tree complexity")
    axes[2].legend(fontsize=7)
    fig.suptitle("Emotion trees of planted-corpus LMs (persona bias: lm-large/persona-biased planted_confusion "
                 f"{arms['lm-large/persona-biased']['planted_confusion']['mean']:.3f} vs neutral "
                 f"{arms['lm-large/persona-neutral']['planted_confusion']['mean']:.3f})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--steps", type=int, default=None, help="training steps per LM (default 1000; smoke 15)")
    parser.add_argument("--loss-on", choices=("all", "label"), default="all",
                        help="LM loss on every token (plain language modelling) or on the label only")
    parser.add_argument("--name", default=PAPER, help="result file name (default emotion_hierarchy)")
    args = parser.parse_args(argv)
    kit.quiet_single_thread()
    steps = args.steps or (15 if args.smoke else 1000)
    num_train, num_test = (512, 64) if args.smoke else (30000, 2000)
    out = Path(args.out)
    start = time.time()
    per_seed = []
    for seed in kit.progress(range(args.seeds), "seeds"):
        row: dict = {"seed": seed}
        torch.manual_seed(seed)
        row["lm-untrained"] = probe(TinyGPT(vocab_size=236, n_layer=4, d_model=128, n_head=4, context_length=16),
                                    seed, "neutral", num_test)
        for size in kit.progress(SIZES, f"seed {seed}: LM sizes"):
            policy = train_lm(size, seed, steps, num_train, args.loss_on)
            tree_dir = str(out / f"{args.name}_tree") if (size == "large" and seed == 0) else None
            row[f"lm-{size}"] = probe(policy, seed, "neutral", num_test, tree_dir)
            if size == "large":
                row["lm-large/persona-neutral"] = dict(row["lm-large"])
                row["lm-large/persona-biased"] = probe(policy, seed, "biased", num_test)
        per_seed.append(row)
    arms = kit.summarise([{k: v for k, v in r.items() if k != "seed"} for r in per_seed])
    lengths = [r[f"lm-{s}"]["total_path_length"] for r in per_seed for s in SIZES]
    accuracy = [r[f"lm-{s}"]["acc_fine"] for r in per_seed for s in SIZES]
    r_value = float(np.corrcoef(lengths, accuracy)[0, 1]) if np.std(lengths) > 0 and np.std(accuracy) > 0 else 0.0
    wall = time.time() - start
    result = kit.write_result(PAPER, name=args.name, seeds=args.seeds, wall_s=wall, out=out, arms=arms,
                              per_seed=per_seed,
                              config={"steps": steps, "num_train": num_train, "num_test": num_test,
                                      "sizes": {"small": "1x16", "medium": "2x32", "large": "4x128"},
                                      "threshold": 0.3, "bias_rate": 0.3, "loss_on": args.loss_on,
                                      "smoke": args.smoke},
                              correlation={"total_path_length_vs_acc_fine_pearson_r": r_value, "points": len(lengths)})
    plot(arms, per_seed, out / f"{args.name}.png")
    print(kit.markdown_table(arms, METRICS))
    print(f"Pearson r(total path length, fine accuracy) over {len(lengths)} trained runs: {r_value:.3f}; "
          f"wall {wall:.0f} s")
    return result


if __name__ == "__main__":
    main()
