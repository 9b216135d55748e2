"""The VoxParadox release (Hugging Face dataset IHP-Lab/VoxParadox, arXiv 2605.27772) read as published: its
``metadata.jsonl`` is the test split (choices ``choice_a``..``choice_d``, ``answer_gt``, ``adversarial_labels``,
``task_name``, ``id``, the clip in ``file_name``), training questions are the user's own ``train.jsonl`` /
``val.jsonl`` in ``train_dir``; ALA is computed from every adversarial label; bad rows and missing training files
end in one clear error."""
from __future__ import annotations

import json
import os
import wave

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from callbacks.prediction_writer import PredictionWriter
from conftest import config_path, run_cli
from datamodules.paralinguistic_speech import (ParalinguisticSpeechDataModule, collate_spoken_questions,
                                               read_voxparadox_release)
from lightning_modules.pclm.audio_language_model import AudioLanguageModel, OptionAgreement, SpeechEncoder, TinyAudioLM
from lightning_modules.shared.errors import UserInputError

# three rows in the release's columns; questions, choices and labels are the project page's examples
# (voxparadox.github.io), the vocal-range question with its two adversarial labels
ROWS = [
    {"file_name": "audio/gender_prediction/gender_0001.wav", "id": "gender_prediction__gender_0001",
     "task_name": "gender_prediction", "question": "What is the speaker's gender?", "choice_a": "Female",
     "choice_b": "Male", "choice_c": None, "choice_d": None, "answer_gt": "Male", "adversarial_labels": ["Female"]},
    {"file_name": "audio/vocal_range_comparison/range_0001.wav", "id": "vocal_range_comparison__range_0001",
     "task_name": "vocal_range_comparison", "question": "Which vocal range pattern best matches the audio?",
     "choice_a": "high-medium-low", "choice_b": "low-medium-high", "choice_c": "high-low-medium",
     "choice_d": "medium-low-high", "answer_gt": "medium-low-high",
     "adversarial_labels": ["high-medium-low", "high-low-medium"]},
    {"file_name": "audio/age_prediction/age_0001.wav", "id": "age_prediction__age_0001",
     "task_name": "age_prediction", "question": "What is the most likely age group of the speaker in the audio?",
     "choice_a": "Young adult", "choice_b": "Middle-aged adult", "choice_c": "Elderly adult", "choice_d": "Child",
     "answer_gt": "Elderly adult", "adversarial_labels": ["Young adult"]},
]
RATES = {"gender_prediction__gender_0001": 16000, "vocal_range_comparison__range_0001": 16000,
         "age_prediction__age_0001": 24000}          # a clip at another rate is resampled to 16 kHz


def write_wav(path, rate=16000, seconds=0.5):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    samples = (np.sin(np.arange(int(rate * seconds)) * 0.05) * 8000).astype(np.int16)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(samples.tobytes())


def write_release(folder, rows=ROWS, lines: list[str] | None = None) -> str:
    """A release folder as the dataset is published: metadata.jsonl next to the clips it names."""
    folder.mkdir(parents=True, exist_ok=True)
    for row in ROWS:
        write_wav(folder / row["file_name"], RATES[row["id"]])
    text = lines if lines is not None else [json.dumps(r) for r in rows]
    (folder / "metadata.jsonl").write_text("".join(line + "\n" for line in text))
    return str(folder)


def write_training(folder, splits=("train", "val")) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    write_wav(folder / "clips" / "0001.wav")
    rows = [{"audio": "clips/0001.wav", "question": "What is the speaker's gender?", "options": ["Female", "Male"],
             "label": "Male", "task": "gender_prediction", "adv_label": "Female"},
            {"audio": "clips/0001.wav", "question": "How fast is the speaker talking?", "options": ["slow", "fast"],
             "label": "B", "task": "speed"}]
    for split in splits:
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


# ============================================================================================ reading the release
@pytest.mark.parametrize("stage", ["test", "predict"])
def test_the_release_is_the_test_split_with_its_fields_mapped(tmp_path, stage):
    data = ParalinguisticSpeechDataModule(data_dir=write_release(tmp_path / "VoxParadox"), data_format="voxparadox",
                                          batch_size=3)
    data.setup(stage)
    assert list(data.splits) == ["test"]
    assert data.task_names == ["age_prediction", "gender_prediction", "vocal_range_comparison"]
    batch = next(iter(data.test_dataloader() if stage == "test" else data.predict_dataloader()))
    assert batch["id"] == [r["id"] for r in ROWS]
    # null choices are absent: the gender question has two options; the others keep choice_a..d in order
    assert batch["option_texts"] == [["Female", "Male"], [ROWS[1][f"choice_{x}"] for x in "abcd"],
                                     [ROWS[2][f"choice_{x}"] for x in "abcd"]]
    assert (batch["options"][0] >= 0).tolist() == [True, True, False, False]
    assert batch["label"].tolist() == [1, 3, 2]                      # answer_gt's position among the options
    assert batch["adv_label"].tolist() == [0, 0, 0]                  # the first adversarial label
    assert batch["adv_options"].tolist() == [[True, False, False, False], [True, False, True, False],
                                             [True, False, False, False]]
    assert batch["task"].tolist() == [1, 2, 0]
    assert batch["wave_lengths"].tolist() == [8000, 8000, 8000]      # the 24 kHz clip resampled to 16 kHz


def test_labels_as_letters_normalised_texts_and_joined_strings_are_mapped(tmp_path):
    rows = [dict(ROWS[0], answer_gt="(B)", adversarial_labels="choice_a"),
            dict(ROWS[1], answer_gt="D", adversarial_labels="high-medium-low|high-low-medium"),
            dict(ROWS[2], answer_gt="elderly  adult.", adversarial_labels="Young adult")]
    records = read_voxparadox_release(write_release(tmp_path / "VoxParadox", rows))
    assert [r["label"] for r in records] == [1, 3, 2]
    assert [r["adv_labels"] for r in records] == [[0], [0, 2], [0]]
    assert records[1]["audio_path"] == os.path.join(str(tmp_path / "VoxParadox"), ROWS[1]["file_name"])
    # the authors' generation script names the clip `audio_path` and writes "null" for a missing choice
    older = [{**{k: v for k, v in ROWS[0].items() if k != "file_name"}, "audio_path": ROWS[0]["file_name"],
              "choice_c": "null", "choice_d": "null"}]
    (record,) = read_voxparadox_release(write_release(tmp_path / "older", older))
    assert record["options"] == ["Female", "Male"] and record["label"] == 1


def bad(field, value):
    return lambda row: {**row, field: value}


def without(field):
    return lambda row: {k: v for k, v in row.items() if k != field}


@pytest.mark.parametrize("mutate, message", [
    (without("answer_gt"), r"line 2: missing field\(s\) \['answer_gt'\]"),
    (without("file_name"), r"line 2: missing field\(s\) \['file_name'\]"),
    (bad("answer_gt", "medium-medium-medium"), r"line 2: answer_gt='medium-medium-medium' is not one of the "
                                               r"question's choices"),
    (bad("adversarial_labels", ["medium-low-high"]), r"line 2: field adversarial_labels=\['medium-low-high'\] "
                                                     r"contains the answer_gt"),
    (bad("adversarial_labels", []), r"line 2: adversarial_labels=\[\] must name at least one option"),
    (bad("adversarial_labels", "loud|quiet"), r"line 2: adversarial_labels='loud' is not one of"),
    (bad("id", ROWS[0]["id"]), r"line 2: field id='gender_prediction__gender_0001' repeats the id of line 1"),
    (bad("choice_b", 5), r"line 2: field choice_b=5 must be an option text"),
    (bad("choice_c", "high-medium-low"), r"line 2: fields \[.*\] repeat an option text"),
    (bad("task_name", ""), r"line 2: field task_name='' must be a non-empty string"),
    (bad("file_name", "audio/nope.wav"), r"line 2, field file_name: audio file .*nope.wav' does not exist"),
])
def test_a_bad_row_is_one_error_naming_the_line_and_the_field(tmp_path, mutate, message):
    rows = [ROWS[0], mutate(ROWS[1]), ROWS[2]]
    data = ParalinguisticSpeechDataModule(data_dir=write_release(tmp_path / "VoxParadox", rows),
                                          data_format="voxparadox")
    with pytest.raises(UserInputError, match=r"metadata.jsonl, " + message):
        data.setup("test")


def test_a_letter_of_an_absent_choice_and_bad_json_are_clear_errors(tmp_path):
    with pytest.raises(UserInputError, match=r"line 1: answer_gt='D' names choice_d, which this question does not"):
        read_voxparadox_release(write_release(tmp_path / "a", [dict(ROWS[0], answer_gt="D")]))
    with pytest.raises(UserInputError, match=r"metadata.jsonl, line 2: not valid JSON"):
        read_voxparadox_release(write_release(tmp_path / "b", lines=[json.dumps(ROWS[0]), "{not json"]))
    with pytest.raises(UserInputError, match=r"metadata.jsonl' is missing: with data_format=voxparadox, data_dir "
                                             r"must be the VoxParadox release folder"):
        ParalinguisticSpeechDataModule(data_dir=str(tmp_path), data_format="voxparadox").setup("test")


# ============================================================================================ training files
def test_the_users_training_files_are_read_from_train_dir(tmp_path):
    release, train_dir = write_release(tmp_path / "VoxParadox"), write_training(tmp_path / "mine")
    data = ParalinguisticSpeechDataModule(data_dir=release, data_format="voxparadox", train_dir=train_dir,
                                          batch_size=2)
    data.setup("fit")
    assert list(data.splits) == ["train", "val", "test"]
    assert data.task_names == ["age_prediction", "gender_prediction", "speed", "vocal_range_comparison"]
    batch = next(iter(data.val_dataloader()))
    assert batch["label"].tolist() == [1, 1] and batch["adv_label"].tolist() == [0, -1]
    assert batch["adv_options"].tolist() == [[True, False], [False, False]] and "id" not in batch
    assert len(data.splits["test"]) == 3
    # the word vocabulary comes from every file read: a test run with the same train_dir gets the same ids
    again = ParalinguisticSpeechDataModule(data_dir=release, data_format="voxparadox", train_dir=train_dir)
    again.setup("test")
    assert again.vocab == data.vocab


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_fit_without_training_files_is_one_line_naming_the_layout(tmp_path, stage):
    release = write_release(tmp_path / "VoxParadox")
    with pytest.raises(UserInputError) as err:
        ParalinguisticSpeechDataModule(data_dir=release, data_format="voxparadox").setup(stage)
    text = str(err.value)
    assert "\n" not in text and f"stage {stage}: no train_dir" in text
    assert "train.jsonl and val.jsonl" in text and '"label": <option text or letter>' in text
    only_train = write_training(tmp_path / "mine", splits=("train",))
    with pytest.raises(UserInputError, match=r"train_dir '.*mine' lacks val.jsonl; the VoxParadox release"):
        ParalinguisticSpeechDataModule(data_dir=release, data_format="voxparadox", train_dir=only_train).setup(stage)
    data = ParalinguisticSpeechDataModule(data_dir=release, data_format="voxparadox")
    data.setup("test")
    with pytest.raises(UserInputError, match=r"there is no train split; the VoxParadox release"):
        data.train_dataloader()


def test_settings_that_cannot_work_are_refused(tmp_path):
    with pytest.raises(UserInputError, match=r"data_format=voxparadox needs data_dir"):
        ParalinguisticSpeechDataModule(data_format="voxparadox")
    with pytest.raises(UserInputError, match=r"train_dir='x' is read only with data_format=voxparadox"):
        ParalinguisticSpeechDataModule(data_dir=str(tmp_path), train_dir="x")
    with pytest.raises(UserInputError, match=r"train_dir '.*nope' is not a folder"):
        ParalinguisticSpeechDataModule(data_dir=str(tmp_path), data_format="voxparadox",
                                       train_dir=str(tmp_path / "nope"))


# ============================================================================================ ALA on the release
def test_option_agreement_counts_any_of_several_labels():
    metric = OptionAgreement(["a", "b"])
    targets = torch.tensor([[False, True, True], [False, True, False], [False, False, False], [True, False, False]])
    metric.update(torch.tensor([2, 0, 1, 0]), targets, torch.tensor([0, 0, 1, 1]))
    values = metric.compute()          # hits: yes, no, (not counted), yes
    assert values["all"].item() == pytest.approx(2 / 3)
    assert values["a"].item() == pytest.approx(0.5) and values["b"].item() == 1.0
    # one label per example: the set form gives what the label form gives
    gen = torch.Generator().manual_seed(0)
    prediction, label = torch.randint(0, 4, (50,), generator=gen), torch.randint(-1, 4, (50,), generator=gen)
    task = torch.randint(0, 2, (50,), generator=gen)
    as_labels, as_sets = OptionAgreement(["a", "b"]), OptionAgreement(["a", "b"])
    as_labels.update(prediction, label, task)
    mask = torch.zeros(50, 4, dtype=torch.bool)
    mask[label >= 0, label[label >= 0]] = True
    as_sets.update(prediction, mask, task)
    assert {k: v.item() for k, v in as_labels.compute().items()} == {k: v.item() for k, v in as_sets.compute().items()}


def test_collate_marks_the_single_adversarial_label_of_other_data():
    examples = [{"waveform": torch.zeros(800), "prompt": torch.tensor([3, 4]), "options": torch.tensor([5, 6, 7]),
                 "label": 0, "adv_label": adv, "task": 0, "attributes": torch.tensor([-1] * 4), "content": -1}
                for adv in (2, -1)]
    batch = collate_spoken_questions(examples)
    assert batch["adv_options"].tolist() == [[False, False, True], [False, False, False]] and "id" not in batch


# the option each row's model is forced to choose: gender -> Female (its adversarial label), vocal range -> choice
# c, high-low-medium (its SECOND adversarial label), age -> Elderly adult (the acoustic answer)
FORCED = {ROWS[0]["id"]: 0, ROWS[1]["id"]: 2, ROWS[2]["id"]: 2}


class ForcedChoice(AudioLanguageModel):
    """The real forward pass, then the log-probabilities replaced by a fixed choice per question id."""

    def option_logprobs(self, batch):
        logprobs, alpha = super().option_logprobs(batch)
        forced = torch.full_like(logprobs, -10.0)
        forced[torch.arange(len(batch["id"])), torch.tensor([FORCED[i] for i in batch["id"]])] = 0.0
        return forced.masked_fill(batch["options"] < 0, float("-inf")).log_softmax(-1), alpha


def test_ala_on_the_release_comes_from_every_adversarial_label(tmp_path):
    data = ParalinguisticSpeechDataModule(data_dir=write_release(tmp_path / "VoxParadox"), data_format="voxparadox",
                                          batch_size=2)
    torch.manual_seed(0)
    encoder = SpeechEncoder(num_layers=2, width=16, num_heads=2, n_mels=20, hop_length=320)
    model = ForcedChoice(encoder, TinyAudioLM(vocab_size=256, num_layers=1, width=16, num_heads=2),
                         projector_hidden=16)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (metrics,) = trainer.test(model, datamodule=data, verbose=False)
    # ALA: Female (adversarial), high-low-medium (the second adversarial label), Elderly adult (the answer) -> 2/3;
    # counting only the first adversarial label would give 1/3
    assert metrics["test/ala"] == pytest.approx(2 / 3) and metrics["test/acc_gt"] == pytest.approx(1 / 3)
    assert metrics["test/ala/vocal_range_comparison"] == 1.0 and metrics["test/ala/age_prediction"] == 0.0
    batch = next(iter(data.predict_dataloader()))
    fields = model.prediction_fields(model.predict_step(batch, 0), batch)
    assert fields["id"] == [ROWS[0]["id"], ROWS[1]["id"]]
    assert fields["chosen_text"] == ["Female", "high-low-medium"]
    assert fields["adversarial_labels"] == [["Female"], ["high-medium-low", "high-low-medium"]]
    assert fields["follows_transcript"].tolist() == [1, 1] and fields["correct"].tolist() == [0, 0]


def test_predict_through_the_cli_writes_ids_and_adversarial_labels(tmp_path):
    release = write_release(tmp_path / "VoxParadox")
    cli = run_cli("predict", "--config", config_path("configs/pclm/sft_quick.yaml"),
                  "--data.init_args.data_format=voxparadox", f"--data.init_args.data_dir={release}",
                  "--model.init_args.language_model.init_args.vocab_size=256",
                  f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false",
                  "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false")
    writer = next(c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter))
    with open(os.path.join(writer.resolved_dir, "predictions.jsonl")) as handle:
        rows = [json.loads(line) for line in handle]
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]
    assert [r["adversarial_labels"] for r in rows] == [r["adversarial_labels"] for r in ROWS]
    for row, release_row in zip(rows, ROWS):
        assert row["task"] == release_row["task_name"]
        assert row["follows_transcript"] == int(row["chosen_text"] in release_row["adversarial_labels"])
        assert row["correct"] == int(row["chosen_text"] == release_row["answer_gt"])
