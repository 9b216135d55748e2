"""VoxParadox / PCLM (arXiv 2605.27772): the DPO loss and negatives, Acc_GT / ALA, padding masks, projector
cloning, the mixer, the loaders and their errors, espeak-ng synthesis, the probes, the CLI chain
pretrain -> SFT -> PCLM (two stages) -> DPO from checkpoints, and the same chain with a transformers tokenizer
(lettered questions, option letters scored) and a local Qwen2 LM, the layout of the paper configs."""
from __future__ import annotations

import json
import math
import os
import wave

import numpy as np
import pytest
import torch

from conftest import config_path, run_cli
from datamodules.paralinguistic_speech import (ParalinguisticSpeechDataModule, collate_spoken_questions,
                                               generate_items, read_question_file, read_wav, synthesise)
from lightning_modules.pclm.audio_dpo import AudioDPO, dpo_loss, pick_negatives
from lightning_modules.pclm.audio_language_model import (AudioLanguageModel, HFLanguageModel, HFWhisperEncoder,
                                                    MixingWeights, OptionAgreement, SpeechEncoder, TinyAudioLM,
                                                    masked_pool)
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def tiny_model(pclm: bool = False, layers=(1, 2), parts=None, cls=AudioLanguageModel, **kwargs):
    torch.manual_seed(0)
    encoder = SpeechEncoder(num_layers=3, width=16, num_heads=2, n_mels=20, hop_length=320)
    lm = TinyAudioLM(vocab_size=40, num_layers=1, width=16, num_heads=2, context_length=128)
    return cls(encoder, lm, pclm=pclm, pclm_layers=list(layers), projector_hidden=16, mixer_hidden=8,
               train_parts=parts, **kwargs)


def fake_batch(lengths=(8000, 12000), seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for i, n in enumerate(lengths):
        examples.append({"waveform": 0.1 * torch.randn(n, generator=gen), "prompt": torch.tensor([5, 6, 7][:2 + i]),
                         "options": torch.tensor([10, 11, 12, 13]), "label": i % 4, "adv_label": (i + 1) % 4,
                         "task": i % 4, "attributes": torch.tensor([0, 1, 0, 1]), "content": i})
    return collate_spoken_questions(examples)


# ============================================================================================ the paper's math
def test_dpo_loss_matches_a_hand_computed_value():
    # margin = 0.1 * ((-0.2 + 0.5) - (-1.5 + 1.0)) = 0.08; loss = log(1 + exp(-0.08))
    loss, margin = dpo_loss(torch.tensor([-0.2]), torch.tensor([-1.5]), torch.tensor([-0.5]), torch.tensor([-1.0]),
                            beta=0.1)
    assert margin.item() == pytest.approx(0.08)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.08)), abs=1e-6)
    # equal policy and reference: loss log 2 whatever the log-probabilities
    same, _ = dpo_loss(torch.tensor([-3.0, -0.1]), torch.tensor([-0.2, -4.0]), torch.tensor([-3.0, -0.1]),
                       torch.tensor([-0.2, -4.0]), beta=0.1)
    assert same.item() == pytest.approx(math.log(2))


def test_negatives_random_are_wrong_and_valid_and_adversarial_use_the_transcript_option():
    label = torch.tensor([0, 1, 2, 3, 0])
    adv = torch.tensor([1, 1, 0, -1, 3])          # second: transcript agrees with the truth; fourth: neutral text
    valid = torch.ones(5, 4, dtype=torch.bool)
    valid[4, 2:] = False                          # the last question has 2 options
    for _ in range(20):
        rejected, used = pick_negatives(label, adv, valid, "random")
        assert not used.any() and (rejected != label).all() and valid[torch.arange(5), rejected].all()
    rejected, used = pick_negatives(label, adv, valid, "adversarial")
    assert used.tolist() == [True, False, True, False, True]
    assert rejected[[0, 2, 4]].tolist() == [1, 0, 3] and (rejected != label).all()
    with pytest.raises(UserInputError, match="wrong option"):
        pick_negatives(torch.tensor([0]), torch.tensor([-1]), torch.tensor([[True, False]]), "random")


def test_acc_gt_and_ala_per_task_match_the_direct_formula():
    metric = OptionAgreement(["pitch", "speed"])
    prediction = torch.tensor([0, 1, 2, 0, 1, 3])
    target = torch.tensor([0, 2, 2, 1, -1, 3])    # -1: no such label (not counted)
    task = torch.tensor([0, 0, 1, 1, 1, 0])
    metric.update(prediction[:3], target[:3], task[:3])
    metric.update(prediction[3:], target[3:], task[3:])
    values = metric.compute()
    # pitch: items 0, 1, 5 -> 2/3 correct; speed: items 2, 3 (4 skipped) -> 1/2; all: 3/5
    assert values["pitch"].item() == pytest.approx(2 / 3)
    assert values["speed"].item() == pytest.approx(1 / 2)
    assert values["all"].item() == pytest.approx(3 / 5)
    weights = MixingWeights(2, 3)
    weights.update(torch.tensor([[0.2, 0.3, 0.5], [0.4, 0.1, 0.5], [1.0, 0.0, 0.0]]), torch.tensor([0, 0, 1]))
    torch.testing.assert_close(weights.compute(), torch.tensor([[0.3, 0.2, 0.5], [1.0, 0.0, 0.0]]))


def test_masked_pool_ignores_padding_positions():
    states = torch.arange(12.0).view(1, 6, 2)
    mask = torch.tensor([[True, True, True, False, False, False]])
    pooled, pooled_mask = masked_pool(states, mask, 2)
    # pairs (0,1) -> mean of rows 0,1; (2,3) -> row 2 only; (4,5) -> empty
    torch.testing.assert_close(pooled[0, :2], torch.tensor([[1.0, 2.0], [4.0, 5.0]]))
    assert pooled_mask.tolist() == [[True, True, False]]


def test_padding_does_not_change_the_answer():
    model = tiny_model(pclm=True).eval()
    batch = fake_batch()
    junk = batch["waveform"].clone()
    junk[0, 8000:] = 5.0                                  # whatever sits in the padding of the short clip
    with torch.no_grad():
        clean = model.option_logprobs(batch)[0]
        noisy = model.option_logprobs({**batch, "waveform": junk})[0]
        alone = model.option_logprobs(fake_batch(lengths=(8000,)))[0]
    torch.testing.assert_close(clean, noisy)
    torch.testing.assert_close(clean[0], alone[0], atol=1e-5, rtol=1e-5)


def test_pclm_mixer_starts_uniform_and_alpha_is_a_distribution_per_prompt():
    model = tiny_model(pclm=True, layers=(0, 1, 2))
    assert model.layers == [0, 1, 2, 3]
    batch = fake_batch()
    alpha = model.mixing_weights(batch["prompt"], batch["prompt_mask"])
    torch.testing.assert_close(alpha, torch.full((2, 4), 0.25))
    torch.nn.init.normal_(model.mixer[-1].weight)
    alpha = model.mixing_weights(batch["prompt"], batch["prompt_mask"])
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2))
    assert not torch.allclose(alpha[0], alpha[1])          # different prompts, different weights


def test_pclm_projectors_are_cloned_from_the_sft_projector(tmp_path):
    sft = tiny_model(pclm=False)
    torch.nn.init.normal_(sft.projector[0].weight)         # a "trained" final projector
    path = tmp_path / "sft.ckpt"
    torch.save({"state_dict": sft.state_dict()}, path)
    pclm = tiny_model(pclm=True, layers=(1, 2), parts=["projector", "mixer"], init_from=str(path))
    report = pclm.load_initial_weights()
    assert sorted(report["cloned_projectors"]) == ["1", "2"]
    for projector in pclm.layer_projectors.values():
        for ours, theirs in zip(projector.parameters(), sft.projector.parameters()):
            assert torch.equal(ours, theirs)
    # stage 1: encoder and LM frozen, projectors and mixer train
    trainable = {n.split(".")[0] for n, p in pclm.named_parameters() if p.requires_grad}
    assert trainable == {"projector", "layer_projectors", "mixer"}


def test_dpo_reference_is_the_loaded_policy_and_frozen(tmp_path):
    pclm = tiny_model(pclm=True)
    torch.nn.init.normal_(pclm.language_model.head.weight)
    path = tmp_path / "pclm.ckpt"
    torch.save({"state_dict": pclm.state_dict()}, path)
    dpo = tiny_model(pclm=True, cls=AudioDPO, init_from=str(path))
    dpo.load_initial_weights()
    assert torch.equal(dpo.reference_language_model.head.weight, pclm.language_model.head.weight)
    assert not any(p.requires_grad for p in dpo.reference_language_model.parameters())
    assert {n.split(".")[0] for n, p in dpo.named_parameters() if p.requires_grad} == {"language_model"}
    batch = fake_batch()
    torch.testing.assert_close(dpo.reference_logprobs(batch), dpo.option_logprobs(batch)[0])


def test_whisper_encoder_from_a_transformers_config_exposes_every_layer():
    encoder = HFWhisperEncoder(config={"d_model": 16, "encoder_layers": 2, "encoder_attention_heads": 2,
                                       "encoder_ffn_dim": 32, "max_source_positions": 50}, n_mels=20)
    states, mask = encoder(torch.randn(2, 15000), torch.tensor([15000, 8000]))
    assert len(states) == 3 and states[-1].shape == (2, 50, 16)
    assert mask.sum(1).tolist() == [46, 24]          # frames (n - 400) // 160 + 1 = 91, 48; stride 2 -> 46, 24
    with pytest.raises(UserInputError, match="at most 100 frames"):
        encoder(torch.randn(1, 17000), torch.tensor([17000]))


def test_transformers_language_model_from_a_config_follows_the_tiny_lm_interface():
    """HFLanguageModel (the paper config's Qwen2 LM, here a GPT-2 from a config) speaks TinyAudioLM's interface:
    embed -> forward(embeddings, mask) -> logits, and padding after a sequence leaves its real positions alone."""
    torch.manual_seed(0)
    lm = HFLanguageModel(config={"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 50,
                                 "n_positions": 64}).eval()
    assert (lm.width, lm.vocab_size) == (32, 50)
    ids = torch.randint(50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    hidden = lm(lm.embed(ids), mask)
    assert hidden.shape == (2, 7, 32) and lm.logits(hidden).shape == (2, 7, 50)
    alone = lm(lm.embed(ids[1:, :5]), mask[1:, :5])
    torch.testing.assert_close(hidden[1, :5], alone[0], atol=1e-5, rtol=1e-4)
    with pytest.raises(UserInputError, match="exactly one of"):
        HFLanguageModel()
    with pytest.raises(UserInputError, match="lacks `model_type`"):
        HFLanguageModel(config={"n_embd": 32})


# ============================================================================================ errors
def test_a_layer_beyond_the_encoder_depth_is_one_clear_error():
    with pytest.raises(UserInputError, match="beyond the encoder's depth"):
        tiny_model(pclm=True, layers=(1, 7))


def test_a_prompt_without_options_is_one_clear_error(tmp_path):
    model = tiny_model()
    batch = fake_batch()
    batch["options"][1] = -1
    with pytest.raises(UserInputError, match="no options"):
        model.option_logprobs(batch)
    _write_wav(tmp_path / "a.wav")
    (tmp_path / "train.jsonl").write_text(json.dumps({"audio": "a.wav", "question": "q", "options": [],
                                                      "label": "x"}) + "\n")
    with pytest.raises(UserInputError, match="line 1: the question has no options"):
        read_question_file(str(tmp_path / "train.jsonl"), str(tmp_path), "jsonl")


def _write_wav(path, rate=16000, seconds=0.5, channels=1):
    samples = (np.sin(np.arange(int(rate * seconds)) * 0.05) * 8000).astype(np.int16)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(np.repeat(samples, channels).tobytes())


def test_audio_errors_wrong_rate_missing_and_unreadable(tmp_path):
    _write_wav(tmp_path / "44k.wav", rate=44100)
    with pytest.raises(UserInputError, match="44100 Hz but the model expects 16000 Hz"):
        read_wav(str(tmp_path / "44k.wav"))
    with pytest.raises(UserInputError, match="does not exist"):
        read_wav(str(tmp_path / "nope.wav"))
    (tmp_path / "bad.wav").write_bytes(b"not a wav at all")
    with pytest.raises(UserInputError, match="not a readable PCM wav"):
        read_wav(str(tmp_path / "bad.wav"))
    _write_wav(tmp_path / "stereo.wav", channels=2)
    assert read_wav(str(tmp_path / "stereo.wav")).shape == (8000,)


def test_a_label_not_among_the_options_is_one_clear_error(tmp_path):
    _write_wav(tmp_path / "a.wav")
    (tmp_path / "test.jsonl").write_text(json.dumps({"audio": "a.wav", "question": "how fast",
                                                     "options": ["slow", "fast"], "label": "medium"}) + "\n")
    with pytest.raises(UserInputError, match="label='medium' is not among the options"):
        read_question_file(str(tmp_path / "test.jsonl"), str(tmp_path), "jsonl")


def test_loaders_read_the_generic_layout(tmp_path):
    # the VoxParadox release (data_format: voxparadox) is tested in tests/test_voxparadox_release.py
    for name in ("a", "b"):
        _write_wav(tmp_path / f"{name}.wav")
    for split in ("train", "val", "test"):
        rows = [{"audio": "a.wav", "question": "how fast is it", "options": ["slow", "fast"], "label": "fast",
                 "task": "speed"},
                {"audio": "b.wav", "question": "what pitch", "options": ["low", "high"], "label": "A"}]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = ParalinguisticSpeechDataModule(data_dir=str(tmp_path), data_format="jsonl", batch_size=2)
    data.setup("fit")
    batch = next(iter(data.test_dataloader()))
    assert batch["label"].tolist() == [1, 0]
    assert batch["adv_label"].tolist() == [-1, -1]
    assert batch["waveform"].shape == (2, 8000) and (batch["attributes"] == -1).all()
    model = tiny_model()
    assert model.option_logprobs(batch)[0].shape == (2, 2)


# ============================================================================================ embedded data
def test_generated_questions_are_deterministic_and_the_test_split_is_adversarial():
    a = generate_items(200, 3, 0.85, 0.0, ("pitch", "speed", "gender", "volume"))
    assert a == generate_items(200, 3, 0.85, 0.0, ("pitch", "speed", "gender", "volume"))
    kinds = [r["kind"] for r in a]
    assert 0.75 < kinds.count("congruent") / 200 < 0.95 and "incongruent" not in kinds
    for r in a:
        assert r["options"][r["label"]] == r["attributes"][r["task"]] and len(set(r["options"])) == 4
    adversarial = generate_items(100, 3, 0.0, 1.0, ("pitch", "speed"))
    assert all(r["adv_label"] >= 0 and r["adv_label"] != r["label"] for r in adversarial)
    assert {r["task"] for r in adversarial} == {"pitch", "speed"}


def test_synthesis_is_cached_deterministic_and_controls_the_acoustics(tmp_path):
    slow = synthesise("i am talking really fast right now", "low", "slow", "male", "quiet", str(tmp_path))
    assert len(os.listdir(tmp_path)) == 1
    again = synthesise("i am talking really fast right now", "low", "slow", "male", "quiet", str(tmp_path))
    assert np.array_equal(slow, again) and slow.dtype == np.float32
    fast = synthesise("i am talking really fast right now", "low", "fast", "male", "quiet", str(tmp_path))
    loud = synthesise("i am talking really fast right now", "low", "slow", "male", "loud", str(tmp_path))
    assert len(fast) < 0.7 * len(slow)                      # 230 vs 110 words per minute
    assert np.abs(loud).mean() > 3 * np.abs(slow).mean()    # amplitude 180 vs 25
    assert len(os.listdir(tmp_path)) == 3


# ============================================================================================ probes
def test_layer_probes_find_the_attribute_where_it_is_and_not_where_it_is_not():
    from callbacks.layer_probing import LayerProbing

    class Planted(torch.nn.Module):
        def layer_states(self, batch):
            attribute = batch["attributes"][:, :1].float()
            informative = attribute[:, None, :].expand(-1, 3, 4) + 0.1 * torch.randn(len(attribute), 3, 4)
            noise = torch.randn(len(attribute), 3, 4)
            return [informative, noise], torch.ones(len(attribute), 3, dtype=torch.bool)

        @property
        def device(self):
            return torch.device("cpu")

    torch.manual_seed(0)

    def loader():
        for _ in range(4):
            yield {"attributes": torch.randint(0, 2, (32, 4)), "content": torch.randint(0, 3, (32,))}

    results = LayerProbing(attributes=["pitch", "speed", "gender", "volume"]).probe(Planted(), loader(), loader())
    assert results["pitch"][0] == 1.0 and results["pitch"][1] < 0.75
    assert results["speed"][0] < 0.75                       # column 0 is planted, not column 1


# ============================================================================================ the CLI chain
@pytest.mark.slow
def test_the_cli_chain_pretrain_sft_pclm_dpo_runs_from_checkpoints(tmp_path):
    small = ["--data.init_args.num_train=32", "--data.init_args.num_val=16", "--data.init_args.num_test=16",
             "--trainer.max_steps=2", "--trainer.max_epochs=1", "--trainer.limit_val_batches=1", *QUIET]

    def fit(config, name, *extra):
        cli = run_cli("fit", "--config", config_path(config), f"--trainer.default_root_dir={tmp_path / name}",
                      *small, *extra)
        path = str(tmp_path / f"{name}.ckpt")
        cli.trainer.save_checkpoint(path)
        return cli, path

    _, pretrain = fit("configs/pclm/pretrain_quick.yaml", "pretrain")
    sft_cli, sft = fit("configs/pclm/sft_quick.yaml", "sft", f"--model.init_args.init_from={pretrain}")
    assert sft_cli.model.init_from_report["loaded"][0].startswith("encoder.")
    stage1_cli, stage1 = fit("configs/pclm/quick.yaml", "stage1", f"--model.init_args.init_from={sft}")
    assert sorted(stage1_cli.model.init_from_report["cloned_projectors"]) == ["1", "3", "5"]
    stage2_cli, stage2 = fit("configs/pclm/quick.yaml", "stage2", f"--model.init_args.init_from={stage1}",
                             "--model.init_args.train_parts=[projector,mixer,language_model]")
    assert stage2_cli.model.init_from_report["cloned_projectors"] == []
    dpo_cli, _ = fit("configs/pclm/dpo_quick.yaml", "dpo", f"--model.init_args.init_from={stage2}",
                     "--model.init_args.negatives=adversarial")
    before = torch.load(stage2, weights_only=True)["state_dict"]
    after = dpo_cli.model.state_dict()
    assert torch.equal(after["reference_language_model.head.weight"], before["language_model.head.weight"])
    assert not torch.equal(after["language_model.head.weight"], before["language_model.head.weight"])
    assert torch.equal(after["mixer.0.weight"], before["mixer.0.weight"])       # frozen in DPO
    tested = run_cli("test", "--config", config_path("configs/pclm/dpo_quick.yaml"), *small,
                     f"--ckpt_path={tmp_path / 'dpo.ckpt'}")
    assert {"test/acc_gt", "test/ala", "test/acc_gt/pitch"} <= set(tested.trainer.callback_metrics)


# ============================================================================================ transformers tokenizer
LETTER_CORPUS = ([f"what is the speaking rate\nA. slow\nB. fast\nC. low\nD. high\nAnswer: {letter}\n"
                  f"<|user|>how loud is it\n<|assistant|>{letter}" for letter in "ABCD"]
                 + ["Answer: A Answer: B Answer: C Answer: D"] * 20)


def tiny_tokenizer(folder, chat_template: str | None = None) -> str:
    """A byte-level BPE tokenizer trained on a few MCQ lines (so " A".." D" and "A".."D" are single tokens and " E"
    is two), wrapped as a transformers fast tokenizer with pad and eos tokens and saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(LETTER_CORPUS * 8, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(folder))
    return str(folder)


def tiny_qwen2(folder, vocab_size: int) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False)
    Qwen2ForCausalLM(config).save_pretrained(str(folder))
    return str(folder)


MCQ = [("What is the speaking rate", ["slow", "fast", "low", "high"], "fast", "slow"),
       ("How loud is the speaker", ["quiet", "loud", "male", "slow"], "quiet", "loud"),
       ("Is the pitch high or low", ["high", "female", "low", "fast"], "low", "high"),
       ("What is the gender of the speaker", ["male", "female", "loud", "low"], "female", "male")]


def mcq_folder(folder, questions=MCQ) -> str:
    folder.mkdir(exist_ok=True)
    _write_wav(folder / "a.wav")
    for split in ("train", "val", "test"):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"audio": "a.wav", "question": q, "options": o, "label": y, "adv_label": a, "task": "t"}) + "\n"
            for q, o, y, a in questions))
    return str(folder)


def test_tokenizer_path_renders_lettered_questions_and_scores_the_letter_tokens(tmp_path):
    from transformers import AutoTokenizer

    path = tiny_tokenizer(tmp_path / "tok")
    data = ParalinguisticSpeechDataModule(data_dir=mcq_folder(tmp_path / "mcq"), tokenizer_path=path, batch_size=4)
    data.setup("fit")
    tok = AutoTokenizer.from_pretrained(path)
    assert data.vocab_size == len(tok) > 260            # 256 bytes, 2 specials, merges
    batch = next(iter(data.val_dataloader()))
    # the question keeps its case; options lettered; the prompt ends with "Answer:"
    first = batch["prompt"][0][batch["prompt_mask"][0]]
    assert tok.decode(first) == "What is the speaking rate\nA. slow\nB. fast\nC. low\nD. high\nAnswer:"
    # left padding with the tokenizer's pad id
    pad = tok.convert_tokens_to_ids("<pad>")
    assert (batch["prompt"][~batch["prompt_mask"]] == pad).all() and (~batch["prompt_mask"]).any()
    letters = tok.convert_tokens_to_ids(["ĠA", "ĠB", "ĠC", "ĠD"])           # byte-level " A" .. " D"
    assert batch["options"].tolist() == [letters] * 4 and len(set(letters)) == 4
    assert batch["label"].tolist() == [1, 0, 2, 1] and batch["adv_label"].tolist() == [0, 1, 0, 0]


def test_tokenizer_chat_template_wraps_the_question_and_letters_follow_the_generation_prompt(tmp_path):
    from transformers import AutoTokenizer

    template = ("{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    path = tiny_tokenizer(tmp_path / "tok", chat_template=template)
    tok = AutoTokenizer.from_pretrained(path)
    for use, expected, letter in ((True, "<|user|>What is the speaking rate\nA. slow\nB. fast\nC. low\nD. high\n"
                                         "Answer:\n<|assistant|>", "A"),
                                  (False, "What is the speaking rate\nA. slow\nB. fast\nC. low\nD. high\nAnswer:",
                                   "ĠA")):
        data = ParalinguisticSpeechDataModule(data_dir=mcq_folder(tmp_path / "mcq"), tokenizer_path=path,
                                              use_chat_template=use, batch_size=1)
        data.setup("fit")
        example = data.splits["train"][0]
        assert tok.decode(example["prompt"]) == expected
        assert example["options"][0].item() == tok.convert_tokens_to_ids(letter)


def test_tokenizer_errors_missing_unloadable_and_multi_token_letters(tmp_path):
    data_dir = mcq_folder(tmp_path / "mcq")
    with pytest.raises(UserInputError, match=r"tokenizer_path '.*nope' is not a folder; point tokenizer_path"):
        ParalinguisticSpeechDataModule(data_dir=data_dir, tokenizer_path=str(tmp_path / "nope")).setup("fit")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"'.*empty': no tokenizer could be loaded"):
        ParalinguisticSpeechDataModule(data_dir=data_dir, tokenizer_path=str(tmp_path / "empty")).setup("fit")
    five = [("What is the speaking rate", ["slow", "fast", "low", "high", "loud"], "fast", "slow")]
    with pytest.raises(UserInputError, match=r"option letter ' E' as 2 tokens"):
        ParalinguisticSpeechDataModule(data_dir=mcq_folder(tmp_path / "five", five),
                                       tokenizer_path=tiny_tokenizer(tmp_path / "tok")).setup("fit")
    # a BPE that does not split at spaces learns "Answer: A" as one token: " A" alone is one token, but after the
    # prompt it is not the token that follows, which would score the wrong logit
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Split(pattern="\n", behavior="isolated")
    bpe.train_from_iterator([f"{prefix}{letter}" for prefix in ("Answer: ", " ") for letter in "ABCD"] * 20,
                            trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<unk>"]))
    merging = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")
    assert merging.tokenize(" A") == [" A"] and merging.tokenize("Answer: A") == ["Answer: A"]
    merging.save_pretrained(str(tmp_path / "merging"))
    with pytest.raises(UserInputError, match=r"merges the answer ' A' with the end of the prompt"):
        ParalinguisticSpeechDataModule(data_dir=data_dir, tokenizer_path=str(tmp_path / "merging")).setup("fit")


def _stage_config(tmp_path, base: str, name: str, lm: str, data_dir: str, tokenizer: str, **model) -> str:
    """A quick config of the chain with a tiny transformers Whisper encoder, a local Qwen2 LM and the tokenizer."""
    import yaml

    with open(config_path(base)) as f:
        config = yaml.safe_load(f)
    init = config["model"]["init_args"]
    init["encoder"] = {"class_path": "lightning_modules.pclm.audio_language_model.HFWhisperEncoder",
                       "init_args": {"config": {"d_model": 16, "encoder_layers": 2, "encoder_attention_heads": 2,
                                                "encoder_ffn_dim": 32, "max_source_positions": 50},
                                     "n_mels": 20, "hop_length": 320}}
    init["language_model"] = {"class_path": "lightning_modules.pclm.audio_language_model.HFLanguageModel",
                              "init_args": {"path": lm}}
    init.update(projector_hidden=16, mixer_hidden=8, **model)
    if init.get("pclm"):
        init["pclm_layers"] = [1, 2]
    config["data"]["init_args"] = {"data_dir": data_dir, "tokenizer_path": tokenizer, "batch_size": 2}
    config["trainer"].update(default_root_dir=str(tmp_path / name), max_steps=2, max_epochs=1, limit_val_batches=1,
                             logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_cli_chain_with_a_transformers_tokenizer_and_qwen2_lm_sft_pclm_dpo(tmp_path):
    """SFT (last layer) -> PCLM stage 1 -> DPO through train.py with tokenizer_path and a local Qwen2 LM, the
    layout of configs/pclm/paper.yaml at toy size."""
    from transformers import AutoTokenizer

    tokenizer = tiny_tokenizer(tmp_path / "tok")
    lm = tiny_qwen2(tmp_path / "lm", vocab_size=len(AutoTokenizer.from_pretrained(tokenizer)))
    data_dir = mcq_folder(tmp_path / "mcq")
    original = HFLanguageModel(path=lm).state_dict()

    def fit(base, name, *extra, **model):
        cli = run_cli("fit", "--config", _stage_config(tmp_path, base, name, lm, data_dir, tokenizer, **model),
                      *extra)
        path = str(tmp_path / f"{name}.ckpt")
        cli.trainer.save_checkpoint(path)
        assert math.isfinite(float(cli.trainer.callback_metrics["train/loss"]))
        return cli, path, {k: v.clone() for k, v in cli.model.state_dict().items()}

    sft_cli, sft, sft_weights = fit("configs/pclm/sft_quick.yaml", "sft")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    batch = next(iter(sft_cli.datamodule.train_dataloader()))
    texts = {tok.decode(row[mask]) for row, mask in zip(batch["prompt"], batch["prompt_mask"])}
    assert texts <= {"\n".join([q, *(f"{'ABCD'[i]}. {o}" for i, o in enumerate(opts)), "Answer:"])
                     for q, opts, _, _ in MCQ} and len(texts) == 2
    assert batch["options"][0].tolist() == tok.convert_tokens_to_ids(["ĠA", "ĠB", "ĠC", "ĠD"])
    key = "language_model.model.model.embed_tokens.weight"
    assert not torch.equal(sft_weights[key], original["model.model.embed_tokens.weight"])    # the LM trained

    stage1_cli, stage1, stage1_weights = fit("configs/pclm/quick.yaml", "stage1",
                                             f"--model.init_args.init_from={sft}")
    assert stage1_cli.model.init_from_report["cloned_projectors"] == ["1"]
    assert torch.equal(stage1_weights[key], sft_weights[key])                                # LM frozen
    encoder_key = "encoder.model.layers.0.fc1.weight"
    assert torch.equal(stage1_weights[encoder_key], sft_weights[encoder_key])                # encoder frozen
    assert not torch.equal(stage1_weights["layer_projectors.1.0.weight"], sft_weights["projector.0.weight"])
    assert stage1_weights["mixer.2.weight"].abs().sum() > 0                                  # zero at the start

    dpo_cli, _, dpo_weights = fit("configs/pclm/dpo_quick.yaml", "dpo", f"--model.init_args.init_from={stage1}")
    assert torch.equal(dpo_weights[f"reference_{key}"], stage1_weights[key])
    assert not torch.equal(dpo_weights[key], stage1_weights[key])
    assert torch.equal(dpo_weights["mixer.2.weight"], stage1_weights["mixer.2.weight"])     # frozen in DPO
    assert math.isfinite(float(dpo_cli.trainer.callback_metrics["train/reward_margin"]))


def test_a_tokenizer_larger_than_the_language_model_is_one_clear_error(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = tiny_tokenizer(tmp_path / "tok")
    lm = tiny_qwen2(tmp_path / "lm", vocab_size=200)                 # the tokenizer has 300 tokens
    config = _stage_config(tmp_path, "configs/pclm/sft_quick.yaml", "sft", lm, mcq_folder(tmp_path / "mcq"),
                           tokenizer)
    size = len(AutoTokenizer.from_pretrained(tokenizer))
    with pytest.raises(UserInputError, match=rf"ids up to {size - 1} \(vocab_size {size}\) but the language model "
                                             r"has 200 embedding rows .* the tokenizer does not match the language"):
        run_cli("fit", "--config", config)
    model = tiny_model()                                             # TinyAudioLM with 40 rows, without the data
    batch = fake_batch()
    batch["prompt"][0, -1] = 40
    with pytest.raises(UserInputError, match="a batch holds token id 40 .*vocab_size=41"):
        model.option_logprobs(batch)


def test_qwen2_audio_encoder_states_all_have_the_encoder_positions(tmp_path):
    """Qwen2-Audio's encoder pools its final output by 2 (750 positions) while its other layers keep 1,500; the
    wrapper returns the final layer at 1,500 positions (its final norm applied), so PCLM can pool and mix every
    layer alike and the final layer is not pooled twice."""
    from transformers import AutoConfig, Qwen2AudioForConditionalGeneration

    config = AutoConfig.for_model(
        "qwen2_audio", audio_config={"model_type": "qwen2_audio_encoder", "num_mel_bins": 128, "encoder_layers": 2,
                                     "encoder_attention_heads": 2, "encoder_ffn_dim": 32, "d_model": 16,
                                     "max_source_positions": 1500},
        text_config={"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64})
    torch.manual_seed(0)
    Qwen2AudioForConditionalGeneration(config).save_pretrained(str(tmp_path / "qwen2_audio"))
    encoder = HFWhisperEncoder(path=str(tmp_path / "qwen2_audio")).eval()
    waveform = torch.randn(2, 16000) * 0.1
    with torch.no_grad():
        states, mask = encoder(waveform, torch.tensor([16000, 8000]))
        captured = []
        hook = encoder.model.layers[-1].register_forward_hook(lambda m, a, o: captured.append(o))
        features, frames = encoder.front_end(waveform, torch.tensor([16000, 8000]))
        encoder.model(torch.nn.functional.pad(features, (0, 0, 0, 3000 - features.shape[1])).transpose(1, 2))
        hook.remove()
    assert [s.shape[1] for s in states] == [1500, 1500, 1500] and mask.shape == (2, 1500)
    positions = ((frames + 1) // 2).tolist()                             # 1 s and 0.5 s at 50 positions per second
    assert mask.sum(1).tolist() == positions and 48 <= positions[0] <= 50 and 23 <= positions[1] <= 25
    last = captured[0][0] if isinstance(captured[0], tuple) else captured[0]
    assert torch.allclose(states[-1], encoder.model.layer_norm(last))
    model = AudioLanguageModel(encoder, TinyAudioLM(vocab_size=40, width=16, num_heads=2), pclm=True,
                               pclm_layers=[1, 2], pool_stride=2)
    pooled, pooled_mask, _ = model.audio_tokens({"waveform": waveform, "wave_lengths": torch.tensor([16000, 8000]),
                                                 "prompt": torch.ones(2, 3, dtype=torch.long),
                                                 "prompt_mask": torch.ones(2, 3, dtype=torch.bool)})
    assert pooled.shape[1] == 750 and pooled_mask.sum(1).tolist() == [(n + 1) // 2 for n in positions]
