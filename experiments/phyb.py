"""PhyB vs PMDB vs MOPO vs the mean-ensemble target, and TD3+BC, offline on CPU: ``python -m experiments phyb``.

Paper: "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief" (ICML 2026, arXiv
2606.00680). Its claim: a Bellman target from a convex combination of the k most pessimistic of N sampled models
(softmax of their normalised values, lambda = -3) is pessimistic enough to avoid the overestimation of a plain model
ensemble and less brittle than PMDB's single order statistic.

The protocol is ``configs/phyb/experiment.yaml``, run by `experiments.runner`; this module holds its hooks. Per seed
S (the data seed, the ensemble's and every policy's seed) and dataset (``currency_exchange``: CurrencyExchange with
a uniform-random behaviour policy; ``pendulum``: Pendulum with the noisy medium controller, `datamodules.offline_rl`):

1. ``<env>/ensemble`` (no row): one dynamics ensemble (``configs/phyb/ensemble_quick.yaml``: 7 members, 5 elites,
   5 epochs of 60 batches); `evaluate` saves its final weights, shared by the four targets.
2. ``<env>/mean``, ``/mopo``, ``/pmdb``, ``/phyb``: ``configs/phyb/quick.yaml`` from that ensemble (`prepare` sets
   ``init_from``), only ``belief_target`` changed, ``trainer.max_steps`` optimiser steps each (one critic and one
   actor step per training step); ``<env>/td3_bc``: the model-free TD3+BC (Fujimoto & Gu 2021,
   ``configs/phyb/td3_bc_quick.yaml``: the same critic sizes, batch and optimiser, no ensemble) for
   ``max_steps / 2`` batches in one epoch (`prepare`: its actor steps every second batch, so its optimiser-step
   count is not the batch count). Every arm keeps its paper's settings (PhyB lambda = -3, MOPO lambda = 1, PMDB
   k = 2, TD3+BC alpha = 2.5): no arm is tuned and the last policy is evaluated, so nothing is selected on the
   evaluation episodes.
3. `evaluate`: ``settings.episodes`` real-environment episodes from seed 10,000 + S (the code's acting rule; TD3+BC's
   deterministic actor): ``return`` (mean undiscounted return), ``q_overestimation`` (critic Q(s0, a0) /
   reward_scale minus the discounted Monte-Carlo return of the same episodes, signed), ``abs_q_bias`` (its absolute
   value: how far the critic is off on average, whichever the sign) and ``q_abs_error`` (the mean of the per-episode
   absolute differences); the td3_bc run adds the reference row ``<env>/behaviour`` with ``behaviour_return`` (the
   data-collecting policy's return).
4. `report`: the pairs of ``settings.paired`` (per dataset, PhyB minus every other arm seed by seed:
   `icml26.paired.paired_block`, the mean and 95% t interval) after the runner's pairs of the Pendulum rows against
   ``baseline``; prints a table per dataset. `plot`: the PNG.

Longer budgets are ablations of the whole protocol, e.g. ``python -m experiments phyb --set trainer.max_steps=6000
--name phyb_3000_steps`` (3,000 training steps; docs/phyb.md lists the commands of every landed table).
"""
from __future__ import annotations

from pathlib import Path

from callbacks.offline_evaluation import evaluate as evaluate_in_env
from experiments import kit
from experiments.runner import ExperimentError, arm_flags
from lightning_modules.shared.errors import UserInputError

TARGETS = ("mean", "mopo", "pmdb", "phyb")
ARMS = (*TARGETS, "td3_bc")
METRICS = ("return", "q_overestimation", "abs_q_bias", "q_abs_error")
ENSEMBLE_CHECKPOINT = "ensemble.ckpt"  # the ensemble run's final weights, in its run folder


class SettingError(ExperimentError, UserInputError):
    """A setting of the PhyB protocol (experiment.yaml or ``--set``) that cannot run: one line, the fix included."""


def q_metrics(result: dict[str, float]) -> dict[str, float]:
    """An `evaluate` result -> the reported metrics: the return, the signed Q bias, its absolute value (the bias
    whichever its sign: a critic 60 below the return is as far off as one 60 above) and the per-episode abs error."""
    return {"return": result["return"], "q_overestimation": result["q_overestimation"],
            "abs_q_bias": abs(result["q_overestimation"]), "q_abs_error": result["q_abs_error"]}


def split_arm(name: str) -> tuple[str, str]:
    """``"<env>/<arm>"`` -> ``(env, arm)``; an arm of experiment.yaml named otherwise is one error line."""
    env, sep, arm = name.partition("/")
    if not sep or arm not in (*ARMS, "ensemble"):
        raise SettingError(f"configs/phyb/experiment.yaml: arm {name!r} must be named <dataset>/<arm> with <arm> one "
                           f"of {', '.join((*ARMS, 'ensemble'))}")
    return env, arm


def max_steps(run) -> int:
    """The run's ``trainer.max_steps`` as given (experiment.yaml, smoke, ``--set``): the model-based arms' optimiser
    steps, twice their training steps; must be a positive even number."""
    given = [f.partition("=")[2] for f in arm_flags(run.spec, run.arm, run.variant)
             if f.startswith("--trainer.max_steps=")]
    value = given[-1] if given else None
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = None
    if steps is None or steps < 2 or steps % 2:
        raise SettingError(f"trainer.max_steps={value}: must be a positive even number (one critic and one actor "
                           "step per training step), e.g. --set trainer.max_steps=6000 for 3,000 steps")
    return steps


def episodes(run) -> int:
    """``settings.episodes``: the real-environment evaluation episodes per arm (20, as in the earlier script)."""
    value = run.settings.get("episodes", 20)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(f"settings.episodes={value!r}: must be a positive integer (real-environment evaluation "
                           "episodes per arm), e.g. 20")
    return value


def prepare(run) -> dict:
    """Overrides computed per run: the ensemble trains its epochs whatever ``trainer.max_steps`` says; TD3+BC gets
    ``max_steps / 2`` batches as one epoch (the old protocol's batch count); the model-based arms start from the
    same seed's ensemble of their dataset (``init_from`` = its final weights)."""
    env, arm = split_arm(run.arm.name)
    steps = max_steps(run)
    episodes(run)
    if arm == "ensemble":
        return {"trainer.max_steps": -1}
    if arm == "td3_bc":
        return {"data.init_args.steps_per_epoch": steps // 2, "trainer.max_steps": -1}
    ensemble = run.earlier.get(f"{env}/ensemble")
    if ensemble is None:
        raise SettingError(f"{run.arm.name} starts from the arm {env}/ensemble, which did not run before it on seed "
                           f"{run.seed}: list {env}/ensemble before it in configs/phyb/experiment.yaml")
    return {"model.init_args.init_from": str(Path(ensemble.root) / ENSEMBLE_CHECKPOINT)}


def evaluate(run) -> dict[str, float]:
    """The ensemble: save its final weights for the targets (no metrics). A policy: its last weights over
    ``settings.episodes`` real episodes from seed 10,000 + S (`q_metrics`); the td3_bc run also adds the row
    ``<env>/behaviour`` (the data's own return)."""
    env, arm = split_arm(run.arm.name)
    if arm == "ensemble":
        Path(run.root).mkdir(parents=True, exist_ok=True)
        run.trainer.save_checkpoint(str(Path(run.root) / ENSEMBLE_CHECKPOINT))
        return {}
    metrics = q_metrics(evaluate_in_env(run.model, run.datamodule.make_env(), episodes(run), seed=10_000 + run.seed))
    if arm == "td3_bc":
        run.derived[f"{env}/behaviour"] = {"behaviour_return": float(run.datamodule.behaviour_return)}
    return metrics


def environments(arms) -> list[str]:
    """The datasets of the result's rows, in order."""
    return list(dict.fromkeys(name.partition("/")[0] for name in arms if "/" in name))


def same_dataset(pair: str) -> bool:
    """``"<env>/<arm> - <env>/<baseline>"``: both rows of the pair are of one dataset."""
    first, _, second = pair.partition(" - ")
    return first.partition("/")[0] == second.partition("/")[0]


def paired_differences(per_seed: list[dict], pairs: list) -> dict:
    """``{"<arm> - <baseline>": {metric: {mean, lo, hi, n}}}`` for every ``{baseline, arms}`` entry of ``pairs``
    (``settings.paired``): each arm minus the baseline, seed by seed, with the 95% t interval of
    `icml26.paired.paired_block` (lo = hi = None from one seed), on `METRICS`. Rows the run did not make (a smoke
    run keeps Pendulum only) are skipped; a name that is no ``<dataset>/<arm>`` of the protocol is an error."""
    from icml26.paired import paired_block

    if not isinstance(pairs, list):
        raise SettingError("settings.paired must be a list of {baseline: ROW, arms: [ROW, ...]}, e.g. "
                           "{baseline: pendulum/pmdb, arms: [pendulum/phyb]}")
    known = {arm for row in per_seed for arm in row}
    block = {}
    for entry in pairs:
        if not isinstance(entry, dict) or set(entry) != {"baseline", "arms"} or not isinstance(entry["arms"], list):
            raise SettingError(f"settings.paired entry {entry!r}: write {{baseline: ROW, arms: [ROW, ...]}}, e.g. "
                               "{baseline: pendulum/pmdb, arms: [pendulum/phyb]}")
        for name in (entry["baseline"], *entry["arms"]):
            split_arm(str(name))
        arms = [arm for arm in entry["arms"] if arm in known]
        if entry["baseline"] in known and arms:
            metrics = [m for m in METRICS if any(m in row.get(arm, {}) for row in per_seed for arm in arms)]
            block.update(paired_block(per_seed, entry["baseline"], metrics, arms))
    return block


def report(result: dict, records: list[dict], spec) -> dict:
    """The pairs of ``settings.paired`` (`paired_differences`: PhyB minus every other arm of its dataset), added
    after the runner's pairs of every row minus ``baseline``, of which only those within the baseline's dataset are
    kept (a CurrencyExchange arm minus a Pendulum arm compares two tasks); prints a table and the pairs per dataset."""
    pairs = paired_differences(result["per_seed"], spec.settings.get("paired", []))
    runner_pairs = result.get("paired")
    if isinstance(runner_pairs, dict):  # the runner adds its block before the report's: drop its cross-dataset pairs
        for pair in [p for p in runner_pairs if not same_dataset(p)]:
            del runner_pairs[pair]
    for env in environments(result["arms"]):
        table = {arm: cells for arm, cells in result["arms"].items() if arm.startswith(env + "/")}
        print(f"\n{env}\n{kit.markdown_table(table, [*METRICS, 'behaviour_return'])}")
        for pair, cells in pairs.items():
            if pair.startswith(env + "/"):
                print(pair, "; ".join(f"{m} {c['mean']:.1f} [{_fmt(c['lo'])}, {_fmt(c['hi'])}]"
                                      for m, c in cells.items()))
    return {"paired": pairs}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def plot(result: dict, path) -> None:
    """Return, signed and absolute Q bias per arm (mean ± std over seeds), one column per dataset; the dashed line is
    the behaviour data's return."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, envs = result["arms"], environments(result["arms"])
    metrics = ("return", "q_overestimation", "abs_q_bias")
    fig, axes = plt.subplots(len(metrics), len(envs), figsize=(5 * len(envs), 8.5), squeeze=False)
    for col, env in enumerate(envs):
        names = [t for t in ARMS if f"{env}/{t}" in arms]
        for row, metric in enumerate(metrics):
            cells = [arms[f"{env}/{t}"][metric] for t in names]
            axes[row, col].bar(names, [c["mean"] for c in cells], yerr=[c["std"] for c in cells], capsize=3)
            if metric == "return" and f"{env}/behaviour" in arms:
                axes[row, col].axhline(arms[f"{env}/behaviour"]["behaviour_return"]["mean"], color="k", ls="--",
                                       lw=1, label="behaviour")
                axes[row, col].legend()
            axes[row, col].set_title(f"{env}: {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.phyb [runner flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["phyb", *sys.argv[1:]]))
