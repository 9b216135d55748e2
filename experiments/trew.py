"""Reproduce TREW's central claim at small scale: ``python -m experiments trew`` (digits, CPU; or ``icml26 experiment
trew``; ``python -m experiments.trew`` still works).

Claim (arXiv 2506.20893): class-unlearning methods leave the forget class's inputs with a predictive
distribution unlike a retrained model's, which a neighbour-class attack (CMIA) detects; TREW, which matches
a similarity-tilted version of the original distribution, gets closest to retraining.

The protocol is ``configs/trew/experiment.yaml``, run by `experiments.runner`: every model is an arm built as
``python train.py fit`` builds it (the configs' trainers and callbacks), the seed S driving the data split of every
run. Per seed:
1. the original ``ImageClassifier`` (MLP 64-128-10, Adam 1e-3, 40 epochs, no validation during training) on all
   digits: ``configs/trew/classifier_quick.yaml``, model seed S;
2. four retrained models without the forget class (``configs/trew/retrain_quick.yaml``, the same recipe, each
   with its own model seed, the arm's ``seed_offset``: S + 1000 / 2000 / 3000 / 4000): R, the reference every test
   metric compares with; R2, a second retrain compared with R (the *floor* any method can hope for); A, the CMIA
   attacker's shadow model; and S, the *selection* model: every arm's hyper-parameters are chosen by the mean
   total-variation distance to S on the validation forget inputs, so that selection reads neither the test inputs
   nor the model R the test metric compares with;
3. unlearning runs (``row: false`` arms: grid points) from the original (``ClassUnlearning`` from
   ``configs/trew/quick.yaml``; `prepare` sets ``init_from`` to the original's checkpoint and ``reference_from`` to
   S's; the arm sets the method, learning rate, forget weight, epochs and the TREW callback's arguments). Every run
   validates after each epoch against S and its ModelCheckpoint (``monitor: val/tv_to_reference``, mode min, the
   arm's ``trainer.callbacks``) keeps its best epoch, so the number of epochs is read off the run. Every selected
   arm picks from the same number of (configuration, epoch) points, 125 (`grid_points`):
   TREW, per similarity (the paper's weights; the original model's confusions): beta x T (24 + beta = 0) at
   the config's learning rate 1e-3, epochs 1-5; FT: learning rate (5 values), epochs 1-25 (FT has no other
   knob, so its runs are longer: the same points and the same training epochs); NegGrad+: learning rate x
   ascent weight (5 x 5), epochs 1-5; RL: learning rate x random-label weight (5 x 5), epochs 1-5.
   Fixed arms are a run's final state: FT (a 5-epoch run at Adam 1e-3: the first 5 epochs of the 25-epoch run),
   NegGrad+ (ascent weight 0.1) and RL as first hand-set (Adam 1e-3, 5 epochs), TREW at the paper default
   (weights, beta 10, T 0.1, 5 epochs); the beta = 0 ablation has its epoch read off on validation like every
   grid point (experiment.yaml ``settings.rows``);
4. metrics on held-out data: forget / retain test accuracy, forget-train accuracy, MIA efficacy, TV to R on
   test forget inputs, CMIA detection rate and its gap to R; and the validation criterion (TV to S).

This module holds what is not configuration: `prepare` (the checkpoints an unlearning run starts from and
validates against), `evaluate` (the `Evaluator`'s metrics of the original and the floor; for a grid point, its best
epoch and score, checked against the evaluator's TV to S, and the rows of ``settings.rows`` once their runs are
done), `report` (``chosen``: every selected arm's configuration per seed; ``grid_points``; the tables) and `plot`.
Writes ``results/trew.json`` and ``results/trew.png``, prints a markdown table (mean ± std over seeds).
"""
from __future__ import annotations

import copy

import torch

from experiments import runner
from lightning_modules.trew.trew import (CMIAttack, mia_efficacy, neighbour_classes, predict_probabilities,
                                         total_variation)

METRICS = ("forget_acc", "retain_acc", "forget_train_acc", "mia_efficacy", "tv_to_retrain", "cmia_rate",
           "cmia_gap", "val_tv_to_selection")
SELECTION_MONITOR = "val/tv_to_reference"   # ClassUnlearning's TV to its `reference_from` (here S) on val forget
ROLES = ("original", "reference", "shadow", "selection", "floor")   # settings.classifiers: role -> arm name

# the seed in progress: its evaluator, grid points and emitted rows (the runner runs the arms of a seed in order,
# one seed after the other)
_SEED: dict = {"key": None}


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
        if arm.startswith("diagnostic") or not all(m in metrics for m in METRICS):
            continue
        cells = [f"{metrics[m]['mean']:.3f} ± {metrics[m]['std']:.3f}" if "tv" in m
                 else f"{metrics[m]['mean']:.1f} ± {metrics[m]['std']:.1f}" for m in METRICS]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(arms: dict, path: str) -> None:
    """TV to R, CMIA gap and retain accuracy per reported arm (mean ± std over seeds)."""
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
    plt.close(fig)


def classifiers(spec) -> dict[str, str]:
    """experiment.yaml's ``settings.classifiers`` (role -> arm), checked: every role names an arm that runs before
    the unlearning arms."""
    roles = dict(spec.settings.get("classifiers") or {})
    names = [arm.name for arm in spec.arms]
    missing = [role for role in ROLES if roles.get(role) not in names]
    if missing:
        raise runner.ExperimentError(f"{spec.path}: settings.classifiers must name an arm for each of {list(ROLES)}; "
                                     f"{missing} name none")
    last = max(names.index(roles[role]) for role in ROLES)
    if any(name not in roles.values() for name in names[:last]):
        raise runner.ExperimentError(f"{spec.path}: list the classifier arms {sorted(roles.values())} before the "
                                     "unlearning arms (these start from the original and validate against S)")
    return roles


def members(spec, row: dict) -> list[str]:
    """The arms a ``settings.rows`` entry reads, in the order of ``arms``: ``final`` (one arm) or ``select`` (each
    entry an arm name, or a prefix ending in a space or a comma and space that arm names start with)."""
    if row.get("diagnostic"):
        return []
    if "final" in row:
        return [arm.name for arm in spec.arms if arm.name == row["final"]]
    patterns = row.get("select") or []
    return [arm.name for arm in spec.arms
            if any(arm.name == p or (p.endswith(" ") and arm.name.startswith(p)) for p in patterns)]


def check_rows(spec) -> list[dict]:
    rows = list(spec.settings.get("rows") or [])
    for row in rows:
        kinds = [k for k in ("final", "select", "diagnostic") if row.get(k)]
        if not row.get("name") or len(kinds) != 1 or set(row) - {"name", "final", "select", "diagnostic"}:
            raise runner.ExperimentError(f"{spec.path}: settings.rows entry {row} needs a name and one of final "
                                         "(an arm), select (arm names or prefixes) or diagnostic: true")
    return rows


def grid_points(spec) -> dict[str, int]:
    """(configuration, epoch) points every selected row of ``settings.rows`` chooses from: the sum of its runs'
    ``trainer.max_epochs`` (the configuration's 5 where the arm does not set it)."""
    def epochs(name: str) -> int:
        arm = next(a for a in spec.arms if a.name == name)
        return int({**spec.overrides, **arm.overrides, **spec.smoke_overrides, **arm.smoke_overrides}.get(
            "trainer.max_epochs", 5))

    return {row["name"]: sum(epochs(m) for m in members(spec, row)) for row in check_rows(spec) if "select" in row}


def _seed_state(run) -> dict:
    key = (id(run.spec), run.seed, run.variant.name if run.variant else "")
    if _SEED["key"] != key:
        _SEED.clear()
        _SEED.update(key=key, roles=classifiers(run.spec), rows=check_rows(run.spec), runs={}, emitted=0,
                     evaluator=None, original=None)
    return _SEED


def prepare(run) -> dict:
    """An unlearning run starts from the seed's original (``init_from``) and validates against its selection model
    S (``reference_from``): the checkpoints of those earlier runs. Classifiers need nothing."""
    roles = classifiers(run.spec)
    if run.arm.name in roles.values():
        return {}
    original, selection = run.earlier.get(roles["original"]), run.earlier.get(roles["selection"])
    paths = [r.best_checkpoint() if r is not None else None for r in (original, selection)]
    if None in paths:
        raise runner.ExperimentError(f"{run.arm.name}: no checkpoint of {roles['original']!r} / {roles['selection']!r} "
                                     "from this seed; those arms must run (and save a checkpoint) first")
    return {"model.init_args.init_from": paths[0], "model.init_args.reference_from": paths[1]}


def run_config(run) -> dict:
    """The unlearning run's configuration as ``chosen`` reports it: lr (and forget weight; TREW's similarity, beta,
    T)."""
    from callbacks.trew import TREWReweighting

    init = run.cli.config["model"]["init_args"]
    config = {"lr": float(init["optimizer"]["init_args"]["lr"])}
    if init["method"] != "finetune":
        config["forget_weight"] = float(init["forget_weight"])
    trew = next((c for c in run.trainer.callbacks if isinstance(c, TREWReweighting)), None)
    if init["method"] == "trew" and trew is not None:
        config.update(similarity=trew.similarity_source, beta=float(trew.beta), temperature=float(trew.temperature))
    return config


def evaluate(run) -> dict[str, float]:
    """The original and the floor: the `Evaluator`'s metrics (R, A and S are only read). A grid point: its final
    state's metrics when a ``final`` row reads it, then its best epoch (the config's ModelCheckpoint on
    ``val/tv_to_reference``), whose score must be the evaluator's TV to S; then every ``settings.rows`` entry whose
    runs are all done, in order, as derived arms."""
    state = _seed_state(run)
    roles = state["roles"]
    name = run.arm.name
    if name in (roles["reference"], roles["shadow"], roles["selection"]):
        return {}
    model = run.model.eval()
    if name == roles["original"]:
        earlier = {role: run.earlier[roles[role]].model.eval() for role in ("reference", "shadow", "selection")}
        forget_class = run.datamodule.hparams.forget_class
        state.update(original=model, evaluator=Evaluator(run.datamodule, earlier["reference"], earlier["shadow"],
                                                         earlier["selection"], forget_class, run.seed))
    evaluator = state["evaluator"]
    if evaluator is None:
        raise runner.ExperimentError(f"{name}: the original ({roles['original']!r}) must run before it")
    if name in (roles["original"], roles["floor"]):
        return evaluator.metrics(model)
    record = {"config": run_config(run)}
    if any(row.get("final") == name for row in state["rows"]):
        record["final"] = evaluator.metrics(model)  # the last epoch: a hand-set arm
    callback = next((c for c in run.trainer.checkpoint_callbacks if getattr(c, "monitor", None) == SELECTION_MONITOR),
                    None)
    if callback is None or callback.best_model_score is None:
        raise runner.ExperimentError(f"{name}: no ModelCheckpoint(monitor={SELECTION_MONITOR}) with a score; trew's "
                                     "unlearning arms need one in trainer.callbacks and reference_from set")
    record["epoch"] = int(torch.load(callback.best_model_path, map_location="cpu", weights_only=False)["epoch"]) + 1
    record["val_tv"] = float(callback.best_model_score)
    run.load_best()
    model = run.model.eval()
    check = evaluator.validation_tv(model)
    if abs(check - record["val_tv"]) > 1e-4:  # the in-training criterion must be the evaluator's (TV to S)
        raise RuntimeError(f"validation criterion {record['val_tv']} != TV to the selection model {check}")
    record["state"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    state["runs"][name] = record
    emit_rows(run, state)
    return {}


def select(records: list[dict]) -> dict:
    """The run with the lowest validation TV to S (the first in arm order on ties)."""
    return min(records, key=lambda record: record["val_tv"])


def emit_rows(run, state: dict) -> None:
    """Add to ``run.derived`` every ``settings.rows`` entry whose runs are done, in order (a row whose runs this
    experiment lacks, e.g. in a smoke run, is left out); the selected rows' choices go to ``run.extra``."""
    rows, evaluator = state["rows"], state["evaluator"]
    while state["emitted"] < len(rows):
        row = rows[state["emitted"]]
        names = members(run.spec, row)
        if any(name not in state["runs"] for name in names):
            return
        state["emitted"] += 1
        if row.get("diagnostic"):
            run.derived[row["name"]] = similarity_diagnostic(state["original"], evaluator,
                                                             evaluator.forget_class)
        elif not names:
            continue
        elif "final" in row:
            run.derived[row["name"]] = state["runs"][names[0]]["final"]
        else:
            best = select([state["runs"][name] for name in names])
            model = copy.deepcopy(run.model)
            model.load_state_dict(best["state"])
            run.derived[row["name"]] = evaluator.metrics(model.eval())
            run.extra.setdefault("chosen", {})[row["name"]] = {**best["config"], "epochs": best["epoch"]}


def report(result: dict, records: list[dict], spec) -> dict:
    """``chosen`` ({selected arm: its configuration and epochs per seed}) and ``grid_points``; prints the table."""
    chosen: dict[str, list] = {}
    for seed in records:
        for extra in seed.get("", {}).values():
            for arm, pick in extra.get("chosen", {}).items():
                chosen.setdefault(arm, []).append(pick)
    order = [row["name"] for row in check_rows(spec)]
    chosen = {arm: chosen[arm] for arm in order if arm in chosen}
    print(markdown_table(result["arms"]))
    for arm, picks in chosen.items():
        print(f"{arm}: chosen per seed {picks}")
    diagnostic = result["arms"].get("diagnostic: similarity vs retrained")
    if diagnostic:
        print("similarity diagnostic (mean ± std): " + ", ".join(
            f"{k} {v['mean']:.2f} ± {v['std']:.2f}" for k, v in diagnostic.items()))
    return {"chosen": chosen, "grid_points": grid_points(spec)}


def plot(result: dict, path) -> None:
    draw(result["arms"], str(path))


if __name__ == "__main__":  # the older spelling: python -m experiments.trew [runner flags]
    import sys

    sys.exit(runner.experiment_command(["trew", *sys.argv[1:]]))
