"""Reproduce the NT-SSM claim at small scale: ``python -m experiments.nt_ssm`` (~5-10 min on 2 cores).

Paper: "Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy"
(NT-SSM, arXiv 2605.24015). Claim: the neighbour-type-aware sampled softmax (NT-SSM) beats the sampled
softmax (SSM) on graph CF backbones. The method card's prototype found that at the paper's fixed tau = 0.2
most of the gap is a temperature effect (SSM wants a much higher tau on small graphs), so SSM is compared
here at its own validation-selected temperature too.

Setup (everything through the collection's `GraphCollaborativeFiltering` + `GraphRecDataModule` + a Lightning
`Trainer` on CPU): the embedded clustered-popularity graph (1000 users, 1500 items, 10 clusters, degrees
5-24; ~10k train edges, per-user 70/10/20 split), one graph per data seed (the model seed is the same number).
LightGCN d 32, L 2, Adam 1e-3, batch 512, reg 1e-4, at most 80 epochs, validation every epoch, early
stopping on val NDCG@20 with patience 5; test metrics are those of the best-validation epoch's weights.
Full ranking over all items; at test only the train items are masked (the official protocol: validation
items compete), K = 20.

Arms (per data seed; "tuned" = chosen on validation NDCG@20 of that seed, test reported at the choice):
* ``SSM, tau 0.2 (paper)`` and ``SSM, tau tuned`` over tau in {0.2, 0.5, 1, 2, 3} (one-directional, the
  official baseline);
* ``bidirectional SSM (= NT, all alphas 1), tau 0.2`` and ``..., tau tuned`` over the same grid: the
  uniform-alpha ablation, which isolates the second direction from the type-aware scaling;
* ``NT-SSM, ml-1m alphas, tau 0.2 (paper)``: alphas (uu, ii, ui, iu) = (1.2, 0.8, 0.8, 1.0);
* ``NT-SSM, uniform alpha, tuned``: tau and alpha **tuned jointly** on {0.5, 1} x {0.2, 0.4, 0.6, 0.8}
  (all four alphas equal);
* ``NT-SSM, type-specific, tuned``: the previous grid plus, from its best point, each single alpha halved
  (4 more runs); the best of the 12 on validation.

Part 2 (speed): training samples/s and full-ranking evaluation users/s of the same module and data through
Lightning (`Trainer.fit` / `Trainer.validate`) and through a plain PyTorch loop, official sizes (d 64, L 2,
batch 2048): the fastest of 9 epochs after a warm-up epoch, and of 19 evaluation passes (the minimum is the
measure least disturbed by other processes on a shared machine). ``--speed-only`` runs just this part.

Outputs: markdown tables on stdout, ``results/nt_ssm.json`` (``{"paper", "seeds", "wall_s", "arms": {arm:
{metric: {"mean", "std"}}}, "chosen": {arm: [per-seed tau/alphas/best epoch]}, "speed": ..., "runs": [every run
per seed]}``) and ``results/nt_ssm.png``.
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
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping
from tqdm import tqdm

from datamodules.interaction_graph import GraphRecDataModule
from lightning_modules.nt_ssm import GraphCollaborativeFiltering

PAPER = ("Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy "
         "(NT-SSM, arXiv 2605.24015)")
TAUS = (0.2, 0.5, 1.0, 2.0, 3.0)
NT_TAUS = (0.5, 1.0)
NT_ALPHAS = (0.2, 0.4, 0.6, 0.8)
PAPER_ALPHAS = (1.2, 0.8, 0.8, 1.0)  # (uu, ii, ui, iu), ml-1m
ALPHA_KEYS = ("alpha_uu", "alpha_ii", "alpha_ui", "alpha_iu")
METRICS = ("test/ndcg@20", "test/recall@20", "val/ndcg@20")


class KeepBest(Callback):
    """Keeps (in memory) the weights of the epoch with the best validation NDCG@20."""

    def __init__(self):
        self.best, self.state, self.epoch = -1.0, None, -1

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        value = float(trainer.callback_metrics["val/ndcg@20"])
        if value > self.best:
            self.best, self.epoch = value, trainer.current_epoch
            self.state = copy.deepcopy(pl_module.state_dict())


def quiet_trainer(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def train_run(datamodule: GraphRecDataModule, seed: int, loss: str, tau: float,
              alphas: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0), max_epochs: int = 80,
              patience: int = 5, embedding_dim: int = 32, backbone: str = "lightgcn",
              **model_kwargs) -> dict:
    """One early-stopped run; returns validation/test metrics at the best-validation epoch. ``backbone="simgcl"``
    uses SimGCL with its official defaults (cl_weight 0.5, noise_eps 0.1, cl_tau 0.2) unless ``model_kwargs``
    (further `GraphCollaborativeFiltering` arguments) say otherwise."""
    seed_everything(seed, verbose=False)
    model = GraphCollaborativeFiltering(loss=loss, tau=tau, embedding_dim=embedding_dim, num_layers=2, reg=1e-4,
                                        ks=(20,), backbone=backbone, **dict(zip(ALPHA_KEYS, alphas)), **model_kwargs,
                                        optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    keep = KeepBest()
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[
        keep, EarlyStopping("val/ndcg@20", mode="max", patience=patience, check_on_train_epoch_end=False)])
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    model.load_state_dict(keep.state)
    test = quiet_trainer().test(model, datamodule=datamodule, verbose=False)[0]
    return {"loss": loss, "tau": tau, "alphas": list(alphas), "best_epoch": keep.epoch, "val/ndcg@20": keep.best,
            "test/ndcg@20": test["test/ndcg@20"], "test/recall@20": test["test/recall@20"],
            "wall_s": time.perf_counter() - start}


def run_seed(seed: int, progress: tqdm, backbone: str = "lightgcn", **backbone_kwargs) -> dict[str, dict]:
    """All runs of one data seed; returns {arm: chosen run}."""
    datamodule = GraphRecDataModule(source="synthetic", batch_size=512, eval_batch_size=256, seed=seed)
    runs: list[dict] = []

    def run(loss, tau, alphas=(1.0, 1.0, 1.0, 1.0)):
        result = train_run(datamodule, seed, loss, tau, alphas, backbone=backbone, **backbone_kwargs)
        runs.append(result)
        progress.update(1)
        progress.set_postfix(loss=loss, tau=tau, ndcg=f"{result['test/ndcg@20']:.3f}")
        return result

    best = lambda rs: max(rs, key=lambda r: r["val/ndcg@20"])  # noqa: E731
    ssm = [run("ssm", tau) for tau in TAUS]
    bidir = [run("bidirectional_ssm", tau) for tau in TAUS]
    nt_paper = run("nt_ssm", 0.2, PAPER_ALPHAS)
    uniform = [run("nt_ssm", tau, (a,) * 4) for tau in NT_TAUS for a in NT_ALPHAS]
    start = best(uniform)
    probes = []
    for k in range(4):
        alphas = list(start["alphas"])
        alphas[k] = round(alphas[k] / 2, 3)
        probes.append(run("nt_ssm", start["tau"], tuple(alphas)))
    arms = {
        "SSM, tau 0.2 (paper)": ssm[0],
        "SSM, tau tuned": best(ssm),
        "bidirectional SSM (NT, all alphas 1), tau 0.2": bidir[0],
        "bidirectional SSM (NT, all alphas 1), tau tuned": best(bidir),
        "NT-SSM, ml-1m alphas, tau 0.2 (paper)": nt_paper,
        "NT-SSM, uniform alpha + tau tuned": start,
        "NT-SSM, type-specific alphas + tau tuned": best(uniform + probes),
    }
    return {"arms": arms, "runs": runs}


# ============================================================================================ speed
class EpochTimer(Callback):
    def __init__(self):
        self.train, self.val = [], []

    def on_train_epoch_start(self, trainer, pl_module):
        self._t = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        self.train.append(time.perf_counter() - self._t)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._v = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        self.val.append(time.perf_counter() - self._v)


def speed(epochs: int = 10, eval_repeats: int = 20) -> dict:
    """Samples/s and users/s, Lightning vs a plain loop over the same module, data and optimiser."""
    datamodule = GraphRecDataModule(source="synthetic", batch_size=2048, eval_batch_size=256, seed=0)
    datamodule.setup("fit")
    n_train, n_eval = len(datamodule.train_set), len(datamodule.test_set)

    def fresh_model():
        seed_everything(0, verbose=False)
        model = GraphCollaborativeFiltering(loss="nt_ssm", tau=0.2, embedding_dim=64, num_layers=2, ks=(10, 20, 40),
                                            num_users=datamodule.num_users, num_items=datamodule.num_items,
                                            optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
        model.set_train_graph(datamodule.train_edge_index())
        return model

    # Lightning: fit without validation (train timing), then validate on the test users repeatedly
    timer = EpochTimer()
    model = fresh_model()
    quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=[timer]).fit(model, datamodule=datamodule)
    lightning_train = n_train / np.min(timer.train[1:])
    evaluator = quiet_trainer(callbacks=[timer])
    timer.val = []
    for _ in range(eval_repeats):
        evaluator.validate(model, dataloaders=datamodule.test_dataloader(), verbose=False)
    lightning_eval = n_eval / np.min(timer.val[1:])

    # plain PyTorch: the same module's loss and evaluation, hand-written loop
    model = fresh_model()
    optimizer = model.configure_optimizers()
    loader = datamodule.train_dataloader()
    times = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        start = time.perf_counter()
        model.train()
        for batch in loader:
            optimizer.zero_grad()
            model.compute_loss(batch).backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    plain_train = n_train / np.min(times[1:])
    times = []
    model.eval()
    for _ in range(eval_repeats):
        start = time.perf_counter()
        with torch.no_grad():
            model._cache_embeddings()
            for batch in datamodule.test_dataloader():
                model.validation_step(batch, 0)
            model.val_metrics.compute()
            model.val_metrics.reset()
            model._clear_cache()
        times.append(time.perf_counter() - start)
    plain_eval = n_eval / np.min(times[1:])
    return {"setting": f"LightGCN d 64, L 2, NT-SSM, batch 2048, {n_train} train edges, {datamodule.num_items} items, "
                       f"{n_eval} evaluated users (full ranking, K 10/20/40), 1 CPU thread",
            "train_samples_per_s": {"lightning": lightning_train, "plain": plain_train,
                                    "ratio": lightning_train / plain_train},
            "eval_users_per_s": {"lightning": lightning_eval, "plain": plain_eval,
                                 "ratio": lightning_eval / plain_eval}}


# ============================================================================================ report
def summarise(per_seed: list[dict]) -> tuple[dict, dict]:
    """({arm: {metric: {"mean", "std"}}}, {arm: [the run chosen on each seed: tau, alphas, best epoch]})."""
    arms, chosen_runs = {}, {}
    for arm in per_seed[0]["arms"]:
        chosen = [s["arms"][arm] for s in per_seed]
        arms[arm] = {m: {"mean": float(np.mean([c[m] for c in chosen])), "std": float(np.std([c[m] for c in chosen]))}
                     for m in METRICS}
        chosen_runs[arm] = [{"tau": c["tau"], "alphas": c["alphas"], "best_epoch": c["best_epoch"]} for c in chosen]
    return arms, chosen_runs


def markdown(arms: dict, speed_result: dict | None, chosen_runs: dict | None = None) -> str:
    lines = ["| arm | test NDCG@20 | test Recall@20 | val NDCG@20 | chosen (tau; alphas uu/ii/ui/iu) per seed |",
             "|---|---|---|---|---|"] if arms else []
    for arm, m in arms.items():
        chosen = ", ".join(f"{c['tau']:g}; {'/'.join(f'{a:g}' for a in c['alphas'])}" for c in chosen_runs[arm])
        lines.append(f"| {arm} | {m['test/ndcg@20']['mean']:.4f} ± {m['test/ndcg@20']['std']:.4f} | "
                     f"{m['test/recall@20']['mean']:.4f} ± {m['test/recall@20']['std']:.4f} | "
                     f"{m['val/ndcg@20']['mean']:.4f} | {chosen} |")
    if speed_result:
        lines += ["", f"Speed ({speed_result['setting']}):", "",
                  "| work | Lightning | plain PyTorch | ratio |", "|---|---|---|---|"]
        for key, label in (("train_samples_per_s", "training samples/s"),
                           ("eval_users_per_s", "full-ranking eval users/s")):
            s = speed_result[key]
            lines.append(f"| {label} | {s['lightning']:.0f} | {s['plain']:.0f} | {s['ratio']:.2f} |")
    return "\n".join(lines)


def plot(arms: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(arms)
    means = [arms[a]["test/ndcg@20"]["mean"] for a in names]
    stds = [arms[a]["test/ndcg@20"]["std"] for a in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(range(len(names)), means, xerr=stds, color=["#3a7" if n.startswith("NT-SSM") else "#999" for n in names])
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("test NDCG@20 (best-valid epoch; mean ± std over data seeds)")
    ax.set_title("NT-SSM vs SSM, LightGCN on the synthetic clustered graph")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="data seeds 0..n-1")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--speed-only", action="store_true", help="only the Lightning vs plain-loop timing")
    parser.add_argument("--out", default="results")
    parser.add_argument("--backbone", choices=("lightgcn", "simgcl"), default="lightgcn",
                        help="simgcl: every arm on SimGCL; writes nt_ssm_simgcl_cl<weight>.json/.png")
    parser.add_argument("--cl-weight", type=float, default=0.5, help="SimGCL's contrastive weight (official 0.5)")
    args = parser.parse_args(argv)
    backbone_kwargs = {"cl_weight": args.cl_weight} if args.backbone == "simgcl" else {}
    result_name = "nt_ssm" if args.backbone == "lightgcn" else f"nt_ssm_simgcl_cl{args.cl_weight:g}"
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "datamodules.interaction_graph"):
        logging.getLogger(name).setLevel(logging.ERROR)
    start = time.perf_counter()
    if args.speed_only:
        print(markdown({}, speed()))
        return {}
    runs_per_seed = 2 * len(TAUS) + 1 + len(NT_TAUS) * len(NT_ALPHAS) + 4
    per_seed = []
    with tqdm(total=args.seeds * runs_per_seed, desc="nt_ssm runs") as progress:
        for seed in range(args.seeds):
            per_seed.append(run_seed(seed, progress, args.backbone, **backbone_kwargs))
    arms, chosen_runs = summarise(per_seed)
    speed_result = None if args.skip_speed else speed()
    wall = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"paper": PAPER, "seeds": args.seeds, "wall_s": wall, "arms": arms, "chosen": chosen_runs,
              "backbone": args.backbone, **({"cl_weight": args.cl_weight} if backbone_kwargs else {}),
              "speed": speed_result,
              "protocol": "synthetic clustered graph (1000 users, 1500 items), per-user 70/10/20; LightGCN d 32 L 2, "
                          "Adam 1e-3, batch 512, reg 1e-4, <= 80 epochs, early stop on val NDCG@20 (patience 5); "
                          "test at the best-valid epoch, full ranking, only train items masked at test",
              "runs": [s["runs"] for s in per_seed]}
    (out / f"{result_name}.json").write_text(json.dumps(result, indent=1))
    plot(arms, out / f"{result_name}.png")
    print(markdown(arms, speed_result, chosen_runs))
    print(f"\nwall {wall:.0f} s; results in {out / (result_name + '.json')} and {out / (result_name + '.png')}")
    return result


if __name__ == "__main__":
    main()
