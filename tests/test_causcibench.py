"""CauSciBench: method labels, estimators against known effects and hand values, the scoring rule, the query
sources (synthetic generators, causaldata queries, the benchmark's file layouts) and the agents."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader

from datamodules import causal_queries as cq
from experiments import kit
from lightning_modules.causcibench import causal_estimators as ce
from lightning_modules.causcibench.causal_agent import (CausalInferenceAgent, parse_method, relative_error,
                                                        rule_based_method)
from lightning_modules.shared.errors import UserInputError


# --------------------------------------------------------------------------------------------- labels
def test_the_two_label_tables_agree():
    assert cq.METHOD_LABELS == ce.METHODS
    assert cq._SYNONYMS == ce.SYNONYMS


@pytest.mark.parametrize("raw, label", [("iv", "iv"), ("IV-2SLS", "iv"), ("did ", "did"), ("diff-in-diff", "did"),
                                        ("propensity score matching", "matching"), ("OLS", "ols"), ("RDD", "rdd"),
                                        ("glm", "glm"), ("rct", "ols"), ("iv_encouragement", "iv"),
                                        ("did_twfe", "did"), ("frontdoor", "frontdoor"), ("observational", "matching")])
def test_benchmark_labels_normalise_to_the_closed_set(raw, label):
    assert ce.normalise_method(raw) == label == cq.normalise_method(raw)


def test_unknown_method_label_is_one_clear_error():
    with pytest.raises(UserInputError, match="unknown method label 'synthetic control'"):
        cq.normalise_method("synthetic control")


# --------------------------------------------------------------------------------------------- estimators
def test_ols_is_the_difference_in_means_by_hand():
    frame = pd.DataFrame({"t": [0, 0, 1, 1], "y": [1.0, 2.0, 5.0, 7.0]})
    result = ce.estimate("ols", frame, ce.Roles(treatment="t", outcome="y"))
    assert result.effect == pytest.approx(4.5)  # (5 + 7) / 2 - (1 + 2) / 2
    # HC1: residuals -0.5, 0.5, -1, 1; var = n/(n-k) * (sum_1 r^2 / n1^2 + sum_0 r^2 / n0^2) = 2 * (2/4 + 0.5/4)
    assert result.std_error == pytest.approx(math.sqrt(2 * (2 / 4 + 0.5 / 4)))


def test_did_2x2_is_the_double_difference_by_hand():
    # group 1 treated in period 1: (9 - 4) - (3 - 2) = 4
    frame = pd.DataFrame({"g": [0, 0, 1, 1] * 2, "time": [0, 1, 0, 1] * 2, "d": [0, 0, 0, 1] * 2,
                          "y": [2.0, 3.0, 4.0, 9.0, 2.2, 2.8, 4.2, 8.8]})
    result = ce.estimate("did", frame, ce.Roles(treatment="d", outcome="y", group="g", time="time"))
    assert result.effect == pytest.approx((8.9 - 4.1) - (2.9 - 2.1))


def test_rdd_recovers_an_exact_jump_with_either_side_treated():
    run = np.linspace(-1, 1, 41)
    y = 2 + 0.5 * run + 3.0 * (run >= 0) + 1.5 * run * (run >= 0)
    frame = pd.DataFrame({"run": run, "y": y, "below": (run < 0).astype(float)})
    sharp = ce.estimate("rdd", frame, ce.Roles(outcome="y", running="run", cutoff=0.0))
    assert sharp.effect == pytest.approx(3.0)
    treated_below = ce.estimate("rdd", frame, ce.Roles(treatment="below", outcome="y", running="run", cutoff=0.0))
    assert treated_below.effect == pytest.approx(-3.0)  # the treated side is below: the effect of "below"
    local = ce.estimate("rdd", frame, ce.Roles(outcome="y", running="run", cutoff=0.0), rdd_bandwidth=0.5)
    assert local.effect == pytest.approx(3.0) and local.n == 19  # |run| < 0.5: 9 below, 10 at or above


def test_frontdoor_is_the_product_of_the_two_slopes():
    rng = np.random.default_rng(0)
    d = rng.binomial(1, 0.5, 200).astype(float)
    m = 2.0 * d + rng.normal(0, 1, 200)
    y = 1.0 + 3.0 * m + 0.0 * d
    frame = pd.DataFrame({"d": d, "m": m, "y": y})
    result = ce.estimate("frontdoor", frame, ce.Roles(treatment="d", outcome="y", mediator="m"))
    slope = np.polyfit(d, m, 1)[0]  # OLS of m on d
    assert result.effect == pytest.approx(3.0 * slope)


@pytest.mark.parametrize("design", cq.DESIGNS)
def test_reference_method_recovers_the_generator_effect(design):
    errors = []
    for seed in range(3):
        query = cq.generate_query(design, seed, rows=2000)
        result = ce.estimate(query["method"], query["data"], ce.Roles(**query["roles"]))
        errors.append(abs(result.effect - query["effect"]) / abs(query["effect"]))
    assert np.mean(errors) < 0.1, errors


@pytest.mark.parametrize("method", ["regression_adjustment", "ipw", "matching"])
def test_backdoor_estimators_recover_the_observational_effect(method):
    errors = []
    for seed in range(3):
        query = cq.generate_query("observational", 10 + seed, rows=2000)
        result = ce.estimate(method, query["data"], ce.Roles(**query["roles"]))
        errors.append(abs(result.effect - query["effect"]) / abs(query["effect"]))
    assert np.mean(errors) < 0.1, errors


def test_iv_beats_ols_under_unobserved_confounding():
    iv_errors, ols_errors = [], []
    for seed in range(3):
        query = cq.generate_query("iv", seed, rows=2000)
        roles = ce.Roles(**query["roles"])
        iv_errors.append(abs(ce.estimate("iv", query["data"], roles).effect / query["effect"] - 1))
        ols_errors.append(abs(ce.estimate("ols", query["data"], roles).effect / query["effect"] - 1))
    assert np.mean(iv_errors) < 0.02 and np.mean(ols_errors) > 5 * np.mean(iv_errors), (iv_errors, ols_errors)


def test_glm_gcomputation_recovers_a_logistic_ate():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, 20000)
    t = rng.binomial(1, 0.5, 20000).astype(float)

    def p(treated):
        return 1 / (1 + np.exp(-(-0.5 + 1.0 * treated + 0.8 * x)))

    y = rng.binomial(1, p(t)).astype(float)
    truth = float(np.mean(p(1.0) - p(0.0)))
    result = ce.estimate("glm", pd.DataFrame({"t": t, "x": x, "y": y}), ce.Roles(treatment="t", outcome="y",
                                                                                  controls=["x"]))
    assert result.effect == pytest.approx(truth, abs=0.02)


def test_a_method_without_its_variables_is_an_estimation_failure():
    query = cq.generate_query("rct", 0, rows=200)
    with pytest.raises(ce.EstimationError, match="instrument"):
        ce.estimate("iv", query["data"], ce.Roles(**query["roles"]))


# --------------------------------------------------------------------------------------------- scoring
def test_relative_error_guard_cap_and_failure():
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert relative_error(-2.0, -4.0) == pytest.approx(0.5)
    assert relative_error(0.5, 0.0) == pytest.approx(0.5)  # |reference| < near_zero: absolute error
    assert relative_error(5.0, 1.0) == 1.0 and relative_error(5.0, 1.0, cap=None) == pytest.approx(4.0)
    assert relative_error(None, 3.0) == 1.0 and relative_error(float("nan"), 3.0) == 1.0


@pytest.mark.parametrize("reply, method", [(" Instrumental variables (2SLS)", "iv"),
                                           (" I would use difference-in-differences", "did"),
                                           (" propensity score matching, or ols", "matching"),
                                           (" rdd", "rdd"), (" banana", None)])
def test_llm_reply_parsing(reply, method):
    assert parse_method(reply) == method


@pytest.mark.parametrize("design", cq.DESIGNS)
def test_rule_based_selector_on_each_design(design):
    assert rule_based_method(cq.generate_query(design, 0, rows=100)) == cq.DESIGN_METHOD[design]


def test_features_do_not_read_the_roles_or_the_method():
    query = cq.generate_query("iv", 0, rows=200)
    features = cq.query_features(query)
    stripped = dict(query, roles={}, method="ols", effect=0.0)
    assert torch.equal(features, cq.query_features(stripped))
    assert features.shape == (512 + 64 + cq.N_STRUCTURE,)


def test_synthetic_queries_are_seeded():
    a, b, c = (cq.generate_query("did_twfe", s, rows=300) for s in (4, 4, 5))
    assert a["effect"] == b["effect"] and a["data"].equals(b["data"]) and a["query"] == b["query"]
    assert a["effect"] != c["effect"]


# --------------------------------------------------------------------------------------------- benchmark files
def _benchmark(tmp_path, method="did ", treatment="treated"):
    rng = np.random.default_rng(0)
    run = rng.normal(0, 1, 200)
    pd.DataFrame({"score": run, "won": (run >= 0.25).astype(float), "outcome": 2 * (run >= 0.25) + run,
                  "treated": rng.binomial(1, 0.5, 200), "state": rng.integers(0, 5, 200),
                  "year": rng.integers(0, 3, 200)}).to_csv(tmp_path / "elections.csv", index=False)
    # the benchmark's JSON: bare NaN for missing fields, controls as one comma string
    text = ('[{"name": "p1", "query": "q?", "dataset_description": "d", "method": "%s", '
            '"dataset_path": "data/elections.csv", "effect": 1.5, "std_error": NaN, "treatment_var": "%s", '
            '"outcome_var": "outcome", "control_variables": "score, won", "running_var": NaN, '
            '"instrument_var": NaN, "temporal_var": "year", "state_var": "state"},'
            ' {"name": "p2", "query": "q2?", "dataset_description": "d2", "method": "RDD", '
            '"dataset_path": "elections.csv", "effect": 2.0, "treatment_var": "won", "outcome_var": "outcome", '
            '"control_variables": NaN, "running_var": "score"}]') % (method, treatment)
    (tmp_path / "real_data.json").write_text(text)
    return tmp_path


def test_benchmark_json_with_nan_fields(tmp_path):
    queries = cq.load_benchmark(str(_benchmark(tmp_path)), "real_data.json")
    first, second = queries
    assert first["method"] == "did" and first["roles"]["controls"] == ["score", "won"]
    assert first["roles"]["running"] is None and first["roles"]["time"] == "year"
    assert second["method"] == "rdd" and second["roles"]["controls"] == []
    run = second["data"]["score"]
    assert run[run < 0.25].max() < 0.25 < run[run >= 0.25].min()
    assert second["roles"]["cutoff"] == 0.25  # inferred: the round number where the sharp treatment switches on
    agent = CausalInferenceAgent(agent="oracle")
    assert agent.answer(second)["estimate"] == pytest.approx(2.0)


def test_benchmark_csv_layout(tmp_path):
    _benchmark(tmp_path)
    pd.DataFrame([{"paper_name": "s1", "data_description": "d", "natural_language_query": "q", "answer": 2.0,
                   "method": "rdd", "data_files": "elections.csv", "treatment": "won", "outcome": "outcome",
                   "control_variables": float("nan"), "running_var": "score", "temporal_var": float("nan")}]
                 ).to_csv(tmp_path / "synthetic_info.csv", index=False)
    (query,) = cq.load_benchmark(str(tmp_path), "synthetic_info.csv")
    assert query["method"] == "rdd" and query["effect"] == 2.0 and query["roles"]["treatment"] == "won"


def test_benchmark_query_with_a_variable_missing_from_its_data(tmp_path):
    _benchmark(tmp_path, treatment="repeal")
    queries = cq.load_benchmark(str(tmp_path), "real_data.json")  # that query is skipped, the other loads
    assert [q["name"] for q in queries] == ["benchmark/p2"]
    ((query_id, reason),) = queries.skipped_queries
    assert query_id == 0 and reason.startswith("variable 'repeal' is not a column of elections.csv")


def test_benchmark_query_with_an_unknown_method(tmp_path):
    _benchmark(tmp_path, method="synthetic control")
    ((query_id, reason),) = cq.load_benchmark(str(tmp_path), "real_data.json").skipped_queries
    assert query_id == 0 and reason.startswith("unknown method label 'synthetic control'")


def test_missing_benchmark_files(tmp_path):
    with pytest.raises(UserInputError, match="no benchmark query file"):
        cq.load_benchmark(str(tmp_path), "json/real_data.json")
    (tmp_path / "q.json").write_text('[{"name": "a", "method": "ols", "effect": 1, "dataset_path": "x.csv", '
                                     '"treatment_var": "t", "outcome_var": "y"}]')
    with pytest.raises(UserInputError, match="data file 'x.csv' named by the query file is not under"):
        cq.load_benchmark(str(tmp_path), "q.json")
    with pytest.raises(UserInputError, match="needs data_dir"):
        cq.CausalQueryDataModule(test_source="benchmark")


# --------------------------------------------------------------------------------------------- agents
def _queries(designs, seeds=(0,), rows=400):
    return [dict(q, features=cq.query_features(q)) for q in
            (cq.generate_query(d, s, rows) for d in designs for s in seeds)]


def test_agents_through_the_test_loop():
    kit.quiet_single_thread()
    queries = _queries(["rct", "iv_encouragement", "frontdoor"], seeds=(0, 1))
    loader = DataLoader(queries, batch_size=2, collate_fn=list)
    results = {}
    for agent in ("oracle", "forced-ols"):
        model = CausalInferenceAgent(agent=agent)
        (metrics,) = kit.quiet_trainer().test(model, dataloaders=loader, verbose=False)
        results[agent] = metrics
        assert len(model.records) == 6
        assert metrics["test/mre"] == pytest.approx(np.mean([r["error"] for r in model.records]), abs=1e-6)
    assert results["oracle"]["test/method_acc"] == 1.0 and results["oracle"]["test/mre"] < 0.1
    assert results["forced-ols"]["test/method_acc"] == pytest.approx(1 / 3)
    assert results["forced-ols"]["test/mre"] > 3 * results["oracle"]["test/mre"]


def test_a_non_learned_agent_refuses_to_fit():
    model = CausalInferenceAgent(agent="oracle")
    loader = DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 584), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(UserInputError, match="nothing to train"):
        kit.quiet_trainer(max_steps=1).fit(model, loader)


def test_feature_size_mismatch_is_a_clear_error():
    with pytest.raises(UserInputError, match="input_dim"):
        CausalInferenceAgent(input_dim=10)(torch.zeros(1, 584))


def test_llm_agent_from_a_local_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789 .,:?-_()'/+\n":
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=1, n_head=2, n_positions=4096)
                    ).save_pretrained(tmp_path)
    agent = CausalInferenceAgent(agent="llm", llm_path=str(tmp_path), max_new_tokens=4)
    query = _queries(["rct"], rows=100)[0]
    record = agent.answer(query)  # a random model's reply rarely names a method: then a failure with error 1
    assert record["method"] in (None, *ce.METHODS)
    assert (record["failure"] is not None and record["error"] == 1.0) or record["method"] is not None
    agent.ask_llm = lambda q: "iv"  # a reply naming a method whose variables the query lacks: a failure
    record = agent.answer(query)
    assert record["method"] == "iv" and record["error"] == 1.0 and "instrument" in record["failure"]
    with pytest.raises(UserInputError, match="needs llm_path"):
        CausalInferenceAgent(agent="llm")
    with pytest.raises(UserInputError, match="not a local model folder"):
        CausalInferenceAgent(agent="llm", llm_path=str(tmp_path / "nope")).load_llm()


@pytest.mark.slow
def test_learned_selector_learns_the_synthetic_designs():
    kit.quiet_single_thread()
    model, data = kit.from_config("configs/causcibench/selector_quick.yaml", "--trainer.logger=false")
    keep = kit.KeepBest("val/method_acc")
    kit.quiet_trainer([keep], max_epochs=15).fit(model, datamodule=data)
    keep.restore(model)
    data.setup("test")
    (metrics,) = kit.quiet_trainer().test(model, datamodule=data, verbose=False)
    assert keep.best_score > 0.8 and metrics["test/method_acc"] > 0.7, (keep.best_score, metrics)

