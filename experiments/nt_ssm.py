"""Reproduce the NT-SSM claim at small scale: ``python -m experiments.nt_ssm`` (~35 min a seed on 2 busy cores).

Paper: "Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy"
(NT-SSM, arXiv 2605.24015). Claim: the neighbour-type-aware sampled softmax (NT-SSM) beats the sampled
softmax (SSM) on graph CF backbones. The paper compares at one fixed temperature, tau = 0.2; on small graphs SSM
wants a much higher tau, so most of the gap at tau 0.2 is a temperature effect, and SSM is compared here at its
own validation-selected temperature too.

Setup: every run starts from ``configs/nt_ssm/quick.yaml`` (``simgcl_quick.yaml`` with ``--backbone simgcl``)
through `experiments.kit.from_config`, i.e. `GraphCollaborativeFiltering` + `GraphRecDataModule` exactly as
``python train.py fit --config ...`` builds them: the embedded clustered-popularity graph (1000 users, 1500
items, 10 clusters, degrees 5-24; ~10k train edges, per-user 70/10/20 split), LightGCN d 32, L 2, Adam 1e-3,
batch 512, reg 1e-4. The experiment overrides only what it varies: the loss, tau and the four alphas, the data
seed (one graph per data seed; the model seed is the same number), K = 20 only (``ks``), and for SimGCL the
contrastive weight. Training (a quiet Lightning `Trainer` on CPU): at most 80 epochs, validation every epoch,
early stopping on val NDCG@20 with patience 5; test metrics are those of the best-validation epoch's weights
(`experiments.kit.KeepBest`). Full ranking over all items; at test only the train items are masked (the official
protocol: validation items compete), K = 20.

Arms (per data seed; "tuned" = chosen on validation NDCG@20 of that seed, test reported at the choice):
* ``SSM, tau 0.2 (paper)`` and ``SSM, tau tuned`` over the 12 temperatures of ``TAUS`` (one-directional, the
  official baseline);
* ``bidirectional SSM (= NT, all alphas 1), tau 0.2`` and ``..., tau tuned`` over the same grid: the
  uniform-alpha ablation, which isolates the second direction from the type-aware scaling;
* ``NT-SSM, ml-1m alphas, tau 0.2 (paper)``: alphas (uu, ii, ui, iu) = (1.2, 0.8, 0.8, 1.0);
* ``NT-SSM, uniform alpha, tuned``: tau and alpha **tuned jointly** on {0.5, 1} x {0.2, 0.4, 0.6, 0.8}
  (all four alphas equal, 8 runs);
* ``NT-SSM, type-specific, tuned``: the previous grid plus, from its best point, each single alpha halved
  (4 more runs); the best of the 12 on validation.

Equal selection budget: each tuned baseline gets as many runs (12 temperatures) as the largest NT-SSM selection
(12 runs), with the same training, early stopping and validation selection; the temperature grid reaches well
above the SSM optimum on this graph, so a chosen value at the grid's top edge would show in ``chosen``
(``tau_position``: ``bottom`` / ``interior`` / ``top`` of its grid, per tuned arm and seed). Selection reads only
the validation metric; the test metrics are computed for every run but never compared.

Part 2 (speed): training samples/s and full-ranking evaluation users/s of the same module and data through
Lightning (`Trainer.fit` / `Trainer.validate`) and through a plain PyTorch loop, official sizes (d 64, L 2,
batch 2048, K 10/20/40): the fastest of 9 epochs after a warm-up epoch, and of 19 evaluation passes (the minimum is
the measure least disturbed by other processes on a shared machine). ``--speed-only`` runs just this part
(printed, not written); ``--skip-speed`` leaves it out.

SimGCL variant: ``--backbone simgcl --cl-weight W`` runs every arm on SimGCL (``simgcl_quick.yaml``) and writes
``<out>/nt_ssm_simgcl_cl<W>.json`` / ``.png`` instead of ``nt_ssm.json`` / ``.png``.

Outputs: markdown tables on stdout and the kit's schema in ``<out>/nt_ssm.json`` (``{"paper", "seeds", "wall_s",
"config", "arms": {arm: {metric: {"mean", "std"}}}, "per_seed": [{"seed", "arms", "chosen": {arm: tau/alphas/best
epoch}, "runs": [every run]}], "title", "backbone", "speed"}``) and ``<out>/nt_ssm.png``.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import EarlyStopping

from experiments.kit import (KeepBest, experiment_parser, from_config, progress, quiet_single_thread, quiet_trainer,
                             summarise, write_result)

PAPER = "nt_ssm"
TITLE = ("Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy "
         "(NT-SSM, arXiv 2605.24015)")
CONFIGS = {"lightgcn": "configs/nt_ssm/quick.yaml", "simgcl": "configs/nt_ssm/simgcl_quick.yaml"}
MONITOR = "val/ndcg@20"
# the baselines' temperature grid: as many points as NT-SSM's largest selection (nt_grid_size(): 8 + 4 = 12);
# 0.2 is the paper's fixed value, and the grid runs far past the old top (3), where SSM's choice used to land
TAUS = (0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0)
NT_TAUS = (0.5, 1.0)
NT_ALPHAS = (0.2, 0.4, 0.6, 0.8)
PAPER_ALPHAS = (1.2, 0.8, 0.8, 1.0)  # (uu, ii, ui, iu), ml-1m
ALPHA_KEYS = ("alpha_uu", "alpha_ii", "alpha_ui", "alpha_iu")
METRICS = ("test/ndcg@20", "test/recall@20", "val/ndcg@20")
# --smoke: a 120 x 200 graph, one epoch, one-point grids (checks the pipeline in seconds, not the claim)
SMOKE_DATA = ("--data.init_args.synthetic_users=120", "--data.init_args.synthetic_items=200")
SMOKE_GRIDS = dict(taus=(0.2,), nt_taus=(0.5,), nt_alphas=(0.4,))


def build(seed: int, loss: str, tau: float, alphas=(1.0, 1.0, 1.0, 1.0), backbone: str = "lightgcn",
          overrides: tuple[str, ...] = ()):
    """(model, datamodule) from the backbone's quick config with the experiment's overrides."""
    return from_config(CONFIGS[backbone], f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                       f"--model.init_args.loss={loss}", f"--model.init_args.tau={tau}",
                       *(f"--model.init_args.{key}={value}" for key, value in zip(ALPHA_KEYS, alphas)),
                       "--model.init_args.ks=[20]", *overrides)


def train_run(seed: int, loss: str, tau: float, alphas: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0),
              max_epochs: int = 80, patience: int = 5, backbone: str = "lightgcn",
              overrides: tuple[str, ...] = ()) -> dict:
    """One early-stopped run on data seed ``seed``; returns validation/test metrics at the best-validation epoch.
    ``overrides`` are further CLI strings for the config (e.g. ``"--model.init_args.cl_weight=0.05"``)."""
    model, datamodule = build(seed, loss, tau, alphas, backbone, overrides)
    keep = KeepBest(MONITOR, mode="max")
    trainer = quiet_trainer([keep, EarlyStopping(MONITOR, mode="max", patience=patience,
                                                 check_on_train_epoch_end=False)], max_epochs=max_epochs)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    keep.restore(model)
    test = quiet_trainer().test(model, datamodule=datamodule, verbose=False)[0]
    # validation runs at each epoch end, after that epoch's num_training_batches optimiser steps
    best_epoch = keep.best_step // trainer.num_training_batches - 1
    return {"loss": loss, "tau": tau, "alphas": list(alphas), "best_epoch": best_epoch, MONITOR: keep.best_score,
            "test/ndcg@20": test["test/ndcg@20"], "test/recall@20": test["test/recall@20"],
            "wall_s": time.perf_counter() - start}


def nt_grid_size(nt_taus=NT_TAUS, nt_alphas=NT_ALPHAS) -> int:
    """Runs the type-specific NT-SSM arm selects from: the tau x uniform-alpha grid plus one probe per alpha."""
    return len(nt_taus) * len(nt_alphas) + len(ALPHA_KEYS)


def runs_per_seed(taus=TAUS, nt_taus=NT_TAUS, nt_alphas=NT_ALPHAS) -> int:
    return 2 * len(taus) + 1 + nt_grid_size(nt_taus, nt_alphas)


def grid_position(value: float, grid) -> str:
    """Where a chosen value sits in its grid: ``"bottom"``, ``"top"`` or ``"interior"`` (one-point grid: top)."""
    grid = sorted(set(grid))
    return "top" if value == grid[-1] else "bottom" if value == grid[0] else "interior"


def run_seed(seed: int, bar, backbone: str = "lightgcn", overrides: tuple[str, ...] = (), taus=TAUS,
             nt_taus=NT_TAUS, nt_alphas=NT_ALPHAS, **run_kwargs) -> dict:
    """All runs of one data seed: ``{"seed", "arms": {arm: metrics}, "chosen": {arm: tau/alphas/epoch}, "runs"}``."""
    runs: list[dict] = []

    def run(loss, tau, alphas=(1.0, 1.0, 1.0, 1.0)):
        result = train_run(seed, loss, tau, alphas, backbone=backbone, overrides=overrides, **run_kwargs)
        runs.append(result)
        bar.update(1)
        bar.set_postfix(loss=loss, tau=tau, ndcg=f"{result['test/ndcg@20']:.3f}")
        return result

    best = lambda rs: max(rs, key=lambda r: r[MONITOR])  # noqa: E731
    ssm = [run("ssm", tau) for tau in taus]
    bidir = [run("bidirectional_ssm", tau) for tau in taus]
    nt_paper = run("nt_ssm", 0.2, PAPER_ALPHAS)
    uniform = [run("nt_ssm", tau, (a,) * 4) for tau in nt_taus for a in nt_alphas]
    start = best(uniform)
    probes = []
    for k in range(4):
        alphas = list(start["alphas"])
        alphas[k] = round(alphas[k] / 2, 3)
        probes.append(run("nt_ssm", start["tau"], tuple(alphas)))
    chosen = {
        "SSM, tau 0.2 (paper)": ssm[0],
        "SSM, tau tuned": best(ssm),
        "bidirectional SSM (NT, all alphas 1), tau 0.2": bidir[0],
        "bidirectional SSM (NT, all alphas 1), tau tuned": best(bidir),
        "NT-SSM, ml-1m alphas, tau 0.2 (paper)": nt_paper,
        "NT-SSM, uniform alpha + tau tuned": start,
        "NT-SSM, type-specific alphas + tau tuned": best(uniform + probes),
    }
    tau_grids = {"SSM, tau tuned": taus, "bidirectional SSM (NT, all alphas 1), tau tuned": taus,
                 "NT-SSM, uniform alpha + tau tuned": nt_taus, "NT-SSM, type-specific alphas + tau tuned": nt_taus}
    return {"seed": seed, "arms": {arm: {m: r[m] for m in METRICS} for arm, r in chosen.items()},
            "chosen": {arm: {"tau": r["tau"], "alphas": r["alphas"], "best_epoch": r["best_epoch"],
                             **({"tau_position": grid_position(r["tau"], tau_grids[arm])} if arm in tau_grids else {})}
                       for arm, r in chosen.items()},
            "runs": runs}


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


def speed(epochs: int = 10, eval_repeats: int = 20, data_overrides: tuple[str, ...] = ()) -> dict:
    """Samples/s and users/s, Lightning vs a plain loop over the same module, data and optimiser."""
    sizes = ("--seed_everything=0", "--data.init_args.seed=0", "--data.init_args.batch_size=2048",
             "--model.init_args.loss=nt_ssm", "--model.init_args.tau=0.2", "--model.init_args.embedding_dim=64",
             *(f"--model.init_args.{key}=1.0" for key in ALPHA_KEYS), *data_overrides)
    _, datamodule = from_config(CONFIGS["lightgcn"], *sizes)
    datamodule.setup("fit")
    n_train, n_eval = len(datamodule.train_set), len(datamodule.test_set)

    def fresh_model():  # built with the data's sizes, so the plain loop needs no Trainer to create the embeddings
        model, _ = from_config(CONFIGS["lightgcn"], *sizes, f"--model.init_args.num_users={datamodule.num_users}",
                               f"--model.init_args.num_items={datamodule.num_items}")
        model.set_train_graph(datamodule.train_edge_index())
        return model

    # Lightning: fit without validation (train timing), then validate on the test users repeatedly
    timer = EpochTimer()
    model = fresh_model()
    quiet_trainer([timer], max_epochs=epochs, limit_val_batches=0).fit(model, datamodule=datamodule)
    lightning_train = n_train / np.min(timer.train[1:])
    evaluator = quiet_trainer([timer])
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


def stored_speed(path: Path) -> dict | None:
    """``--skip-speed``: the speed block of an earlier ``<out>/<name>.json`` (timings want quiet cores, so a
    re-run on a busy machine keeps the stored figures instead of re-measuring), marked as carried over; None
    when there is none."""
    if not path.is_file():
        return None
    previous = json.loads(path.read_text()).get("speed")
    if not previous:
        return None
    return {**previous, "carried_over": previous.get("carried_over", "not re-measured (--skip-speed): taken "
                                                     "unchanged from the previous results file, which measured it")}


# ============================================================================================ report
def markdown(arms: dict, per_seed: list[dict], speed_result: dict | None) -> str:
    lines = ["| arm | test NDCG@20 | test Recall@20 | val NDCG@20 | chosen (tau; alphas uu/ii/ui/iu) per seed |",
             "|---|---|---|---|---|"] if arms else []
    for arm, m in arms.items():
        chosen = ", ".join(f"{s['chosen'][arm]['tau']:g}"
                           + {"top": " (grid top)", "bottom": " (grid bottom)"}.get(
                               s["chosen"][arm].get("tau_position"), "")
                           + f"; {'/'.join(f'{a:g}' for a in s['chosen'][arm]['alphas'])}" for s in per_seed)
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


def plot(arms: dict, path: Path, backbone: str = "lightgcn") -> None:
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
    ax.set_title(f"NT-SSM vs SSM, {'SimGCL' if backbone == 'simgcl' else 'LightGCN'} on the synthetic clustered graph")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--skip-speed", action="store_true", help="leave out the Lightning vs plain-loop timing")
    parser.add_argument("--speed-only", action="store_true",
                        help="only the Lightning vs plain-loop timing (printed, nothing written)")
    parser.add_argument("--backbone", choices=("lightgcn", "simgcl"), default="lightgcn",
                        help="simgcl: every arm on SimGCL (simgcl_quick.yaml); writes nt_ssm_simgcl_cl<W>.json/.png")
    parser.add_argument("--cl-weight", type=float, default=0.5,
                        help="SimGCL's contrastive weight (official 0.5); only with --backbone simgcl")
    args = parser.parse_args(argv)
    quiet_single_thread()
    logging.getLogger("datamodules.interaction_graph").setLevel(logging.ERROR)
    data_overrides = SMOKE_DATA if args.smoke else ()
    speed_sizes = dict(epochs=2, eval_repeats=2, data_overrides=SMOKE_DATA) if args.smoke else {}
    start = time.perf_counter()
    if args.speed_only:
        speed_result = speed(**speed_sizes)
        print(markdown({}, [], speed_result))
        return {"speed": speed_result}
    simgcl = args.backbone == "simgcl"
    overrides = (*data_overrides, *((f"--model.init_args.cl_weight={args.cl_weight}",) if simgcl else ()))
    name = f"nt_ssm_simgcl_cl{args.cl_weight:g}" if simgcl else PAPER
    grids = SMOKE_GRIDS if args.smoke else {}
    run_kwargs = dict(max_epochs=1, patience=1) if args.smoke else {}
    bar = progress(None, desc=f"{name} runs", total=args.seeds * runs_per_seed(**grids))
    partial = Path(args.out) / f"{name}.partial.json"  # every finished seed, in case a long run is stopped
    per_seed = []
    for seed in range(args.seeds):
        per_seed.append(run_seed(seed, bar, args.backbone, overrides, **grids, **run_kwargs))
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"seeds_done": len(per_seed), "per_seed": per_seed}))
    bar.close()
    partial.unlink(missing_ok=True)
    arms = summarise([s["arms"] for s in per_seed])
    speed_result = stored_speed(Path(args.out) / f"{name}.json") if args.skip_speed else speed(**speed_sizes)
    wall = time.perf_counter() - start
    config = {"config_file": CONFIGS[args.backbone],
              "varied": "loss, tau, alpha_uu/ii/ui/iu, data seed (= model seed), ks [20]"
                        + (", cl_weight" if simgcl else ""),
              "overrides": list(overrides), "max_epochs": run_kwargs.get("max_epochs", 80),
              "early_stopping": {"monitor": MONITOR, "patience": run_kwargs.get("patience", 5)},
              "taus": grids.get("taus", TAUS), "nt_taus": grids.get("nt_taus", NT_TAUS),
              "nt_alphas": grids.get("nt_alphas", NT_ALPHAS), "paper_alphas": PAPER_ALPHAS,
              "selection_runs": {"SSM, tau tuned": len(grids.get("taus", TAUS)),
                                 "bidirectional SSM (NT, all alphas 1), tau tuned": len(grids.get("taus", TAUS)),
                                 "NT-SSM, uniform alpha + tau tuned":
                                     len(grids.get("nt_taus", NT_TAUS)) * len(grids.get("nt_alphas", NT_ALPHAS)),
                                 "NT-SSM, type-specific alphas + tau tuned":
                                     nt_grid_size(grids.get("nt_taus", NT_TAUS), grids.get("nt_alphas", NT_ALPHAS))},
              "selection": "each tuned arm: the run with the best val NDCG@20 of its data seed (test never read)",
              "protocol": "synthetic clustered graph (1000 users, 1500 items), per-user 70/10/20; LightGCN d 32 L 2, "
                          "Adam 1e-3, batch 512, reg 1e-4, <= 80 epochs, early stop on val NDCG@20 (patience 5); "
                          "test at the best-valid epoch, full ranking, only train items masked at test",
              "smoke": args.smoke}
    result = write_result(PAPER, seeds=args.seeds, wall_s=wall, config=config, arms=arms, per_seed=per_seed,
                          out=args.out, name=name, title=TITLE, backbone=args.backbone,
                          **({"cl_weight": args.cl_weight} if simgcl else {}), speed=speed_result)
    out = Path(args.out)
    plot(arms, out / f"{name}.png", args.backbone)
    print(markdown(arms, per_seed, speed_result))
    print(f"\nwall {wall:.0f} s; results in {out / (name + '.json')} and {out / (name + '.png')}")
    return result


if __name__ == "__main__":
    main()
