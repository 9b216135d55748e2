"""InfoGeo vs a MixVPR + InfoNCE baseline under a cross-view domain shift: ``python -m experiments.infogeo``.

Paper: "InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization"
(arXiv 2605.07099). Its claim: object-centric concepts selected across views (CACS) and aligned structurally (CSRR),
fused back into the features (FiLM), generalise better to unseen domains than a plain global descriptor.

Per seed (the generator, initialisation and batch order change with the seed), on the embedded procedural scenes of
``datamodules/geo_localization.py`` (``--image-size`` px; ``--train-locations`` locations x ``--train-views`` drone
views for training; ``--test-locations`` unseen locations x 2 drone queries for testing):

* arms ``baseline`` (``object_centric: false``: encoder + MixVPR + InfoNCE), ``infogeo``, ``infogeo w/o CACS``
  (``use_cacs: false``), ``infogeo w/o CSRR`` (``use_csrr: false``), each built from ``configs/infogeo/quick.yaml``
  (only sizes, the seed and the arm's switch are overridden) and trained for the same ``--steps`` AdamW steps with
  the same batches; the final weights are tested (no selection, so no arm sees validation or test data);
* test: drone -> satellite retrieval on the ``clean`` test level (the training distribution) and the ``shifted``
  level (heavy clutter and an unseen weather): ``r1_clean``, ``r1_shifted``, ``ap_clean``, ``ap_shifted`` (percent)
  and ``r1_drop`` = r1_clean - r1_shifted.

Outputs: a markdown table (mean ± std over seeds), ``results/infogeo.json`` and ``results/infogeo.png``.
"""
from __future__ import annotations

import logging
import os
import time

from experiments import kit

CONFIG = "configs/infogeo/quick.yaml"
ARMS = {"baseline": ["--model.init_args.object_centric=false"],
        "infogeo": [],
        "infogeo w/o CACS": ["--model.init_args.use_cacs=false"],
        "infogeo w/o CSRR": ["--model.init_args.use_csrr=false"]}
METRICS = ("r1_clean", "r1_shifted", "ap_clean", "ap_shifted", "r1_drop")
PAPER = ("InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization "
         "(arXiv 2605.07099)")


def sizes(args) -> list[str]:
    return [f"--model.init_args.image_size={args.image_size}", f"--data.init_args.image_size={args.image_size}",
            f"--data.init_args.train_locations={args.train_locations}",
            f"--data.init_args.train_views={args.train_views}",
            f"--data.init_args.test_locations={args.test_locations}", "--data.init_args.val_locations=8",
            f"--data.init_args.batch_size={args.batch_size}", f"--model.init_args.num_slots={args.slots}"]


def run_arm(arm: str, seed: int, args, data=None):
    """Train one arm for ``args.steps`` steps; returns (metrics, datamodule) (the datamodule is reused per seed)."""
    model, fresh = kit.from_config(CONFIG, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                   *sizes(args), *ARMS[arm])
    data = data or fresh
    trainer = kit.quiet_trainer(max_steps=args.steps, max_epochs=-1, limit_val_batches=0, deterministic=True)
    trainer.fit(model, datamodule=data)
    metrics = {}
    for level in ("clean", "shifted"):
        loader = data.eval_loader(data.retrieval_set(level))
        (values,) = kit.quiet_trainer().test(model, dataloaders=loader, verbose=False)
        metrics[f"r1_{level}"], metrics[f"ap_{level}"] = values["test/r1"], values["test/ap"]
        metrics[f"r5_{level}"] = values["test/r5"]
    metrics["r1_drop"] = metrics["r1_clean"] - metrics["r1_shifted"]
    return metrics, data


def plot(arms: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = list(arms)
    x = np.arange(len(names))
    for ax, metric in zip(axes, ("r1", "ap")):
        for offset, level in ((-0.18, "clean"), (0.18, "shifted")):
            cells = [arms[n][f"{metric}_{level}"] for n in names]
            ax.bar(x + offset, [c["mean"] for c in cells], 0.36, yerr=[c["std"] for c in cells], capsize=3,
                   label=level)
        ax.set_xticks(x, names, rotation=12)
        ax.set_ylabel(f"{'Recall@1' if metric == 'r1' else 'AP'} (%)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="test level")
    fig.suptitle("drone -> satellite retrieval on unseen procedural locations (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--steps", type=int, default=500, help="training steps per arm (equal for every arm)")
    parser.add_argument("--image-size", type=int, default=48)
    parser.add_argument("--train-locations", type=int, default=300)
    parser.add_argument("--train-views", type=int, default=4)
    parser.add_argument("--test-locations", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--slots", type=int, default=8, help="K (r = 4 from the config)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.image_size, args.train_locations, args.train_views, args.test_locations = 2, 32, 12, 2, 6
        args.batch_size = 6
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    start = time.time()
    per_seed = []
    bar = kit.progress(None, "seeds x arms", total=args.seeds * len(args.arms))
    for seed in range(args.seeds):
        row, data = {}, None
        for arm in args.arms:
            row[arm], data = run_arm(arm, seed, args, data)
            bar.update()
        per_seed.append(row)
    bar.close()
    arms = kit.summarise(per_seed)
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config.update(config_file=CONFIG, arm_overrides=ARMS)
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="infogeo")
    plot(arms, os.path.join(args.out, "infogeo.png"))
    print(kit.markdown_table(arms, [*METRICS, "r5_clean", "r5_shifted"], digits=1))
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds, {args.steps} steps per arm)")
    return result


if __name__ == "__main__":
    main()
