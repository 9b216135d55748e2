"""Verifiable-task datamodule: the embedded reversed-addition pools, batches, the verifier and the file loaders."""
from __future__ import annotations

import json

import pytest
import torch

from datamodules import many_answer_tasks
from datamodules.verifiable_tasks import (TEST_ID_OFFSET, CharTokenizer, VerifiableTaskDataModule, collate_prompts,
                                          collate_sft, load_jsonl, load_parquet)
from lightning_modules.rlvr.answers import answers_match, extract_answer, normalize_math_answer
from lightning_modules.shared.errors import UserInputError
from lightning_modules.rlvr.grpo import ExactMatchReward


# --------------------------------------------------------------------------------------------- verifier
@pytest.mark.parametrize("a, b", [("1,000", "1000"), ("0.50", "1/2"), ("\\frac{1}{2}", "0.5"), ("3.0", "3"),
                                  ("$42$", "42"), (" Paris. ", "paris"), ("\\text{Yes}", "yes"), ("+7", "7"),
                                  ("New   York", "new york"), ("-2/4", "-0.5")])
def test_normalisation_equates_equivalent_answers(a, b):
    assert normalize_math_answer(a) == normalize_math_answer(b)


@pytest.mark.parametrize("a, b", [("007", "7"), ("0.5", "0.51"), ("paris", "london"), ("12", "21"), ("1/0", "0")])
def test_normalisation_keeps_different_answers_apart(a, b):
    assert normalize_math_answer(a) != normalize_math_answer(b)


def test_answer_extraction_and_matching():
    assert extract_answer("so we get \\boxed{\\frac{3}{4}} done") == "\\frac{3}{4}"
    assert extract_answer("a \\boxed{1} then \\boxed{x^{2}}") == "x^{2}"
    assert extract_answer("steps...\n#### 1,234") == " 1,234"
    assert extract_answer("The answer is: 17.") == "17."
    assert answers_match("The answer is 0.75", ["3/4"])
    assert answers_match("\\boxed{5}", ["4", "5"])  # any acceptable answer
    assert not answers_match("\\boxed{5}", ["4"])
    rewards, metrics = ExactMatchReward()(["001", "1", "x"], [["001"], ["001"], ["x"]])
    assert rewards.tolist() == [1.0, 0.0, 1.0] and metrics["accuracy"] == pytest.approx(2 / 3)
    assert ExactMatchReward(wrong_reward=-1.0)(["2"], [["3"]])[0].tolist() == [-1.0]


# --------------------------------------------------------------------------------------------- tokenizer and batches
def test_char_tokenizer_round_trip_and_errors():
    tok = CharTokenizer()
    assert tok.vocab_size == 15 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.decode(tok.encode("12+34=")) == "12+34="
    assert tok.decode([1] + tok.encode("7") + [2, 0]) == "7"
    with pytest.raises(UserInputError, match="'x'"):
        tok.encode("1x")


def test_collate_left_pads_prompts_and_masks_sft_targets():
    tok = CharTokenizer()
    batch = collate_prompts([{"prompt_id": 5, "prompt": "1+2=", "answers": ["3"], "tier": 1},
                             {"prompt_id": 9, "prompt": "10+20=", "answers": ["03"]}], tok)
    assert batch["prompt_tokens"].shape == (2, 7)
    assert batch["prompt_tokens"][0].tolist() == [0, 0, 1] + tok.encode("1+2=")
    assert batch["prompt_mask"][0].tolist() == [False, False, True, True, True, True, True]
    assert batch["prompt_ids"].tolist() == [5, 9] and batch["tier"].tolist() == [1, -1]
    assert batch["answers"] == [["3"], ["03"]]
    sft = collate_sft([{"prompt": "1+2=", "target": "3"}, {"prompt": "10+20=", "target": "03"}], tok)
    assert sft["input_tokens"][0].tolist() == [1] + tok.encode("1+2=3") + [2, 0, 0, 0]
    assert sft["loss_mask"][0].tolist() == [False] * 5 + [True, True, False, False, False]
    assert sft["loss_mask"][1].tolist() == [False] * 7 + [True] * 3


# --------------------------------------------------------------------------------------------- embedded task
def test_embedded_pools_are_stratified_disjoint_stable_and_correct():
    dm = VerifiableTaskDataModule(sft_num_examples=20000)
    dm.setup("fit")
    train, test = dm.train_examples, dm.val_examples
    assert len(train) == 512 and len(test) == 512
    for examples in (train, test):
        assert [sum(ex["tier"] == d for ex in examples) for d in (2, 3, 4, 5)] == [128] * 4
    assert [ex["prompt_id"] for ex in train] == list(range(512))
    assert [ex["prompt_id"] for ex in test] == [TEST_ID_OFFSET + i for i in range(512)]
    assert not {ex["prompt"] for ex in train} & {ex["prompt"] for ex in test}
    assert len({ex["prompt"] for ex in train}) == 512
    for ex in train[::37]:
        a, b = (int(x) for x in ex["prompt"].rstrip("=").split("+"))
        assert ex["answers"] == [str(a + b)[::-1]]
        assert ex["tier"] == max(len(str(a)), len(str(b)))
    again = VerifiableTaskDataModule(sft_num_examples=20000)
    again.setup("fit")
    assert again.train_examples == train and again.val_examples == test  # stable ids and prompts from the seed
    other = VerifiableTaskDataModule(sft_num_examples=20000, seed=1)
    other.setup("fit")
    assert other.train_examples != train


def test_sft_split_digit_mix_and_held_out_pools():
    dm = VerifiableTaskDataModule(sft_num_examples=20000, train_split="sft", sft_batch_size=16)
    dm.setup("fit")
    sft = dm.sft_dataset
    digits = [max(len(str(int(a))), len(str(int(b)))) for a, b in zip(sft.a, sft.b)]
    assert set(digits) <= {1, 2, 3, 4}
    assert 0.035 < sum(d == 4 for d in digits) / len(digits) < 0.065
    pooled = {ex["prompt"] for ex in dm.train_examples + dm.val_examples}
    assert not pooled & {f"{int(a)}+{int(b)}=" for a, b in zip(sft.a, sft.b)}
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_tokens", "loss_mask"} and batch["input_tokens"].shape[0] == 16
    rl = next(iter(_rl_loader()))
    assert rl["prompt_tokens"].shape[0] == 32 and rl["prompt_mask"][:, -1].all()


def _rl_loader():
    dm = VerifiableTaskDataModule(sft_num_examples=100, batch_size=32)
    dm.setup("fit")
    return dm.train_dataloader()


def test_bad_datamodule_arguments():
    with pytest.raises(UserInputError, match="digit_tiers"):
        VerifiableTaskDataModule(digit_tiers=[0, 3])
    with pytest.raises(UserInputError, match="data_dir"):
        VerifiableTaskDataModule(task="jsonl")
    with pytest.raises(UserInputError, match="distinct"):
        VerifiableTaskDataModule(digit_tiers=[1], train_pool_size=200, sft_num_examples=10).setup("fit")


# --------------------------------------------------------------------------------------------- file loaders
def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_jsonl_loader_fields_and_datamodule(tmp_path):
    rows = [{"question": "2+2=", "answer": 4, "id": 7, "tier": 1},
            {"prompt": [{"role": "user", "content": "capital of france?"}], "answers": ["Paris", "paris city"]},
            {"question": "1+1=", "reward_model": {"ground_truth": "2"}, "extra_info": {"index": 3}}]
    examples = load_jsonl(write_jsonl(tmp_path / "train.jsonl", rows))
    assert [ex["prompt_id"] for ex in examples] == [7, 1, 3]
    assert examples[0]["answers"] == ["4"] and examples[1]["answers"] == ["Paris", "paris city"]
    assert examples[0]["tier"] == 1 and examples[2]["tier"] == -1
    write_jsonl(tmp_path / "test.jsonl", rows[:1])
    dm = VerifiableTaskDataModule(task="jsonl", data_dir=str(tmp_path), batch_size=3)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert batch["prompt_ids"].tolist() == [TEST_ID_OFFSET + 7]  # evaluation ids are shifted past the train ids
    assert dm.tokenizer.decode(batch["prompt_tokens"][0].tolist()) == "2+2="
    assert dm.train_examples[1]["prompt"] == "capital of france?"  # chat list rendered (no chat template)
    assert len(next(iter(dm.train_dataloader()))["answers"]) == 3


def test_jsonl_loader_errors_name_file_line_and_field(tmp_path):
    with pytest.raises(UserInputError, match="missing.jsonl.*does not exist"):
        load_jsonl(str(tmp_path / "missing.jsonl"))
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "1", "answer": "1"}, "{not json"])
    with pytest.raises(UserInputError, match=r"bad.jsonl:2: not valid JSON"):
        load_jsonl(path)
    path = write_jsonl(tmp_path / "noanswer.jsonl", [{"question": "1", "answer": "1"}, {"question": "2"}])
    with pytest.raises(UserInputError, match=r"noanswer.jsonl:2: missing field 'answer'"):
        load_jsonl(path)
    path = write_jsonl(tmp_path / "noprompt.jsonl", [{"answer": "1"}])
    with pytest.raises(UserInputError, match=r"noprompt.jsonl:1: missing field 'question' or 'prompt'"):
        load_jsonl(path)
    path = write_jsonl(tmp_path / "dup.jsonl", [{"question": "1", "answer": "1", "id": 4},
                                                {"question": "2", "answer": "2", "id": 4}])
    with pytest.raises(UserInputError, match="prompt id 4 appears more than once"):
        load_jsonl(path)
    path = write_jsonl(tmp_path / "badid.jsonl", [{"question": "1", "answer": "1", "id": [3]}])  # strings: DAPO test
    with pytest.raises(UserInputError, match="must be an integer or a non-empty string"):
        load_jsonl(path)
    with pytest.raises(UserInputError, match="test.jsonl"):
        write_jsonl(tmp_path / "train.jsonl", [{"question": "1", "answer": "1"}])
        VerifiableTaskDataModule(task="jsonl", data_dir=str(tmp_path))


def test_verl_style_parquet_loader(tmp_path):
    # skips when pyarrow cannot be imported (e.g. pyarrow >= 20 against numpy < 2)
    pa = pytest.importorskip("pyarrow", exc_type=ImportError)
    pq = pytest.importorskip("pyarrow.parquet", exc_type=ImportError)

    table = pa.table({
        "data_source": ["dapo", "dapo"],
        "prompt": [[{"role": "system", "content": "solve"}, {"role": "user", "content": "1+2="}],
                   [{"role": "user", "content": "3+4="}]],
        "reward_model": [{"style": "rule", "ground_truth": "3"}, {"style": "rule", "ground_truth": "7"}],
        "extra_info": [{"index": 11, "split": "train"}, {"index": 12, "split": "train"}],
    })
    pq.write_table(table, tmp_path / "train.parquet")
    pq.write_table(table.slice(0, 1), tmp_path / "test.parquet")
    examples = load_parquet(str(tmp_path / "train.parquet"))
    assert [ex["prompt_id"] for ex in examples] == [11, 12]
    assert [ex["answers"] for ex in examples] == [["3"], ["7"]]
    assert examples[0]["prompt"][1]["content"] == "1+2="
    dm = VerifiableTaskDataModule(task="parquet", data_dir=str(tmp_path), batch_size=2)
    dm.setup("fit")
    assert dm.train_examples[0]["prompt"] == "solve\n1+2="
    batch = next(iter(dm.val_dataloader()))
    assert batch["prompt_ids"].tolist() == [TEST_ID_OFFSET + 11] and batch["answers"] == [["3"]]
    pq.write_table(pa.table({"prompt": ["x"], "extra_info": [{"index": 1}]}), tmp_path / "broken.parquet")
    with pytest.raises(UserInputError, match=r"broken.parquet: row 0: missing field 'answer'"):
        load_parquet(str(tmp_path / "broken.parquet"))
    (tmp_path / "garbage.parquet").write_text("not parquet")
    with pytest.raises(UserInputError, match="not a readable parquet"):
        load_parquet(str(tmp_path / "garbage.parquet"))
    with pytest.raises(UserInputError, match="does not exist"):
        load_parquet(str(tmp_path / "none.parquet"))


def test_max_prompt_tokens_refuses_long_prompts(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"question": "1+1=", "answer": "2"},
                                           {"question": "123456+1=", "answer": "7"}])
    write_jsonl(tmp_path / "test.jsonl", [{"question": "1+1=", "answer": "2"}])
    dm = VerifiableTaskDataModule(task="jsonl", data_dir=str(tmp_path), max_prompt_tokens=5)
    with pytest.raises(UserInputError, match="prompt id 1 has more than max_prompt_tokens=5"):
        dm.setup("fit")


def test_rl_batches_are_shuffled_reproducibly():
    first = [next(iter(_rl_loader()))["prompt_ids"] for _ in range(2)]
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], torch.arange(32))


def _write_verl_split(path, split, questions, first_index=0):
    """A parquet file in verl's RL format (its data preprocessing scripts, e.g. gsm8k.py): extra_info.index counts the
    rows of each split from 0."""
    pa = pytest.importorskip("pyarrow", exc_type=ImportError)
    pq = pytest.importorskip("pyarrow.parquet", exc_type=ImportError)
    rows = [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"{q} Let's think step by step."}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(answer)},
             "extra_info": {"split": split, "index": first_index + i, "answer": str(answer), "question": q}}
            for i, (q, answer) in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_train_and_test_prompt_ids_are_distinct(tmp_path):
    _write_verl_split(tmp_path / "train.parquet", "train", [("1+1?", 2), ("2+3?", 5), ("4+4?", 8)])
    _write_verl_split(tmp_path / "test.parquet", "test", [("5+5?", 10), ("6+1?", 7)])
    dm = VerifiableTaskDataModule(task="parquet", data_dir=str(tmp_path), batch_size=3, eval_batch_size=8)
    dm.setup("fit")
    train_ids = next(iter(dm.train_pool_loader()))["prompt_ids"].tolist()
    val = next(iter(dm.val_dataloader()))
    assert train_ids == [0, 1, 2]  # the training ids stay the file's
    assert val["prompt_ids"].tolist() == [TEST_ID_OFFSET, TEST_ID_OFFSET + 1] and dm.eval_id_offset == TEST_ID_OFFSET
    assert val["answers"] == [["10"], ["7"]]
    # training ids at or past the offset push the evaluation ids further (10x), never onto a training id
    _write_verl_split(tmp_path / "big.parquet", "train", [("1+1?", 2), ("2+3?", 5)], first_index=TEST_ID_OFFSET)
    dm = VerifiableTaskDataModule(task="parquet", data_dir=str(tmp_path), train_file="big.parquet")
    assert [ex["prompt_id"] for ex in dm.val_examples] == [10 * TEST_ID_OFFSET, 10 * TEST_ID_OFFSET + 1]
    _write_verl_split(tmp_path / "negative.parquet", "train", [("1+1?", 2)], first_index=-1)
    with pytest.raises(UserInputError, match=r"negative.parquet: row 0: field 'id' / 'extra_info.index' is -1"):
        load_parquet(str(tmp_path / "negative.parquet"))


def test_dapo_math_release_uuid_ids_and_answer_lines(tmp_path):
    """DAPO-Math-17k (BytedTsinghua-SIA) ships extra_info.index as a UUID string and asks for the answer on a final
    "Answer: ..." line: string ids number the prompts by row (unique strings required) and the verifier reads the
    last "Answer:" line, as verl's math_dapo reward does."""
    pa = pytest.importorskip("pyarrow", exc_type=ImportError)
    pq = pytest.importorskip("pyarrow.parquet", exc_type=ImportError)

    def rows(keys):
        return [{"data_source": "math_dapo", "prompt": [{"content": f"Problem {i}? End with Answer:", "role": "user"}],
                 "ability": "MATH", "reward_model": {"ground_truth": str(10 + i), "style": "rule-lighteval/MATH_v2"},
                 "extra_info": {"index": key}} for i, key in enumerate(keys)]

    uuids = ["9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079", "b426d104-244d-4831-a2c4-cd756b61700a", "1b0b4e26-8b23-4e9f"]
    pq.write_table(pa.Table.from_pylist(rows(uuids)), tmp_path / "dapo-math-17k.parquet")
    pq.write_table(pa.Table.from_pylist(rows(uuids[:2])), tmp_path / "aime-2024.parquet")
    examples = load_parquet(str(tmp_path / "dapo-math-17k.parquet"))
    assert [ex["prompt_id"] for ex in examples] == [0, 1, 2]
    assert [ex["source_id"] for ex in examples] == uuids and examples[1]["answers"] == ["11"]
    dm = VerifiableTaskDataModule(task="parquet", data_dir=str(tmp_path), train_file="dapo-math-17k.parquet",
                                  val_file="aime-2024.parquet", batch_size=3)
    assert [ex["prompt_id"] for ex in dm.val_examples] == [TEST_ID_OFFSET, TEST_ID_OFFSET + 1]
    pq.write_table(pa.Table.from_pylist(rows([uuids[0], uuids[0]])), tmp_path / "dup.parquet")
    with pytest.raises(UserInputError, match="dup.parquet: prompt id '9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079' appears"):
        load_parquet(str(tmp_path / "dup.parquet"))
    pq.write_table(pa.Table.from_pylist(rows([uuids[0], ""])), tmp_path / "empty.parquet")
    with pytest.raises(UserInputError, match="row 1: field 'id' / 'extra_info.index' must be an integer or a"):
        load_parquet(str(tmp_path / "empty.parquet"))
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"question": "a", "answer": "1", "id": 3}) + "\n"
                                          + json.dumps({"question": "b", "answer": "2", "id": "x-1"}) + "\n")
    with pytest.raises(UserInputError, match="mixes integers and strings"):
        load_jsonl(str(tmp_path / "mixed.jsonl"))
    # the verifier: the last "Answer:" line (DAPO's requested format), after \\boxed{} and ####
    assert extract_answer("Work...\nAnswer: 34") == "34"
    assert extract_answer("Answer: 3\nrechecking\nanswer:  $-12$\n") == "$-12$"
    assert answers_match("so the total is 84.\nAnswer: 84", ["84"])
    assert not answers_match("Answer: 85", ["84"])
    assert extract_answer("Answer: 1, so \\boxed{2}") == "2"
    rewards, _ = ExactMatchReward(wrong_reward=-1.0)(["...\nAnswer: 370", "...\nAnswer: 37"], [["370"], ["370"]])
    assert rewards.tolist() == [1.0, -1.0]

def test_embedded_task_ids_are_unchanged():
    dm = VerifiableTaskDataModule(train_pool_size=8, test_pool_size=4, sft_num_examples=10)
    dm.setup("fit")
    assert [ex["prompt_id"] for ex in dm.train_examples] == list(range(8))
    assert [ex["prompt_id"] for ex in dm.val_examples] == [TEST_ID_OFFSET + i for i in range(4)]


def test_many_answer_validation_ids_stay_past_a_long_training_file(tmp_path, monkeypatch):
    # a training file longer than the offset (a million lines in use; 2 here) must not share ids with the
    # validation file
    monkeypatch.setattr(many_answer_tasks, "VAL_ID_OFFSET", 2)
    write_jsonl(tmp_path / "train.jsonl", [{"question": f"q{i}", "answers": [str(i)]} for i in range(3)])
    write_jsonl(tmp_path / "val.jsonl", [{"question": f"v{i}", "answers": [str(i)]} for i in range(2)])
    dm = many_answer_tasks.ManyAnswerDataModule(source="jsonl", data_path=str(tmp_path / "train.jsonl"),
                                                val_data_path=str(tmp_path / "val.jsonl"))
    train_ids = {e.id for e in dm.train_pool}
    val_ids = {e.id for e in dm.val_pool}
    assert train_ids == {0, 1, 2} and val_ids == {20, 21}
    assert len(dm.prompts) == 5  # one prompt text per id: no validation prompt overwrote a training one
