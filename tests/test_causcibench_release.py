"""CauSciBench's released query files load query by query: tiny files written the way the release writes them
(github.com/causalNLP/CauSciBench: v1 ``data/json/real_data.json`` from ``create_json.py``, a JSON list of query
records with bare NaN for missing fields; v2 ``data/metadata_csv/*_input.csv`` with the data under
``data/csv_files/<split>/``), each with the release's kinds of faults: a missing CSV, a variable that is not a
column (``x17`` against ``x0..x16``), formula expressions (``age^2``, ``I(...)``, ``np.log``, ``C(...)``), names
with trailing spaces, an interaction variable, a multi-arm treatment and RDD cutoffs."""
from __future__ import annotations

import json
import logging
import math

import numpy as np
import pandas as pd
import pytest

from datamodules import causal_queries as cq
from lightning_modules.causcibench import causal_estimators as ce
from lightning_modules.causcibench.causal_agent import CausalInferenceAgent
from lightning_modules.shared.errors import UserInputError

NAN = float("nan")


def _v1_record(**fields) -> dict:
    """One record with every field `create_json.py` writes (missing ones NaN, as in the release)."""
    record = {"name": "paper", "query": "q?", "dataset_description": "d", "method": "ols",
              "dataset_path": "data/real_data/jobs.csv", "effect": 1.0, "std_error": 0.1, "is_significant": 1,
              "treatment_var": "t", "outcome_var": "y", "control_variables": NAN, "running_var": NAN,
              "instrument_var": NAN, "temporal_var": NAN, "state_var": NAN, "interaction_var": NAN,
              "publication_year": 2020, "domain": "economics"}
    record.update(fields)
    return record


def _write_v1(root, records) -> None:
    (root / "json").mkdir(exist_ok=True)
    (root / "json" / "real_data.json").write_text(json.dumps(records, indent=4))  # json writes NaN bare


@pytest.fixture
def release(tmp_path):
    """A v1 data folder: real_data/jobs.csv (y = 5 t + x0 + 0.01 age^2 exactly) and real_data/rdd.csv (a sharp
    design with the cutoff at 50 and a jump of 5)."""
    rng = np.random.default_rng(0)
    n = 400
    age = rng.integers(20, 60, n).astype(float)
    x0, t = rng.normal(0, 1, n), rng.binomial(1, 0.5, n).astype(float)
    (tmp_path / "real_data").mkdir()
    pd.DataFrame({"x0": x0, "x1": rng.normal(0, 1, n), "x2": rng.normal(0, 1, n), "age": age, "t": t,
                  "female": rng.binomial(1, 0.5, n).astype(float),
                  "y": 5 * t + x0 + 0.01 * age ** 2}).to_csv(
        tmp_path / "real_data" / "jobs.csv", index=False)
    score = np.round(rng.uniform(30, 70, n), 2)
    score = score[(score < 49.9) | (score > 51.0)]  # the treated side starts at 51.01, the true cutoff is 50
    won = (score >= 50).astype(float)
    pd.DataFrame({"score": score, "won": won, "vote": 5.0 * won + 0.2 * (score - 50)}).to_csv(
        tmp_path / "real_data" / "rdd.csv", index=False)
    return tmp_path


def _load(root, records):
    _write_v1(root, records)
    return cq.load_benchmark(str(root), "json/real_data.json")


# --------------------------------------------------------------------------------------------- query by query
def test_bad_queries_are_skipped_with_their_reasons_and_a_warning(release, caplog):
    records = [_v1_record(),  # loads
               _v1_record(dataset_path="data/real_data/hansen.csv"),  # a CSV missing from the folder
               _v1_record(control_variables="x1, x2, x3"),  # a typo: x3 is not a column
               _v1_record(method="synthetic control")]  # an unknown method label
    with caplog.at_level(logging.WARNING, logger="datamodules.causal_queries"):
        queries = _load(release, records)
    assert [q["id"] for q in queries] == [0]
    skipped = dict(queries.skipped_queries)
    assert sorted(skipped) == [1, 2, 3]
    assert "data file 'data/real_data/hansen.csv' named by the query file is not under" in skipped[1]
    assert skipped[2].startswith("variable 'x3' is not a column of jobs.csv (columns: x0, x1, x2, age, t, female, y)")
    assert "unknown method label 'synthetic control'" in skipped[3]
    (message,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert "skipped 3 of 4 queries" in message and "query 2: variable 'x3'" in message


def test_the_datamodule_exposes_the_skipped_queries(release):
    _write_v1(release, [_v1_record(), _v1_record(treatment_var="x17")])
    data = cq.CausalQueryDataModule(test_source="benchmark", data_dir=str(release), queries_file="json/real_data.json")
    data.setup("test")
    assert len(data.test_queries) == 1 and data.test_queries[0]["features"].shape == (data.feature_dim,)
    ((query_id, reason),) = data.skipped_queries
    assert query_id == 1 and reason.startswith("variable 'x17' is not a column of jobs.csv")


def test_no_query_loads_is_one_error_with_the_reasons(release):
    with pytest.raises(UserInputError, match=r"no query of .*real_data.json could be loaded \(2 skipped\): "
                                             r"query 0: variable 'x17' is not a column.*query 1: data file"):
        _load(release, [_v1_record(treatment_var="x17"), _v1_record(dataset_path="data/real_data/gone.csv")])


def test_names_are_stripped_everywhere(release):
    (query,) = _load(release, [_v1_record(treatment_var="t ", outcome_var="y   ", control_variables=" x0,  x1 ,")])
    assert query["roles"]["treatment"] == "t" and query["roles"]["outcome"] == "y"
    assert query["roles"]["controls"] == ["x0", "x1"]


# --------------------------------------------------------------------------------------------- formula terms
def test_formula_expressions_become_design_columns(release):
    (query,) = _load(release, [_v1_record(control_variables="x0, age^2, I(age**2), np.log(age), C(female)",
                                          outcome_var="gain = y - x0")])
    frame, roles = query["data"], query["roles"]
    age = frame["age"].to_numpy()
    assert roles["controls"] == ["x0", "age^2", "I(age**2)", "np.log(age)", "C(female)[T.1.0]"]
    np.testing.assert_allclose(frame["age^2"], age ** 2)
    np.testing.assert_allclose(frame["I(age**2)"], age ** 2)
    np.testing.assert_allclose(frame["np.log(age)"], np.log(age))
    np.testing.assert_allclose(frame["C(female)[T.1.0]"], frame["female"])
    np.testing.assert_allclose(frame["gain"], frame["y"] - frame["x0"])
    assert roles["outcome"] == "gain"
    # the design columns are the query's, not the file's: the selector's features and forced OLS do not see them
    assert query["columns"] == ["x0", "x1", "x2", "age", "t", "female", "y"]
    assert set(query["derived_columns"]) == {"age^2", "I(age**2)", "np.log(age)", "C(female)[T.1.0]", "gain"}
    plain = dict(query, data=frame[query["columns"]], derived_columns=[])
    assert np.array_equal(cq.query_features(query).numpy(), cq.query_features(plain).numpy())
    # y = 5 t + x0 + 0.01 age^2: the outcome y - x0 regressed on t and age^2 gives 5 exactly
    result = ce.estimate("ols", frame, ce.Roles(treatment="t", outcome="gain", controls=["age^2"]))
    assert result.effect == pytest.approx(5.0)


def test_a_name_still_unknown_after_the_formula_is_a_skip(release):
    queries = _load(release, [_v1_record(), _v1_record(control_variables="x0, log(wage)"),
                              _v1_record(control_variables="inc_run i")])
    skipped = dict(queries.skipped_queries)
    assert skipped[1].startswith("variable 'wage' in 'log(wage)' is not a column of jobs.csv (columns: ")
    assert skipped[2].startswith("variable 'inc_run i' is not a column of jobs.csv")


# --------------------------------------------------------------------------------------------- RDD cutoffs
def test_rdd_cutoff_is_read_from_the_query(release, caplog):
    record = _v1_record(method="RDD", dataset_path="data/real_data/rdd.csv", treatment_var="won",
                        outcome_var="vote", running_var="score ", cutoff=50)
    with caplog.at_level(logging.WARNING, logger="datamodules.causal_queries"):
        (query,) = _load(release, [record])
    assert query["roles"]["running"] == "score" and query["roles"]["cutoff"] == 50.0
    assert not [r for r in caplog.records if "cutoff" in r.getMessage()]  # nothing inferred, nothing to warn
    assert CausalInferenceAgent(agent="oracle").answer(query)["estimate"] == pytest.approx(5.0)


def test_rdd_cutoff_inferred_only_when_absent_with_a_warning(release, caplog):
    record = _v1_record(method="rdd", dataset_path="data/real_data/rdd.csv", treatment_var="won",
                        outcome_var="vote", running_var="score")
    with caplog.at_level(logging.WARNING, logger="datamodules.causal_queries"):
        (query,) = _load(release, [record])
    # the treated side starts at 51.01: the cutoff is the round 50 between the two sides, not the first value
    assert query["roles"]["cutoff"] == 50.0
    (message,) = [r.getMessage() for r in caplog.records if "cutoff" in r.getMessage()]
    assert "no 'cutoff' field" in message and "0: 50 (the treatment switches on between" in message
    assert CausalInferenceAgent(agent="oracle").answer(query)["estimate"] == pytest.approx(5.0)
    assert cq._round_number(-0.004, 0.006) == 0.0 and cq._round_number(49.93, 51.01) == 50.0
    assert cq._round_number(0.2468, 0.2531) == 0.25 and cq._round_number(12.31, 12.37) == 12.35


def test_a_bad_cutoff_is_a_skip(release):
    record = _v1_record(method="rdd", dataset_path="data/real_data/rdd.csv", treatment_var="won",
                        outcome_var="vote", running_var="score", cutoff="fifty")
    queries = _load(release, [_v1_record(), record])
    assert dict(queries.skipped_queries)[1] == "the RDD cutoff 'fifty' is not a number."


def test_rdd_specification_fields_are_read_and_reach_the_estimator(release):
    rng = np.random.default_rng(1)
    run = rng.uniform(40, 60, 400)
    won = (run >= 50).astype(float)
    x = run - 50
    pd.DataFrame({"score": run, "won": won, "vote": 3.0 * won + 0.1 * x ** 2 - 0.3 * won * x ** 2}).to_csv(
        release / "real_data" / "curved.csv", index=False)
    fields = dict(method="rdd", dataset_path="data/real_data/curved.csv", treatment_var="won", outcome_var="vote",
                  running_var="score", cutoff=50)
    plain, quadratic = _load(release, [_v1_record(**fields),
                                       _v1_record(**fields, bandwidth=5.0, kernel="uniform", polynomial=2.0)])
    assert plain["spec"] == {} and quadratic["spec"] == {"bandwidth": 5.0, "kernel": "uniform", "polynomial": 2}
    oracle = CausalInferenceAgent(agent="oracle")
    assert oracle.answer(quadratic)["estimate"] == pytest.approx(3.0)  # the curvature is fitted exactly
    assert oracle.answer(plain)["estimate"] != pytest.approx(3.0, abs=0.1)  # a line through a parabola is not
    bad = _load(release, [_v1_record(), _v1_record(**fields, polynomial=7), _v1_record(bandwidth=1.0)])
    reasons = dict(bad.skipped_queries)
    assert reasons[1].startswith("polynomial=7") and "ols takes none" in reasons[2]


# --------------------------------------------------------------------------------------------- new fields
def test_interaction_var_is_kept_and_reaches_the_estimator(release):
    (query,) = _load(release, [_v1_record(control_variables="x0, age", interaction_var="female ")])
    assert query["roles"]["interaction"] == "female"
    roles = ce.Roles(**query["roles"])
    assert roles.interaction == "female"
    frame = query["data"]
    result = ce.estimate("ols", frame, roles)
    # by hand: OLS of y on [t, female, t * female, x0, age]
    design = np.column_stack([np.ones(len(frame)), frame["t"], frame["female"], frame["t"] * frame["female"],
                              frame["x0"], frame["age"]])
    coef = np.linalg.lstsq(design, frame["y"].to_numpy(), rcond=None)[0]
    assert result.effect == pytest.approx(coef[1]) and result.interaction_effect == pytest.approx(coef[3])
    with pytest.raises(ce.EstimationError, match="matching cannot use the interaction variable 'female'"):
        ce.estimate("matching", frame, roles)


def test_multirct_treatment_is_kept_and_selects_the_arm(tmp_path):
    root = tmp_path
    rng = np.random.default_rng(1)
    arm = np.array(["Control", "Hawthorne", "Neighbors"])[rng.integers(0, 3, 300)]
    (root / "real_data").mkdir()
    pd.DataFrame({"treatment": arm, "voted": (arm == "Hawthorne") * 0.1 + (arm == "Neighbors") * 0.3}).to_csv(
        root / "real_data" / "arms.csv", index=False)
    pd.DataFrame([{"paper_name": "Gerber", "data_description": "d", "natural_language_query": "q",
                   "answer": 0.1, "method": "ols", "treatment": "treatment", "outcome": "voted",
                   "control_variables": NAN, "interacting_var": NAN, "multirct_treatment": "Neighbors",
                   "data_files": "arms.csv"},
                  {"paper_name": "Gerber", "data_description": "d", "natural_language_query": "q",
                   "answer": 0.1, "method": "ols", "treatment": "treatment", "outcome": "voted",
                   "control_variables": NAN, "interacting_var": NAN, "multirct_treatment": "Self",
                   "data_files": "arms.csv"},
                  {"paper_name": "Gerber", "data_description": "d", "natural_language_query": "q",
                   "answer": 0.1, "method": "ols", "treatment": "treatment", "outcome": "voted",
                   "control_variables": NAN, "interacting_var": NAN, "multirct_treatment": NAN,
                   "data_files": "arms.csv"}]).to_csv(root / "real_info.csv", index=False)  # v1's CSV layout
    queries = cq.load_benchmark(str(root), "real_info.csv")
    (query,) = queries
    assert query["roles"]["treatment_arm"] == "Neighbors"
    assert CausalInferenceAgent(agent="oracle").answer(query)["estimate"] == pytest.approx(0.3)  # vs Control
    assert CausalInferenceAgent(agent="forced-ols").answer(query)["estimate"] == pytest.approx(0.3)
    skipped = dict(queries.skipped_queries)
    assert skipped[1].startswith("multirct_treatment 'Self' is not a value of the treatment 'treatment'")
    assert skipped[2].startswith("the treatment 'treatment' of arms.csv is not numeric")
    np.testing.assert_array_equal(ce.arm_indicator(["a", "Control", "b", "a"], "a"), [1.0, 0.0, np.nan, 1.0])


def test_several_instruments_reach_2sls(release):
    rng = np.random.default_rng(2)
    n = 2000
    z1, z2, u = rng.normal(0, 1, (3, n))
    d = z1 + z2 + u + rng.normal(0, 1, n)
    pd.DataFrame({"z1": z1, "z2": z2, "d": d, "y": 2 * d + 2 * u}).to_csv(release / "real_data" / "iv.csv",
                                                                          index=False)
    (query,) = _load(release, [_v1_record(method="IV-2SLS", dataset_path="data/real_data/iv.csv",
                                          treatment_var="d", outcome_var="y", instrument_var="z1, z2 ")])
    assert query["roles"]["instrument"] == ["z1", "z2"]
    assert CausalInferenceAgent(agent="oracle").answer(query)["estimate"] == pytest.approx(2.0, abs=0.1)


# --------------------------------------------------------------------------------------------- v2 layout
def test_v2_metadata_csv_columns_are_read(tmp_path):
    folder = tmp_path / "csv_files" / "qrdata"
    folder.mkdir(parents=True)
    (tmp_path / "csv_files" / "realdata").mkdir()
    rng = np.random.default_rng(3)
    t = rng.binomial(1, 0.5, 200).astype(float)
    x1 = rng.normal(0, 1, 200)
    pd.DataFrame({"x1": x1, "treatment": t, "y": 4 * t + x1}).to_csv(folder / "ihdp_0.csv", index=False)
    pd.DataFrame({"other": [1, 2]}).to_csv(tmp_path / "csv_files" / "realdata" / "ihdp_0.csv", index=False)
    (tmp_path / "metadata_csv").mkdir()
    header = ("id,paper_name,data_description,dataset_name,query,method,answer,std_error,treatment,outcome,"
              "controls,instrument_var,running_var,temporal_var,state_var,interaction_var,is_rct,is_multirct\n")
    rows = ('1,QRData,"The CSV file ihdp_0.csv, IHDP.",ihdp_0.csv,Does it help?,ols,4.021,0.143,treatment,y,'
            '"x1",,,,,,1,0\n'
            '7,QRData,"d",ihdp_0.csv,Which arm?,ols,−0.5,0.1,treatment,y,"x1",,,,,,1,1\n'
            '9,QRData,"d",gone.csv,q,ols,1,0.1,treatment,y,,,,,,,0,0\n')
    (tmp_path / "metadata_csv" / "qr_input.csv").write_text(header + rows)
    queries = cq.load_benchmark(str(tmp_path), "metadata_csv/qr_input.csv")
    (query,) = queries
    assert query["id"] == 1 and query["name"] == "benchmark/QRData" and query["query"] == "Does it help?"
    assert query["description"] == "The CSV file ihdp_0.csv, IHDP." and query["effect"] == 4.021
    assert query["std_error"] == 0.143 and query["is_rct"] is True and query["is_multirct"] is False
    assert query["roles"]["controls"] == ["x1"] and query["data_file"].endswith("csv_files/qrdata/ihdp_0.csv")
    skipped = dict(queries.skipped_queries)
    assert sorted(skipped) == [7, 9]
    assert skipped[7].startswith("is_multirct is set")  # v2 flags several arms but does not name the arm
    assert "data file 'gone.csv' named by the query file is not under" in skipped[9]
    assert CausalInferenceAgent(agent="oracle").answer(query)["estimate"] == pytest.approx(4.0)
    assert math.isclose(cq._number("−0.5"), -0.5)  # the release's Unicode minus
