"""Causal-inference queries for the CauSciBench agents: seeded synthetic designs with known effects, real queries
of the benchmark on datasets shipped in the ``causaldata`` package (scored against the benchmark's released
references), and the benchmark's own query files. One file: the three sources produce the same query records,
whose fields and checks are defined once here.

Paper: "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research?" (ICML 2026, PMLR v306;
repository github.com/causalNLP/CauSciBench). A query is a natural-language question about a data file, with a
reference method, the variables by role and a reference effect. Here a query is a plain dict::

    {"name", "source" ("synthetic" | "real" | "benchmark"), "design", "query", "description", "method"
     (closed label), "effect" (reference), "roles" {treatment, outcome, controls, instrument, running, cutoff,
     time, group, mediator, interaction, treatment_arm}, "data" (pandas DataFrame), "columns" (the data file's),
     "reference" (how the effect was obtained), "features" (float32 tensor of `query_features`)}

and, for real and benchmark queries, "spec" (how the reference method was run, e.g. an RDD's window and polynomial
order; the keys of `lightning_modules.causcibench.causal_methods.SPEC_KEYS`); for benchmark queries, "id",
"derived_columns" (design columns built from formula terms, in "data" but not in "columns"), "data_file",
"std_error", "is_rct", "is_multirct".

Sources (``test_source`` of `CausalQueryDataModule`; training and validation queries are always synthetic):

* ``synthetic``: one seeded generator per design (`DESIGNS`), after the formulas of the CAIS generators
  (github.com/causalNLP/causal-agent, ``auto_causal/synthetic/generator.py``): RCT, observational (confounded by
  covariates), IV (confounded by an unobserved U), encouragement IV (binary instrument and treatment; U kept so
  that the design is confounded, the CAIS variant drops it), sharp RDD (different slopes on each side), canonical
  2x2 DiD, staggered DiD (TWFE), front-door (unobserved confounder of treatment and outcome). Effects are drawn
  per query; the text (question and data description) comes from templates with a few wordings per design over
  four domains, so that the method must be read from the description (the benchmark's texts were written by an
  LLM; ours are templates).
* ``real``: `REAL_QUERIES`, eight queries of the benchmark's real set (and one textbook query) on the same data as
  shipped in ``causaldata`` (most are the release's own tables); the reference effect is the released one
  (`REFERENCE_EFFECTS`: CauSciBench v2 ``data/metadata_csv/real_input.csv``, whose every answer has its replication
  script under ``replications/real/``), and the query carries the estimator settings of that replication
  (``spec``, `REAL_SPECS`: the RDD window, kernel and polynomial order). Where causaldata's table lacks a column the
  benchmark's specification uses, ours runs the nearest specification the table allows (`NOT_REPRODUCED`; each
  entry's note says why and by how much they differ).
* ``benchmark``: the benchmark's query file in ``data_dir`` (``queries_file``) and the data files it names, read
  query by query by `load_benchmark` (layouts of github.com/causalNLP/CauSciBench: v2
  ``data/metadata_csv/*_input.csv`` and ``data/metadata_json/*_input.json``, v1 ``data/json/*.json`` written by
  its ``create_json.py`` with bare ``NaN`` for missing fields, and v1 ``data/*_info.csv``). A query that cannot be
  loaded (missing data file, a variable that is not a column, unknown method label, ...) is skipped with its
  reason (``skipped_queries`` and one warning); no loadable query at all is an error. Variable names are
  stripped; the release's formula expressions (``age^2``, ``I(age**2)``, ``np.log(x)``, ``C(state)``,
  ``a x b``, ``y = re78 - re75``) become design columns evaluated by formulaic on the data file (text controls
  and instruments become category dummies, as a formula would make them). ``interaction_var`` and
  ``multirct_treatment`` are kept as the roles ``interaction`` and ``treatment_arm`` (their use by each estimator
  is in `lightning_modules.causcibench.causal_estimators`). The release has no RDD cutoff field: a ``cutoff`` field is
  read when present, else the cutoff is inferred with a warning (the round number between the two sides of a sharp
  0/1 treatment, e.g. 0 or 50 rather than the first treated value; else 0). Nor does it have fields for how an
  RDD reference was run; the optional fields ``bandwidth``, ``kernel``, ``polynomial`` and ``regressor``
  (`SPEC_FIELDS`) become the query's ``spec`` when present (a bad value skips the query with its reason).

Method labels are normalised to the closed set of `METHOD_LABELS` (the same set as
`lightning_modules.causcibench.causal_estimators.METHODS`; a test keeps them equal); an unknown label is an error.

`query_features` (the learned method selector's input) sees only the question, the description and the data
file (column names and simple structure), never the roles or the reference method.

Length: one data family read top to bottom (the synthetic designs, the causaldata queries with their
reference effects, the benchmark's file layout and the selector's features share the query dictionary defined
here); the estimators live in `lightning_modules/causcibench/causal_estimators.py`.
"""
from __future__ import annotations

import json
import logging
import math
import re
import zlib
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from datamodules.sampling import evaluation_sampler, training_sampler
from lightning_modules.causcibench.causal_methods import METHODS as METHOD_LABELS, SYNONYMS as _SYNONYMS  # noqa: F401
from lightning_modules.causcibench.causal_methods import SPEC_KEYS, check_spec, normalise_method
from lightning_modules.shared.errors import UserInputError, one_line

DESIGNS = ("rct", "observational", "iv", "iv_encouragement", "rdd", "did_canonical", "did_twfe", "frontdoor")
DESIGN_METHOD = {"rct": "ols", "observational": "matching", "iv": "iv", "iv_encouragement": "iv", "rdd": "rdd",
                 "did_canonical": "did", "did_twfe": "did", "frontdoor": "frontdoor"}
ROLE_KEYS = ("treatment", "outcome", "controls", "instrument", "running", "cutoff", "time", "group", "mediator",
             "interaction", "treatment_arm")
COLUMN_ROLES = ("treatment", "outcome", "instrument", "running", "time", "group", "mediator", "interaction")


def _roles(**given) -> dict:
    roles = {key: None for key in ROLE_KEYS}
    roles["controls"] = []
    roles.update(given)
    return roles


# ============================================================================================ synthetic designs
THEMES = {
    "health": dict(treatment=["new_drug", "vaccinated", "treated"], outcome=["recovery_days", "health_index"],
                   covariates=["age", "bmi", "income", "smoker", "chronic"], instrument=["clinic_distance",
                   "drug_supply"], encouragement=["reminder_sent", "invited"], running=["risk_score", "test_value"],
                   mediator=["adherence", "dose_taken"], group=["hospital", "county"], time=["year", "quarter"],
                   subject="patients", t_text="receiving the treatment", y_text="patient health outcomes"),
    "education": dict(treatment=["tutoring", "small_class", "scholarship"], outcome=["test_score", "graduated_gpa"],
                      covariates=["parent_income", "prior_score", "female", "age", "urban"],
                      instrument=["lottery_rank", "distance_school"], encouragement=["mailer", "offer_letter"],
                      running=["entrance_score", "grade_points"], mediator=["study_hours", "attendance"],
                      group=["school", "district"], time=["year", "term"], subject="students",
                      t_text="the education programme", y_text="student achievement"),
    "labour": dict(treatment=["job_training", "union_member", "subsidy"], outcome=["earnings", "hours_worked"],
                   covariates=["age", "education_years", "experience", "married", "region_code"],
                   instrument=["quarter_of_birth", "plant_closure"], encouragement=["letter", "counselling_offer"],
                   running=["unemployment_days", "firm_size"], mediator=["skills_index", "job_search"],
                   group=["firm", "state"], time=["year", "month"], subject="workers",
                   t_text="the labour-market programme", y_text="earnings"),
    "policy": dict(treatment=["policy_adopted", "tax_credit", "law_passed"], outcome=["crime_rate", "employment_rate"],
                   covariates=["population", "median_income", "poverty_rate", "density", "unemployment"],
                   instrument=["rainfall", "election_cycle"], encouragement=["info_campaign", "nudge_letter"],
                   running=["vote_margin", "population_rank"], mediator=["police_spending", "enforcement"],
                   group=["state", "municipality"], time=["year", "period"], subject="regions",
                   t_text="the policy", y_text="the regional outcome"),
}
CUES = {
    "rct": ["{subject} were randomly assigned to {t}", "the study is a randomized controlled trial: a coin flip "
            "decided who received {t}", "assignment to {t} was decided by a random lottery among {subject}",
            "an experiment randomized {t} across {subject}"],
    "observational": ["the data are observational records: {subject} chose {t} themselves, and richer or healthier "
                      "{subject} chose it more often", "no experiment was run; {t} was taken up voluntarily and "
                      "the take-up depends on the recorded characteristics", "survey data collected without any "
                      "intervention; whether {subject} got {t} depends on their background characteristics"],
    "iv": ["{z} shifts how much of {t} {subject} get but plausibly affects {y} only through {t}; unmeasured "
           "factors drive both {t} and {y}", "variation in {z} is as good as random and changes {t}, which is "
           "otherwise endogenous", "{t} is endogenous, but {z} provides exogenous variation in it"],
    "iv_encouragement": ["some {subject} were randomly encouraged ({z}) to take up {t}, but take-up was voluntary",
                         "a random subset received {z} encouraging {t}; compliance was imperfect",
                         "{z} was sent at random and raised participation in {t}, which {subject} chose freely"],
    "rdd": ["{t} was given exactly to {subject} whose {r} was at or above {c}", "eligibility for {t} required a "
            "{r} of at least {c}, a strict threshold", "{subject} just above the cutoff of {c} in {r} received "
            "{t}; those just below did not"],
    "did_canonical": ["{y} was measured before and after {t} started, for a treated group and a comparison group "
                      "of {gs}", "one set of {gs} introduced {t} in the second period while the others did not; "
                      "both are observed in both periods", "a panel of {gs} observed before and after the change, "
                      "only some of which were exposed to {t}"],
    "did_twfe": ["different {gs} adopted {t} in different years (staggered adoption); each {g} is observed every "
                 "{tm}", "a panel of {gs} over several {tms}, with {t} rolled out at different times",
                 "{t} was introduced gradually: {gs} switched on in different periods and stayed treated"],
    "frontdoor": ["{t} affects {y} only through {m}; unobserved factors confound {t} and {y} but not {m}",
                  "the whole effect of {t} runs through {m}, which is measured, while the direct link between {t} "
                  "and {y} is confounded", "hidden confounders affect both {t} and {y}; {m} fully mediates the "
                  "effect and is not confounded"],
}
QUESTIONS = ["What is the effect of {t} on {y}?", "How much does {t} change {y}?",
             "Estimate the causal effect of {t} on {y}.", "Does {t} affect {y}, and by how much?"]


def _plural(word: str) -> str:
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _covariates(rng, n: int, names: list[str], k: int) -> dict[str, np.ndarray]:
    chosen = list(rng.choice(names, size=k, replace=False))
    out = {}
    for i, name in enumerate(chosen):
        if i == k - 1:  # one binary covariate, the rest integer-valued like the CAIS generators
            out[name] = rng.binomial(1, 0.5, n).astype(float)
        else:
            out[name] = np.round(rng.normal(rng.integers(3, 20), 2.0, n))
    return out


def generate_query(design: str, seed: int, rows: int = 1000) -> dict:
    """One synthetic query of ``design`` (see `DESIGNS`) with a known effect, deterministic given ``seed``."""
    import pandas as pd

    if design not in DESIGNS:
        raise UserInputError(f"unknown design {design!r}; choose from {list(DESIGNS)}.")
    rng = np.random.default_rng(seed)
    theme_name = _pick(rng, sorted(THEMES))
    theme = THEMES[theme_name]
    t, y = _pick(rng, theme["treatment"]), _pick(rng, theme["outcome"])
    covs = _covariates(rng, rows, theme["covariates"], int(rng.integers(2, 5)))
    x = np.column_stack(list(covs.values()))
    xc = (x - x.mean(0)) / np.maximum(x.std(0), 1e-9)
    effect = float(rng.uniform(2.0, 10.0) * (1 if rng.random() < 0.75 else -1))
    v1, v2 = rng.uniform(-1, 1, x.shape[1]), rng.uniform(-2, 2, x.shape[1])
    eps = rng.normal(0, 1, rows)
    cols, roles, cue = dict(covs), _roles(treatment=t, outcome=y, controls=list(covs)), {}
    if design == "rct":
        d = rng.binomial(1, 0.5, rows).astype(float)
        cols[t], cols[y] = d, 50 + xc @ v2 + effect * d + eps
    elif design == "observational":
        ps = np.clip(1 / (1 + np.exp(-(xc @ v1 + rng.normal(0, 0.5, rows)))), 1e-3, 1 - 1e-3)
        d = rng.binomial(1, ps).astype(float)
        cols[t], cols[y] = d, 50 + xc @ v2 + effect * d + eps
    elif design == "iv":
        z_name = _pick(rng, theme["instrument"])
        z = np.round(rng.normal(rng.uniform(8, 12), 2.0, rows))
        u = rng.normal(0, 1, rows)
        d = np.round(1.0 * z + xc @ v1 + rng.normal(0, 1, rows) + 30 + 2.0 * u)
        cols[z_name], cols[t] = z, d
        cols[y] = effect * d + xc @ v2 + eps + 50 + 2.0 * u
        roles["instrument"], cue["z"] = z_name, z_name.replace("_", " ")
    elif design == "iv_encouragement":
        z_name = _pick(rng, theme["encouragement"])
        z = rng.binomial(1, 0.5, rows).astype(float)
        u = rng.normal(0, 1, rows)
        d = (2.0 * z + 0.5 * (xc @ v1) + u + rng.normal(0, 0.5, rows) > 1.0).astype(float)
        cols[z_name], cols[t] = z, d
        cols[y] = effect * d + xc @ v2 + eps + 50 + 2.0 * u
        roles["instrument"], cue["z"] = z_name, z_name.replace("_", " ")
    elif design == "rdd":
        r_name = _pick(rng, theme["running"])
        cutoff = 10.0
        run = rng.normal(cutoff, 2.0, rows)
        d = (run >= cutoff).astype(float)
        rc = run - cutoff
        cols[r_name], cols[t] = run, d
        cols[y] = 10 + effect * d + 1.5 * rc * (1 - d) + 0.8 * rc * d + 0.3 * (xc @ v2) + rng.normal(0, 0.5, rows)
        roles.update(running=r_name, cutoff=cutoff)
        cue.update(r=r_name.replace("_", " "), c=f"{cutoff:g}")
    elif design in ("did_canonical", "did_twfe"):
        g_name, tm_name = _pick(rng, theme["group"]), _pick(rng, theme["time"])
        units = max(rows // (2 if design == "did_canonical" else 8), 4)
        periods = 2 if design == "did_canonical" else 8
        unit = np.repeat(np.arange(units), periods)
        period = np.tile(np.arange(periods), units)
        if design == "did_canonical":
            ever = (np.arange(units) < units // 2).astype(float)
            start = np.where(ever > 0, 1, periods + 1)
        else:
            start = np.where(rng.random(units) < 2 / 3, rng.integers(2, 6, units), periods + 1)
            ever = (start <= periods).astype(float)
        unit_effect = rng.normal(0, 1, units) + 3.0 * ever  # treated units differ in level
        time_effect = np.cumsum(rng.normal(0.5, 1, periods))
        d = (period >= start[unit]).astype(float)
        n = len(unit)
        covs = {k: v[:n] if len(v) >= n else np.resize(v, n) for k, v in covs.items()}
        xc = np.column_stack([(v - v.mean()) / max(v.std(), 1e-9) for v in covs.values()])
        cols = dict(covs)
        cols[g_name], cols[tm_name], cols[t] = unit.astype(float), period.astype(float) + 2000, d
        cols[y] = 20 + unit_effect[unit] + time_effect[period] + effect * d + xc @ (v2 * 0.5) + rng.normal(0, 1, n)
        roles.update(group=g_name, time=tm_name)
        cue.update(g=g_name.replace("_", " "), tm=tm_name.replace("_", " "), gs=_plural(g_name.replace("_", " ")),
                   tms=_plural(tm_name.replace("_", " ")))
    elif design == "frontdoor":
        m_name = _pick(rng, theme["mediator"])
        a, b = rng.uniform(1, 3), rng.uniform(1, 3) * np.sign(effect)
        u = rng.normal(0, 1, rows)
        d = (xc @ v1 + 1.5 * u + rng.normal(0, 1, rows) > 0).astype(float)
        m = xc @ rng.uniform(-1, 1, x.shape[1]) + a * d + rng.normal(0, 1, rows)
        cols[t], cols[m_name] = d, m
        cols[y] = 50 + b * m + 4.0 * u + xc @ v2 + rng.normal(0, 1, rows)
        effect = float(a * b)
        roles["mediator"], cue["m"] = m_name, m_name.replace("_", " ")
    frame = pd.DataFrame(cols)
    frame = frame[list(rng.permutation(frame.columns))]  # column order carries no hint
    text = dict(t=t.replace("_", " "), y=y.replace("_", " "), subject=theme["subject"], **cue)
    description = (f"A {theme_name} dataset of {theme['subject']} ({len(frame)} rows). "
                   + _pick(rng, CUES[design]).format(**text).capitalize() + ". The data record "
                   + ", ".join(c.replace("_", " ") for c in frame.columns) + ".")
    return {"name": f"synthetic/{design}/{seed}", "source": "synthetic", "design": design,
            "query": _pick(rng, QUESTIONS).format(**text), "description": description,
            "method": DESIGN_METHOD[design], "effect": effect, "roles": roles, "data": frame,
            "columns": list(frame.columns), "reference": f"true effect of the {design} generator"}


# ============================================================================================ real queries
def _load(name: str):
    import importlib

    try:
        module = importlib.import_module(f"causaldata.{name}")
    except ImportError as err:
        raise UserInputError(f"the real queries need the causaldata package ({err}); install it with "
                             "`pip install causaldata` (or the `causal` extra of this package).") from None
    return module.load_pandas().data


def _close_elections():
    return _load("close_elections_lmb")


def _nsw():
    frame = _load("nsw_mixtape").copy()
    frame["age"] = frame["age"].astype(float)  # an int8 column overflows when squared
    frame["age_sq"] = frame["age"] ** 2  # the replication's I(age**2)
    return frame


def _castle():
    frame = _load("castle").copy()
    frame["l_homicide"] = np.log(frame["homicide"].astype(float))  # the benchmark's column (log homicide rate)
    return frame


def _organ_donations():
    frame = _load("organ_donations").copy()
    frame["california"] = (frame["State"] == "California").astype(float)
    frame["treated"] = frame["california"] * (frame["Quarter_Num"] >= 4).astype(float)  # policy from Q3 2011
    return frame


def _nhefs():
    frame = _load("nhefs_complete").copy()
    for column in ("sex", "race", "age", "smokeintensity", "smokeyrs", "wt71"):
        frame[column] = frame[column].astype(float)  # int8 columns overflow when squared
    frame["age_sq"], frame["wt71_sq"] = frame["age"] ** 2, frame["wt71"] ** 2
    return frame


# the benchmark's RDD replications (replications/real/paper10.py and paper13.py of github.com/causalNLP/CauSciBench)
# fit OLS of outcome ~ treatment * (x + x^2), x the centred running variable, on a window of the running variable
_BENCHMARK_RDD = {"polynomial": 2, "regressor": "treatment"}

# name -> (loader, method, roles, question, description, note); the reference effect is `REFERENCE_EFFECTS`, the
# estimator settings the benchmark's replication fixes are `REAL_SPECS`; the note says where the reference comes
# from, how the benchmark's two releases differ and why our estimate on causaldata's table may differ from it
REAL_QUERIES = {
    "close_elections_score": (
        _close_elections, "rdd",
        dict(treatment="democrat", outcome="score", running="demvoteshare", cutoff=0.5),
        "What is the effect of electing a Democrat on the liberal voting score (ADA score) of the House seat's "
        "representative?",
        "US House elections 1946-1995 (Lee, Moretti and Butler 2004): vote share of the Democratic candidate, "
        "whether the Democrat won (share above one half), and the ADA liberal voting score of the winner. Races "
        "that are barely won or lost are compared.",
        "CauSciBench v2 (data/metadata_csv/real_input.csv, id 22): 45.191, OLS of score ~ democrat * (x + x^2), "
        "x = demvoteshare - 0.5, on 0.45 <= demvoteshare <= 0.55 (replications/real/paper13.py); v1 "
        "(data/json/real_data.json): 46.778, the linear fit on the same window. causaldata.close_elections_lmb is "
        "the release's close_elections.csv (13,588 rows)"),
    "close_elections_incumbency": (
        _close_elections, "rdd",
        dict(treatment="lagdemocrat", outcome="democrat", running="demvoteshare", cutoff=0.5),
        "Does winning the previous election make the Democratic party more likely to win the seat the next time?",
        "US House elections (Lee, Moretti and Butler 2004): the Democratic vote share and win in the previous "
        "election and whether the Democrat wins now. Winning was decided by crossing fifty percent of the vote.",
        "CauSciBench v2 (id 23): 0.167, OLS of democrat ~ lagdemocrat * (x + x^2), x = demvoteshare - 0.5, on "
        "0.45 <= demvoteshare <= 0.55 (paper13.py); v1: 0.214, running variable lagdemvoteshare_c, reproduced by "
        "democrat ~ lagdemocrat * (lagdemvoteshare - 0.5) on the same demvoteshare window (0.2137). Both select "
        "the sample on the current vote share, which decides the outcome, so neither is an RDD of lagdemocrat at "
        "its own cutoff; the v2 regression is the benchmark's current reference"),
    "thornton_hiv_ols": (
        lambda: _load("thornton_hiv"), "ols",
        dict(treatment="any", outcome="got", controls=["hiv2004", "age"]),
        "What is the effect of receiving any cash incentive on the probability of learning one's HIV test result?",
        "Malawi (Thornton 2008): individuals were tested for HIV and randomly offered a cash incentive, of random "
        "amount, for collecting their result at a centre; distance to the centre and age are recorded.",
        "CauSciBench v2 (id 21): 0.431, OLS of got ~ any + male + hiv2004 + age + rumphi + balaka (paper12.py) on "
        "the release's 2,812 complete rows; v1: 0.31, which also controls for the incentive amount tinc, itself "
        "part of the treatment. causaldata.thornton_hiv has no male, rumphi or balaka column, so ours controls for "
        "hiv2004 and age only (2,829 rows with these columns)"),
    "nsw_lalonde_ols": (
        _nsw, "ols",
        dict(treatment="treat", outcome="re78", controls=["age", "educ", "black", "hisp", "nodegree", "re74",
                                                         "re75", "age_sq"]),
        "What is the effect of the National Supported Work job-training programme on 1978 earnings?",
        "The NSW experiment (LaLonde 1986; Dehejia-Wahba sample, 445 men): eligible applicants were randomly "
        "assigned to job training; earnings in 1974, 1975 and 1978 and demographics are recorded.",
        "CauSciBench v2 (id 5): 1672.204, OLS of re78 ~ treat + age^2 + age + education + black + hispanic + "
        "nodegree + re74 + re75 (paper2.py); v1: 1672, listing married instead of age^2 among the controls. "
        "causaldata.nsw_mixtape holds the same 445 rows (earnings rounded to 0.05)"),
    "close_college_iv": (
        lambda: _load("close_college"), "iv",
        dict(treatment="educ", outcome="lwage", instrument="nearc4", controls=["exper", "black", "south", "smsa"]),
        "What is the return to an additional year of schooling on log wages?",
        "Card (1995), National Longitudinal Survey of Young Men: years of education, log hourly wage, experience, "
        "race, region, and whether the man grew up near a four-year college, which lowers the cost of college "
        "but plausibly does not change wages otherwise.",
        "CauSciBench v2 (id 9) and v1: 0.132, 2SLS of lwage on educ instrumented by nearc4 with exper, black, "
        "south and smsa (paper5.py); causaldata.close_college is the release's card_geographic.csv (3,010 rows)"),
    "gov_transfers_rdd": (
        lambda: _load("gov_transfers"), "rdd",
        dict(treatment="Participation", outcome="Support", running="Income_Centered", cutoff=0.0),
        "What is the effect of participating in the cash-transfer programme on support for the government?",
        "Uruguay's PANES programme (Manacorda, Miguel and Vigorito 2011): households qualified when a predicted "
        "income score fell below a threshold; income is centred at that threshold, and the survey records "
        "support for the government.",
        "CauSciBench v2 (id 19) and v1: 0.093, OLS of support ~ participation * (x + x^2), x = income_centered, "
        "every row (paper10.py); participation is exactly income_centered < 0 in causaldata.gov_transfers, the "
        "release's 1,948 rows"),
    "castle_doctrine_did": (
        _castle, "did",
        dict(treatment="post", outcome="l_homicide", group="sid", time="year"),
        "Did castle-doctrine (stand-your-ground) laws change homicide rates?",
        "US states 2000-2010 (Cheng and Hoekstra 2013): states adopted castle-doctrine laws in different years; "
        "the panel records crime rates, demographics and a post-adoption indicator for each state and year.",
        "CauSciBench v2 (id 15): 0.088, OLS of l_homicide ~ cdl + C(sid) + C(year), no controls (paper9.py); v1: "
        "0.1, with twelve controls. cdl is the share of the year the law was in force (fractional in the adoption "
        "year); causaldata.castle has only the binary post indicator (0 in the adoption year), so ours regresses "
        "on post: the release's castle.csv gives 0.0877 with cdl and 0.0694 with post"),
    "organ_donations_did": (
        _organ_donations, "did",
        dict(treatment="treated", outcome="Rate", group="State", time="Quarter_Num"),
        "Did California's active-choice policy for organ donor registration change the donor registration rate?",
        "Kessler and Roth (2014): quarterly organ-donor registration rates of US states, Q4 2010 to Q1 2012; "
        "California changed its registration question in July 2011, the other states did not.",
        "CauSciBench v2 (id 20): -0.022, OLS of rate ~ post + california + post x california with post = "
        "quarter_num > 3 (paper11.py); v1: -0.023. On this balanced panel (27 states x 6 quarters) the two-way "
        "fixed-effects estimate equals that 2x2 coefficient"),
    "nhefs_smoking_matching": (
        _nhefs, "matching",
        dict(treatment="qsmk", outcome="wt82_71",
             controls=["sex", "race", "age", "age_sq", "education", "smokeintensity", "smokeyrs", "exercise",
                       "active", "wt71", "wt71_sq"]),
        "What is the effect of quitting smoking on weight gain between 1971 and 1982?",
        "NHEFS (Hernan and Robins, Causal Inference: What If): smokers interviewed in 1971 and 1982; whether "
        "they quit was their own choice and depends on their age, sex, smoking history and health.",
        "not in the benchmark: Hernan and Robins, What If, sec. 12.2, 3.4 kg, the inverse-probability-weighted "
        "average effect on the same 1,566 rows; ours is 1-NN propensity-score matching on a linear logistic "
        "score"),
}

# the reference effects as released: CauSciBench v2 data/metadata_csv/real_input.csv (`answer`), the release with
# replication code for every reference; the textbook's printed value for the query that is not in the benchmark
REFERENCE_EFFECTS = {"close_elections_score": 45.191, "close_elections_incumbency": 0.167, "thornton_hiv_ols": 0.431,
                     "nsw_lalonde_ols": 1672.204, "close_college_iv": 0.132, "gov_transfers_rdd": 0.093,
                     "castle_doctrine_did": 0.088, "organ_donations_did": -0.022, "nhefs_smoking_matching": 3.4}
# where each reference comes from (query id of v2 real_input.csv, or the textbook)
REFERENCE_SOURCES = {"close_elections_score": "CauSciBench v2 id 22",
                     "close_elections_incumbency": "CauSciBench v2 id 23",
                     "thornton_hiv_ols": "CauSciBench v2 id 21", "nsw_lalonde_ols": "CauSciBench v2 id 5",
                     "close_college_iv": "CauSciBench v2 id 9", "gov_transfers_rdd": "CauSciBench v2 id 19",
                     "castle_doctrine_did": "CauSciBench v2 id 15", "organ_donations_did": "CauSciBench v2 id 20",
                     "nhefs_smoking_matching": "What If, sec. 12.2"}
# the estimator settings of each query's reference (`lightning_modules.causcibench.causal_estimators.SPEC_KEYS`)
REAL_SPECS = {"close_elections_score": dict(_BENCHMARK_RDD, bandwidth=0.05, kernel="uniform"),
              "close_elections_incumbency": dict(_BENCHMARK_RDD, bandwidth=0.05, kernel="uniform"),
              "gov_transfers_rdd": dict(_BENCHMARK_RDD)}
# the queries whose reference our estimator does not reproduce on causaldata's table (the notes say why)
NOT_REPRODUCED = ("thornton_hiv_ols", "castle_doctrine_did", "nhefs_smoking_matching")


def real_query(name: str) -> dict:
    """The real query ``name`` of `REAL_QUERIES` with its released reference effect (`REFERENCE_EFFECTS`) and the
    estimator settings of that reference (``spec``, from `REAL_SPECS`)."""
    if name not in REAL_QUERIES:
        raise UserInputError(f"unknown real query {name!r}; choose from {sorted(REAL_QUERIES)}.")
    loader, method, given, question, description, note = REAL_QUERIES[name]
    effect = REFERENCE_EFFECTS[name]
    frame = loader()
    roles = _roles(**given)
    missing = [c for c in [roles[k] for k in COLUMN_ROLES] + roles["controls"]
               if c is not None and c not in frame.columns]
    if missing:  # a causaldata release that renamed columns
        raise UserInputError(f"real query {name}: columns {missing} are missing from its causaldata dataset; "
                             "install causaldata 0.1.5.")
    return {"name": f"real/{name}", "source": "real", "design": method, "query": question,
            "description": description, "method": method, "effect": float(effect), "roles": roles, "data": frame,
            "columns": list(frame.columns), "reference": f"{REFERENCE_SOURCES[name]}: {note}",
            "spec": dict(REAL_SPECS.get(name, {}))}


# ============================================================================================ benchmark files
log = logging.getLogger(__name__)

# the query files' field names, newest first: v2 metadata_json / v1 data/json (create_json.py) use treatment_var,
# control_variables, dataset_path, effect; v2 metadata_csv/*_input.csv and v1 *_info.csv use treatment, controls
# (v1: control_variables), dataset_name (v1: data_files), answer; v1 real_info.csv spells interacting_var
FIELDS = {"id": ("id",), "name": ("name", "paper_name"), "query": ("query", "natural_language_query"),
          "description": ("dataset_description", "data_description"),
          "data": ("dataset_path", "dataset_name", "data_files"), "method": ("method",),
          "effect": ("effect", "answer"), "std_error": ("std_error",), "treatment": ("treatment_var", "treatment"),
          "outcome": ("outcome_var", "outcome"), "controls": ("control_variables", "controls"),
          "instrument": ("instrument_var",), "running": ("running_var",), "time": ("temporal_var",),
          "group": ("state_var",), "mediator": ("mediator",), "interaction": ("interaction_var", "interacting_var"),
          "treatment_arm": ("multirct_treatment",), "cutoff": ("cutoff",), "is_rct": ("is_rct",),
          "is_multirct": ("is_multirct",)}
# optional fields fixing how the reference method is run (an RDD's bandwidth, kernel, polynomial order, regressor;
# see `lightning_modules.causcibench.causal_methods.check_spec`); the release has none, a user's query file may
SPEC_FIELDS = tuple(dict.fromkeys(key for keys in SPEC_KEYS.values() for key in keys))
# the split folders of the data files (v2 data/csv_files/<split>/, v1 data/<split>/), by the query file's name
SPLIT_FOLDERS = {"qr": ("qrdata",), "real": ("realdata", "real_data"), "synthetic": ("synthetic_data",)}
# what a variable expression may call besides the data file's columns (formulaic's transforms and numpy)
FORMULA_NAMES = {"I", "C", "log", "exp", "sqrt", "abs", "center", "scale", "standardize"}
NUMPY_NAMES = {"log", "log1p", "log2", "log10", "exp", "sqrt", "abs", "square"}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
EXPANDING = ("control", "instrument")  # the roles whose variable may stand for several design columns


class BenchmarkQueries(list):
    """The queries of a benchmark file that loaded (a list), and ``skipped_queries``: ``(query id, reason)`` of
    each query that did not (the release's ``id`` field, else the query's 0-based position in the file)."""

    def __init__(self, queries: list[dict], skipped: list[tuple]) -> None:
        super().__init__(queries)
        self.skipped_queries = list(skipped)


class _Skip(Exception):
    """This query cannot be loaded; the message is the reason."""


def _read_table(path: Path):
    import pandas as pd

    try:
        if path.suffix == ".csv":
            try:
                return pd.read_csv(path)
            except UnicodeDecodeError:  # some of the release's files are latin-1, as its own reader allows
                return pd.read_csv(path, encoding="latin1")
        if path.suffix in (".dta",):
            return pd.read_stata(path)
        if path.suffix in (".xlsx", ".xls"):
            return pd.read_excel(path)
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
    except Exception as err:
        raise UserInputError(f"could not read data file {path}: {one_line(err)}") from None
    raise UserInputError(f"data file {path} has an unsupported format; use .csv, .dta, .xlsx or .parquet.")


def _missing(value) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return str(value).strip().lower() in ("", "nan", "none", "null", "na")


def _field(item: dict, *names):
    for name in names:
        if not _missing(item.get(name)):
            return item[name]
    return None


def _text(item: dict, key: str) -> str | None:
    value = _field(item, *FIELDS[key])
    return None if value is None else str(value).strip()


def _find_file(data_dir: Path, name: str, split: tuple[str, ...]) -> Path:
    """``name`` under ``data_dir``: as a path (also without its leading folders, so that the release's
    ``data/real_data/x.csv`` is found under its ``data`` folder), else by file name, preferring the split's folder."""
    parts = Path(name).parts
    for start in range(len(parts)):
        candidate = data_dir.joinpath(*parts[start:])
        if candidate.is_file():
            return candidate
    matches = sorted(data_dir.rglob(Path(name).name))
    preferred = [m for m in matches if m.parent.name in split]
    matches = preferred or matches
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise _Skip(f"data file {name!r} named by the query file is not under {data_dir}; put the benchmark's data "
                    "files there (v2: csv_files/<split>/, v1: real_data/, qrdata/).")
    raise _Skip(f"data file {name!r} matches several files under {data_dir} ({[str(m) for m in matches[:4]]}); "
                "name it by its path in the query file.")


def _columns_text(frame, file_name: str) -> str:
    columns = [str(c) for c in frame.columns]
    shown = ", ".join(columns[:30]) + (f", ... ({len(columns)} in all)" if len(columns) > 30 else "")
    return f"{file_name} (columns: {shown})"


def _formula(expression: str) -> str:
    """A variable expression as the release writes it, as a formulaic term: ``[]`` -> ``()``, ``a x b`` / ``a × b``
    -> ``a:b`` (an interaction), ``^`` -> ``**``, and arithmetic wrapped in ``I(...)`` so that it is evaluated
    rather than read as formula operators (``age^2`` -> ``I(age**2)``, ``re78 - re75`` -> ``I(re78 - re75)``)."""
    text = expression.strip().replace("[", "(").replace("]", ")").replace("×", ":")
    text = re.sub(r"\s+x\s+", ":", text).replace("^", "**")
    if re.search(r"[-+*/]", text) and not text.startswith("I("):
        text = f"I({text})"
    return text


class _Design:
    """The variables of one query resolved against its data file: plain columns (names matched after stripping
    whitespace) or design columns that formulaic builds from the release's formula expressions."""

    def __init__(self, frame, file_name: str) -> None:
        self.frame, self.file_name = frame, file_name
        self.lookup = {str(c).strip(): c for c in frame.columns}
        self.derived: dict[str, object] = {}  # design column name -> values

    def unknown(self, name: str, part: str | None = None) -> _Skip:
        inside = f" in {name!r}" if part is not None and part != name else ""
        where = _columns_text(self.frame, self.file_name)
        return _Skip(f"variable {part or name!r}{inside} is not a column of {where}")

    def columns(self, name: str, role: str) -> list:
        """The column(s) the variable ``name`` stands for; only controls and instruments may expand to several
        (a text column or a ``C(...)`` term becomes its category dummies, the first category dropped)."""
        name = name.strip()
        if name in self.lookup:
            column = self.lookup[name]
            if role in EXPANDING and not _is_numeric(self.frame[column]):  # a formula reads text as categories
                return self._evaluate(f"C({name})", name, role, frame_name=name)
            return [column]
        target = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(.+)", name)  # "income_change = re78 - re75"
        label, expression = (target.group(1), target.group(2)) if target else (name, name)
        if label in self.lookup:
            label = name
        if re.fullmatch(r"[\w .]+", expression):  # a plain name (maybe with spaces) that is not a column
            raise self.unknown(name)
        formula = _formula(expression)
        for function in re.findall(r"\bnp\.(\w+)", formula):
            if function not in NUMPY_NAMES:
                raise _Skip(f"variable {name!r} calls np.{function}, which is not allowed in a variable "
                            f"expression (allowed: np.{', np.'.join(sorted(NUMPY_NAMES))}).")
        bare = re.sub(r"\bnp\.\w+", " ", formula)
        bare = re.sub(r"(?<![\w.])\d+(\.\d*)?([eE][-+]?\d+)?", " ", bare)
        for identifier in _IDENTIFIER.findall(bare):
            if identifier not in self.lookup and identifier not in FORMULA_NAMES:
                raise self.unknown(name, identifier)
        return self._evaluate(formula, name, role, frame_name=label)

    def _evaluate(self, formula: str, name: str, role: str, frame_name: str) -> list:
        from formulaic import model_matrix

        used = [self.lookup[i] for i in set(_IDENTIFIER.findall(formula)) if i in self.lookup]
        data = self.frame[used].rename(columns={c: str(c).strip() for c in used})
        context = {"np": np, "log": np.log, "exp": np.exp, "sqrt": np.sqrt, "abs": np.abs}
        try:
            matrix = model_matrix(f"1 + {formula}", data, na_action="ignore", context=context)
        except Exception as err:  # formulaic's errors for a term it cannot read or evaluate
            raise _Skip(f"variable {name!r} could not be evaluated as the formula term {formula!r} on "
                        f"{self.file_name}: {one_line(err)}") from None
        built = [c for c in matrix.columns if c != "Intercept"]
        if not built:
            raise _Skip(f"variable {name!r} ({formula!r}) gives no design column on {self.file_name}.")
        if len(built) > 1 and role not in EXPANDING:
            raise _Skip(f"the {role} {name!r} gives {len(built)} design columns ({built[:4]}...); only controls "
                        "and instruments may expand to several (e.g. fixed effects C(...)).")
        if len(built) == 1 and frame_name not in self.lookup and "[" not in str(built[0]):
            names = [frame_name]
        else:  # categories: "name[T.level]", never a name the file has already
            names = [f"{name}[{str(c).split('[', 1)[-1]}" if "[" in str(c) else f"{name}:{c}" for c in built]
        for new, column in zip(names, built):
            self.derived[new] = np.asarray(matrix[column], dtype=float)
        return names

    def data(self):
        if not self.derived:
            return self.frame
        import pandas as pd

        extra = pd.DataFrame(self.derived, index=self.frame.index)
        return pd.concat([self.frame, extra], axis=1)


def _is_numeric(values) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)


def _read_queries(path: Path) -> list[dict]:
    import pandas as pd

    if path.suffix == ".json":
        try:
            items = json.loads(path.read_text())  # Python's json reads v1's bare NaN as float nan
        except json.JSONDecodeError as err:
            raise UserInputError(f"{path} is not valid JSON: {err}") from None
        if isinstance(items, dict):
            items = next((v for v in items.values() if isinstance(v, list)), [])
    elif path.suffix == ".csv":
        try:
            try:
                items = pd.read_csv(path).to_dict("records")
            except UnicodeDecodeError:  # a latin-1 file, read as `_read_table` reads one
                items = pd.read_csv(path, encoding="latin1").to_dict("records")
        except (ValueError, OSError) as err:  # pandas' ParserError (a row with extra fields), EmptyDataError, ...
            raise UserInputError(f"could not read the query file {path} as CSV ({type(err).__name__}: "
                                 f"{one_line(err)}); fix the line it names, or pass the benchmark's own query "
                                 "file.") from None
    else:
        raise UserInputError(f"query file {path} is neither .json nor .csv; pass one of the benchmark's query files "
                             "(v2 metadata_csv/real_input.csv, metadata_json/real_input.json; v1 json/real_data.json).")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise UserInputError(f"{path} is not a list of query records (JSON objects or CSV rows).")
    if not items:
        raise UserInputError(f"{path} holds no queries.")
    return items


def load_benchmark(data_dir: str, queries_file: str) -> BenchmarkQueries:
    """The queries of the benchmark's ``queries_file`` with their data files under ``data_dir``, query by query.

    Layouts (github.com/causalNLP/CauSciBench): v2 ``data/metadata_csv/*_input.csv`` (columns ``id, paper_name,
    data_description, dataset_name, query, method, answer, std_error, treatment, outcome, controls,
    instrument_var, running_var, temporal_var, state_var, [mediator], interaction_var, is_rct, is_multirct``; data
    under ``data/csv_files/<split>/``) and ``data/metadata_json/*_input.json``; v1 ``data/json/*.json``
    (``create_json.py``: bare ``NaN`` for missing fields) and ``data/*_info.csv``. A query that cannot be loaded
    (its data file is missing, a variable is not a column and no formula term builds it, its method label is
    unknown, ...) is skipped: the returned list's ``skipped_queries`` holds ``(query id, reason)`` for each and one
    warning lists them all. If no query loads, that is one error listing the reasons."""
    root = Path(data_dir)
    path = Path(queries_file) if Path(queries_file).is_absolute() else root / queries_file
    if not root.is_dir() or not path.is_file():
        raise UserInputError(f"no benchmark query file {path} (data_dir={data_dir!r}); pass the benchmark's "
                             "data folder as data_dir and a query file such as metadata_csv/real_input.csv (v2) or "
                             "json/real_data.json (v1).")
    items = _read_queries(path)
    split = next((folders for key, folders in SPLIT_FOLDERS.items() if path.name.lower().startswith(key)), ())
    queries, skipped, inferred, tables = [], [], [], {}
    for index, item in enumerate(items):
        raw_id = _field(item, *FIELDS["id"])
        query_id = index if raw_id is None else (int(raw_id) if str(raw_id).strip().lstrip("-").isdigit()
                                                  else str(raw_id).strip())
        try:
            query, cutoff_note = _benchmark_query(item, index, query_id, path, root, split, tables)
        except _Skip as reason:
            skipped.append((query_id, str(reason)))
            continue
        if cutoff_note:
            inferred.append(f"{query_id}: {cutoff_note}")
        queries.append(query)
    if not queries:
        reasons = "; ".join(f"query {i}: {r}" for i, r in skipped[:5]) + (" ..." if len(skipped) > 5 else "")
        raise UserInputError(f"no query of {path} could be loaded ({len(skipped)} skipped): {reasons}")
    if skipped:
        log.warning("%s: skipped %d of %d queries: %s", path.name, len(skipped), len(items),
                    "; ".join(f"query {i}: {r}" for i, r in skipped))
    if inferred:
        log.warning("%s: the query file gives no RDD cutoff (no 'cutoff' field) for %d queries; inferred from the "
                    "data: %s", path.name, len(inferred), "; ".join(inferred))
    return BenchmarkQueries(queries, skipped)


def _benchmark_query(item: dict, index: int, query_id, path: Path, root: Path, split: tuple[str, ...],
                     tables: dict) -> tuple[dict, str | None]:
    """One query record (see `load_benchmark`) and, for an RDD whose cutoff was inferred, how; `_Skip` if not."""
    name = _text(item, "name") or f"query_{index}"
    method_raw = _field(item, *FIELDS["method"])
    if method_raw is None:
        raise _Skip("no method label.")
    try:
        method = normalise_method(method_raw)
    except UserInputError as err:
        raise _Skip(str(err)) from None
    effect = _field(item, *FIELDS["effect"])
    try:
        effect = float(str(effect).replace("−", "-").strip())  # the release's CSVs have a Unicode minus
    except ValueError:
        raise _Skip(f"the reference effect {effect!r} is not a number.") from None
    if not math.isfinite(effect):
        raise _Skip("no reference effect (answer / effect).")
    data_name = _text(item, "data")
    if data_name is None:
        raise _Skip("names no data file (dataset_name / dataset_path / data_files).")
    data_name = data_name.split(",")[0].strip()
    file = _find_file(root, data_name, split)
    if file not in tables:
        try:
            tables[file] = _read_table(file)
        except UserInputError as err:
            raise _Skip(str(err)) from None
    frame = tables[file]
    design = _Design(frame, file.name)

    def one(key: str, role: str):
        value = _text(item, key)
        if value is None:
            return None
        (column,) = design.columns(value, role)
        return column

    outcome = one("outcome", "outcome")
    if outcome is None:
        raise _Skip("names no outcome variable.")
    instruments = [c for v in (_text(item, "instrument") or "").split(",") if v.strip()
                   for c in design.columns(v, "instrument")]
    controls = []
    for value in str(_field(item, *FIELDS["controls"]) or "").split(","):
        if value.strip():
            controls += [c for c in design.columns(value, "control") if c not in controls]
    roles = _roles(treatment=one("treatment", "treatment"), outcome=outcome, controls=controls,
                   instrument=(instruments[0] if len(instruments) == 1 else instruments) or None,
                   running=one("running", "running variable"), time=one("time", "temporal variable"),
                   group=one("group", "state variable"), mediator=one("mediator", "mediator"),
                   interaction=one("interaction", "interaction variable"), treatment_arm=_text(item, "treatment_arm"))
    data = design.data()
    for role in ("treatment", "outcome", "running", "mediator", "interaction"):
        column = roles[role]
        arm = role == "treatment" and roles["treatment_arm"]
        if column is not None and not arm and not _is_numeric(data[column]):
            values = sorted(map(str, data[column].dropna().unique()))[:6]
            hint = " (a multi-arm treatment needs multirct_treatment naming the arm)" if role == "treatment" else ""
            raise _Skip(f"the {role} {column!r} of {file.name} is not numeric (values {values}){hint}.")
    is_multirct = _field(item, *FIELDS["is_multirct"])
    if roles["treatment_arm"] is not None:
        values = data[roles["treatment"]].dropna()
        if not _arm_present(values, roles["treatment_arm"]):
            raise _Skip(f"multirct_treatment {roles['treatment_arm']!r} is not a value of the treatment "
                        f"{roles['treatment']!r} (values {sorted(map(str, values.unique()))[:8]}).")
    elif is_multirct is not None and str(is_multirct).strip().lower() in ("1", "1.0", "true"):
        raise _Skip(f"is_multirct is set (the treatment {roles['treatment']!r} has several arms) but the query names "
                    "no arm (multirct_treatment); the effect of which arm is asked cannot be read from the fields.")
    cutoff_note = None
    if method == "rdd" and roles["running"] is not None:
        cutoff = _field(item, *FIELDS["cutoff"])
        if cutoff is not None:
            try:
                roles["cutoff"] = float(cutoff)
            except (TypeError, ValueError):
                raise _Skip(f"the RDD cutoff {cutoff!r} is not a number.") from None
        else:
            roles["cutoff"], how = _infer_cutoff(data, roles)
            cutoff_note = f"{roles['cutoff']:g} ({how})"
    spec = {key: value for key in SPEC_FIELDS if (value := _field(item, key)) is not None}
    try:  # optional fields of ours (the release has none): how the reference method was run
        spec = check_spec(method, spec)
    except UserInputError as err:
        raise _Skip(str(err)) from None
    std_error = _field(item, *FIELDS["std_error"])
    is_rct = _field(item, *FIELDS["is_rct"])
    record = {"id": query_id, "name": f"benchmark/{name}", "source": "benchmark", "design": method,
              "query": _text(item, "query") or "", "description": _text(item, "description") or "",
              "method": method, "effect": effect, "roles": roles, "data": data, "columns": list(frame.columns),
              "derived_columns": list(design.derived), "data_file": str(file),
              "std_error": _number(std_error), "is_rct": None if is_rct is None else _flag(is_rct),
              "is_multirct": None if is_multirct is None else _flag(is_multirct),
              "reference": f"{path.name} query {query_id}", "spec": spec}
    return record, cutoff_note


def _number(value) -> float | None:
    try:
        return float(str(value).replace("−", "-"))
    except (TypeError, ValueError):
        return None


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "1.0", "true", "yes")


def _arm_present(values, arm: str) -> bool:
    import pandas as pd

    if (values.astype(str).str.strip() == arm).any():
        return True
    numbers = pd.to_numeric(values, errors="coerce")
    try:
        return bool(numbers.notna().all() and (numbers == float(arm)).any())
    except ValueError:
        return False


def _round_number(low: float, high: float) -> float:
    """The roundest number in ``(low, high]``: 0 if it lies there, else a multiple of the largest power of ten
    (or of half of one) that does, the one nearest the middle."""
    if low < 0 <= high:
        return 0.0
    middle = (low + high) / 2
    for exponent in range(int(math.floor(math.log10(max(abs(low), abs(high))))) + 1, -13, -1):
        for step in (10.0 ** exponent, 5 * 10.0 ** (exponent - 1)):
            first, last = math.floor(low / step) + 1, math.floor(high / step)
            if first <= last:
                return float(round(min(range(first, last + 1), key=lambda k: abs(k * step - middle)) * step, 12))
    return float(high)


def _infer_cutoff(frame, roles: dict) -> tuple[float, str]:
    """An RDD cutoff the query file does not give: where a sharp 0/1 treatment switches, the roundest number
    between the last running value of one side and the first of the other (a true 0 or 50, not the first
    observed value); else 0."""
    if roles["treatment"] is None:
        return 0.0, "no treatment column to locate it; 0 assumed"
    sub = frame[[roles["running"], roles["treatment"]]].dropna()
    run, treated = sub[roles["running"]].to_numpy(float), sub[roles["treatment"]].to_numpy(float)
    if set(np.unique(treated)) <= {0.0, 1.0} and treated.any() and not treated.all():
        on, off = run[treated == 1], run[treated == 0]
        if on.min() > off.max():
            return _round_number(off.max(), on.min()), f"the treatment switches on between {off.max():g} and " \
                                                       f"{on.min():g}"
        if on.max() < off.min():
            return _round_number(on.max(), off.min()), f"the treatment switches off between {on.max():g} and " \
                                                       f"{off.min():g}"
    return 0.0, "the treatment is not a sharp threshold of the running variable; 0 assumed"


# ============================================================================================ selector features
N_STRUCTURE = 8
_WORD = re.compile(r"[a-z]+")


def _bucket(token: str, buckets: int) -> int:
    return zlib.crc32(token.encode()) % buckets


def query_features(query: dict, text_buckets: int = 512, column_buckets: int = 64) -> torch.Tensor:
    """The learned selector's input: hashed words and word pairs of the question and description
    (``text_buckets``), hashed column-name words (``column_buckets``) and `N_STRUCTURE` structural features of the
    data file (log rows, number of columns, share of 0/1 columns, a 0/1 column that is a threshold of another
    column, a balanced time-like integer column, a unit-like id column, the share of columns with many distinct
    values, two or more 0/1 columns). Roles and reference method are never read."""
    text = np.zeros(text_buckets, dtype=np.float32)
    words = _WORD.findall(f"{query['query']} {query['description']}".lower())
    for token in words + [f"{a}_{b}" for a, b in zip(words, words[1:])]:
        text[_bucket(token, text_buckets)] += 1.0
    text = np.log1p(text)
    names = np.zeros(column_buckets, dtype=np.float32)
    for column in query["columns"]:
        for word in _WORD.findall(str(column).lower()):
            names[_bucket(word, column_buckets)] = 1.0
    frame = query["data"].drop(columns=query.get("derived_columns", []))  # the file's columns, not the roles' terms
    numeric = frame.select_dtypes("number")
    values = {c: numeric[c].dropna().to_numpy(float) for c in numeric.columns}
    binary = [c for c, v in values.items() if len(v) and np.isin(v, (0.0, 1.0)).all()]
    threshold = 0.0
    for b in binary:
        mask = numeric[b].notna()
        for c, v in values.items():
            if c == b or c in binary or len(np.unique(v)) < 20:
                continue
            col = numeric.loc[mask, c].to_numpy(float)
            on = numeric.loc[mask, b].to_numpy(float) == 1
            keep = ~np.isnan(col)
            col, on = col[keep], on[keep]
            if on.any() and (~on).any() and (col[on].min() >= col[~on].max() or col[on].max() <= col[~on].min()):
                threshold = 1.0
    time_like = id_like = many = 0.0
    for c, v in values.items():
        distinct = np.unique(v)
        if 2 <= len(distinct) <= 40 and np.allclose(distinct, np.round(distinct)) and len(v) >= 4 * len(distinct) \
                and np.all(np.diff(distinct) == 1):
            counts = np.unique(v, return_counts=True)[1]
            time_like = max(time_like, float(counts.max() <= 1.5 * counts.min()))  # a balanced panel's periods
        if len(distinct) > 40 and len(v) >= 2 * len(distinct) and np.allclose(distinct, np.round(distinct)):
            id_like = 1.0
        if len(distinct) > 0.5 * max(len(v), 1):
            many += 1.0
    structure = np.array([math.log1p(len(frame)) / 10, len(frame.columns) / 20, len(binary) / max(len(values), 1),
                          threshold, time_like, id_like, many / max(len(values), 1),
                          float(len(binary) >= 2)], dtype=np.float32)
    return torch.from_numpy(np.concatenate([text, names, structure]))


# ============================================================================================ datamodule
def _collate_queries(batch: list[dict]) -> list[dict]:
    return batch


class CausalQueryDataModule(LightningDataModule):
    """Synthetic queries to train and validate the learned method selector, and test queries for the agents.

    Fit batches are ``(features [B, D], method index [B])`` (index into `METHOD_LABELS`); test batches are lists
    of query dicts (with their data frames and ``features``).

    Args:
        test_source: ``real`` (the causaldata queries), ``synthetic`` (fresh seeded queries) or ``benchmark``
            (``queries_file`` under ``data_dir``).
        train_per_design / val_per_design / test_per_design: synthetic queries per design and split.
        rows: rows of each synthetic data file.
        designs: the synthetic designs used (default all of `DESIGNS`).
        real_queries: names of `REAL_QUERIES` to test on (default all).
        data_dir / queries_file: the benchmark's data folder and query file (``test_source: benchmark``).
        text_buckets / column_buckets: sizes of the hashed features (the model's ``input_dim`` must be
            ``text_buckets + column_buckets + 8``).
        batch_size: fit batch size (test batches hold ``test_batch_size`` queries).
        seed: the synthetic queries' seed (train, validation and test use disjoint seed ranges).
    """

    def __init__(self, test_source: str = "real", train_per_design: int = 40, val_per_design: int = 10,
                 test_per_design: int = 10, rows: int = 1000, designs: list[str] | None = None,
                 real_queries: list[str] | None = None, data_dir: str | None = None,
                 queries_file: str | None = None, text_buckets: int = 512, column_buckets: int = 64,
                 batch_size: int = 32, test_batch_size: int = 8, seed: int = 0) -> None:
        super().__init__()
        if test_source not in ("real", "synthetic", "benchmark"):
            raise UserInputError(f"test_source={test_source!r}; choose real, synthetic or benchmark.")
        if test_source == "benchmark" and (data_dir is None or queries_file is None):
            raise UserInputError("test_source=benchmark needs data_dir (the benchmark's data folder) and "
                                 "queries_file (e.g. json/real_data.json).")
        for name, value in (("train_per_design", train_per_design), ("val_per_design", val_per_design),
                            ("rows", rows), ("batch_size", batch_size), ("text_buckets", text_buckets),
                            ("column_buckets", column_buckets), ("test_batch_size", test_batch_size)):
            if int(value) < 1:
                raise UserInputError(f"{name}={value} must be at least 1.")
        self.designs = list(designs or DESIGNS)
        unknown = [d for d in self.designs if d not in DESIGNS]
        if unknown:
            raise UserInputError(f"unknown designs {unknown}; choose from {list(DESIGNS)}.")
        self.real_names = list(real_queries or REAL_QUERIES)
        unknown = [q for q in self.real_names if q not in REAL_QUERIES]
        if unknown:
            raise UserInputError(f"unknown real queries {unknown}; choose from {sorted(REAL_QUERIES)}.")
        self.save_hyperparameters()
        self.feature_dim = text_buckets + column_buckets + N_STRUCTURE
        self.train_queries = self.val_queries = self.test_queries = None
        self.skipped_queries: list[tuple] = []  # (query id, reason) of the benchmark queries that did not load

    def _features(self, query: dict) -> dict:
        query["features"] = query_features(query, self.hparams.text_buckets, self.hparams.column_buckets)
        return query

    def synthetic(self, split: str, per_design: int) -> list[dict]:
        """``per_design`` queries of each design; seeds ``seed * 1e6 + split offset + design * 1e4 + i``."""
        offset = {"train": 0, "val": 100_000, "test": 200_000}[split]
        return [self._features(generate_query(design, self.hparams.seed * 1_000_000 + offset + d * 10_000 + i,
                                               self.hparams.rows))
                for d, design in enumerate(self.designs) for i in range(per_design)]

    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate") and self.train_queries is None:
            self.train_queries = self.synthetic("train", self.hparams.train_per_design)
            self.val_queries = self.synthetic("val", self.hparams.val_per_design)
        if stage in ("test", "predict") and self.test_queries is None:
            if self.hparams.test_source == "real":
                queries = [real_query(name) for name in self.real_names]
            elif self.hparams.test_source == "synthetic":
                queries = self.synthetic("test", self.hparams.test_per_design)
            else:
                queries = load_benchmark(self.hparams.data_dir, self.hparams.queries_file)
                self.skipped_queries = queries.skipped_queries
            self.test_queries = [q if "features" in q else self._features(q) for q in queries]

    @staticmethod
    def tensors(queries: list[dict]) -> TensorDataset:
        return TensorDataset(torch.stack([q["features"] for q in queries]),
                             torch.tensor([METHOD_LABELS.index(q["method"]) for q in queries]))

    def train_dataloader(self):
        # epoch-seeded order: a run resumed from a checkpoint sees the same batches as an uninterrupted one
        train = self.tensors(self.train_queries)
        return DataLoader(train, batch_size=self.hparams.batch_size,
                          sampler=training_sampler(len(train), self.hparams.seed, self.trainer))

    def val_dataloader(self):
        val = self.tensors(self.val_queries)
        return DataLoader(val, batch_size=self.hparams.batch_size, sampler=evaluation_sampler(val, self.trainer))

    def test_dataloader(self):
        return DataLoader(self.test_queries, batch_size=self.hparams.test_batch_size, collate_fn=_collate_queries,
                          sampler=evaluation_sampler(self.test_queries, self.trainer))

    def predict_dataloader(self):
        """The test queries (``predict`` writes each one's method and effect estimate)."""
        return self.test_dataloader()
