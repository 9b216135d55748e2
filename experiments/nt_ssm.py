"""NT-SSM vs SSM on graph CF at small scale (CPU): ``python -m experiments nt_ssm`` (~35 min a seed on 2 busy cores).

Paper: "Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy"
(NT-SSM, arXiv 2605.24015). Claim: the neighbour-type-aware sampled softmax (NT-SSM) beats the sampled
softmax (SSM) on graph CF backbones. The paper compares at one fixed temperature, tau = 0.2; on small graphs SSM
wants a much higher tau, so most of the gap at tau 0.2 is a temperature effect, and SSM is compared here at its
own validation-selected temperature too.

The protocol is ``configs/nt_ssm/experiment.yaml``, run by `experiments.runner`: every run is
``configs/nt_ssm/quick.yaml`` built as ``python train.py fit`` builds it (`GraphCollaborativeFiltering` +
`GraphRecDataModule`: the embedded clustered-popularity graph, 1000 users, 1500 items, 10 clusters, degrees 5-24,
~10k train edges, per-user 70/10/20 split; LightGCN d 32, L 2, Adam 1e-3, batch 512, reg 1e-4), the seed S driving
the model and the data (one graph per seed), K = 20 only, at most 80 epochs, early stopping on val NDCG@20 with
patience 5 (the config's EarlyStopping) and the test metrics from the best-validation checkpoint (the config's
ModelCheckpoint). Full ranking over all items; at test only the train items are masked (the official protocol:
validation items compete).

Arms (per seed; "tuned" = chosen on validation NDCG@20 of that seed, test reported at the choice):
* ``SSM, tau 0.2 (paper)`` and ``SSM, tau tuned`` over the 12 temperatures of the ``SSM, tau ...`` arms
  (one-directional, the official baseline);
* ``bidirectional SSM (NT, all alphas 1), tau 0.2`` and ``..., tau tuned`` over the same grid: the uniform-alpha
  ablation, which isolates the second direction from the type-aware scaling;
* ``NT-SSM, ml-1m alphas, tau 0.2 (paper)``: alphas (uu, ii, ui, iu) = (1.2, 0.8, 0.8, 1.0);
* ``NT-SSM, uniform alpha + tau tuned``: tau and alpha **tuned jointly** on {0.5, 1} x {0.2, 0.4, 0.6, 0.8}
  (all four alphas equal, the 8 ``NT-SSM, tau ..., alpha ...`` arms);
* ``NT-SSM, type-specific alphas + tau tuned``: the previous grid plus, from its best point, each single alpha
  halved (4 probe runs, trained by `evaluate` once the uniform choice is known); the best of the 12 on validation.

Equal selection budget: each tuned baseline gets as many runs (12 temperatures) as the largest NT-SSM selection
(12 runs), with the same training, early stopping and validation selection; the temperature grid reaches well
above the SSM optimum on this graph, so a chosen value at the grid's top edge would show in ``chosen``
(``tau_position``: ``bottom`` / ``interior`` / ``top`` of its grid, per tuned arm and seed). Selection reads only
the validation metric; the test metrics are computed for every run but never compared.

This module holds what is not configuration. `evaluate`: the test from the best checkpoint plus the run's best
validation score and epoch; when the last run of a selection (experiment.yaml ``settings.select``) is done, the
tuned arm's metrics (a derived arm: the chosen run's), and after the uniform NT-SSM choice the 4 probes
(``settings.probes``). `report`: ``chosen`` ({arm: [tau / alphas / best epoch / tau_position per seed]}), ``runs``
(every run of every seed), ``paired_tuned`` (each reported arm minus ``SSM, tau tuned`` over seeds, the claim's
pair), ``backbone`` and the speed block; `plot`: test NDCG@20 of the reported arms (``results/nt_ssm.png``);
`train_run`: one run of the protocol at a given loss, tau and alphas, for a comparison without the whole grid.

Speed (the ``speed`` block; ``settings.speed``, null leaves it out): training samples/s and full-ranking
evaluation users/s of the same module and data through Lightning (`Trainer.fit` / `Trainer.validate`) and through a
plain PyTorch loop, official sizes (d 64, L 2, batch 2048, K 10/20/40): the fastest of 9 epochs after a warm-up
epoch, and of 19 evaluation passes (the minimum is the measure least disturbed by other processes on a shared
machine).

SimGCL variant: ``--set model.init_args.backbone=simgcl --set model.init_args.cl_weight=W --name
nt_ssm_simgcl_clW`` runs every arm on SimGCL (the settings of ``simgcl_quick.yaml``: noise 0.1, InfoNCE tau 0.2 are
the module's defaults) and writes ``<out>/nt_ssm_simgcl_clW.json`` / ``.png``.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

from experiments import runner
from experiments.kit import from_config, quiet_trainer

CONFIGS = {"lightgcn": "configs/nt_ssm/quick.yaml", "simgcl": "configs/nt_ssm/simgcl_quick.yaml"}
ALPHA_KEYS = ("alpha_uu", "alpha_ii", "alpha_ui", "alpha_iu")
METRICS = ("test/ndcg@20", "test/recall@20", "val/ndcg@20")
MONITOR = "val/ndcg@20"
REPORT_SETTINGS = ("reported", "tuned_baseline", "speed")  # the settings `report` reads (it sees the runs' records)

# the runs of the seed in progress, {arm: record}; `evaluate` selects among them (the runner runs the arms of a
# seed in order, one seed after the other)
_SEED: dict = {"key": None, "runs": {}}


# ============================================================================================ one run
def record(run) -> dict:
    """The fitted run's test metrics (best-validation checkpoint) and configuration: loss, tau, alphas, best epoch
    (0-based) and best ``val/ndcg@20`` as the config's ModelCheckpoint saw them."""
    test = run.test()
    path = run.best_checkpoint()
    callback = next((c for c in run.trainer.checkpoint_callbacks if getattr(c, "monitor", None) == MONITOR), None)
    if path is None or callback is None or callback.best_model_score is None:
        raise runner.ExperimentError(f"{run.arm.name}: no checkpoint monitoring {MONITOR}; nt_ssm needs the config's "
                                     f"ModelCheckpoint(monitor={MONITOR}) and validation every epoch")
    hparams = run.model.hparams
    epoch = int(torch.load(path, map_location="cpu", weights_only=False)["epoch"])
    return {"arm": run.arm.name, "loss": hparams.loss, "tau": float(hparams.tau),
            "alphas": [float(hparams[key]) for key in ALPHA_KEYS], "best_epoch": epoch,
            MONITOR: float(callback.best_model_score), "test/ndcg@20": test["ndcg@20"],
            "test/recall@20": test["recall@20"], "backbone": hparams.backbone,
            **({"cl_weight": float(hparams.cl_weight)} if hparams.backbone == "simgcl" else {})}


def metrics_of(rec: dict) -> dict[str, float]:
    return {m: rec[m] for m in METRICS}


def best(records: list[dict]) -> dict:
    """The record with the best validation NDCG@20 (the first on ties); reads nothing else."""
    return max(records, key=lambda r: r[MONITOR])


def grid_position(value: float, grid) -> str:
    """Where a chosen value sits in its grid: ``"bottom"``, ``"top"`` or ``"interior"`` (one-point grid: top)."""
    grid = sorted(set(grid))
    return "top" if value == grid[-1] else "bottom" if value == grid[0] else "interior"


def chosen_entry(rec: dict, taus) -> dict:
    return {"tau": rec["tau"], "alphas": rec["alphas"], "best_epoch": rec["best_epoch"],
            "tau_position": grid_position(rec["tau"], taus)}


def check_settings(spec) -> None:
    """experiment.yaml's ``settings``: each ``select`` names arms of the experiment, its last member after the
    others (the selection is made when that arm is done); ``probes.from`` is a selection; ``reported`` and
    ``tuned_baseline`` name arms or tuned arms."""
    names = [arm.name for arm in spec.arms]
    settings = spec.settings
    select = settings.get("select") or {}
    for tuned, members in select.items():
        missing = [m for m in members or [] if m not in names]
        if not members or missing:
            raise runner.ExperimentError(f"{spec.path}: settings.select.{tuned} names no arm or unknown arms "
                                         f"{missing}; list arms of this experiment")
        if tuned in names:
            raise runner.ExperimentError(f"{spec.path}: settings.select.{tuned} is also an arm; give the tuned arm "
                                         "a name of its own")
        if max(names.index(m) for m in members) != names.index(members[-1]):
            raise runner.ExperimentError(f"{spec.path}: settings.select.{tuned}: list its arms in the order of "
                                         "`arms` (the selection is made after the last one)")
    probes = settings.get("probes") or {}
    if probes and (probes.get("from") not in select or not probes.get("name")):
        raise runner.ExperimentError(f"{spec.path}: settings.probes needs `from`, a tuned arm of settings.select, "
                                     f"and a `name`; got {probes}")
    known = set(names) | set(select) | ({probes["name"]} if probes else set())
    unknown = [a for a in [*(settings.get("reported") or []), settings.get("tuned_baseline")] if a not in known]
    if unknown or not settings.get("reported"):
        raise runner.ExperimentError(f"{spec.path}: settings.reported / tuned_baseline name unknown arms {unknown}; "
                                     "name arms or tuned arms of this experiment")


def evaluate(run) -> dict[str, float]:
    """The run's metrics; when it is the last member of a selection, the tuned arm as a derived arm (the chosen
    run's metrics), and after the probes' source selection the probes and the type-specific choice."""
    key = (id(run.spec), run.seed, run.variant.name if run.variant else "")
    if _SEED["key"] != key or run.arm is run.spec.arms[0]:
        check_settings(run.spec)
        _SEED.update(key=key, runs={})
    seen = _SEED["runs"]
    rec = record(run)
    seen[run.arm.name] = rec
    run.extra.update(run=rec, chosen={}, settings={k: run.settings.get(k) for k in REPORT_SETTINGS})
    probes = run.settings.get("probes") or {}
    for tuned, members in (run.settings.get("select") or {}).items():
        if run.arm.name != members[-1]:
            continue
        missing = [m for m in members if m not in seen]
        if missing:
            raise runner.ExperimentError(f"settings.select.{tuned}: arms {missing} did not run before "
                                         f"{run.arm.name}; list each selection's arms in the order of `arms`")
        pool = [seen[m] for m in members]
        choice = best(pool)
        taus = [r["tau"] for r in pool]
        run.derived[tuned] = metrics_of(choice)
        run.extra["chosen"][tuned] = chosen_entry(choice, taus)
        if probes.get("from") == tuned:
            trials = [train_probe(run, choice, k) for k in range(len(ALPHA_KEYS))]
            run.extra["probes"] = trials
            final = best(pool + trials)
            run.derived[probes["name"]] = metrics_of(final)
            run.extra["chosen"][probes["name"]] = chosen_entry(final, taus)
    return metrics_of(rec)


def halved(alphas, k: int) -> list[float]:
    """The probe's alphas: alpha ``k`` of ``alphas`` halved (rounded to 3 decimals), the others as they are."""
    alphas = list(alphas)
    alphas[k] = round(alphas[k] / 2, 3)
    return alphas


def train_probe(run, start: dict, k: int) -> dict:
    """From the chosen point ``start``, alpha ``k`` halved: the chosen arm's configuration with tau and the alphas
    overridden, built, fitted and tested as the runner builds every arm (the config's trainer and callbacks)."""
    source = next(arm for arm in run.spec.arms if arm.name == start["arm"])
    flags = runner.arm_flags(run.spec, source, run.variant) + runner.QUIET + [
        runner.flag("model.init_args.tau", start["tau"]),
        *(runner.flag(f"model.init_args.{key}", value) for key, value in zip(ALPHA_KEYS, halved(start["alphas"], k)))]
    rec = fit_and_record(run, source, flags, run.root / f"probe_{ALPHA_KEYS[k]}")
    return {**rec, "arm": f"probe: {ALPHA_KEYS[k]} halved from {start['arm']}"}


def fit_and_record(run, arm, flags: list[str], root: Path) -> dict:
    """A further run of ``run``'s seed (and variant) with CLI arguments ``flags``: fit, then `record`."""
    probe = runner.Run(run.spec, arm, run.variant, run.seed, root, run.out)
    probe.cli = probe.build(flags)
    probe.trainer.fit(probe.model, datamodule=probe.datamodule)
    probe.fitted = True
    return record(probe)


def train_run(seed: int, loss: str, tau: float, alphas=(1.0, 1.0, 1.0, 1.0), overrides: dict | None = None) -> dict:
    """One run of the experiment's protocol outside its grid (experiment.yaml's overrides, then this loss, tau,
    alphas and ``overrides``; ``seed`` drives the model and the data), built and fitted as the runner builds every
    arm, in a temporary folder: its `record`. For a single comparison (tests) without the whole grid."""
    spec = runner.load_spec("nt_ssm")
    values = {"model.init_args.loss": loss, "model.init_args.tau": tau,
              **{f"model.init_args.{key}": value for key, value in zip(ALPHA_KEYS, alphas)}, **(overrides or {})}
    arm = runner.Arm(f"{loss}, tau {tau:g}", list(spec.arms[0].configs), values)
    with tempfile.TemporaryDirectory(prefix="nt_ssm_run_") as root, runner.isolated():
        run = runner.Run(spec, arm, None, seed, Path(root), Path(root))
        return fit_and_record(run, arm, runner.arm_flags(spec, arm) + runner.QUIET, Path(root))


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


# ============================================================================================ report
def report(result: dict, records: list[dict]) -> dict:
    """``chosen`` ({arm: [its tau / alphas / best epoch per seed]}, tuned arms with ``tau_position``), ``runs``
    (every run of every seed, probes included), ``paired_tuned`` (the reported arms minus ``tuned_baseline`` over
    seeds), ``backbone`` (and ``cl_weight`` on SimGCL) and the ``speed`` block; prints the markdown table."""
    settings = next(extra["settings"] for seed in records for runs in seed.values() for extra in runs.values())
    reported = settings["reported"]
    chosen: dict[str, list] = {arm: [] for arm in reported}
    runs = []
    for seed in records:
        seed_runs = seed.get("", {})
        picks = {arm: {k: extra["run"][k] for k in ("tau", "alphas", "best_epoch")}
                 for arm, extra in seed_runs.items() if arm in reported}
        for extra in seed_runs.values():
            picks.update(extra["chosen"])
        for arm in reported:
            if arm in picks:
                chosen[arm].append(picks[arm])
        runs.append([r for extra in seed_runs.values() for r in [extra["run"], *extra.get("probes", [])]])
    chosen = {arm: picks for arm, picks in chosen.items() if picks}
    first = runs[0][0]
    rows = [{arm: cells for arm, cells in row.items() if arm in reported} for row in result["per_seed"]]
    extra = {"backbone": first["backbone"], **({"cl_weight": first["cl_weight"]} if "cl_weight" in first else {}),
             "chosen": chosen, "runs": runs,
             "paired_tuned": runner.paired(rows, settings["tuned_baseline"], list(METRICS)),
             "speed": speed(**speed_arguments(settings["speed"])) if settings.get("speed") else None}
    print(markdown({arm: result["arms"][arm] for arm in chosen}, chosen, extra["speed"]))
    return extra


def speed_arguments(value: dict) -> dict:
    """``settings.speed`` ({epochs, eval_repeats, data: {datamodule argument: value}}) as `speed`'s arguments."""
    unknown = sorted(set(value) - {"epochs", "eval_repeats", "data"})
    if unknown:
        raise runner.ExperimentError(f"settings.speed: unknown key(s) {unknown}; allowed: data, epochs, eval_repeats")
    data = tuple(runner.flag(f"data.init_args.{k}", v) for k, v in (value.get("data") or {}).items())
    return {k: v for k, v in value.items() if k != "data"} | {"data_overrides": data}


def markdown(arms: dict, chosen: dict, speed_result: dict | None) -> str:
    lines = ["| arm | test NDCG@20 | test Recall@20 | val NDCG@20 | chosen (tau; alphas uu/ii/ui/iu) per seed |",
             "|---|---|---|---|---|"] if arms else []
    for arm, m in arms.items():
        picks = ", ".join(f"{s['tau']:g}" + {"top": " (grid top)", "bottom": " (grid bottom)"}.get(
                              s.get("tau_position"), "")
                          + f"; {'/'.join(f'{a:g}' for a in s['alphas'])}" for s in chosen[arm])
        lines.append(f"| {arm} | {m['test/ndcg@20']['mean']:.4f} ± {m['test/ndcg@20']['std']:.4f} | "
                     f"{m['test/recall@20']['mean']:.4f} ± {m['test/recall@20']['std']:.4f} | "
                     f"{m['val/ndcg@20']['mean']:.4f} | {picks} |")
    if speed_result:
        lines += ["", f"Speed ({speed_result['setting']}):", "",
                  "| work | Lightning | plain PyTorch | ratio |", "|---|---|---|---|"]
        for key, label in (("train_samples_per_s", "training samples/s"),
                           ("eval_users_per_s", "full-ranking eval users/s")):
            s = speed_result[key]
            lines.append(f"| {label} | {s['lightning']:.0f} | {s['plain']:.0f} | {s['ratio']:.2f} |")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    """Test NDCG@20 of the reported arms (mean ± std over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["chosen"])
    arms = result["arms"]
    means = [arms[a]["test/ndcg@20"]["mean"] for a in names]
    stds = [arms[a]["test/ndcg@20"]["std"] for a in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(range(len(names)), means, xerr=stds, color=["#3a7" if n.startswith("NT-SSM") else "#999" for n in names])
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("test NDCG@20 (best-valid epoch; mean ± std over data seeds)")
    backbone = "SimGCL" if result.get("backbone") == "simgcl" else "LightGCN"
    ax.set_title(f"NT-SSM vs SSM, {backbone} on the synthetic clustered graph")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.nt_ssm [flags]
    import sys

    sys.exit(runner.experiment_command(["nt_ssm", *sys.argv[1:]]))
