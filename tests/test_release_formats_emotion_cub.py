"""Released data files read as their official readers read them, or end in one clear error naming the fix.

Emotion hierarchy (arXiv 2507.10599): the files of github.com/phys-ai/Emotion-Hierarchy-LLMs, ``data/``, as
``emotion_hierarchy/scoring.py`` reads them. CUB-200-2011: the split pickles of Koh et al.
(github.com/yewsiang/ConceptBottleneck, ``CUB/data_processing.py`` + ``CUB/generate_new_data.py``) in Koh et al.'s
``CUB_processed/class_attr_data_10`` layout and in the CEM repository's ``class_attr_data_10`` layout.
"""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from PIL import Image

from datamodules.concepts import ConceptDataModule, cub_image_path
from datamodules.emotion_corpus import EmotionCorpusDataModule, read_scenarios, shaver_words
from lightning_modules.shared.errors import UserInputError

WORDS = shaver_words()[0]
RECORDS = [
    {"label": "love", "text": "She glanced at him from across the room, her heart skipping a beat."},
    {"label": "joy", "text": "The children\u2019s laughter echoed through the park. "},
    {"label": "fear", "text": "  The lights went out and something moved in the hall."},
]


# ============================================================================================ emotion hierarchy
def write_recognition_jsonl(path, records=RECORDS):
    """``data/recognition_scenarios.jsonl`` of the official repository: ``json.dumps`` of ``{"label", "text"}``
    per line, label first, non-ASCII characters escaped (``\\u2019``), a newline after every record."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_recognition_jsonl_gives_the_text_as_scenario_and_the_label_as_emotion(tmp_path):
    """Official ``scoring.py::read_scenarios``: ``json.loads`` per non-blank line, ``text.strip()``, ``label``."""
    path = write_recognition_jsonl(tmp_path / "recognition_scenarios.jsonl")
    rows = read_scenarios(str(path), WORDS)
    assert [text for text, _ in rows] == [r["text"].strip() for r in RECORDS]
    assert [WORDS[label] for _, label in rows] == ["love", "joy", "fear"]
    assert not any(text.startswith("{") for text, _ in rows)
    # blank lines are skipped, as the official reader skips them
    path.write_text(path.read_text() + "\n   \n", encoding="utf-8")
    assert read_scenarios(str(path), WORDS) == rows


def word_tokenizer(path):
    """A whole-word tokenizer saved with save_pretrained (a local folder, nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(path)
    return str(path)


def file_datamodule(scenario_file, tokenizer_path, **kwargs) -> EmotionCorpusDataModule:
    dm = EmotionCorpusDataModule(source="file", scenario_file=str(scenario_file), tokenizer_path=tokenizer_path,
                                 eval_batch_size=64, **kwargs)
    dm.setup("test")
    return dm


def test_recognition_jsonl_prompts_and_labels_reach_the_batches(tmp_path):
    """The datamodule's prompts are the official recognition prompts: ``scenario + "\\n" + prefix + "I think the
    emotion involved in this situation is"`` with the prefix "As a woman, " of ``data/personas.json``; the labels
    reach the evaluation batches (before the fix every label was -1 and the prompt began with ``{"label": ...``)."""
    path = write_recognition_jsonl(tmp_path / "recognition_scenarios.jsonl")
    template = "{scenario}\nAs a {persona}, I think the emotion involved in this situation is"
    dm = file_datamodule(path, word_tokenizer(tmp_path / "tok"), persona="woman", prompt_template=template)
    rows = dm.splits["test"]
    assert [r["prompt"] for r in rows] == [
        r["text"].strip() + "\nAs a woman, I think the emotion involved in this situation is" for r in RECORDS]
    batch = next(iter(dm.test_dataloader()))
    assert batch["labels"].tolist() == [WORDS.index(w) for w in ("love", "joy", "fear")]
    assert batch["answers"] == [["love"], ["joy"], ["fear"]]
    assert batch["prompt_ids"].tolist() == [0, 1, 2]


def test_recognition_jsonl_errors_name_the_line_and_the_fix(tmp_path):
    bad_label = write_recognition_jsonl(tmp_path / "a.jsonl", RECORDS[:2] + [{"label": "blue", "text": "x"}])
    with pytest.raises(UserInputError, match=r"a\.jsonl, line 3: label 'blue' is not one of the 135"):
        read_scenarios(str(bad_label), WORDS)
    broken = tmp_path / "b.jsonl"
    broken.write_text(json.dumps(RECORDS[0]) + "\n" + '{"label": "joy", "text": "cut off\n', encoding="utf-8")
    with pytest.raises(UserInputError, match=r"b\.jsonl, line 2: not valid JSON"):
        read_scenarios(str(broken), WORDS)
    no_text = write_recognition_jsonl(tmp_path / "c.jsonl", [{"label": "joy", "scenario": "x"}])
    with pytest.raises(UserInputError, match=r"c\.jsonl, line 1: expected a JSON object with a string field 'text'"):
        read_scenarios(str(no_text), WORDS)
    # the released file under another name is refused, not read as scenario text with the answer inside
    renamed = write_recognition_jsonl(tmp_path / "scenarios.txt")
    with pytest.raises(UserInputError, match=r"line 1 is a JSON record.*must be named \*\.jsonl"):
        read_scenarios(str(renamed), WORDS)
    # a record without a label is unlabelled (-1), as a text line without a TAB
    unlabelled = write_recognition_jsonl(tmp_path / "d.jsonl", [{"text": "x"}, {"label": None, "text": "y"}])
    assert read_scenarios(str(unlabelled), WORDS) == [("x", -1), ("y", -1)]


def test_hierarchy_prompts_keep_every_row_including_empty_ones(tmp_path):
    """Official ``data/hierarchy_prompts.txt``: one GPT-4o sentence per line, most with two trailing spaces, a few
    empty rows; ``scoring.py::read_lines`` keeps every physical row (``line.rstrip("\\r\\n")``) and
    ``format_hierarchy_prompts`` writes ``sentence.strip() + " The emotion in this sentence is"``."""
    lines = ["The sun peeked through the curtains, promising a new beginning.  ",
             "She slammed the door shut, her heart pounding with unresolved anger.  ",
             "",
             "His resolve hardened, a stone in the river of challenges.",
             "",
             "She gasped in awe at the beauty of the sunset. "]
    path = tmp_path / "hierarchy_prompts.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = read_scenarios(str(path), WORDS)
    assert len(rows) == len(lines) == 6
    assert rows == [(line.strip(), -1) for line in lines]
    dm = file_datamodule(path, word_tokenizer(tmp_path / "tok"))
    official = [line.strip() + " The emotion in this sentence is" for line in lines]
    assert [r["prompt"] for r in dm.splits["test"]] == official
    batch = next(iter(dm.test_dataloader()))
    assert batch["prompt_ids"].tolist() == list(range(6)) and batch["labels"].tolist() == [-1] * 6
    # Windows line ends read the same rows
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    assert read_scenarios(str(path), WORDS) == rows


# ============================================================================================ CUB-200-2011
AUTHORS_ROOT = "/juice/scr/scr102/scr/thaonguyen/CUB_supervision/datasets/CUB_200_2011/images"


def _jpeg(path, colour):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((30, 40, 3), colour, dtype=np.uint8)).save(path, format="JPEG")


def write_cub_release(root, layout: str, with_images: bool = True):
    """Koh et al.'s split pickles: ``data_processing.py`` writes dicts ``{"id", "img_path" (absolute, on the
    authors' machine), "class_label", "attribute_label", "attribute_certainty", "uncertain_attribute_label"}``
    over all 312 attributes; ``generate_new_data.py::get_class_attributes_data`` then replaces ``attribute_label``
    by the class-level list of the 112 selected ones (numpy integers) in ``class_attr_data_10``. ``layout`` is
    ``koh`` (``CUB_processed/class_attr_data_10``) or ``cem`` (``class_attr_data_10``, the CEM repository's)."""
    folder = root / "CUB_processed" / "class_attr_data_10" if layout == "koh" else root / "class_attr_data_10"
    folder.mkdir(parents=True)
    truth = {}
    for s, split in enumerate(("train", "val", "test")):
        records = []
        for i in range(2):
            cls = 2 * s + i
            rel = f"{cls + 1:03d}.Bird_{cls}/Bird_{cls}_{split}_{i}.jpg"
            if with_images:
                _jpeg(root / "CUB_200_2011" / "images" / rel, colour=40 * cls)
            attrs = list(np.array([(cls + j) % 2 for j in range(112)], dtype=np.int64))
            records.append({"id": 100 * s + i, "img_path": f"{AUTHORS_ROOT}/{rel}", "class_label": cls,
                            "attribute_label": attrs, "attribute_certainty": [4] * 312,
                            "uncertain_attribute_label": [1.0] * 312})
            truth.setdefault(split, []).append((cls, [int(a) for a in attrs], 40 * cls))
        with open(folder / f"{split}.pkl", "wb") as f:
            pickle.dump(records, f)
    return truth


@pytest.mark.parametrize("layout", ["koh", "cem"])
def test_cub_split_pickles_read_in_both_released_layouts(tmp_path, layout):
    truth = write_cub_release(tmp_path, layout)
    dm = ConceptDataModule(dataset="cub", data_dir=str(tmp_path), image_size=16, batch_size=2)
    dm.setup("fit")
    for split, part in (("train", dm.train_set), ("val", dm.val_set), ("test", dm.test_set)):
        assert len(part) == 2
        for i, (cls, attrs, colour) in enumerate(truth[split]):
            x, y, c = part[i]
            assert int(y) == cls and c.tolist() == attrs
            # the image read is the one the record names: its flat colour survives JPEG and the normalisation
            assert abs(float(x.mean()) - (colour / 255 - 0.5) / 2) < 0.01
            assert x.shape == (3, 16, 16)
    assert part.paths[0].startswith(str(tmp_path / "CUB_200_2011" / "images"))


def test_cub_img_path_is_rewritten_by_its_part_after_images():
    """``CUBDataset.__getitem__`` keeps the path from ``CUB_200_2011`` on, relative to the data folder."""
    assert cub_image_path("/data/CUB_200_2011/images", f"{AUTHORS_ROOT}/001.Black_footed_Albatross/B_0046_18.jpg") \
        == "/data/CUB_200_2011/images/001.Black_footed_Albatross/B_0046_18.jpg"
    windows = "C:\\x\\CUB_200_2011\\images\\002.Laysan\\L_1.jpg"
    assert cub_image_path("/d/images", windows) == "/d/images/002.Laysan/L_1.jpg"
    assert cub_image_path("/d/images", "/home/me/myimages/001.A/a.jpg") is None
    assert cub_image_path("/d/images", "/x/CUB_200_2011/images/") is None


def test_cub_errors_name_the_layouts_and_the_missing_images(tmp_path):
    with pytest.raises(UserInputError, match=r"neither class_attr_data_10/train\.pkl .* nor "
                                             r"CUB_processed/class_attr_data_10/train\.pkl"):
        ConceptDataModule(dataset="cub", data_dir=str(tmp_path))
    write_cub_release(tmp_path / "no_images", "koh", with_images=False)
    dm = ConceptDataModule(dataset="cub", data_dir=str(tmp_path / "no_images"), image_size=16)
    with pytest.raises(UserInputError, match=r"2 image\(s\) of .*train\.pkl' are missing, e\.g\. record 0 "
                                             r"\(img_path '/juice/.*'\) read as .*CUB_200_2011/images/001\.Bird_0"):
        dm.setup("fit")
    write_cub_release(tmp_path / "both", "koh")
    write_cub_release(tmp_path / "both", "cem", with_images=False)
    with pytest.raises(UserInputError, match="holds both class_attr_data_10/ and CUB_processed"):
        ConceptDataModule(dataset="cub", data_dir=str(tmp_path / "both"))
    # the raw 312-attribute pickles of data_processing.py are not the concept split
    raw = tmp_path / "raw"
    write_cub_release(raw, "koh")
    with open(raw / "CUB_processed" / "class_attr_data_10" / "train.pkl", "rb") as f:
        records = pickle.load(f)
    for r in records:
        r["attribute_label"] = [1] * 312
    with open(raw / "CUB_processed" / "class_attr_data_10" / "train.pkl", "wb") as f:
        pickle.dump(records, f)
    with pytest.raises(UserInputError, match=r"112 binary values per record \(got shape \(2, 312\)\)"):
        ConceptDataModule(dataset="cub", data_dir=str(raw)).setup("fit")
    # an img_path without an images/ folder cannot be found
    odd = tmp_path / "odd"
    write_cub_release(odd, "cem")
    with open(odd / "class_attr_data_10" / "val.pkl", "rb") as f:
        records = pickle.load(f)
    records[1]["img_path"] = "/somewhere/Bird_2_val_1.jpg"
    with open(odd / "class_attr_data_10" / "val.pkl", "wb") as f:
        pickle.dump(records, f)
    with pytest.raises(UserInputError, match=r"val\.pkl', record 1: img_path .* has no 'images/<class>/<file>'"):
        ConceptDataModule(dataset="cub", data_dir=str(odd)).setup("fit")
