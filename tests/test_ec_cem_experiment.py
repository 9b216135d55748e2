"""The EC-CEM experiment's collapse rule and per-seed report (experiments/ec_cem.py), and (slow) the seeds on which
the evi-CEM code's ReLU evidence lost a concept."""
from __future__ import annotations

import pytest
import torch

from experiments import runner
from experiments.ec_cem import collapsed, concept_accuracy_table, evaluate, per_concept_accuracy, report


def test_per_concept_accuracy_and_the_collapse_rule():
    concepts = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    probs = torch.tensor([[0.9, 0.2, 0.4], [0.4, 0.7, 0.6], [0.8, 0.1, 0.3], [0.3, 0.9, 0.2]])
    accuracy, majority = per_concept_accuracy(probs, concepts)
    torch.testing.assert_close(accuracy, torch.tensor([0.75, 1.0, 0.25]))
    torch.testing.assert_close(majority, torch.tensor([0.75, 0.5, 0.5]))
    # concept 0 is no better than always predicting 1; concept 2 is inverted; concept 1 is learned
    assert collapsed(accuracy, majority, 0.05).tolist() == [True, False, True]


def _record(per_concept, majority, curves=False):
    record = {"per_concept_acc": per_concept, "majority_rate": majority, "collapse_margin": 0.05}
    if curves:
        record["curves"] = {"random": [(0, 0.5), (1, 0.6)]}
    return record


def test_report_lists_every_run_and_flags_exactly_the_collapsed_one(capsys):
    ok, lost = [0.98, 0.97], [0.99, 0.49]
    records = [{"": {"CEM": _record(ok, [0.5, 0.5], True), "EC-CEM": _record(ok, [0.5, 0.5], True)},
                "XOR": {"CEM": _record(ok, [0.5, 0.5]), "EC-CEM": _record(lost if seed == 1 else ok, [0.5, 0.51])}}
               for seed in range(3)]
    xor = [{"XOR": {"CEM": {"concept_acc": 0.975}, "EC-CEM": {"concept_acc": 0.74 if seed == 1 else 0.975}}}
           for seed in range(3)]
    extra = report({"paired": {"EC-CEM - CEM": {}}, "per_seed_synthetic": xor}, records)
    assert extra["concept_acc_per_seed"]["XOR"]["EC-CEM"] == pytest.approx([0.975, 0.74, 0.975])
    assert extra["per_concept_acc_per_seed"]["main"]["CEM"][2] == pytest.approx(ok)
    assert [(f["setting"], f["arm"], f["seed"]) for f in extra["collapsed_runs"]] == [("XOR", "EC-CEM", 1)]
    assert extra["collapsed_runs"][0]["collapsed"] == [{"concept": 1, "acc": pytest.approx(0.49),
                                                        "majority_rate": pytest.approx(0.51)}]
    cell = extra["paired_variants"]["XOR"]["EC-CEM - CEM"]["concept_acc"]
    assert cell["mean"] == pytest.approx(-0.235 / 3) and cell["n"] == 3 and cell["lo"] < cell["mean"] < cell["hi"]
    printed = capsys.readouterr().out
    assert "| XOR | EC-CEM | 0.975 (0.970) | 0.740 (0.490) COLLAPSED | 0.975 (0.970) |" in printed
    assert "COLLAPSED: XOR / EC-CEM / seed 1: concept 1 at 0.490 (majority rate 0.510)" in printed


def test_report_table_says_when_nothing_collapsed():
    table = concept_accuracy_table({"main": {"CEM": [0.9]}}, {"main": {"CEM": [[0.9, 0.9]]}}, [], "rule")
    assert "COLLAPSED" not in table and table.endswith("no collapsed run")


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "seed", "arm"),
                         [("XOR", 1, "EC-CEM"), ("XOR", 2, "EC-CEM"), ("Dot", 1, "evi-CEM")])
def test_default_evidence_learns_every_concept_where_relu_evidence_lost_one(variant, seed, arm, tmp_path):
    """The runs on which ReLU evidence (the evi-CEM code's) left one concept at chance (concept accuracy 0.47-0.51)
    train with the default softplus evidence exactly as ``python -m experiments ec_cem`` does (about 15 s each)."""
    spec = runner.load_spec("ec_cem")
    run = runner.Run(spec, next(a for a in spec.arms if a.name == arm),
                     next(v for v in spec.variants if v.name == variant), seed, tmp_path, tmp_path)
    metrics = runner.execute(run, evaluate)
    assert run.model.hparams.evidence_activation == "softplus"
    assert metrics["collapsed_concepts"] == 0 and metrics["worst_concept_acc"] > 0.9, metrics
