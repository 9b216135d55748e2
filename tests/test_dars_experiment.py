"""experiments.dars' paired comparison: seed-by-seed differences against the compute-matched and the plain uniform
arm, the primary held-out verdict, and the paired table of a stored result."""
from __future__ import annotations

import json
import math

import pytest

from experiments import dars
from lightning_modules.shared.errors import UserInputError

METRICS = ["pass@1", "pass@32_tier3", "pass@32_tier4", "hard_positives_total"]


def seed_row(**pass1: float) -> dict:
    """One seed's arms: pass@1 as given, the other metrics derived so each pair has a known difference."""
    return {arm: {"pass@1": p, "pass@32_tier3": 2 * p, "pass@32_tier4": 0.0, "hard_positives_total": 100 * p}
            for arm, p in pass1.items()}


def rows(dars_hw: list[float], matched: list[float]) -> list[dict]:
    return [seed_row(uniform=0.5, dars_et=0.5, dars_hw=h, uniform_matched=m, breadth=0.5)
            for h, m in zip(dars_hw, matched)]


def test_paired_block_pairs_each_arm_with_both_baselines_seed_by_seed():
    per_seed = rows([0.71, 0.73, 0.72], [0.70, 0.70, 0.70])  # differences 0.01, 0.03, 0.02
    pairs = dars.paired_block(per_seed, METRICS)
    assert set(pairs) == {"dars_et - uniform_matched", "dars_hw - uniform_matched", "dars_et - uniform",
                          "dars_hw - uniform", "breadth - uniform"}  # breadth costs what uniform does
    cell = pairs["dars_hw - uniform_matched"]["pass@1"]
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n), by hand
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(0.02)
    assert (cell["lo"], cell["hi"]) == (pytest.approx(0.02 - half), pytest.approx(0.02 + half))
    assert pairs["dars_hw - uniform_matched"]["hard_positives_total"]["mean"] == pytest.approx(2.0)
    assert pairs["dars_hw - uniform"]["pass@1"]["mean"] == pytest.approx(0.22)
    assert pairs["breadth - uniform"]["pass@1"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3}


def test_one_seed_has_no_interval():
    cell = dars.paired_block(rows([0.71], [0.70]), METRICS)["dars_hw - uniform_matched"]["pass@1"]
    assert cell["lo"] is None and cell["hi"] is None and cell["n"] == 1


@pytest.mark.parametrize("dars_hw, matched, verdict", [
    ([0.72, 0.73, 0.725], [0.70, 0.70, 0.70], "held"),               # interval above zero
    ([0.71, 0.69, 0.72], [0.70, 0.70, 0.70], "within seed noise"),   # interval contains zero
    ([0.68, 0.67, 0.675], [0.70, 0.70, 0.70], "not held"),           # interval below zero
    ([0.72], [0.70], "within seed noise"),                           # one seed: no interval
])
def test_primary_claim_is_the_held_out_comparison_against_the_matched_arm(dars_hw, matched, verdict):
    per_seed = rows(dars_hw, matched)
    claim = dars.primary_claim(dars.paired_block(per_seed, METRICS), per_seed)
    assert claim["primary"]["pair"] == "dars_hw - uniform_matched" and claim["primary"]["metric"] == "pass@1"
    assert claim["verdict"] == verdict and claim["held"] == (verdict == "held")
    ratios = [h / m for h, m in zip(dars_hw, matched)]  # hard positives are 100 x pass@1 here
    assert claim["hard_positives_ratio"]["per_seed"] == pytest.approx(ratios)


def test_paired_from_a_stored_result(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"config": {"tiers": [2, 3, 4]}, "per_seed": rows([0.71, 0.73], [0.70, 0.70])}))
    out = dars.main(["--paired-from", str(path)])
    assert out["paired"]["dars_hw - uniform_matched"]["pass@1"]["mean"] == pytest.approx(0.02)
    assert set(out["paired"]["dars_hw - uniform"]) == set(METRICS)
    assert "| dars_hw - uniform_matched | pass@1 | +0.0200 |" in capsys.readouterr().out
    path.write_text(json.dumps({"per_seed": []}))
    with pytest.raises(UserInputError, match="config.tiers") as err:
        dars.main(["--paired-from", str(path)])
    assert "\n" not in str(err.value)
