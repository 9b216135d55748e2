"""CauSciBench on CPU: method selection is the bottleneck: ``python -m experiments.causcibench``.

Paper: "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research?" (ICML 2026, PMLR v306).
Its finding: LLM agents are worse on real than on synthetic tasks, and choosing the method is the bottleneck
(models default to simpler methods). No LLM is run here; the experiment checks the pipeline and that claim with
four agents of `lightning_modules.causal_agent.CausalInferenceAgent`:

* ``oracle``: the reference method and variables (validates the generators, the causaldata queries and the
  estimators: near-zero error on synthetic queries is expected);
* ``rule-based``: design variables of the query decide (running variable -> RDD, instrument -> IV, mediator ->
  front-door, time and group -> DiD), else a randomisation cue -> OLS, else propensity-score matching;
* ``forced OLS``: OLS with every other numeric column as a control (what the paper reports models falling back to);
* ``learned selector``: the MLP of ``configs/causcibench/quick.yaml`` trained on synthetic queries (query text and
  data columns in, method out; ``--epochs`` epochs, the epoch with the best validation method accuracy kept, on
  synthetic validation queries only), then evaluated on held-out synthetic queries and on the real queries.

Per seed: training and validation queries (seed-dependent), ``--test-per-design`` synthetic test queries of each
of the 8 designs (seeds disjoint from training), and the 9 real queries re-derived from causaldata (the same each
seed; only the learned selector changes). Metrics (prefix ``synthetic/`` or ``real/``): ``method_acc`` and ``mre``
(relative error capped at 1 per query, a failure counts 1; absolute error where |reference| < 1e-8). The per-design
MRE (synthetic) is in ``by_design``; ``claims`` records whether each expectation held.

Outputs: a markdown table (mean ± std over seeds), ``results/causcibench.json`` and ``results/causcibench.png``
(MRE per design and arm).
"""
from __future__ import annotations

import time

import numpy as np
from torch.utils.data import DataLoader

from experiments import kit

PAPER = "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research? (ICML 2026)"
CONFIG = "configs/causcibench/quick.yaml"
ARMS = {"oracle": "oracle", "rule-based": "rule-based", "forced OLS": "forced-ols", "learned selector": "learned"}
HARD_DESIGNS = ("iv", "iv_encouragement", "rdd", "did_canonical", "did_twfe", "frontdoor")
SMOKE_REAL = ["thornton_hiv_ols", "gov_transfers_rdd", "organ_donations_did"]


def train_selector(seed: int, args):
    """The learned selector of the quick config, trained on this seed's synthetic queries (keep-best on val)."""
    model, data = kit.from_config(CONFIG, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                  f"--data.init_args.train_per_design={args.train_per_design}",
                                  f"--data.init_args.val_per_design={args.val_per_design}",
                                  f"--data.init_args.rows={args.rows}")
    keep = kit.KeepBest("val/method_acc", mode="max")
    kit.quiet_trainer([keep], max_epochs=args.epochs, deterministic=True).fit(model, datamodule=data)
    keep.restore(model).eval()
    return model, data, keep.best_score


def evaluate(model, queries: list[dict]) -> list[dict]:
    """Answer ``queries`` through the module's test loop; returns its per-query records."""
    loader = DataLoader(queries, batch_size=16, collate_fn=list)
    kit.quiet_trainer().test(model, dataloaders=loader, verbose=False)
    return list(model.records)


def summary(records: list[dict]) -> dict[str, float]:
    return {"method_acc": float(np.mean([r["method_correct"] for r in records])),
            "mre": float(np.mean([r["error"] for r in records]))}


def plot(by_design: dict, real: dict, path) -> None:
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


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--epochs", type=int, default=30, help="selector training epochs")
    parser.add_argument("--train-per-design", type=int, default=40)
    parser.add_argument("--val-per-design", type=int, default=10)
    parser.add_argument("--test-per-design", type=int, default=15)
    parser.add_argument("--rows", type=int, default=1000, help="rows of each synthetic data file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.train_per_design, args.val_per_design, args.test_per_design, args.rows = 2, 3, 1, 1, 200
    kit.quiet_single_thread()
    from lightning_modules.causal_agent import CausalInferenceAgent

    start = time.perf_counter()
    per_seed, records_per_seed, selector_val = [], [], []
    for seed in kit.progress(range(args.seeds), "seeds"):
        learned, data, best = train_selector(seed, args)
        selector_val.append(best)
        data.hparams.test_per_design = args.test_per_design
        synthetic = data.synthetic("test", args.test_per_design)
        data.hparams.test_source = "real"
        if args.smoke:
            data.real_names = SMOKE_REAL
        data.setup("test")
        real = data.test_queries
        row, kept = {}, {}
        for arm, agent in kit.progress(ARMS.items(), "arms", total=len(ARMS)):
            model = learned if agent == "learned" else CausalInferenceAgent(agent=agent)
            synthetic_records, real_records = evaluate(model, synthetic), evaluate(model, real)
            row[arm] = {**{f"synthetic/{k}": v for k, v in summary(synthetic_records).items()},
                        **{f"real/{k}": v for k, v in summary(real_records).items()}}
            kept[arm] = {"synthetic": synthetic_records, "real": real_records}
        per_seed.append(row)
        records_per_seed.append(kept)
    arms = kit.summarise(per_seed)
    designs = list(dict.fromkeys(r["design"] for r in records_per_seed[0]["oracle"]["synthetic"]))
    by_design = {arm: {d: float(np.mean([r["error"] for seed in records_per_seed for r in seed[arm]["synthetic"]
                                         if r["design"] == d])) for d in designs} for arm in ARMS}
    real_mre = {arm: arms[arm]["real/mre"]["mean"] for arm in ARMS}
    hard = [d for d in HARD_DESIGNS if d in designs]
    hard_mre = {arm: float(np.mean([by_design[arm][d] for d in hard])) for arm in ARMS}
    claims = {
        "oracle synthetic MRE < 0.1": arms["oracle"]["synthetic/mre"]["mean"] < 0.1,
        "rule-based synthetic MRE within 0.05 of the oracle":
            arms["rule-based"]["synthetic/mre"]["mean"] - arms["oracle"]["synthetic/mre"]["mean"] < 0.05,
        "forced OLS MRE on IV/RDD/DiD/front-door >= 3x the oracle's": hard_mre["forced OLS"] >= 3 * hard_mre["oracle"],
    }
    wall = time.perf_counter() - start
    real_examples = [{k: r[k] for k in ("name", "reference_method", "method", "estimate", "reference", "error")}
                     for r in records_per_seed[0]["learned selector"]["real"]]
    result = kit.write_result(
        PAPER, seeds=args.seeds, wall_s=wall, name="causcibench",
        config={k: getattr(args, k) for k in ("epochs", "train_per_design", "val_per_design", "test_per_design",
                                              "rows", "smoke")} | {"model_config": CONFIG},
        arms=arms, per_seed=per_seed, out=args.out, by_design=by_design, hard_design_mre=hard_mre,
        claims=claims, selector_best_val_method_acc=selector_val, real_queries_seed0_learned=real_examples,
        real_queries_seed0_rule_based=[{k: r[k] for k in ("name", "method", "estimate", "reference", "error")}
                                       for r in records_per_seed[0]["rule-based"]["real"]],
        real_queries_seed0_forced_ols=[{k: r[k] for k in ("name", "method", "estimate", "reference", "error")}
                                       for r in records_per_seed[0]["forced OLS"]["real"]])
    from pathlib import Path

    plot(by_design, real_mre, Path(args.out) / "causcibench.png")
    print(kit.markdown_table(arms, ["synthetic/method_acc", "synthetic/mre", "real/method_acc", "real/mre"]))
    print("MRE per design:", {arm: {d: round(v, 3) for d, v in m.items()} for arm, m in by_design.items()})
    print("claims:", claims, f"wall {wall:.0f} s")
    return result


if __name__ == "__main__":
    main()
