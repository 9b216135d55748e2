"""CauSciBench's real queries against the benchmark's released references: the references are the released values
(CauSciBench v2 ``data/metadata_csv/real_input.csv``), each query runs the specification of the benchmark's
replication (``replications/real/paper*.py``: RDD window, kernel and polynomial order, controls), our estimate
matches the released value to its printed precision except on the queries documented as not reproduced, and an
independent statsmodels formula fit of the benchmark's specification on the same table agrees with both."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from datamodules import causal_queries as cq
from lightning_modules.causcibench import causal_estimators as ce
from lightning_modules.causcibench.causal_agent import CausalInferenceAgent
from lightning_modules.shared.errors import UserInputError

smf = pytest.importorskip("statsmodels.formula.api")


def _ours(name: str) -> tuple[dict, float]:
    query = cq.real_query(name)
    return query, ce.estimate(query["method"], query["data"], ce.Roles(**query["roles"]), spec=query["spec"]).effect


def _printed_tolerance(value: float) -> float:
    """Half a unit in the last digit the release prints (0.093 -> 0.0005), plus 1e-6 of the value: causaldata rounds
    the NSW earnings to 0.05, which moves that estimate by 5e-7 of itself."""
    text = repr(float(value))
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** -decimals + 1e-6 * abs(value)


# --------------------------------------------------------------------------------------------- references
def test_references_are_the_released_values_with_their_source():
    released_v2 = {"close_elections_score": 45.191, "close_elections_incumbency": 0.167, "thornton_hiv_ols": 0.431,
                   "nsw_lalonde_ols": 1672.204, "close_college_iv": 0.132, "gov_transfers_rdd": 0.093,
                   "castle_doctrine_did": 0.088, "organ_donations_did": -0.022}
    for name, value in released_v2.items():
        assert cq.REFERENCE_EFFECTS[name] == value and cq.REFERENCE_SOURCES[name].startswith("CauSciBench v2 id")
    assert set(cq.REFERENCE_EFFECTS) == set(cq.REAL_QUERIES) == set(cq.REFERENCE_SOURCES)
    query = cq.real_query("close_elections_score")
    assert query["effect"] == 45.191 and query["reference"].startswith("CauSciBench v2 id 22")
    assert query["spec"] == {"polynomial": 2, "regressor": "treatment", "bandwidth": 0.05, "kernel": "uniform"}


@pytest.mark.parametrize("name", list(cq.REAL_QUERIES))
def test_our_estimate_matches_the_release_except_where_documented(name):
    query, ours = _ours(name)
    close = abs(ours - query["effect"]) <= _printed_tolerance(query["effect"])
    assert close != (name in cq.NOT_REPRODUCED), (name, ours, query["effect"])


# --------------------------------------------------------------------------------------------- cross-checks
def _window(frame, column, low, high):
    return frame[frame[column].between(low, high)]


# the cross-checks agree to 1e-6 relative: causaldata stores the vote shares as float32, which the formula fits
# keep and our estimator widens to float64 before centring


def test_close_elections_score_by_statsmodels():
    query, ours = _ours("close_elections_score")
    frame = _window(query["data"], "demvoteshare", 0.45, 0.55).assign(x=lambda f: f["demvoteshare"] - 0.5)
    fit = smf.ols("score ~ democrat * (x + I(x**2))", data=frame).fit()
    assert fit.nobs == 2387
    assert ours == pytest.approx(fit.params["democrat"], rel=1e-6)
    assert fit.params["democrat"] == pytest.approx(45.191, abs=5e-4)


def test_close_elections_incumbency_by_statsmodels():
    query, ours = _ours("close_elections_incumbency")
    frame = _window(query["data"], "demvoteshare", 0.45, 0.55).assign(x=lambda f: f["demvoteshare"] - 0.5)
    fit = smf.ols("democrat ~ lagdemocrat * (x + I(x**2))", data=frame).fit()
    assert ours == pytest.approx(fit.params["lagdemocrat"], rel=1e-6)
    assert fit.params["lagdemocrat"] == pytest.approx(0.167, abs=5e-4)
    # the v1 reference (0.214): the linear fit in the previous election's share on the same window
    v1 = smf.ols("democrat ~ lagdemocrat * lx", data=frame.assign(lx=frame["lagdemvoteshare"] - 0.5)).fit()
    assert v1.params["lagdemocrat"] == pytest.approx(0.214, abs=5e-4)


def test_gov_transfers_by_statsmodels():
    query, ours = _ours("gov_transfers_rdd")
    frame = query["data"]
    assert ((frame["Income_Centered"] < 0) == (frame["Participation"] == 1)).all()  # a sharp design
    fit = smf.ols("Support ~ Participation * (Income_Centered + I(Income_Centered**2))", data=frame).fit()
    assert ours == pytest.approx(fit.params["Participation"], rel=1e-6)
    assert fit.params["Participation"] == pytest.approx(0.093, abs=5e-4)
    # the side-indicator form of the same quadratic RDD gives the same number (the treated side is below 0)
    side = ce.estimate("rdd", frame, ce.Roles(**query["roles"]), spec={"polynomial": 2})
    assert side.effect == pytest.approx(ours, rel=1e-6)


def test_nsw_by_statsmodels():
    query, ours = _ours("nsw_lalonde_ols")
    fit = smf.ols("re78 ~ treat + I(age**2) + age + educ + black + hisp + nodegree + re74 + re75",
                  data=query["data"]).fit()
    assert ours == pytest.approx(fit.params["treat"], rel=1e-6)
    assert fit.params["treat"] == pytest.approx(1672.204, abs=_printed_tolerance(1672.204))


def test_organ_donations_two_way_effects_equal_the_2x2_regression():
    query, ours = _ours("organ_donations_did")
    frame = query["data"].assign(post=lambda f: (f["Quarter_Num"] > 3).astype(float))
    fit = smf.ols("Rate ~ post + california + post:california", data=frame).fit()
    assert ours == pytest.approx(fit.params["post:california"], rel=1e-6)
    assert fit.params["post:california"] == pytest.approx(-0.022, abs=5e-4)


def test_nhefs_reference_is_the_textbooks_ip_weighted_estimate_on_this_table():
    """What If, sec. 12.2: nonstabilised IP weights from a logistic model of quitting (sex, race, age, education,
    smoking intensity and years, exercise, activity, 1971 weight; quadratic terms for the continuous ones), then the
    weighted difference in weight gain: 3.4 kg as printed. Our 1-NN matching estimate differs (the documented gap)."""
    sm = pytest.importorskip("statsmodels.api")
    query, ours = _ours("nhefs_smoking_matching")
    frame = query["data"]
    model = ("qsmk ~ sex + race + age + I(age**2) + C(education) + smokeintensity + I(smokeintensity**2) + smokeyrs"
             " + I(smokeyrs**2) + C(exercise) + C(active) + wt71 + I(wt71**2)")
    score = smf.glm(model, data=frame, family=sm.families.Binomial()).fit().predict(frame)
    weights = np.where(frame["qsmk"] == 1, 1 / score, 1 / (1 - score))
    ipw = smf.wls("wt82_71 ~ qsmk", data=frame, weights=weights).fit().params["qsmk"]
    assert len(frame) == 1566 and ipw == pytest.approx(3.4, abs=0.05)
    assert abs(ours - ipw) > 0.3


# --------------------------------------------------------------------------------------------- specification
def test_rdd_quadratic_uniform_window_by_hand():
    run = np.linspace(-1, 1, 81)
    y = 1 + 2 * run - 3 * run ** 2 + 4.0 * (run >= 0) + 5 * run ** 2 * (run >= 0)
    frame = pd.DataFrame({"run": run, "y": y, "t": (run >= 0).astype(float)})
    roles = ce.Roles(treatment="t", outcome="y", running="run", cutoff=0.0)
    linear = ce.estimate("rdd", frame, roles)
    quadratic = ce.estimate("rdd", frame, roles, spec={"polynomial": 2, "bandwidth": 0.5, "kernel": "uniform"})
    assert quadratic.effect == pytest.approx(4.0) and linear.effect != pytest.approx(4.0, abs=0.1)
    assert quadratic.n == 41  # |run| <= 0.5 on a 0.025 grid: the window's edges are kept
    triangular = ce.estimate("rdd", frame, roles, spec={"polynomial": 2, "bandwidth": 0.5})
    assert triangular.effect == pytest.approx(4.0) and triangular.n == 39


def test_rdd_regressor_treatment_is_the_coefficient_not_a_wald_ratio():
    rng = np.random.default_rng(0)
    run = rng.uniform(-1, 1, 400)
    t = rng.binomial(1, 0.5, 400).astype(float)  # no threshold of run
    frame = pd.DataFrame({"run": run, "t": t, "y": 2.0 * t + run})
    roles = ce.Roles(treatment="t", outcome="y", running="run", cutoff=0.0)
    as_treatment = ce.estimate("rdd", frame, roles, spec={"regressor": "treatment"})
    assert as_treatment.effect == pytest.approx(2.0)
    with pytest.raises(ce.EstimationError, match="needs the roles"):
        ce.estimate("rdd", frame, ce.Roles(outcome="y", running="run", cutoff=0.0), spec={"regressor": "treatment"})


@pytest.mark.parametrize("spec, message", [({"window": 1}, "unknown keys"), ({"bandwidth": -1}, "bandwidth"),
                                           ({"polynomial": 1.5}, "polynomial"), ({"kernel": "epan"}, "kernel"),
                                           ({"regressor": "side"}, "regressor")])
def test_a_bad_specification_is_one_clear_error(spec, message):
    frame = pd.DataFrame({"run": [-1.0, 1.0], "y": [0.0, 1.0]})
    with pytest.raises(UserInputError, match=message) as error:
        ce.estimate("rdd", frame, ce.Roles(outcome="y", running="run", cutoff=0.0), spec=spec)
    assert "\n" not in str(error.value)
    with pytest.raises(UserInputError, match="ols takes none"):
        ce.estimate("ols", frame, ce.Roles(treatment="run", outcome="y"), spec={"bandwidth": 1})


def test_agents_run_the_specification_only_with_the_reference_method():
    query = cq.real_query("close_elections_score")
    oracle = CausalInferenceAgent(agent="oracle").answer(query)
    assert oracle["estimate"] == pytest.approx(45.1914, abs=1e-4) and oracle["error"] < 1e-4
    wide = CausalInferenceAgent(agent="oracle", rdd_bandwidth=0.05).answer(query)  # the option overrides the window
    assert wide["estimate"] != pytest.approx(oracle["estimate"], rel=1e-3)
    forced = CausalInferenceAgent(agent="forced-ols").answer(query)  # an OLS answer ignores the RDD settings
    assert forced["method"] == "ols" and forced["failure"] is None
