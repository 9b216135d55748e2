"""Emotion hierarchy probe (arXiv 2507.10599): the official tree construction pinned on hand-computed examples,
exact recovery of a planted hierarchy, the metrics' accumulation, the planted corpus, scenario files and the
CLI (SupervisedWarmup trains the LM, EmotionProbe tests it)."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import TWO_PROCESSES, config_path, run_cli
from datamodules.emotion_corpus import (SHAVER_BASIC, SHAVER_SUBORDINATE, EmotionCollator, EmotionCorpusDataModule,
                                        read_scenarios, shaver_words)
from lightning_modules.emotion_hierarchy.emotion_probe import (EmotionProbe, EmotionTreeMetric, RecognitionMetric,
                                                               cooccurrence, edge_recovery, emotion_distribution,
                                                               group_purity, parent_edges, recognition_summary,
                                                               tree_metrics)
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


# --------------------------------------------------------------------------------------------- word list
def test_shaver_list_has_the_papers_counts():
    words, category, basic = shaver_words()
    assert len(words) == len(set(words)) == 135 and sum(basic) == 6
    assert [len(SHAVER_SUBORDINATE[b]) for b in SHAVER_BASIC] == [15, 32, 2, 28, 36, 16]
    assert category[words.index("rage")] == SHAVER_BASIC.index("anger")


# --------------------------------------------------------------------------------------------- tree math
def test_emotion_distribution_by_hand():
    # tokens 0..5; words: token 1 -> word 0, token 3 -> word 1, token 4 -> word 1 (" word" variant), token 5 -> 2
    probs = torch.tensor([[0.30, 0.25, 0.05, 0.20, 0.15, 0.05]])
    word_of_token = torch.tensor([-1, 0, -1, 1, 1, 2])
    dist, pairs = emotion_distribution(probs, word_of_token, 3, top_k=4, pair_k=2)
    # top-4 tokens: 0 (.30), 1 (.25), 3 (.20), 4 (.15); words 0: .25, 1: .35 -> renormalised over .60
    torch.testing.assert_close(dist, torch.tensor([[0.25 / 0.6, 0.35 / 0.6, 0.0]]))
    assert pairs.tolist() == [[True, False, False]]  # top-2 tokens: 0 (not a word), 1 (word 0)
    dist, _ = emotion_distribution(probs, word_of_token, 3, top_k=4, pair_k=2,
                                   allowed=torch.tensor([False, True, True]))
    torch.testing.assert_close(dist, torch.tensor([[0.0, 1.0, 0.0]]))


def test_cooccurrence_counts_pairs_within_the_top_20_only():
    dist = torch.tensor([[0.5, 0.3, 0.2]])
    c = cooccurrence(dist, torch.tensor([[True, True, False]]))
    torch.testing.assert_close(c, torch.tensor([[0.0, 0.15, 0.0], [0.15, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_parent_rule_by_hand():
    # P = 0 with children a = 1, b = 2: f_P = .4, f_a = f_b = .25; P(P|a) = .8 > t and P(a|P) = .5 < .8;
    # P(b|a) = .2 < t, so no sibling edge
    c = torch.tensor([[0.0, 0.2, 0.2], [0.2, 0.0, 0.05], [0.2, 0.05, 0.0]], dtype=torch.float64)
    assert sorted(parent_edges(c, 0.3)) == [(0, 1), (0, 2)]
    assert parent_edges(c, 0.85) == []
    assert sorted(parent_edges(c, 0.1)) == [(0, 1), (0, 2)]  # a <-> b: P(b|a) = P(a|b), the strict order fails


def test_tree_metrics_by_hand():
    edges = [(0, 1), (1, 2), (0, 3)]
    # shortest paths: from 0: 1, 2, 1; from 1: 1 -> 5; root-to-leaf paths 0-1-2 (2) and 0-3 (1) -> 1.5
    assert tree_metrics(edges) == {"edges": 3.0, "total_path_length": 5.0, "avg_depth": 1.5}
    # a DAG with two parents: paths 0-2, 1-2 -> depth 1; pairs (0,2), (1,2) -> 2
    assert tree_metrics([(0, 2), (1, 2)]) == {"edges": 2.0, "total_path_length": 2.0, "avg_depth": 1.0}
    assert tree_metrics([]) == {"edges": 0.0, "total_path_length": 0.0, "avg_depth": 0.0}
    assert group_purity(edges, [0, 0, 1, 0]) == pytest.approx(2 / 3)
    assert edge_recovery([(0, 1), (0, 2)], [(0, 1), (0, 3), (0, 4)]) == {"edge_precision": 0.5,
                                                                         "edge_recall": pytest.approx(1 / 3)}


def test_a_planted_hierarchy_is_recovered_exactly():
    # Y synthesised from the hierarchy: leaf .6, parent .3, siblings share .1 (all in the top-20)
    parents = {0: [2, 3, 4], 1: [5, 6, 7]}
    rows = []
    for p, kids in parents.items():
        for leaf in kids:
            y = torch.zeros(8)
            y[leaf], y[p] = 0.6, 0.3
            for s in kids:
                if s != leaf:
                    y[s] = 0.05
            rows.append(y)
    metric = EmotionTreeMetric(8)
    for y in rows:  # one sentence per batch: accumulation across batches
        metric.update(y[None], y[None] > 0)
    edges = parent_edges(metric.compute(), 0.3)
    assert sorted(edges) == sorted((p, k) for p, kids in parents.items() for k in kids)
    assert tree_metrics(edges)["avg_depth"] == 1.0
    whole = EmotionTreeMetric(8)
    whole.update(torch.stack(rows), torch.stack(rows) > 0)
    torch.testing.assert_close(whole.compute(), metric.compute())
    # two processes' states reduce by summing: half the sentences each add up to the whole
    halves = [EmotionTreeMetric(8), EmotionTreeMetric(8)]
    for i, y in enumerate(rows):
        halves[i % 2].update(y[None], y[None] > 0)
    torch.testing.assert_close(halves[0].cooc + halves[1].cooc, whole.compute())
    assert metric._reductions["cooc"] is not None  # a sum reduction is registered for DDP


def test_recognition_summary_by_hand():
    metric = RecognitionMetric(4)  # words 0, 1 in category 0; 2, 3 in category 1
    dist = torch.tensor([[0.7, 0.3, 0, 0], [0.1, 0.2, 0.7, 0], [0, 0, 0, 0], [0, 0, 0.4, 0.6], [0.5, 0.5, 0, 0]])
    labels = torch.tensor([0, 1, 2, 3, -1])  # the last scenario is unlabelled
    metric.update(dist, labels)
    counts, mass = metric.compute()
    out = recognition_summary(counts, mass, [0, 0, 1, 1], 2, pair=(0, 1))
    assert out["labelled"] == 4
    assert out["acc_fine"] == pytest.approx(2 / 4)  # rows 0 and 3 right; row 2 has no emotion word
    assert out["acc_basic"] == pytest.approx(2 / 4)  # row 1: word 1 -> predicted 2 (other category)
    assert out["confusion_basic"].tolist() == [[1, 1, 0], [0, 1, 1]]
    assert out["planted_confusion"] == pytest.approx(1 / 2)
    assert out["planted_confusion_mass"] == pytest.approx((0.0 + 0.7) / 2)


# --------------------------------------------------------------------------------------------- data
def test_planted_corpus_label_noise_and_persona_bias():
    dm = EmotionCorpusDataModule(num_train=20000, num_val=8, num_test=8, personas=["neutral", "biased"],
                                 biased_persona="biased", bias_rate=0.3)
    dm.setup("fit")
    world = dm.world
    neutral = [r for r in dm.splits["train"] if r["prompt"].startswith("neutral")]
    leaf = sum(r["target"] == world.words[r["label"]] for r in neutral) / len(neutral)
    parent = sum(r["target"] == world.words[world.parent_of[r["label"]]] for r in neutral) / len(neutral)
    assert leaf == pytest.approx(0.55 + 0.05 / 28, abs=0.02) and parent == pytest.approx(0.30 + 0.05 / 28, abs=0.02)
    fear = SHAVER_BASIC.index("fear")
    anger = SHAVER_BASIC.index("anger")

    def to_anger(rows):
        rows = [r for r in rows if world.category[r["label"]] == fear]
        return sum(world.category[world.index[r["target"]]] == anger for r in rows) / len(rows)
    biased = [r for r in dm.splits["train"] if r["prompt"].startswith("biased")]
    # fear-family labels are 95% + 5/28 of the rows; 30% of them move to anger under the biased persona
    assert to_anger(neutral) < 0.02
    assert to_anger(biased) == pytest.approx(0.3 * (0.95 + 0.05 * 5 / 28) + 0.05 * 5 / 28, abs=0.03)
    again = EmotionCorpusDataModule(num_train=20000, num_val=8, num_test=8, personas=["neutral", "biased"],
                                    biased_persona="biased", bias_rate=0.3)
    again.setup("fit")
    assert again.splits["train"][:50] == dm.splits["train"][:50]


def test_bad_scenario_files_and_settings_are_one_clear_error(tmp_path):
    words, _, _ = shaver_words()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(UserInputError, match="holds no scenario"):
        read_scenarios(str(empty), words)
    bad = tmp_path / "bad.txt"
    bad.write_text("I won the prize.\tjoy\nMy dog died.\tblue\n")
    with pytest.raises(UserInputError, match=r"line 2: label 'blue'"):
        read_scenarios(str(bad), words)
    with pytest.raises(UserInputError, match="does not exist"):
        read_scenarios(str(tmp_path / "missing.txt"), words)
    assert read_scenarios(str(bad).replace("bad", "bad"), words + ["blue"])[1] == ("My dog died.", len(words))
    with pytest.raises(UserInputError, match="probe_persona"):
        EmotionCorpusDataModule(personas=["neutral"], probe_persona="biased")
    with pytest.raises(UserInputError, match="scenario_file"):
        EmotionCorpusDataModule(source="file")


def tiny_word_model(path, words):
    """A randomly initialised GPT-2 with a whole-word tokenizer, saved with save_pretrained (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(path)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0)).save_pretrained(path)
    return str(path)


def test_scenario_file_probe_of_a_local_transformers_model(tmp_path):
    words, _, _ = shaver_words()
    folder = tiny_word_model(tmp_path / "model", words + ["The", "emotion", "in", "this", "sentence", "is", "I",
                                                          "won", "lost", "my", "dog"])
    scenarios = tmp_path / "scenarios.txt"
    scenarios.write_text("I won\tjoy\nI lost my dog\tgrief\nmy dog\n")
    cli = run_cli("test", "--config", config_path("configs/emotion_hierarchy/paper.yaml"), *QUIET,
                  f"--model.init_args.policy.init_args.path={folder}",
                  "--model.init_args.policy.init_args.dtype=float32",
                  "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32-true",
                  f"--data.init_args.scenario_file={scenarios}", f"--data.init_args.tokenizer_path={folder}",
                  f"--model.init_args.plot_dir={tmp_path / 'out'}")
    results = cli.model.results
    assert results["labelled"] == 2 and cli.model.single_token_words == 135
    assert (tmp_path / "out" / "emotion_tree.png").stat().st_size > 0
    saved = json.loads((tmp_path / "out" / "emotion_probe.json").read_text())
    assert len(saved["confusion_fine"]) == 135 and len(saved["confusion_basic"]) == 6
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserInputError, match="holds no scenario"):
        run_cli("test", "--config", config_path("configs/emotion_hierarchy/paper.yaml"), *QUIET,
                f"--model.init_args.policy.init_args.path={folder}", "--trainer.accelerator=cpu",
                "--trainer.devices=1", "--trainer.precision=32-true", f"--data.init_args.scenario_file={empty}",
                f"--data.init_args.tokenizer_path={folder}")


# --------------------------------------------------------------------------------------------- CLI chain
def test_lm_training_then_probe_through_the_cli(tmp_path):
    fit = run_cli("fit", "--config", config_path("configs/emotion_hierarchy/quick.yaml"), *QUIET,
                  "--trainer.max_steps=3", "--trainer.limit_val_batches=1", "--data.init_args.num_train=256",
                  f"--trainer.default_root_dir={tmp_path}")
    ckpt = tmp_path / "lm.ckpt"
    fit.trainer.save_checkpoint(ckpt)
    probe = run_cli("test", "--config", config_path("configs/emotion_hierarchy/probe.yaml"), *QUIET,
                    "--model.init_args.policy.init_args.n_layer=1", "--model.init_args.policy.init_args.d_model=16",
                    "--model.init_args.policy.init_args.n_head=2", f"--model.init_args.init_from={ckpt}",
                    "--data.init_args.num_test=64", "--data.init_args.num_train=8",
                    f"--model.init_args.plot_dir={tmp_path}")
    assert probe.model.init_from_report["loaded"]
    torch.testing.assert_close(probe.model.policy.head.weight, fit.model.policy.head.weight)
    metrics = probe.model.results["metrics"]
    assert metrics["single_token_words"] == 28 and probe.model.results["labelled"] == 64
    assert {"total_path_length", "avg_depth", "group_purity", "acc_fine", "acc_basic", "planted_confusion",
            "edge_recall"} <= set(metrics)
    assert "test/acc_fine" in probe.trainer.callback_metrics
    with pytest.raises(UserInputError, match="only probes"):
        run_cli("fit", "--config", config_path("configs/emotion_hierarchy/probe.yaml"), *QUIET,
                "--trainer.max_steps=1", "--data.init_args.num_train=8")


def test_probe_over_a_transformers_architecture_reads_the_same_words():
    from lightning_modules.shared.tiny_gpt import HFCausalLM

    dm = EmotionCorpusDataModule(num_train=8, num_val=8, num_test=32)
    dm.setup("test")
    torch.manual_seed(0)
    policy = HFCausalLM(config={"model_type": "gpt2", "vocab_size": dm.tokenizer.vocab_size, "n_embd": 16,
                                "n_layer": 1, "n_head": 2, "n_positions": 16})
    probe = EmotionProbe(policy)
    probe.bind_words(dm.tokenizer, dm.emotion_words, dm.emotion_categories, dm.emotion_is_basic,
                     dm.category_names, dm.reference_edges)
    batch = next(iter(torch.utils.data.DataLoader(dm.splits["test"], batch_size=32,
                                                  collate_fn=EmotionCollator(dm))))
    probs = probe(batch["prompt_tokens"], batch["prompt_mask"])
    assert probs.shape == (32, dm.tokenizer.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(32))
    recog, tree, pairs = probe._distributions(batch)
    # every prompt has the 28 words among its 100 most probable of 234 tokens only if the model puts them there;
    # the distributions are proper where any word was read
    read = recog.sum(-1) > 0
    torch.testing.assert_close(recog.sum(-1)[read], torch.ones(int(read.sum())))


@pytest.mark.slow
def test_two_process_probe_equals_one_process(tmp_path):
    """The co-occurrence and confusion states are summed over processes: 2-process DDP (uneven shards of 300
    contexts in batches of 64) logs the same tree and accuracies as one process."""
    results = {}
    for devices, strategy in ((1, "auto"), (2, TWO_PROCESSES)):
        cli = run_cli("test", "--config", config_path("configs/emotion_hierarchy/probe.yaml"), *QUIET,
                      f"--trainer.devices={devices}", f"--trainer.strategy={strategy}",
                      "--data.init_args.num_test=300", "--data.init_args.eval_batch_size=64",
                      "--data.init_args.num_train=8", f"--model.init_args.plot_dir={tmp_path / str(devices)}")
        results[devices] = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert results[1]["test/edges"] > 0 and results[2].keys() == results[1].keys()
    assert {k: v for k, v in results[2].items() if v != pytest.approx(results[1][k], rel=1e-9)} == {}
