"""EC-CEM vs CEM vs evi-CEM on correlated concepts (EC-CEM is a RECONSTRUCTION): ``python -m experiments.ec_cem``.

Paper: "Evidential Copula Concept Embedding Models" (ICML 2026; only the abstract is public, so the copula part of
``lightning_modules/concept_models.py`` is reconstructed). Its argument: concepts are not independent, and a model
of their dependencies lets an intervention on one concept correct the ones it is correlated with.

Per seed (data, initialisation and training order change with the seed):

1. **correlated concepts** (``ConceptDataModule`` ``dataset: correlated``: 3 pairs of concepts with latent
   correlation ``--rho``, x = tanh(W z) + noise eps, y = c_0 xor c_2), at each ``--noise`` level (the first one
   fills ``arms``; the others ``other_noise``: the noisier x, the more concept dependence is left given x).
   Arms ``CEM``, ``evi-CEM``, ``EC-CEM``, each built from its quick config
   (``configs/ec_cem/{cem_quick,evi_cem_quick,quick}.yaml``; only the data seed, size and noise are overridden)
   and trained the same way: Adam (the configs' lr), ``--epochs`` epochs, the weights of the epoch with the best
   validation task accuracy kept (no other tuning for any arm; test data never selects).
   Test metrics: ``task_acc``, ``concept_acc``, ``concept_auroc``, ``concept_ece`` (15 bins), and
   ``partner_concept_acc``: accuracy of the non-intervened member of each planted pair after intervening on the
   other member with its true value (both directions, averaged; ``partner_concept_acc_before``: the same concepts
   without intervention). For EC-CEM ``rho_pairs`` (mean learned correlation of the planted pairs) and
   ``rho_others`` (mean |correlation| of the other pairs). The intervention curves (random and uncertainty-first
   order, `callbacks.concept_interventions`) are averaged over seeds and plotted.
2. **XOR / Trig / Dot** (the CEM repository's generators, 3000 examples): the same three arms with the same
   recipe (``--synthetic-epochs``), test ``task_acc`` and ``concept_acc`` (the pipeline check).

Outputs: markdown tables (mean ± std over seeds), ``results/ec_cem.json`` (``arms`` = the correlated-concept arms;
``synthetic`` = {dataset: arms}; ``curves``) and ``results/ec_cem.png`` (intervention curves per arm).
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
import torchmetrics

from callbacks.concept_interventions import ConceptInterventions
from experiments import kit

CONFIGS = {"CEM": "configs/ec_cem/cem_quick.yaml", "evi-CEM": "configs/ec_cem/evi_cem_quick.yaml",
           "EC-CEM": "configs/ec_cem/quick.yaml"}
SYNTHETIC = {"XOR": ("xor", 2, 2), "Trig": ("trig", 3, 7), "Dot": ("dot", 2, 4)}   # dataset, concepts, input dim
PAPER = "Evidential Copula Concept Embedding Models (EC-CEM, ICML 2026; copula part reconstructed)"


def train(arm: str, seed: int, epochs: int, overrides: list[str]):
    """Build the arm from its config (data seed = seed), fit with keep-best on val/task_acc; returns (model, data)."""
    model, data = kit.from_config(CONFIGS[arm], f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                  *overrides)
    keep = kit.KeepBest("val/task_acc", mode="max")
    kit.quiet_trainer([keep], max_epochs=epochs, deterministic=True).fit(model, datamodule=data)
    keep.restore(model).eval()
    return model, data


@torch.no_grad()
def test_outputs(model, data) -> dict[str, torch.Tensor]:
    """Concept outputs of the whole test split (one pass), with its x, y and c."""
    x, y, c = (torch.cat(parts) for parts in zip(*data.test_dataloader()))
    return {"x": x, "y": y, "c": c, "out": model.concept_outputs(x)}


@torch.no_grad()
def evaluate(model, test: dict, pairs: int | None) -> dict[str, float]:
    out, y, c = test["out"], test["y"], test["c"]
    probs = out["probs"]
    metrics = {"task_acc": float((model.task_logits(out, probs).argmax(-1) == y).float().mean()),
               "concept_acc": float(((probs > 0.5).float() == c).float().mean()),
               "concept_auroc": float(torchmetrics.functional.classification.binary_auroc(probs.flatten(),
                                                                                          c.flatten().long())),
               "concept_ece": float(torchmetrics.functional.classification.binary_calibration_error(
                   probs.flatten(), c.flatten().long(), n_bins=15))}
    if pairs is None:
        return metrics
    first, second = torch.arange(pairs) * 2, torch.arange(pairs) * 2 + 1
    after, before = [], []
    for known, partner in ((first, second), (second, first)):
        mask = torch.zeros_like(c)
        mask[:, known] = 1.0
        updated = model.intervene(out, mask, c)
        after.append(((updated[:, partner] > 0.5).float() == c[:, partner]).float().mean())
        before.append(((probs[:, partner] > 0.5).float() == c[:, partner]).float().mean())
    metrics["partner_concept_acc"] = float(torch.stack(after).mean())
    metrics["partner_concept_acc_before"] = float(torch.stack(before).mean())
    if hasattr(model, "correlation"):
        corr = model.correlation()
        planted = torch.zeros_like(corr, dtype=torch.bool)
        planted[first, second] = True
        upper = torch.triu(torch.ones_like(planted), diagonal=1)
        metrics["rho_pairs"] = float(corr[planted].mean())
        metrics["rho_others"] = float(corr[upper & ~planted].abs().mean())
    return metrics


def intervention_curves(model, test: dict, points: int) -> dict[str, list[tuple[int, float]]]:
    callback = ConceptInterventions(policies=["random", "uncertainty"], num_points=points, plot=False)
    batches = [(test["x"], test["y"], test["c"])]
    return callback.evaluate(model, batches, torch.eye(test["c"].shape[1]))


def run_seed(seed: int, args) -> tuple[dict, dict, dict, dict]:
    arms, curves, synthetic, other_noise = {}, {}, {}, {}
    bar = kit.progress(None, f"seed {seed}: arms x datasets",
                       total=len(CONFIGS) * (len(args.noise) + len(args.synthetic)))
    for level, noise in enumerate(args.noise):
        correlated = [f"--data.init_args.dataset_size={args.size}", f"--data.init_args.rho={args.rho}",
                      f"--data.init_args.noise={noise}"]
        for arm in CONFIGS:
            model, data = train(arm, seed, args.epochs, correlated)
            test = test_outputs(model, data)
            metrics = evaluate(model, test, data.hparams.pairs)
            if level == 0:
                arms[arm] = metrics
                curves[arm] = intervention_curves(model, test, points=7)
            else:
                other_noise.setdefault(f"noise={noise}", {})[arm] = metrics
            bar.update()
    for name in args.synthetic:
        dataset, concepts, input_dim = SYNTHETIC[name]
        overrides = [f"--data.init_args.dataset={dataset}", f"--data.init_args.dataset_size={args.synthetic_size}",
                     f"--model.init_args.num_concepts={concepts}", f"--model.init_args.input_dim={input_dim}"]
        for arm in CONFIGS:
            model, data = train(arm, seed, args.synthetic_epochs, overrides)
            synthetic.setdefault(name, {})[arm] = {k: v for k, v in evaluate(model, test_outputs(model, data),
                                                                             None).items()
                                                   if k in ("task_acc", "concept_acc")}
            bar.update()
    bar.close()
    return arms, curves, synthetic, other_noise


def mean_curves(per_seed_curves: list[dict]) -> dict:
    """{arm: {policy: [(n, mean accuracy over seeds)]}}."""
    out = {}
    for arm in per_seed_curves[0]:
        for policy, curve in per_seed_curves[0][arm].items():
            values = np.mean([[a for _, a in seed[arm][policy]] for seed in per_seed_curves], axis=0)
            out.setdefault(arm, {})[policy] = [(n, float(v)) for (n, _), v in zip(curve, values)]
    return out


def plot(curves: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, policy in zip(axes, ("random", "uncertainty")):
        for arm, policies in curves.items():
            ax.plot([n for n, _ in policies[policy]], [a for _, a in policies[policy]], marker="o", ms=3, label=arm)
        ax.set_title(f"{policy} interventions (correlated concepts)")
        ax.set_xlabel("intervened concepts")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test task accuracy")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--epochs", type=int, default=60, help="epochs on the correlated-concept data")
    parser.add_argument("--size", type=int, default=3000, help="correlated-concept examples (70/10/20 split)")
    parser.add_argument("--rho", type=float, default=0.8, help="latent correlation of the planted pairs")
    parser.add_argument("--noise", type=float, nargs="+", default=[1.0, 2.0],
                        help="input noise levels of the correlated data; the first one gives `arms` and the curves")
    parser.add_argument("--synthetic", nargs="*", default=list(SYNTHETIC), choices=list(SYNTHETIC))
    parser.add_argument("--synthetic-epochs", type=int, default=40)
    parser.add_argument("--synthetic-size", type=int, default=3000)
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.size, args.synthetic_epochs, args.synthetic_size = 1, 300, 1, 300
        args.noise = args.noise[:1]
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    start = time.time()
    per_seed, per_seed_curves, per_seed_synthetic, per_seed_noise = [], [], [], []
    for seed in kit.progress(range(args.seeds), "seeds"):
        arms, curves, synthetic, other_noise = run_seed(seed, args)
        per_seed.append(arms)
        per_seed_curves.append(curves)
        per_seed_synthetic.append(synthetic)
        per_seed_noise.append(other_noise)
    arms = kit.summarise(per_seed)
    synthetic = {name: kit.summarise([s[name] for s in per_seed_synthetic]) for name in args.synthetic}
    noise_levels = {name: kit.summarise([s[name] for s in per_seed_noise]) for name in per_seed_noise[0]}
    curves = mean_curves(per_seed_curves)
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config["configs"] = CONFIGS
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="ec_cem", synthetic=synthetic, curves=curves,
                              other_noise=noise_levels, per_seed_synthetic=per_seed_synthetic,
                              per_seed_other_noise=per_seed_noise)
    plot(curves, os.path.join(args.out, "ec_cem.png"))
    print(f"correlated concepts, noise={args.noise[0]}\n{kit.markdown_table(arms)}")
    for name, table in {**noise_levels, **synthetic}.items():
        print(f"\n{name}\n{kit.markdown_table(table)}")
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
