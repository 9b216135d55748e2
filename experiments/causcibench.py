"""CauSciBench on CPU: method selection is the bottleneck: ``python -m experiments causcibench``.

Paper: "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research?" (ICML 2026, PMLR v306).
Its finding: LLM agents are worse on real than on synthetic tasks, and choosing the method is the bottleneck
(models default to simpler methods). No LLM is run here; the experiment checks the pipeline and that claim with
four agents of `lightning_modules.causcibench.causal_agent.CausalInferenceAgent`:

* ``oracle``: the reference method and variables (validates the generators and the estimators: near-zero error
  on synthetic queries is expected; on the real queries, scored against the benchmark's released references, its
  error is where our estimate on causaldata's table differs from the release);
* ``rule-based``: design variables of the query decide (running variable -> RDD, instrument -> IV, mediator ->
  front-door, time and group -> DiD), else a randomisation cue -> OLS, else propensity-score matching;
* ``forced OLS``: OLS with every other numeric column as a control (what the paper reports models falling back to);
* ``learned selector``: the MLP of ``configs/causcibench/quick.yaml`` trained on synthetic queries (query text and
  data columns in, method out), tested from the checkpoint with the best validation method accuracy.

The protocol (arms, seeds, sizes, smoke sizes) is ``configs/causcibench/experiment.yaml``, run by
`experiments.runner`; this module holds what is not configuration: the evaluation on two test sources per run
(`evaluate`), the per-design summary and the claims (`report`) and the figure (`plot`). Metrics (prefix
``synthetic/`` or ``real/``): ``method_acc`` and ``mre`` (relative error capped at 1 per query, a failure counts 1;
absolute error where |reference| < 1e-8). The per-design MRE (synthetic) is in ``by_design``; ``claims`` records
whether each expectation held.
"""
from __future__ import annotations

import numpy as np

HARD_DESIGNS = ("iv", "iv_encouragement", "rdd", "did_canonical", "did_twfe", "frontdoor")
TABLE = ("name", "method", "estimate", "reference", "error")


def evaluate(run) -> dict[str, float]:
    """Test the run's agent on the synthetic test queries, then on the real ones (the datamodule's two test
    sources, each through ``trainer.test``); keeps the per-query records for `report`."""
    data, metrics = run.datamodule, {}
    for source in ("synthetic", "real"):
        data.hparams.test_source, data.test_queries = source, None
        run.test()
        records = list(run.model.records)
        run.extra[source] = records
        metrics[f"{source}/method_acc"] = float(np.mean([r["method_correct"] for r in records]))
        metrics[f"{source}/mre"] = float(np.mean([r["error"] for r in records]))
    if run.fitted:
        best = next(c for c in run.trainer.checkpoint_callbacks if getattr(c, "monitor", None))
        run.extra["best_val"] = float(best.best_model_score)
    return metrics


def report(result: dict, records: list[dict]) -> dict:
    """MRE per synthetic design, the hard designs' MRE, the claims and seed 0's real answers (the oracle's show where
    our estimate of the reference method differs from the released reference)."""
    arms = result["arms"]
    runs = [seed[""] for seed in records]
    designs = list(dict.fromkeys(r["design"] for r in runs[0]["oracle"]["synthetic"]))
    by_design = {arm: {d: float(np.mean([r["error"] for seed in runs for r in seed[arm]["synthetic"]
                                         if r["design"] == d])) for d in designs} for arm in arms}
    hard = [d for d in HARD_DESIGNS if d in designs]
    hard_mre = {arm: float(np.mean([by_design[arm][d] for d in hard])) for arm in arms}
    claims = {
        "oracle synthetic MRE < 0.1": arms["oracle"]["synthetic/mre"]["mean"] < 0.1,
        "rule-based synthetic MRE within 0.05 of the oracle":
            arms["rule-based"]["synthetic/mre"]["mean"] - arms["oracle"]["synthetic/mre"]["mean"] < 0.05,
        "forced OLS MRE on IV/RDD/DiD/front-door >= 3x the oracle's": hard_mre["forced OLS"] >= 3 * hard_mre["oracle"],
    }
    return {"by_design": by_design, "hard_design_mre": hard_mre, "claims": claims,
            "real_paired_by_query": real_paired_by_query(runs, arms),
            "selector_best_val_method_acc": [seed["learned selector"]["best_val"] for seed in runs],
            "real_queries_seed0_learned": [{k: r[k] for k in ("name", "reference_method", *TABLE[1:])}
                                           for r in runs[0]["learned selector"]["real"]],
            "real_queries_seed0_oracle": [{k: r[k] for k in TABLE} for r in runs[0]["oracle"]["real"]],
            "real_queries_seed0_rule_based": [{k: r[k] for k in TABLE} for r in runs[0]["rule-based"]["real"]],
            "real_queries_seed0_forced_ols": [{k: r[k] for k in TABLE} for r in runs[0]["forced OLS"]["real"]]}


def real_paired_by_query(runs: list[dict], arms, baseline: str = "forced OLS") -> dict:
    """Each arm's real-query error minus the baseline's, query by query (each query's error averaged over seeds),
    as ``paired_interval`` over the queries: the real queries are the same every seed, so the arms without training
    have one value per query and the seed-paired interval of ``paired`` has no spread; the queries are the sample."""
    from icml26.claims import paired_interval

    def per_query(arm: str) -> tuple[list[str], np.ndarray]:
        names = [r["name"] for r in runs[0][arm]["real"]]
        if any([r["name"] for r in seed[arm]["real"]] != names for seed in runs):
            raise RuntimeError(f"the real queries of {arm} differ between seeds")
        return names, np.mean([[r["error"] for r in seed[arm]["real"]] for seed in runs], axis=0)

    names, base = per_query(baseline)
    out = {}
    for arm in arms:
        if arm == baseline:
            continue
        arm_names, errors = per_query(arm)
        if arm_names != names:
            raise RuntimeError(f"{arm} and {baseline} answered different real queries")
        mean, lo, hi, n = paired_interval(errors - base)
        out[f"{arm} - {baseline}"] = {"real/mre": {"mean": mean, "lo": lo, "hi": hi, "n": n}}
    return out


def plot(result: dict, path) -> None:
    """MRE per design and arm (synthetic) and on the real queries."""
    by_design = result["by_design"]
    real = {arm: cells["real/mre"]["mean"] for arm, cells in result["arms"].items()}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(next(iter(by_design.values()))) + ["REAL"]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(by_design)
    for i, (arm, designs) in enumerate(by_design.items()):
        values = [designs[d] for d in groups[:-1]] + [real[arm]]
        ax.bar(np.arange(len(groups)) + i * width, values, width, label=arm)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups, rotation=20)
    ax.set_ylabel("MRE (capped at 1)")
    ax.set_title("CauSciBench on CPU: mean relative error per design (synthetic) and on the real queries")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.causcibench [flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["causcibench", *sys.argv[1:]]))
