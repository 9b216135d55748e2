"""The ``"paired"`` block of result JSONs (icml26/paired.py): hand-checked intervals on two real per-seed shapes,
every shape the collection's results use, the command that adds a block to a landed result, and agreement of every
block in results/ with its per-seed values and with the claim checks."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from icml26 import claims, registry
from icml26.paired import NOTE_KEY, paired_block, paired_command, paired_table, seed_arms
from lightning_modules.shared.errors import UserInputError

RESULTS = Path(__file__).resolve().parents[1] / "results"
T_975_4 = 2.7764451051977934  # scipy.stats.t.ppf(0.975, 4): five seeds
T_975_2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2): three seeds


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


# ------------------------------------------------------------------------------------------ hand-checked intervals
def test_flat_records_infogeo_shifted_r1_by_hand():
    """``{arm: {metric: v}}`` records: InfoGeo's shifted R@1 is +10.5, +4.0, -10.5, +2.5 and +0.5 points on the
    five seeds."""
    per_seed = load("infogeo.json")["per_seed"]
    pairs = [(r["infogeo"]["r1_shifted"], r["baseline"]["r1_shifted"]) for r in per_seed]
    expected = [(50.0, 39.5), (48.5, 44.5), (46.5, 57.0), (47.5, 45.0), (59.0, 58.5)]
    assert pairs == [(pytest.approx(a, abs=1e-4), pytest.approx(b, abs=1e-4)) for a, b in expected]
    diffs = [10.5, 4.0, -10.5, 2.5, 0.5]
    mean = sum(diffs) / 5  # 1.3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4)
    half = T_975_4 * sd / math.sqrt(5)
    cell = paired_block(per_seed, "baseline", ["r1_shifted"], ["infogeo"])["infogeo - baseline"]["r1_shifted"]
    assert cell == {"mean": pytest.approx(mean, abs=1e-4), "lo": pytest.approx(mean - half, abs=1e-4),
                    "hi": pytest.approx(mean + half, abs=1e-4), "n": 5}
    assert cell["lo"] == pytest.approx(-8.0807, abs=1e-4) and cell["hi"] == pytest.approx(10.8807, abs=1e-4)


def test_seed_and_arms_records_nt_ssm_ndcg_by_hand():
    """``{"seed": s, "arms": {...}, "chosen": {...}}`` records (NT-SSM): the tuned NT-SSM minus the tuned SSM."""
    per_seed = load("nt_ssm.json")["per_seed"]
    method, base = "NT-SSM, type-specific alphas + tau tuned", "SSM, tau tuned"
    pairs = [(r["arms"][method]["test/ndcg@20"], r["arms"][base]["test/ndcg@20"]) for r in per_seed]
    assert [round(a, 6) for a, _ in pairs] == [0.284863, 0.286043, 0.293673]
    assert [round(b, 6) for _, b in pairs] == [0.269067, 0.253194, 0.257235]
    diffs = [a - b for a, b in pairs]  # 0.0158, 0.0328, 0.0364
    mean = sum(diffs) / 3
    half = T_975_2 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
    cell = paired_block(per_seed, base, ["test/ndcg@20"], [method])[f"{method} - {base}"]["test/ndcg@20"]
    assert cell == {"mean": pytest.approx(mean), "lo": pytest.approx(mean - half), "hi": pytest.approx(mean + half),
                    "n": 3}
    assert cell["lo"] > 0  # the one pair of this file whose interval excludes zero (held in `icml26 claims`)


def test_seed_and_runs_records_and_non_numeric_fields_are_skipped():
    """``{"seed": s, "runs": {...}}`` records (LDARNet) whose runs also hold strings and lists."""
    per_seed = load("ldarnet.json")["per_seed"]
    block = paired_block(per_seed, "fixed")
    cells = block["learned - fixed"]
    assert "mcc" in cells and "arm" not in cells and "profile" not in cells  # a string and a list: no difference
    diffs = [r["runs"]["learned"]["mcc"] - r["runs"]["fixed"]["mcc"] for r in per_seed]
    assert len(per_seed) >= 3 and cells["mcc"]["n"] == len(per_seed)
    assert cells["mcc"]["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert seed_arms(per_seed[0], "fixed") is per_seed[0]["runs"]


def test_one_seed_missing_values_and_zero_spread():
    rows = [{"b": {"m": 1.0, "x": 0.0}, "a": {"m": 2.0}}, {"b": {"m": 1.0}, "a": {"m": 2.0, "x": 5.0}}]
    block = paired_block(rows, "b")
    assert block == {"a - b": {"m": {"mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 2}}}  # x is on no seed of both arms
    one = paired_block(rows[:1], "b", ["m"])["a - b"]["m"]
    assert one == {"mean": 1.0, "lo": None, "hi": None, "n": 1}  # one seed: no interval, null in the JSON
    nan = [{"b": {"m": 1.0}, "a": {"m": float("nan")}}, {"b": {"m": 1.0}, "a": {"m": 3.0}}]
    assert paired_block(nan, "b")["a - b"]["m"]["n"] == 1  # a NaN seed does not count
    assert "| within seed noise |" not in paired_table(block) and "| excludes 0 |" in paired_table(block)
    assert "one seed, no interval" in paired_table({"a - b": {"m": one}})


@pytest.mark.parametrize("args, message", [
    (("nope",), "baseline 'nope' is not an arm"),
    (("b", ["acc"]), "metric(s) ['acc'] are in no per-seed record"),
    (("b", None, ["c"]), "arm(s) ['c'] are not in the per-seed records"),
])
def test_bad_names_are_one_line_errors(args, message):
    with pytest.raises(UserInputError) as err:
        paired_block([{"b": {"m": 1.0}, "a": {"m": 2.0}}], *args)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserInputError, match="non-empty list"):
        paired_block([], "b")


# ------------------------------------------------------------------- every per-seed shape of the collection's results
SHAPES = [  # (result, baseline, metric): flat, "env/arm" names, seed + arms, seed + runs
    ("ec_cem.json", "CEM", "partner_concept_acc"),
    ("causcibench.json", "oracle", "synthetic/mre"),
    ("phyb_pendulum_10000_steps.json", "pendulum/pmdb", "q_overestimation"),
    ("dars.json", "uniform_matched", "hard_positives_total"),
    ("knapsack_rl.json", "uniform", "eff_ratio_response_2nd_half"),
    ("emotion_hierarchy.json", "lm-small", "total_path_length"),
    ("rna_fm.json", "tRNAsformer-lite", "pearson"),
    ("recbole_parity.json", "RecBole 1.2.1 LightGCN", "test/ndcg@20"),
]


@pytest.mark.parametrize("name, baseline, metric", SHAPES)
def test_every_result_shape_gives_a_block(name, baseline, metric):
    data = load(name)
    rows = [seed_arms(r, baseline) for r in data["per_seed"]]
    if not any(metric in (r.get(baseline) or {}) for r in rows):
        metric = next(iter(rows[0][baseline]))  # a result re-run with other metric names: any metric it has
    block = paired_block(data["per_seed"], baseline, [metric])
    assert block and all(key.endswith(f" - {baseline}") for key in block)
    for key, cells in block.items():
        method = key[: -len(f" - {baseline}")]
        diffs = [r[method][metric] - r[baseline][metric] for r in rows
                 if isinstance((r.get(method) or {}).get(metric), (int, float)) and metric in r[baseline]]
        assert cells[metric]["n"] == len(diffs) and cells[metric]["mean"] == pytest.approx(sum(diffs) / len(diffs))


# ------------------------------------------------------------------------------------------------- the command
def test_command_adds_pairs_keeps_others_and_notes_the_source(tmp_path, capsys):
    path = tmp_path / "r.json"
    rows = [{"base": {"acc": 0.5}, "new": {"acc": 0.6 + 0.01 * s}, "other": {"acc": 0.4}} for s in range(3)]
    path.write_text(json.dumps({"per_seed": rows, "paired": {"kept - base": {"acc": {"mean": 0.0}}}}, indent=1))
    assert paired_command([str(path), "--baseline", "base", "--arm", "new"]) == 0
    assert "| new - base | acc | 0.110 | [0.085, 0.135] | 3 | excludes 0 |" in capsys.readouterr().out
    assert "paired_note" not in json.loads(path.read_text())  # without --write the file is untouched
    assert paired_command([str(path), "--baseline", "base", "--write"]) == 0
    written = json.loads(path.read_text())
    assert set(written["paired"]) == {"kept - base", "new - base", "other - base"}
    assert written[NOTE_KEY]["source"].startswith("computed after the run from this file's per_seed values")
    assert written[NOTE_KEY]["commands"] == [f"python -m icml26.paired {path} --baseline base --write"]
    assert paired_command([str(path), "--baseline", "nope"]) == 2
    assert paired_command([str(tmp_path / "missing.json"), "--baseline", "base"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "baseline 'nope' is not an arm" in err[0] and "no result file" in err[1]


# ------------------------------------------------------------------------------------------- the landed results
def _blocks() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("paired"), dict) and data.get("per_seed"):
            found.append((path.name, data))
    return found


def test_every_landed_block_matches_its_per_seed_values():
    blocks = _blocks()
    assert len(blocks) >= 15
    for name, data in blocks:
        for key, cells in data["paired"].items():
            method, baseline = key.split(" - ", 1)
            for metric, cell in cells.items():
                again = paired_block(data["per_seed"], baseline, [metric], [method])[key][metric]
                assert again["n"] == cell["n"] and again["mean"] == pytest.approx(cell["mean"]), (name, key, metric)
                for end in ("lo", "hi"):
                    assert (again[end] is None) == (cell[end] is None), (name, key, metric)
                    assert cell[end] is None or again[end] == pytest.approx(cell[end]), (name, key, metric)


PENDING = {"phyb", "dars", "knapsack_rl"}  # results being re-run; their blocks come with the new JSONs


@pytest.mark.parametrize("paper", registry.paper_names())
def test_primary_results_carry_a_block_that_agrees_with_the_claim_check(paper):
    verdict = claims.check_paper(paper)
    data = json.loads(verdict.result.read_text())
    if "paired" not in data and paper in PENDING:
        pytest.skip(f"{paper}: result being re-run")
    assert data.get("paired"), f"{verdict.result.name} has no paired block: python -m icml26.paired"
    check = registry.card(paper)["check"]
    for spec, outcome in zip(check.get("paired", []), verdict.outcomes):
        cell = data["paired"].get(f"{spec['method']} - {spec['baseline']}", {}).get(spec.get("metric"))
        if cell is None:  # a pair of two metrics of one arm, or one the block does not list
            continue
        assert cell["n"] == outcome.n and cell["mean"] == pytest.approx(outcome.mean), (paper, outcome.label)
        assert cell["lo"] == pytest.approx(outcome.lo) and cell["hi"] == pytest.approx(outcome.hi), paper
