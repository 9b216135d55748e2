"""HiDe (arXiv 2510.00054): TAD / LPD functions on planted attention maps, the HiDe module on stub and toy backbones,
the toy MLLM, the high-resolution VQA data and loaders, and the Qwen2.5-VL plumbing on a tiny random model."""
from __future__ import annotations

import base64
import io
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.high_resolution_vqa import (HighResolutionVQADataModule, generate_example, load_hr_bench,
                                             load_vstar, parse_options)
from lightning_modules.shared.errors import UserInputError
from lightning_modules.hide.hide import CategoryAccuracy, HiDe, QwenVLBackbone, parse_entities, parse_letter
from lightning_modules.hide.hide_zoom import (best_iou, box_iou, boxes_from_map, compact_image, merge_boxes,
                                         minmax_normalise, noise_prior, purified_map, raw_attention_boxes,
                                         scale_boxes, smooth, tad_boxes)
from lightning_modules.hide.toy_mllm import ToyMLLMBackbone


# ============================================================================================ planted maps
def planted_maps(seed: int = 0, h: int = 24, w: int = 32, target=(20, 14, 24, 18)):
    """8 prior maps (sink + shared background + noise) then 3 entity maps (the same + a target blob)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    sink = np.zeros((h, w))
    sink[0, :3] = 1.0                                  # the first tokens (top-left)
    sink[:, 0] += 0.35
    sink[-1, :] += 0.35                                 # border sinks
    background = 0.45 * np.exp(-((xx - 8) ** 2 + (yy - 6) ** 2) / (2 * 5.0 ** 2))   # salient background field
    x0, y0, x1, y1 = target
    blob = np.zeros((h, w))
    blob[y0:y1, x0:x1] = 0.3
    maps = []
    for k in range(11):
        m = sink + background + rng.uniform(0, 0.05, (h, w))
        if k >= 8:
            m = m + blob
        maps.append(m / m.sum())
    return np.stack(maps), (x0 / w, y0 / h, x1 / w, y1 / h)


def test_tad_boxes_find_the_planted_target_that_raw_attention_misses():
    maps, target = planted_maps()
    prior, entity = list(range(8)), [8, 9, 10]
    tad = tad_boxes([maps], prior, entity, sigma=1.0, threshold=0.7)[0]
    raw = raw_attention_boxes([maps], entity, threshold=0.7)[0]
    assert tad and raw
    assert best_iou(tad, target) > 0.5                   # 1.0 here: the box is the target
    assert best_iou(raw, target) < 0.1                   # raw attention's peak is the sink
    assert best_iou(tad, target) > best_iou(raw, target) + 0.4
    assert all(box_iou(b, target) > 0 for b in tad)       # nothing but the target survives the prior


def test_smooth_prior_and_purification_pinned():
    np.testing.assert_allclose(minmax_normalise(np.array([1.0, 2.0, 3.0])), [0.0, 0.5, 1.0])
    assert (minmax_normalise(np.ones(3)) == 0).all()
    a = np.array([[0.0, 1.0, 4.0]])
    np.testing.assert_allclose(smooth(a, 0), [[0.0, 0.25, 1.0]])
    prior = noise_prior(np.stack([a, np.array([[4.0, 0.0, 0.0]])]), 0)     # mean of [0,.25,1] and [1,0,0]
    np.testing.assert_allclose(prior, [[0.5, 0.125, 0.5]])
    # entity [0, 2, 4] -> [0, .5, 1] minus prior -> [-.5, .375, .5] -> relu -> norm [0, .75, 1]
    np.testing.assert_allclose(purified_map(np.array([[0.0, 2.0, 4.0]]), prior, 0), [[0.0, 0.75, 1.0]])
    assert purified_map(np.array([[2.0, 2.0, 2.0]]), prior, 0) is None        # nothing above the prior: skipped
    # the Gaussian is scipy's: a delta spreads symmetrically and the peak stays at the centre
    delta = np.zeros((7, 7))
    delta[3, 3] = 1
    s = smooth(delta, 1.0)
    assert s[3, 3] == 1.0 and np.isclose(s[2, 3], s[3, 2]) and np.isclose(s[2, 3], np.exp(-0.5), rtol=0.05)


def test_components_are_8_connected_sorted_by_mass_and_normalised():
    a = np.zeros((4, 8))
    a[0, 0] = a[1, 1] = 0.9                  # diagonal neighbours: one 8-connected component (two 4-connected)
    a[2:4, 5:8] = 1.0                          # a heavier block
    boxes = boxes_from_map(a, 0.7)
    assert boxes == [(5 / 8, 2 / 4, 8 / 8, 4 / 4), (0.0, 0.0, 2 / 8, 2 / 4)]
    assert boxes_from_map(a, 0.95) == [(5 / 8, 2 / 4, 1.0, 1.0)]
    assert boxes_from_map(a, 0.7, top_n=1) == boxes[:1]
    assert scale_boxes([(0.1, 0.25, 0.52, 1.0)], 40, 100) == [(10, 10, 52, 40)]


def test_tad_takes_each_token_to_the_image_with_the_higher_peak():
    first = np.full((3, 4, 4), 1 / 16)
    second = np.full((3, 4, 4), 1 / 16)
    second[2] = 0.01
    second[2, 1, 2] = 0.5                      # the entity token (row 2) peaks in the second image
    boxes = tad_boxes([first, second], [0, 1], [2], sigma=0, threshold=0.7)
    assert boxes[0] == [] and boxes[1] == [(0.5, 0.25, 0.75, 0.5)]


def test_merge_boxes_unions_overlapping_touching_and_chained_boxes():
    assert merge_boxes([(0, 0, 10, 10), (10, 0, 20, 5)]) == [(0, 0, 20, 10)]            # shared edge
    assert merge_boxes([(0, 0, 10, 10), (12, 0, 20, 5)]) == [(0, 0, 10, 10), (12, 0, 20, 5)]
    # C overlaps the union of A and B but neither alone: needs the second round
    assert merge_boxes([(0, 0, 4, 4), (3, 0, 8, 2), (6, 3, 9, 9)]) == [(0, 0, 9, 9)]


def test_compaction_shrinks_keeps_order_and_copies_pixels_exactly():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (100, 100, 3), dtype=np.uint8)
    boxes = [(10, 10, 20, 20), (50, 40, 60, 45), (75, 5, 85, 12)]
    canvas, mask, placed = compact_image(image, boxes)
    # x: [10,20] [50,60] [75,85] kept -> 30 wide; y: [5,12] [10,20] (overlapping spans [5,20]) and [40,45] -> 20
    assert canvas.shape == (20, 30, 3) and canvas.size < image.size
    assert placed == [(0, 5, 10, 15), (10, 15, 20, 20), (20, 0, 30, 7)]
    for (x0, y0, x1, y1), (a0, b0, a1, b1) in zip(boxes, placed):
        np.testing.assert_array_equal(canvas[b0:b1, a0:a1], image[y0:y1, x0:x1])
    assert mask.sum() == sum((b[2] - b[0]) * (b[3] - b[1]) for b in boxes)
    assert (canvas[~mask] == 0).all()
    for (p, q), (bp, bq) in zip(zip(boxes, boxes[1:]), zip(placed, placed[1:])):   # left/right and above/below
        assert np.sign(p[0] - q[0]) == np.sign(bp[0] - bq[0]) and np.sign(p[1] - q[1]) == np.sign(bp[1] - bq[1])
    with pytest.raises(ValueError):
        compact_image(image, [])


def test_box_iou_pinned():
    assert box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    assert best_iou([], (0, 0, 1, 1)) == 0.0


# ============================================================================================ module pieces
def test_category_accuracy_and_parsers():
    metric = CategoryAccuracy(["colour", "position"])
    metric.update([True, False, True, True], ["colour", "colour", "position", "other"])
    out = metric.compute()
    assert out["accuracy"] == pytest.approx(0.75) and out["accuracy_colour"] == pytest.approx(0.5)
    assert out["accuracy_position"] == pytest.approx(1.0)
    assert parse_letter("B", 4) == 1 and parse_letter("(C) a cat", 4) == 2 and parse_letter("The answer is A.", 2) == 0
    assert parse_letter("D", 2) == -1 and parse_letter("nothing", 2) == -1
    assert parse_entities("x <FINAL_OUTPUT>Cup with red color, dog </FINAL_OUTPUT>") == ["cup with red color", "dog"]
    assert parse_entities("dog,, scooter") == ["dog", "scooter"]


class PlantedBackbone(torch.nn.Module):
    """A stub MLLM whose attention puts the entity token on the example's target (boxes in `target`)."""

    num_layers = 2

    def __init__(self, target, grid=16, canvas=128):
        super().__init__()
        self.target, self.grid, self.canvas, self.seen = target, grid, canvas, None

    def prepare(self):
        pass

    def extract_entities(self, question):
        return ["square"] if "square" in question else []

    def attention_maps(self, images, question, entities, layer):
        maps = np.full((3, self.grid, self.grid), 1.0)
        s = self.grid / self.canvas
        x0, y0, x1, y1 = (int(v * s) for v in self.target)
        maps[2, y0:y1, x0:x1] = 20.0
        return [maps], [0, 1], [2]

    def answer(self, images, question, options):
        self.seen = images
        return len(images) - 1


def test_hide_zooms_on_the_target_and_answers_from_original_and_compact():
    image = torch.from_numpy(np.random.default_rng(1).integers(0, 255, (128, 128, 3), dtype=np.uint8))
    backbone = PlantedBackbone((48, 64, 56, 72))
    hide = HiDe(backbone, select_layer=2, sigma=0.0, threshold=0.7)
    out = hide.answer_example({"images": [image], "question": "what colour is the square", "options": ["a", "b"]})
    assert out["prediction"] == 1 and len(backbone.seen) == 2                  # [original, compact]
    assert out["boxes"][0] == [(48, 64, 56, 72)]
    torch.testing.assert_close(backbone.seen[1], image[64:72, 48:56])
    # no entity: answered from the original alone (the release's fallback crashes)
    out = hide.answer_example({"images": [image], "question": "what colour", "options": ["a", "b"]})
    assert out["prediction"] == 0 and out["compact"] == []
    with pytest.raises(UserInputError, match="beyond the model's depth"):
        HiDe(backbone, select_layer=3).check_backbone()
    with pytest.raises(UserInputError, match="counted from 1"):
        HiDe(backbone, select_layer=0)


def test_toy_backbone_interface_spans_and_layers():
    torch.manual_seed(0)
    toy = ToyMLLMBackbone(resolution=32, patch_size=8, dim=32, depth=2, heads=2)
    example = generate_example(3, clutter=4, question="position")
    image = example["images"][0]
    crop = image[:40, :70]
    maps, prior, entity = toy.attention_maps([image, crop], example["question"],
                                             toy.extract_entities(example["question"]), 1)
    words = example["question"].split()
    assert [m.shape for m in maps] == [(len(words), 4, 4)] * 2
    assert [words[k] for k in entity] == [w for w in words if w in ("red", "green", "blue", "yellow", "square")]
    assert sorted(prior + entity) == list(range(len(words)))
    # causal: the last question token attends over everything, so its image mass is < 1 and positive
    total = sum(m[-1].sum() for m in maps)
    assert 0 < total < 1
    other_layer, _, _ = toy.attention_maps([image, crop], example["question"], ["square"], 0)
    assert not np.allclose(other_layer[0], maps[0])
    logits = toy.logits([([image], example["question"], 2), ([image, crop], example["question"], 2)])
    assert torch.isinf(logits[:, 2:]).all() and torch.isfinite(logits[:, :2]).all()
    # left padding does not change a sequence's answer
    alone = toy.logits([([image], example["question"], 2)])
    torch.testing.assert_close(alone[0, :2], logits[0, :2], rtol=1e-5, atol=1e-5)
    with pytest.raises(UserInputError, match="knows only the words"):
        toy.tokenize("where is the cat")


# ============================================================================================ data
def test_synthetic_data_is_seeded_and_split_by_clutter():
    a, b = generate_example(5, clutter=8), generate_example(5, clutter=8)
    assert torch.equal(a["images"][0], b["images"][0]) and a["answer"] == b["answer"]
    x0, y0, x1, y1 = a["target_boxes"][0]
    colour = torch.tensor([215, 45, 40, 40, 175, 60, 45, 80, 225, 225, 205, 40]).view(4, 3)[a["answer"]]
    assert (a["images"][0][y0:y1, x0:x1] == colour.to(torch.uint8)).all()         # the answer is the square's colour
    p = generate_example(6, clutter=8, question="position")
    (l0, _, _, _), (r0, _, _, _) = p["target_boxes"]
    assert p["answer"] == int(l0 > r0) and p["options"] == ["left", "right"]
    data = HighResolutionVQADataModule(num_train=8, num_val=2, num_test=3, clutter_levels=[0, 5])
    data.setup()
    assert [data.splits["test"][i]["clutter"] for i in range(6)] == [0, 5] * 3
    assert len(data.splits["val"]) == 4
    with pytest.raises(UserInputError):
        HighResolutionVQADataModule(clutter_levels=[])


def _png(path, size=(20, 30)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.zeros((size[0], size[1], 3), dtype=np.uint8)).save(path)


def test_vstar_loader_and_its_errors(tmp_path):
    _png(tmp_path / "direct_attributes" / "sa_1.jpg")
    rows = [{"image": "direct_attributes/sa_1.jpg", "text": "What is the colour of the cup?\n(A) red\n(B) blue",
             "label": "B", "category": "direct_attributes", "question_id": 0}]
    (tmp_path / "test_questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data = HighResolutionVQADataModule(dataset="vstar", data_dir=str(tmp_path))
    data.setup("test")
    example = data.splits["test"][0]
    assert example["options"] == ["red", "blue"] and example["answer"] == 1
    assert example["question"] == "What is the colour of the cup?" and example["images"][0].shape == (20, 30, 3)
    with pytest.raises(UserInputError, match="training-free"):
        data.train_dataloader()
    bad = dict(rows[0], label="C")
    (tmp_path / "test_questions.jsonl").write_text(json.dumps(bad))
    with pytest.raises(UserInputError, match="not one of the options"):
        load_vstar(str(tmp_path))
    (tmp_path / "test_questions.jsonl").write_text(json.dumps(dict(rows[0], text="What colour?")))
    with pytest.raises(UserInputError, match="no '\\(A\\) ...'"):
        load_vstar(str(tmp_path))
    (tmp_path / "test_questions.jsonl").write_text(json.dumps(dict(rows[0], image="direct_attributes/missing.jpg")))
    with pytest.raises(UserInputError, match="does not exist"):
        _first_example(HighResolutionVQADataModule(dataset="vstar", data_dir=str(tmp_path)))
    assert parse_options("Q\nA. yes\nB. no", "x") == ("Q", ["yes", "no"])


def _first_example(data):
    data.setup("test")
    return data.splits["test"][0]


def test_hr_bench_loader_and_its_errors(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 12, 3), 200, dtype=np.uint8)).save(buffer, format="JPEG")
    b64 = base64.b64encode(buffer.getvalue()).decode()
    header = "index\tquestion\tA\tB\tC\tD\tanswer\tcategory\timage\n"
    (tmp_path / "hr_bench_4k.tsv").write_text(header + f"7\tWhat colour?\tred\tblue\tgreen\tpink\tC\tFSP\t{b64}\n")
    rows = load_hr_bench(str(tmp_path), "hr_bench_4k.tsv")
    assert rows[0]["options"] == ["red", "blue", "green", "pink"] and rows[0]["answer"] == 2
    data = HighResolutionVQADataModule(dataset="hr_bench", data_dir=str(tmp_path))
    assert _first_example(data)["images"][0].shape == (8, 12, 3)
    (tmp_path / "hr_bench_4k.tsv").write_text(header + f"7\tWhat colour?\tred\t\t\t\tA\tFSP\t{b64}\n")
    with pytest.raises(UserInputError, match="fewer than two options"):
        load_hr_bench(str(tmp_path), "hr_bench_4k.tsv")
    (tmp_path / "hr_bench_4k.tsv").write_text(header + f"7\tWhat colour?\tred\tblue\t\t\tE\tFSP\t{b64}\n")
    with pytest.raises(UserInputError, match="not one of the options"):
        load_hr_bench(str(tmp_path), "hr_bench_4k.tsv")
    with pytest.raises(UserInputError, match="hr_bench_8k.tsv"):
        load_hr_bench(str(tmp_path), "hr_bench_8k.tsv")


# ============================================================================================ Qwen2.5-VL plumbing
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|endoftext|>"]
WORDS = ["system", "user", "assistant", "You", "are", "a", "helpful", "Search", "the", "following", "entities",
         "in", "images", ":", ",", "what", "colour", "is", "square", "red", "blue", "(", ")", "A", "B", "Answer"]


def build_tiny_qwen(folder: str, layers: int = 3) -> dict:
    """A random Qwen2.5-VL (hidden 64) with a word-level tokenizer and an image processor, saved to ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2VLImageProcessor)

    vocab = {"[UNK]": 0}
    for word in SPECIAL + WORDS:
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=SPECIAL)
    ids = dict(bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"],
               pad_token_id=vocab["<|endoftext|>"])
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
                         **ids),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[1],
                           window_size=56),
        image_token_id=vocab["<|image_pad|>"], vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"], video_token_id=0, **ids)
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=224 * 224).save_pretrained(folder)
    return vocab


def test_qwen_plumbing_spans_layer_attention_and_two_image_prompt(tmp_path):
    folder = str(tmp_path / "tiny_qwen")
    vocab = build_tiny_qwen(folder)
    backbone = QwenVLBackbone(folder, min_pixels=56 * 56, max_pixels=224 * 224, dtype="float32")
    hide = HiDe(backbone, select_layer=2, sigma=1.0, threshold=0.7, categories=["direct_attributes"])
    hide.check_backbone()
    assert backbone.num_layers == 3
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (112, 168, 3), dtype=np.uint8))
    crop = image[:56, :56].clone()
    maps, prior, entity = backbone.attention_maps([image, crop], "q", ["red square", "blue"], 1)
    # 112 x 168 px -> 8 x 12 patches of 14 -> 4 x 6 merged tokens; 56 x 56 -> 2 x 2
    assert [m.shape[1:] for m in maps] == [(4, 6), (2, 2)]
    # text after the last image: "Search the following entities in the images :" (8) + "red square , blue" (4)
    # + "<|im_end|> <|im_start|> assistant" (3; newlines are not tokens here); the last 4 are not entities
    assert maps[0].shape[0] == 15 and prior == list(range(8)) and entity == [8, 9, 10]
    # the hook's attention equals the eager attention of the same layer (rows after the last image)
    inputs = backbone._inputs([image, crop], "Search the following entities in the images: red square, blue")
    model = backbone.model
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(**inputs, output_attentions=True, use_cache=False).attentions
    ids = inputs["input_ids"][0]
    starts = (ids == vocab["<|vision_start|>"]).nonzero().flatten().tolist()
    rows = slice(int((ids == vocab["<|vision_end|>"]).nonzero().max()) + 1, None)
    for layer in (1, 2):
        expected = eager[layer][0, :, rows].mean(0)
        first = expected[:, starts[0] + 1:starts[0] + 1 + 24].reshape(15, 4, 6)
        got, _, _ = backbone.attention_maps([image, crop], "q", ["red square", "blue"], layer)
        np.testing.assert_allclose(got[0], first.numpy(), rtol=1e-4, atol=1e-6)
    assert not np.allclose(backbone.attention_maps([image], "q", ["red"], 0)[0][0],
                           backbone.attention_maps([image], "q", ["red"], 2)[0][0])
    # the answer prompt: two images (two vision spans), the options and the letter instruction, one decode
    answer_inputs = backbone._inputs([image, crop], "what colour is the square\n(A) red\n(B) blue")
    assert int((answer_inputs["input_ids"] == vocab["<|vision_start|>"]).sum()) == 2
    assert int(answer_inputs["mm_token_type_ids"].sum()) == 24 + 4
    assert backbone.answer([image, crop], "what colour is the square", ["red", "blue"]) in (-1, 0, 1)
    with pytest.raises(UserInputError, match="beyond the model's depth"):
        HiDe(backbone, select_layer=4).check_backbone()


def test_qwen_folder_errors(tmp_path):
    with pytest.raises(UserInputError, match="no config.json"):
        QwenVLBackbone(str(tmp_path)).prepare()
    from transformers import BertConfig

    BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=8).save_pretrained(tmp_path)
    with pytest.raises(UserInputError, match="cannot be loaded as an image-text-to-text model"):
        QwenVLBackbone(str(tmp_path)).prepare()
