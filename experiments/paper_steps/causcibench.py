"""CauSciBench's paper config (LLM agent, evaluated only) on the benchmark's v1 release layout
(github.com/causalNLP/CauSciBench ``data/``: ``json/real_data.json`` written by ``create_json.py``, a JSON list of
query records with bare ``NaN`` for missing fields, and the data files under ``real_data/``), with a
Llama-3.1-8B-Instruct of the published widths and random weights (test -> predict)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from experiments.paper_steps import Case
from experiments.paper_steps._hf_standins import LAYERS_NOTE_TAIL
from experiments.paper_steps.emotion_hierarchy import LAYERS, llama_folder

FORMAT = ("CauSciBench v1 data folder: json/real_data.json (create_json.py's JSON list, the release's 18 fields "
          "per query, bare NaN) + real_data/lalonde_data.csv (445 rows) and real_data/lalonde_psid1.csv (2,675 rows)")
NSW = ("The data originates from the National Supported Work (NSW) Demonstration, which was a temporary employment "
       "program created to assist disadvantaged workers lacking basic job skills in entering the labor market. The "
       "NSW program randomly assigned qualified applicants into either a treatment group, which received the "
       "benefits of the NSW program, or a control group, which did not.\n\nVariables Measured\ntreat: whether or "
       "not the applicant received the training (1 if received training, 0 otherwise)\nage: measured in years\n"
       "education: measured in years\nblack: indicating race (1 if black, 0 otherwise)\nhispanic: indicating race "
       "(1 if Hispanic, 0 otherwise)\nmarried: indicating marital status (1 if married, 0 otherwise)\nnodegree: "
       "indicating high school diploma (1 if no degree, 0 otherwise)\nre74: real earnings in 1974\nre75: real "
       "earnings in 1975\nre78: real earnings in 1978\n")
PSID = ("The observational dataset merges information from two sources: the National Supported Work (NSW) "
        "Demonstration, a job training program with randomly assigned participants, and the Panel Study of Income "
        "Dynamics (PSID), a nationally representative observational survey of U.S. households.\n\nage: Age in "
        "years\neducation: Number of years of schooling\nblack: Race indicator\nhispanic: Ethnicity indicator\n"
        "married: Marital status\nnodegree: Education status\nre74: Earnings in 1974\nre75: Earnings in 1975\nre78: "
        "Earnings in 1978\nu74: Employment status in 1974\nu75: Employment status in 1975\ntreat: Treatment status\n")
CONTROLS = "age, education, black, hispanic, married, nodegree, re74, re75"


def record(query: str, description: str, method: str, path: str, effect: float, std_error: float) -> dict:
    """One query with every field ``create_json.py`` writes (in its order; the missing ones NaN)."""
    return {"name": "Propensity Score Matching for methods for non-experimental causal studies", "query": query,
            "dataset_description": description, "method": method, "dataset_path": path, "effect": effect,
            "std_error": std_error, "is_significant": int(abs(effect) > 2 * std_error), "treatment_var": "treat",
            "outcome_var": "re78", "control_variables": CONTROLS, "running_var": math.nan,
            "instrument_var": math.nan, "temporal_var": math.nan, "state_var": math.nan,
            "interaction_var": math.nan, "publication_year": 2002.0, "domain": "economics"}


def lalonde(rows: int, treated: int, seed: int, psid: bool) -> "pd.DataFrame":  # noqa: F821
    """NSW-style earnings data with the columns the release's descriptions list (synthetic values)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    treat = np.r_[np.ones(treated), np.zeros(rows - treated)]
    age = rng.integers(17, 55, rows)
    education = rng.integers(3, 17, rows)
    re74, re75 = (np.round(rng.gamma(0.6, 6000, rows) * rng.binomial(1, 0.6, rows), 2) for _ in range(2))
    re78 = np.round(np.maximum(0, 1700 * treat + 0.4 * re75 + 150 * education + rng.normal(0, 5000, rows)), 2)
    frame = {"treat": treat.astype(int), "age": age, "education": education,
             "black": rng.binomial(1, 0.8, rows), "hispanic": rng.binomial(1, 0.1, rows),
             "married": rng.binomial(1, 0.2, rows), "nodegree": (education < 12).astype(int),
             "re74": re74, "re75": re75, "re78": re78}
    if psid:
        frame = {**{k: frame[k] for k in ("age", "education", "black", "hispanic", "married", "nodegree", "re74",
                                          "re75", "re78")},
                 "u74": (re74 == 0).astype(int), "u75": (re75 == 0).astype(int), "treat": frame["treat"]}
    return pd.DataFrame(frame)


def write(folder: Path) -> list[str]:
    data = folder / "data" / "CauSciBench" / "data"
    (data / "json").mkdir(parents=True, exist_ok=True)
    (data / "real_data").mkdir(parents=True, exist_ok=True)
    lalonde(445, 185, 0, psid=False).to_csv(data / "real_data" / "lalonde_data.csv", index=False)
    lalonde(2675, 185, 1, psid=True).to_csv(data / "real_data" / "lalonde_psid1.csv", index=False)
    records = [
        record("What is the effect of the training program on job earnings for 1978?", NSW, "ols",
               "data/real_data/lalonde_data.csv", 1672.0, 638.0),
        record("Does participating in the NSW training program lead to an increase in earnings?", PSID, "matching",
               "data/real_data/lalonde_psid1.csv", 1428.0, 1126.0),
        record("Did the job training raise 1978 earnings of the randomly assigned participants?", NSW, "ols",
               "data/real_data/lalonde_data.csv", 1794.0, 633.0),
        record("What is the effect of NSW training on 1978 earnings compared with the PSID sample?", PSID,
               "matching", "data/real_data/lalonde_psid1.csv", 1473.0, 1100.0),
    ]
    (data / "json" / "real_data.json").write_text(json.dumps(records, indent=4), encoding="utf-8")  # bare NaN
    from lightning_modules.causcibench.causal_agent import METHOD_HELP, CausalInferenceAgent

    texts = [CausalInferenceAgent.prompt({"description": r["dataset_description"], "query": r["query"],
                                          "columns": []}) for r in records]
    model = llama_folder(folder, "Llama-3.1-8B-Instruct", texts, instruct=True, whole_words=list(METHOD_HELP))
    return [f"--data.init_args.data_dir={data}", "--data.init_args.queries_file=json/real_data.json",
            f"--model.init_args.llm_path={model}"]


NOTE = (f"Llama-3.1-8B-Instruct at {LAYERS} of its 32 decoder layers{LAYERS_NOTE_TAIL}; "
        "4 queries (one test batch of 4), 12 new tokens as configured")

CASES = {
    "configs/causcibench/paper.yaml": Case(
        write, note=NOTE, inference_only=True, release_format=FORMAT,
        test_args=("--data.init_args.test_batch_size=1", "--model.init_args.max_new_tokens=4")),
}
