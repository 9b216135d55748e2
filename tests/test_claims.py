"""The claim checks (icml26/claims.py): the paired-interval math against hand-computed values, the verdict rules on
small synthetic result files, every card's check on the landed results, and the ``icml26 claims`` table."""
from __future__ import annotations

import json
import math

import pytest

from icml26 import claims, registry
from icml26.claims import HELD, NO_SEEDS, NOISE, NOT_HELD, evaluate_check, paired_interval, paired_verdict
from lightning_modules.shared.errors import UserInputError

# the Student t 0.975 quantiles in closed form (tables: 4.303 and 12.706): with 2 degrees of freedom
# t = (2p - 1) / sqrt(2 p (1 - p)); with 1 (the Cauchy) t = tan(pi (p - 1/2))
T_975_2DOF = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T_975_1DOF = math.tan(math.pi * 0.475)
VERDICTS = {HELD, NOISE, NO_SEEDS, NOT_HELD}


# ------------------------------------------------------------------------------------------------ the math
def test_paired_interval_matches_the_hand_computed_t_interval():
    mean, lo, hi, n = paired_interval([1.0, 2.0, 3.0])  # sd 1, so the half-width is t * 1 / sqrt(3)
    half = T_975_2DOF / math.sqrt(3)
    assert (mean, n) == (2.0, 3)
    assert lo == pytest.approx(2.0 - half, abs=1e-12) and hi == pytest.approx(2.0 + half, abs=1e-12)


def test_paired_interval_two_seeds_and_degenerate_cases():
    mean, lo, hi, n = paired_interval([0.1, 0.3])  # sd = 0.1 * sqrt(2), se = 0.1
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(T_975_1DOF * 0.1) and n == 2
    assert lo == pytest.approx(0.2 - T_975_1DOF * 0.1)
    mean, lo, hi, n = paired_interval([0.5])
    assert mean == 0.5 and n == 1 and math.isnan(lo) and math.isnan(hi)
    assert paired_interval([-1.0, -1.0, -1.0])[1:3] == (-1.0, -1.0)  # no spread: the interval is the mean
    with pytest.raises(ValueError):
        paired_interval([])


@pytest.mark.parametrize("mean, lo, hi, n, direction, margin, expected", [
    (2.0, 0.5, 3.5, 3, "greater", 0.0, HELD),
    (2.0, -0.5, 4.5, 3, "greater", 0.0, NOISE),  # right side, interval includes zero
    (-2.0, -4.5, 0.5, 3, "greater", 0.0, NOISE),  # mean on the wrong side, interval includes zero: noise too
    (-2.0, -3.5, -0.5, 3, "greater", 0.0, NOT_HELD),  # the interval is wholly on the wrong side
    (-2.0, -3.5, -0.5, 3, "less", 0.0, HELD),
    (-2.0, -4.5, 0.5, 3, "less", 0.0, NOISE),
    (2.0, math.nan, math.nan, 1, "greater", 0.0, NOISE),  # one seed: never more than within noise
    (-2.0, math.nan, math.nan, 1, "greater", 0.0, NOISE),  # ... nor less: one seed has no interval
    (0.2, 0.1, 0.3, 3, "greater", 0.05, HELD),
    (0.2, 0.04, 0.3, 3, "greater", 0.05, NOISE),  # clears zero but not the margin
    (0.04, 0.01, 0.07, 3, "greater", 0.05, NOISE),  # the interval contains the margin
    (0.03, 0.01, 0.045, 3, "greater", 0.05, NOT_HELD),  # the interval is wholly below the margin
    (-0.005, -0.008, -0.002, 3, "greater", -0.01, HELD),  # non-inferiority: no worse than 0.01
    (-0.2, -0.3, -0.1, 3, "less", 0.05, HELD),
    (0.0, -1.0, 1.0, 3, "greater", 0.0, NOISE),
    (0.0, 0.0, 0.0, 3, "greater", 0.0, NOISE),  # no spread, exactly at the margin
])
def test_paired_verdict(mean, lo, hi, n, direction, margin, expected):
    assert paired_verdict(mean, lo, hi, n, direction, margin) == expected


# ------------------------------------------------------------------------------------------ synthetic results
def result(per_seed: list[dict], **extra) -> dict:
    arms: dict = {}
    for row in per_seed:
        for arm, metrics in row.items():
            for metric, value in metrics.items():
                arms.setdefault(arm, {}).setdefault(metric, []).append(value)
    summary = {a: {m: {"mean": sum(v) / len(v), "std": 0.0} for m, v in ms.items()} for a, ms in arms.items()}
    return {"paper": "x", "seeds": len(per_seed), "arms": summary, "per_seed": per_seed, **extra}


def seeds(method: list[float], baseline: list[float]) -> list[dict]:
    return [{"new": {"acc": a, "loss": -a}, "old": {"acc": b, "loss": -b}} for a, b in zip(method, baseline)]


def paired(**spec) -> dict:
    return {"paired": [{"method": "new", "baseline": "old", "metric": "acc", "direction": "greater", **spec}]}


def verdicts(check: dict, data: dict) -> list[str]:
    return [o.verdict for o in evaluate_check(check, data)]


def test_paired_check_verdicts_on_synthetic_results():
    clear = result(seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]))
    assert verdicts(paired(), clear) == [HELD]
    assert verdicts(paired(direction="less"), clear) == [NOT_HELD]
    assert verdicts(paired(metric="loss", direction="less"), clear) == [HELD]
    assert verdicts(paired(margin=0.5), clear) == [NOT_HELD]
    noisy = result(seeds([0.9, 0.7, 0.95], [0.8, 0.8, 0.8]))
    assert verdicts(paired(), noisy) == [NOISE]
    assert verdicts(paired(), result(seeds([0.9], [0.8]))) == [NOISE]  # one seed
    outcome = evaluate_check(paired(), result(seeds([2.0, 3.0, 4.0], [1.0, 1.0, 1.0])))[0]
    assert (outcome.mean, outcome.n) == (2.0, 3)
    assert outcome.lo == pytest.approx(2.0 - T_975_2DOF / math.sqrt(3))
    assert f"[{outcome.lo:.3f}, {outcome.hi:.3f}], n=3" in outcome.figures


def test_paired_check_without_per_seed_values_says_so():
    data = result(seeds([0.9, 0.91], [0.8, 0.8]))
    data.pop("per_seed")
    [outcome] = evaluate_check(paired(), data)
    assert outcome.verdict == NO_SEEDS and "no per-seed values" in outcome.figures


def test_paired_check_reads_nested_per_seed_entries_and_metric_paths():
    nested = [{"seed": i, "runs": row} for i, row in enumerate(seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]))]
    data = result(seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]))
    data["per_seed"] = nested
    assert verdicts(paired(), data) == [HELD]
    two_metrics = {"paired": [{"method": ["new", "acc"], "baseline": ["old", "acc"], "direction": "greater"}]}
    assert verdicts(two_metrics, result(seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]))) == [HELD]
    elsewhere = result(seeds([0.1, 0.1], [0.2, 0.2]), other_seeds=seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]))
    assert verdicts(paired(per_seed=["other_seeds"]), elsewhere) == [HELD]


def test_compare_checks_and_the_weakest_verdict():
    data = result(seeds([0.9, 0.91, 0.92], [0.8, 0.8, 0.81]), extra={"ratio": 1.6})
    above = {"left": ["arms", "new", "acc", "mean"], "op": ">", "right": ["arms", "old", "acc", "mean"]}
    assert verdicts({"compare": [above]}, data) == [HELD]
    assert verdicts({"compare": [{**above, "offset": 0.2}]}, data) == [NOT_HELD]  # 0.91 > 0.803 + 0.2 fails
    assert verdicts({"compare": [{"left": ["extra", "ratio"], "op": ">=", "right": 2}]}, data) == [NOT_HELD]
    assert verdicts({"compare": [{"left": ["extra", "ratio"], "op": ">=", "right": 0.5, "scale": 3}]}, data) == [
        HELD]  # 1.6 >= 3 * 0.5
    assert verdicts({"compare": [{"left": 1, "op": "<=", "right": 1}]}, data) == [HELD]
    verdict = claims.Verdict("x", "c", None, evaluate_check({**paired(), "compare": [{**above, "offset": 0.2}]},
                                                            data))
    assert verdict.verdict == NOT_HELD and not verdict.held  # a held paired check and a failed compare


@pytest.mark.parametrize("check, message", [
    (paired(method="nope"), "arm 'nope' is not in the result's arms"),
    (paired(direction="up"), "direction 'up' must be 'greater' or 'less'"),
    (paired(typo=1), "unknown keys ['typo']"),
    ({"compare": [{"left": ["arms", "new", "acc", "mean"], "op": "=>", "right": 1}]}, "op '=>' must be one of"),
    ({"compare": [{"left": ["arms", "new", "f1", "mean"], "op": ">", "right": 1}]}, "no key 'f1'"),
    ({"compare": [{"left": ["arms", "new", "acc"], "op": ">", "right": 1}]}, "not a number"),
    ({"paired": [], "checks": []}, "unknown keys ['checks']"),
    ({"paired": []}, "has no checks"),
    (paired(metric="f1"), "arm 'new' has no metric 'f1'"),
    (paired(margin="0.05"), "'0.05' is not a number"),
    ({"note": "only a note"}, "must be a mapping with a 'paired' and/or 'compare' list"),
])
def test_bad_checks_are_one_clear_error(check, message):
    with pytest.raises(UserInputError) as err:
        evaluate_check(check, result(seeds([0.9, 0.91], [0.8, 0.8])))
    assert message in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------- the cards and the landed results
def test_every_card_checks_its_claim_on_the_landed_results():
    names = registry.paper_names()
    assert len(names) == 19
    for name in names:
        verdict = claims.check_paper(name)
        assert verdict.outcomes and verdict.verdict in VERDICTS, name
        assert all(o.verdict in VERDICTS and o.figures for o in verdict.outcomes), name
        assert verdict.result.name == registry.card(name)["check"].get("result", f"{name}.json")


def test_paired_checks_agree_with_the_experiments_own_claim_figures():
    knapsack = claims.check_paper("knapsack_rl")
    stored = json.loads(knapsack.result.read_text())["claim"]
    assert knapsack.outcomes[0].mean == pytest.approx(stored["difference_mean"])
    assert knapsack.outcomes[0].n == len(stored["difference_per_seed"])


def test_check_paper_reads_a_given_result_file(tmp_path):
    """What ``icml26 experiment NAME --check`` does with the JSON it just wrote."""
    arms = ("uniform", "knapsack")
    metric = "eff_ratio_response_2nd_half"
    strong = [{arms[0]: {metric: 0.2 + d}, arms[1]: {metric: 0.5 + d}} for d in (0.0, 0.01, 0.02)]
    path = tmp_path / "knapsack_rl.json"
    path.write_text(json.dumps(result(strong)))
    assert claims.check_paper("knapsack_rl", path).held
    weak = [{arms[0]: {metric: 0.2}, arms[1]: {metric: v}} for v in (0.22, 0.21, 0.23)]  # below the 0.05 margin
    path.write_text(json.dumps(result(weak)))
    assert claims.check_paper("knapsack_rl", path).verdict == NOT_HELD
    with pytest.raises(UserInputError, match="no result file"):
        claims.check_paper("knapsack_rl", tmp_path / "missing.json")
    with pytest.raises(UserInputError, match="no paper named"):
        claims.check_paper("knapsak_rl")


def test_claims_command_prints_one_table_of_every_paper(capsys):
    assert claims.claims_command([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| paper | claim | measured | verdict |" and len(lines) == 2 + 19
    rows = [line.strip("|").split(" | ") for line in lines[2:]]
    assert [row[0].strip() for row in rows] == registry.paper_names()
    assert all(row[-1].strip() in VERDICTS for row in rows)


def test_claims_command_options(capsys, tmp_path):
    assert claims.claims_command(["--paper", "phyb"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[2].startswith("| phyb |") and "n=5" in lines[2]  # 5 seeds
    assert claims.claims_command(["--results", str(tmp_path)]) == 0  # nothing run yet: every row says so
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert len(rows) == 19 and all("no result file" in row and row.endswith("| not held |") for row in rows)
    assert claims.claims_command(["--results", str(tmp_path / "nowhere")]) == 2
    assert claims.claims_command(["--paper", "phyp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is not a folder" in err[0] and "no paper named 'phyp' (did you mean phyb?)" in err[1]
