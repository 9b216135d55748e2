"""Multi-answer RL (arXiv 2603.24844): parser, rewards, set metrics, the many-answer task data, and the claim."""
from __future__ import annotations

import json
import math

import pytest
import torch

from lightning_modules.multi_answer_rl.answer_set_metrics import (AnswerSetAccumulator, expected_calibration_error,
                                                                  pass_at_k, set_brier, set_rows)
from lightning_modules.rlvr.answers import answer_key, is_correct, normalize_squad_answer
from lightning_modules.shared.errors import UserInputError
from lightning_modules.multi_answer_rl.multi_answer_protocol import format_completion, parse_completion
from lightning_modules.multi_answer_rl.multi_answer_rl import MultiAnswerReward



# --------------------------------------------------------------------------------------------- helpers
def candidate_set_metrics(candidates, golds, num_candidates: int, ranked: bool = True) -> dict[str, float]:
    """Means of `set_rows` over the sets (NaN entries skipped)."""
    out = {}
    for name, values in set_rows(candidates, golds, num_candidates, ranked).items():
        values = [v for v in values if not math.isnan(v)]
        out[name] = sum(values) / len(values) if values else float("nan")
    return out


def multi_answer_eval_metrics(completions, golds, num_candidates: int, with_confidence: bool, style="compact",
                              rank_by_confidence: bool = False, completion_tokens=None, ece_bins: int = 10,
                              require_think: bool = True, require_analysis: bool = True) -> dict[str, float]:
    """All evaluation metrics of one multi-answer generation per example, through the accumulator."""
    acc = AnswerSetAccumulator(num_candidates, with_confidence, style, rank_by_confidence, require_think,
                               require_analysis, ece_bins)
    acc.add_multi(completions, golds, completion_tokens)
    return acc.compute()


def single_answer_eval_metrics(samples, golds, completion_tokens=None, style="compact") -> dict[str, float]:
    """The single-answer baseline: ``samples[i]`` are the K completions of example i, scored as one set."""
    acc = AnswerSetAccumulator(len(samples[0]), False, style, require_think=False)
    acc.add_single(samples, golds, completion_tokens)
    return acc.compute()


TAGS = ("<think>reasoning</think> <answer1>Flu</answer1> <confidence1>0.5</confidence1> "
        "<answer2>Cold</answer2> <confidence2>0.3</confidence2> <answer3>Covid</answer3> "
        "<confidence3>0.1</confidence3> <analysis>ok</analysis>")


# --------------------------------------------------------------------------------------------- parser
def test_compact_parser_well_formed():
    p = parse_completion("6@4;4@3;12@0", 3, with_confidence=True)
    assert p.format_ok and p.answers == ["6", "4", "12"] and p.confidences == [0.4, 0.3, 0.0] and p.unique
    p = parse_completion(" 6 ; 4;3 ", 3, with_confidence=False)
    assert p.format_ok and p.answers == ["6", "4", "3"] and p.confidences is None
    p = parse_completion("6;6;3", 3, with_confidence=False)
    assert p.format_ok and not p.unique


@pytest.mark.parametrize("text", ["6@4;4@3", "6@4;4@3;3@2;2@1", "6@4;4@;3@2", "6@4;@3;3@2", "6@44;4@3;3@2",
                                  "6;4;3", "6@4@3;4@3;3@2", "", "6@x;4@3;3@2"])
def test_compact_parser_malformed(text):
    p = parse_completion(text, 3, with_confidence=True)
    assert not p.format_ok


def test_compact_parser_malformed_without_confidence():
    for text in ("6;4", "6;;3", "6@1;4;3", ""):
        assert not parse_completion(text, 3, with_confidence=False).format_ok
    assert parse_completion("12", 1, with_confidence=False).answers == ["12"]
    assert not parse_completion("12;4", 1, with_confidence=False).format_ok


def test_tag_parser_interleaved_and_block_order():
    p = parse_completion(TAGS, 3, with_confidence=True, style="tags")
    assert p.format_ok and p.answers == ["Flu", "Cold", "Covid"] and p.confidences == [0.5, 0.3, 0.1]
    block = ("<think>x</think><answer1>a</answer1><answer2>b</answer2><answer3>c</answer3><analysis>y</analysis>"
             "<confidence1>0.2</confidence1><confidence2>0.2</confidence2><confidence3>0.6</confidence3>")
    p = parse_completion(block, 3, with_confidence=True, style="tags")
    assert p.format_ok and p.answers == ["a", "b", "c"] and p.confidences == [0.2, 0.2, 0.6]
    rlvr = "<think>x</think><answer1> a </answer1><answer2>b</answer2><answer3>c</answer3>"
    p = parse_completion(rlvr, 3, with_confidence=False, style="tags")
    assert p.format_ok and p.answers == ["a", "b", "c"]
    single = "<think>x</think><answer>a</answer><confidence>0.7</confidence><analysis>z</analysis>"
    p = parse_completion(single, 1, with_confidence=True, style="tags")
    assert p.format_ok and p.answers == ["a"] and p.confidences == [0.7]


@pytest.mark.parametrize("broken", [
    TAGS.replace("<think>", ""),                                     # no <think>
    TAGS.replace("</think>", ""),                                    # no </think>
    TAGS.replace("<answer3>Covid</answer3>", ""),                     # a missing answer tag
    TAGS.replace("</confidence2>", ""),                               # an unclosed confidence
    TAGS.replace("<analysis>ok</analysis>", ""),                      # RLCR needs <analysis>
    TAGS.replace("0.3", "high"),                                     # non-float confidence
    TAGS.replace("0.3", "1.3"),                                      # confidence outside [0, 1]
    TAGS.replace("0.3", "nan"),                                      # non-finite confidence
])
def test_tag_parser_malformed(broken):
    assert not parse_completion(broken, 3, with_confidence=True, style="tags").format_ok


def test_tag_parser_rlvr_ignores_confidence_and_analysis():
    text = TAGS.replace("<analysis>ok</analysis>", "").replace("0.3", "high")
    assert parse_completion(text, 3, with_confidence=False, style="tags").format_ok
    assert not parse_completion(text.replace("<think>", ""), 3, False, style="tags").format_ok
    assert parse_completion(text.replace("<think>", ""), 3, False, style="tags", require_think=False).format_ok


def test_format_completion_round_trips():
    for style in ("compact", "tags"):
        text = format_completion(["6", "4", "3"], [0.4, 0.3, 0.2], style=style)
        p = parse_completion(text, 3, True, style=style)
        assert p.format_ok and p.answers == ["6", "4", "3"] and p.confidences == pytest.approx([0.4, 0.3, 0.2])
    assert format_completion(["6", "4"]) == "6;4"


def test_matching_is_normalised_exact_and_numeric():
    assert normalize_squad_answer("  The Common-Cold! ") == "commoncold"
    assert is_correct("the flu", ["Flu"]) and is_correct("06", ["6"]) and is_correct("6.0", ["6"])
    assert not is_correct("", ["6"]) and not is_correct("  ", ["6"]) and not is_correct("16", ["6"])
    assert answer_key("06") == answer_key("6")


# --------------------------------------------------------------------------------------------- rewards
GOLD = ["2", "3", "4", "6", "8", "12"]  # divisors of 24


def _reward(mode, texts, gold=GOLD, **kwargs):
    kwargs.setdefault("with_confidence", True)
    r = MultiAnswerReward(mode=mode, num_candidates=3, **kwargs)
    reward, metrics = r(texts, [gold] * len(texts))
    return reward.tolist(), metrics


def test_rlvr_any_reward_hand_computed():
    texts = ["6@4;5@3;7@0", "5@4;7@3;9@0", "6@4;6@3;6@0", "6@4;5@3", "5@4;7@3;9@0;1@1"]
    reward, metrics = _reward("rlvr_any", texts)
    # well-formed & one correct -> 0.5 + 0.5; no correct -> 0.5; duplicates allowed in RLVR; malformed -> 0
    assert reward == pytest.approx([1.0, 0.5, 1.0, 0.0, 0.0])
    assert metrics["format"] == pytest.approx(3 / 5) and metrics["accuracy"] == pytest.approx(2 / 5)
    reward, _ = _reward("rlvr_any", texts[:3], enforce_uniqueness=True)
    assert reward == pytest.approx([1.0, 0.5, 0.5])


def test_rlvr_count_reward_counts_distinct_correct():
    texts = ["6@4;4@3;12@0", "6@4;5@3;4@0", "6@4;6@3;6@0", "5@4;7@3;9@0"]
    reward, metrics = _reward("rlvr_count", texts)
    assert reward == pytest.approx([0.5 + 0.5 * 3 / 3, 0.5 + 0.5 * 2 / 3, 0.5 + 0.5 * 1 / 3, 0.5])
    assert metrics["distinct_correct"] == pytest.approx((3 + 2 + 1 + 0) / 4)
    reward, _ = _reward("rlvr_count", ["6;4;12", "6;5;5"], with_confidence=False)
    assert reward == pytest.approx([1.0, 0.5 + 0.5 / 3])


def test_rlcr_reward_hand_computed():
    # 6 and 4 correct, 5 wrong; p = (.5, .3, .1): brier term = 1 - ((1-.5)^2 + (1-.3)^2 + (0-.1)^2) / 3
    brier = 1 - (0.25 + 0.49 + 0.01) / 3
    reward, metrics = _reward("rlcr", ["6@5;4@3;5@1"])
    assert reward[0] == pytest.approx(0.5 + 0.5 + 0.5 * brier)
    assert metrics["brier"] == pytest.approx(brier)
    # nothing correct, p = (0, 0, 0) -> brier 1, accuracy 0
    reward, _ = _reward("rlcr", ["5@0;7@0;9@0"])
    assert reward[0] == pytest.approx(0.5 + 0 + 0.5 * 1.0)
    # duplicates break the constraint: accuracy and brier are zeroed, format stays
    reward, metrics = _reward("rlcr", ["6@5;6@3;5@1"])
    assert reward[0] == pytest.approx(0.5) and metrics["unique"] == 0.0
    # sum of confidences > 1 zeroes the brier (and, as in the code, the accuracy) term
    reward, _ = _reward("rlcr", ["6@5;4@5;5@1"])
    assert reward[0] == pytest.approx(0.5)
    reward, _ = _reward("rlcr", ["6@5;4@5;5@1"], sum_constraint_gates_accuracy=False)
    assert reward[0] == pytest.approx(1.0)
    reward, _ = _reward("rlcr", ["6@5;4@5;5@1"], confidence_sum_constraint=False)
    assert reward[0] == pytest.approx(1.0 + 0.5 * (1 - (0.25 + 0.25 + 0.01) / 3))
    # malformed -> 0
    reward, _ = _reward("rlcr", ["6@5;4@5"])
    assert reward[0] == 0.0


def test_rlcr_reward_on_official_tags():
    r = MultiAnswerReward(mode="rlcr", num_candidates=3, style="tags")
    reward, metrics = r([TAGS], [["covid", "pneumonia"]])
    brier = 1 - ((0 - 0.5) ** 2 + (0 - 0.3) ** 2 + (1 - 0.1) ** 2) / 3
    assert reward.item() == pytest.approx(0.5 + 0.5 + 0.5 * brier)


def test_reward_bad_inputs():
    with pytest.raises(UserInputError, match="mode"):
        MultiAnswerReward(mode="rlhf")
    with pytest.raises(UserInputError, match="num_candidates"):
        MultiAnswerReward(num_candidates=0)
    with pytest.raises(UserInputError, match="with_confidence"):
        MultiAnswerReward(mode="rlcr", with_confidence=False)
    with pytest.raises(UserInputError, match="format_weight"):
        MultiAnswerReward(format_weight=-1.0)
    with pytest.raises(UserInputError, match="answer lists"):
        MultiAnswerReward()(["6@1;4@1;3@1"], [])


# --------------------------------------------------------------------------------------------- metrics
def test_pass_at_k_matches_combinatorial_formula():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_set_brier_and_ece_match_direct_formulas():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(50, 3, generator=g)
    y = (torch.rand(50, 3, generator=g) < p).double()
    direct = sum(sum((p[i, j].item() - y[i, j].item()) ** 2 for j in range(3)) for i in range(50)) / 50
    assert set_brier(p, y) == pytest.approx(direct)
    pf, yf = p.flatten().tolist(), y.flatten().tolist()
    ece = 0.0
    for b in range(10):
        members = [i for i, q in enumerate(pf) if (b / 10 <= q < (b + 1) / 10) or (b == 9 and q == 1.0)]
        if members:
            acc = sum(yf[i] for i in members) / len(members)
            conf = sum(pf[i] for i in members) / len(members)
            ece += len(members) / len(pf) * abs(acc - conf)
    assert expected_calibration_error(p, y) == pytest.approx(ece)
    assert expected_calibration_error(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])) == 0.0
    assert expected_calibration_error(torch.tensor([0.9, 0.9]), torch.tensor([0.0, 0.0])) == pytest.approx(0.9)


def test_coverage_duplicates_and_pass_at_i():
    golds = [GOLD, ["7"], ["3", "5"]]
    candidates = [["6", "4", "6"], ["7", "8", "9"], ["5", "3", "15"]]
    m = candidate_set_metrics(candidates, golds, 3, ranked=True)
    assert m["coverage"] == pytest.approx((2 / 3 + 1 / 1 + 2 / 2) / 3)
    assert m["distinct_correct"] == pytest.approx((2 + 1 + 2) / 3)
    assert m["duplicate_rate"] == pytest.approx((1 / 3 + 0 + 0) / 3)
    assert m["pass@1"] == pytest.approx(1.0) and m["pass@3"] == pytest.approx(1.0)
    m = candidate_set_metrics([["9", "6"], []], [GOLD, GOLD], 3, ranked=True)  # [] = malformed: excluded from dups
    assert m["pass@1"] == pytest.approx(0.0) and m["pass@2"] == pytest.approx(0.5)
    assert m["duplicate_rate"] == pytest.approx(0.0) and m["coverage"] == pytest.approx(1 / 6)
    m = candidate_set_metrics([["6", "9", "9"]], [GOLD], 3, ranked=False)  # K samples: unbiased pass@i
    assert m["pass@1"] == pytest.approx(1 / 3) and m["pass@2"] == pytest.approx(2 / 3) and m["pass@3"] == 1.0


def test_multi_answer_eval_metrics_rank_by_confidence_and_tokens():
    texts = ["9@1;6@8;7@0", "6@2;4@2;1@3;"]
    m = multi_answer_eval_metrics(texts, [GOLD, GOLD], 3, with_confidence=True, rank_by_confidence=True,
                                  completion_tokens=[12, 13])
    assert m["format"] == 0.5 and m["pass@1"] == pytest.approx(0.5)  # ranked: "6" first
    m_listed = multi_answer_eval_metrics(texts, [GOLD, GOLD], 3, with_confidence=True)
    assert m_listed["pass@1"] == 0.0 and m_listed["pass@2"] == pytest.approx(0.5)
    assert m["set_brier"] == pytest.approx((0.1 ** 2 + 0.2 ** 2 + 0.0))
    assert m["tokens_per_answer"] == pytest.approx(25 / 6) and m["tokens_per_correct_answer"] == pytest.approx(25)


def test_single_answer_eval_metrics_over_k_samples():
    samples = [["6", "6", "4"], ["9", "", "7"]]
    m = single_answer_eval_metrics(samples, [GOLD, ["7"]], completion_tokens=[[2, 2, 2], [2, 1, 2]])
    assert m["format"] == pytest.approx(5 / 6)
    assert m["coverage"] == pytest.approx((2 / 3 + 1) / 2)
    assert m["duplicate_rate"] == pytest.approx((1 / 3 + 0) / 2)
    assert m["pass@1"] == pytest.approx((1 + 1 / 3) / 2)  # a malformed sample counts as a wrong one of the K
    assert m["tokens_per_answer"] == pytest.approx(11 / 6)


def test_rlcr_with_count_accuracy():
    reward, _ = _reward("rlcr", ["6@3;4@3;5@0"], accuracy="count")
    brier = 1 - ((1 - 0.3) ** 2 * 2 + 0.0) / 3
    assert reward[0] == pytest.approx(0.5 + 0.5 * 2 / 3 + 0.5 * brier)
    with pytest.raises(UserInputError, match="contradicts"):
        MultiAnswerReward(mode="rlvr_any", accuracy="count")


# --------------------------------------------------------------------------------------------- data
from datamodules.many_answer_tasks import (ManyAnswerDataModule, divisor_pool, load_many_answer_jsonl,  # noqa: E402
                                           nontrivial_divisors)


def test_divisor_pool_answers_are_exactly_the_nontrivial_divisors():
    pool = divisor_pool(12, 99, 3)
    composites = [n for n in range(12, 100) if any(n % d == 0 for d in range(2, n))]
    assert len(pool) == len(composites) == 68
    for example, n in zip(pool, composites):
        assert example.question == f"{n}:"
        assert sorted(int(a) for a in example.answers) == [d for d in range(2, n) if n % d == 0]
        assert example.tier == min(3, len(example.answers))
    assert [e.id for e in pool] == list(range(68))
    assert nontrivial_divisors(13) == [] and nontrivial_divisors(49) == [7]


def test_datamodule_sft_targets_follow_the_format_and_batches_match_the_interface():
    dm = ManyAnswerDataModule(train_split="sft", sft_samples_per_prompt=4, seed=1)
    assert len(dm.sft_examples) == 68 * 4
    parsed = [parse_completion(ex["target"], 3, True) for ex in dm.sft_examples]
    assert all(p.format_ok for p in parsed)
    assert all(sum(p.confidences) <= 0.9 + 1e-9 for p in parsed)
    assert all(a.isdigit() for p in parsed for a in p.answers)
    by_prompt = {e.question: e.answers for e in dm.examples}
    share = sum(is_correct(a, by_prompt[ex["prompt"]]) for p, ex in zip(parsed, dm.sft_examples) for a in p.answers)
    assert 0.6 < share / (68 * 4 * 3) < 0.8  # sft_valid_prob = 0.7
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_tokens", "loss_mask"}
    text = dm.tokenizer.decode(batch["input_tokens"][0].tolist())
    assert ":" in text and text.count(";") == 2
    single = ManyAnswerDataModule(train_split="sft", target_format="single", sft_samples_per_prompt=2)
    assert all(parse_completion(ex["target"], 1, False).format_ok for ex in single.sft_examples)
    rl = ManyAnswerDataModule(batch_size=5)
    batch = next(iter(rl.train_dataloader()))
    assert batch["prompt_tokens"].shape[0] == 5 and batch["prompt_mask"][:, -1].all()
    assert len(batch["answers"]) == 5 and batch["tier"].min() >= 1
    ids = torch.cat([b["prompt_ids"] for b in rl.val_dataloader()])
    assert sorted(ids.tolist()) == list(range(68))


def test_datamodule_seeded_held_out_split_and_determinism():
    a = ManyAnswerDataModule(val_fraction=0.25, seed=3)
    b = ManyAnswerDataModule(val_fraction=0.25, seed=3)
    assert [e.id for e in a.val_pool] == [e.id for e in b.val_pool] and len(a.val_pool) == 17
    assert not {e.id for e in a.val_pool} & {e.id for e in a.train_pool}
    assert a.sft_examples == b.sft_examples
    assert {ex["prompt"] for ex in a.sft_examples} == {e.question for e in a.train_pool}  # SFT sees train only
    with pytest.raises(UserInputError, match="divisor_n_max"):
        ManyAnswerDataModule(divisor_n_min=50, divisor_n_max=20)
    with pytest.raises(UserInputError, match="source"):
        ManyAnswerDataModule(source="csv")
    with pytest.raises(UserInputError, match="data_path"):
        ManyAnswerDataModule(source="jsonl")


def _write(tmp_path, lines):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_loader_reads_questions_and_answer_lists(tmp_path):
    path = _write(tmp_path, [json.dumps({"question": "colour of the sky?", "answers": ["blue", "grey", "blue"]}),
                             "", json.dumps({"question": "2+2?", "answer": 4})])
    examples = load_many_answer_jsonl(path, 3)
    assert [e.answers for e in examples] == [("blue", "grey"), ("4",)] and [e.tier for e in examples] == [2, 1]
    dm = ManyAnswerDataModule(source="jsonl", data_path=path, sft_samples_per_prompt=2)
    batch = next(iter(dm.val_dataloader()))
    assert dm.tokenizer.decode(batch["prompt_tokens"][1][batch["prompt_mask"][1]].tolist()) == "2+2?"


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "JSON object"),
    ('{"answers": ["a"]}', "question"),
    ('{"question": "q?", "answers": []}', "answers"),
    ('{"question": "q?"}', "answers"),
    ('{"question": "q?", "answers": ["a", ""]}', "non-empty string"),
    ('{"question": "q?", "answers": [true]}', "non-empty string"),
])
def test_jsonl_loader_errors_name_file_line_and_field(tmp_path, line, message):
    path = _write(tmp_path, [json.dumps({"question": "ok?", "answers": ["a"]}), line])
    with pytest.raises(UserInputError, match=message) as info:
        load_many_answer_jsonl(path, 3)
    assert "line 2" in str(info.value)


def test_jsonl_loader_missing_or_empty_file(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_many_answer_jsonl(str(tmp_path / "nope.jsonl"), 3)
    with pytest.raises(UserInputError, match="no examples"):
        load_many_answer_jsonl(_write(tmp_path, [""]), 3)


# --------------------------------------------------------------------------------------------- module
from lightning_modules.rlvr.grpo import ExactMatchReward  # noqa: E402
from lightning_modules.multi_answer_rl.multi_answer_rl import MultiAnswerGRPO  # noqa: E402
from lightning_modules.shared.tiny_gpt import TinyGPT  # noqa: E402


def _policy(dm):
    torch.manual_seed(0)
    return TinyGPT(vocab_size=dm.tokenizer.vocab_size, n_layer=1, d_model=16, n_head=2, context_length=24)


def test_multi_answer_grpo_rejects_inconsistent_settings():
    dm = ManyAnswerDataModule()
    with pytest.raises(UserInputError, match="num_candidates"):
        MultiAnswerGRPO(policy=_policy(dm), reward=MultiAnswerReward(num_candidates=2), num_candidates=3)
    with pytest.raises(UserInputError, match="MultiAnswerReward"):
        MultiAnswerGRPO(policy=_policy(dm), reward=ExactMatchReward(), answer_format="multi")
    assert MultiAnswerGRPO(policy=_policy(dm), reward=MultiAnswerReward(mode="rlcr")).rank_by_confidence
    assert not MultiAnswerGRPO(policy=_policy(dm), reward=MultiAnswerReward(mode="rlvr_any")).rank_by_confidence


@pytest.mark.parametrize("answer_format", ["multi", "single"])
def test_score_sets_groups_k_samples_per_set(answer_format):
    dm = ManyAnswerDataModule(eval_batch_size=7)
    reward = MultiAnswerReward(mode="rlcr") if answer_format == "multi" else ExactMatchReward(extract=False)
    module = MultiAnswerGRPO(policy=_policy(dm), reward=reward, answer_format=answer_format, max_new_tokens=6)
    module.set_tokenizer(dm.tokenizer)
    acc = module.new_accumulator()
    module.score_sets(next(iter(dm.val_dataloader())), acc, 2, 1.0, torch.Generator().manual_seed(0))
    assert acc.counts["coverage"] == 7 * 2 and acc.counts["format"] == 7 * 2 * (3 if answer_format == "single" else 1)
    metrics = acc.compute()
    assert 0.0 <= metrics["coverage"] <= 1.0 and metrics["tokens_per_answer"] > 0


def test_accumulator_matches_one_shot_metrics():
    texts = ["6@5;4@3;5@1", "9@1;6@8;7@0", "bad"]
    acc = AnswerSetAccumulator(3, with_confidence=True, rank_by_confidence=True)
    acc.add_multi(texts[:2], [GOLD, GOLD], [12, 12], tiers=[3, 3])
    acc.add_multi(texts[2:], [GOLD], [4], tiers=[3])
    one_shot = multi_answer_eval_metrics(texts, [GOLD] * 3, 3, True, rank_by_confidence=True,
                                         completion_tokens=[12, 12, 4])
    merged = acc.compute()
    for key, value in one_shot.items():
        assert merged[key] == pytest.approx(value, nan_ok=True), key
    assert merged["coverage_tier3"] == pytest.approx(merged["coverage"])


# --------------------------------------------------------------------------------------------- claim
@pytest.mark.slow
def test_reduced_claim_multi_answer_covers_more_with_fewer_duplicates(tmp_path):
    """One seed, short runs: count-reward Multi-RLVR covers more of the gold set than single-answer RLVR sampled K
    times with fewer duplicates, and Multi-RLCR's set Brier is far below count-reward Multi-RLVR's (whose
    confidences are not trained). Multi-RLCR against the SFT warm-up's Brier is not asserted: even the full
    3-seed experiment separates them on one seed only (0.487 vs 0.711; 0.668 vs 0.703 and 0.608 vs 0.610 on the
    others), so one short seed decides it by chance."""
    import yaml

    from experiments import kit
    from experiments.multi_answer_rl import SINGLE
    from experiments.runner import run_experiment

    # configs/multi_answer_rl/experiment.yaml with three of its GRPO arms, the validation curve every 60 steps
    spec = yaml.safe_load((kit.REPO_ROOT / "configs/multi_answer_rl/experiment.yaml").read_text())
    kept = {SINGLE, "Multi-RLVR (count)", "Multi-RLCR"}
    spec["arms"] = {name: arm for name, arm in spec["arms"].items()
                    if name in kept or not (arm.get("overrides") or {}).get("trainer.callbacks+")}
    for arm in spec["arms"].values():
        if "trainer.callbacks+" in arm["overrides"]:
            arm["overrides"]["trainer.callbacks+"]["init_args"]["every"] = 60
    spec["smoke"]["arms"] = {name: arm for name, arm in spec["smoke"]["arms"].items() if name in spec["arms"]}
    spec_path = tmp_path / "experiment.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_experiment("multi_answer_rl", seeds=1, out=tmp_path, spec_path=spec_path, overrides={
        "trainer.max_steps": 600, "trainer.max_epochs": 12, "model.init_args.eval_samples": 4})  # 60 GRPO steps
    arms = {arm: {m: v["mean"] for m, v in metrics.items()} for arm, metrics in result["arms"].items()}
    single, count = arms[SINGLE], arms["Multi-RLVR (count)"]
    assert count["coverage"] > single["coverage"]
    assert count["duplicate_rate"] < single["duplicate_rate"]
    assert arms["Multi-RLCR"]["set_brier"] < 0.75 * count["set_brier"]
    assert (tmp_path / "multi_answer_rl.json").is_file() and (tmp_path / "multi_answer_rl.png").is_file()


def test_tag_style_datamodule_targets_parse_with_the_official_format():
    dm = ManyAnswerDataModule(output_style="tags", sft_samples_per_prompt=2, divisor_n_max=30)
    reward = MultiAnswerReward(mode="rlcr", style="tags")
    rewards, metrics = reward([ex["target"] for ex in dm.sft_examples], [["2"]] * len(dm.sft_examples))
    assert metrics["format"] == 1.0 and "<answer3>" in dm.sft_examples[0]["prompt"]
    single = ManyAnswerDataModule(output_style="tags", target_format="single", sft_samples_per_prompt=1)
    assert all(parse_completion(ex["target"], 1, False, "tags").format_ok for ex in single.sft_examples)
