"""High-resolution visual question answering (HiDe): multiple-choice questions about small objects in large images.

Every example is a dict ``{"id", "images": [uint8 tensor H x W x 3], "question", "options": [str],
"answer": int (option index), "category", "clutter", "target_boxes": [[x0, y0, x1, y1] pixels] (empty when unknown)}``;
batches are lists of such dicts (images differ in size).

Datasets
--------
* ``synthetic`` (embedded, seeded): ``canvas_size`` x ``canvas_size`` canvases of a textured, unsaturated
  background with small targets (``target_size`` px squares in one of four colours) and ``clutter`` distractors
  (discs, rings, crosses, triangles, bars of ``distractor_size`` px in the same four colours). Two question types,
  after V* Bench's categories: ``colour`` ("what colour is the square", options red/green/blue/yellow) and
  ``position`` (two squares of different colours: "is the red square left or right of the blue square", options
  left/right). Training clutter is drawn uniformly from 0..max(``clutter_levels``); validation and test hold
  ``num_val`` / ``num_test`` examples *per* clutter level of ``clutter_levels`` (the ``clutter`` field says which).
  Training examples (``pair_prob``) come as ``[image, crop]`` pairs: the crop is the union of the target boxes
  grown by a random margin (with probability ``crop_hit_prob``; otherwise a random window), the input a zoom-in
  method gives a model. Each example is drawn from its own seed (split, index), so splits are deterministic.
* ``vstar`` (V* Bench, Wu & Xie 2023, ``craigwu/vstar_bench``), one of three layouts in ``data_dir``, read in
  this order:

  1. ``test_questions.jsonl`` (rows ``{"image", "text" (question with "(A) ..." option lines), "label" ("A"),
     "category", ...}``), options parsed from the ``(A) text`` lines;
  2. a HiDe-style JSON list at the top level (``{"id", "question", "labels", "image_path", "category"}``);
  3. the first release, as github.com/penghao-wu/vstar's ``vstar_bench_eval.py`` reads it (README "Benchmark"):
     the folders ``direct_attributes/`` and ``relative_position/`` (the category), each image with the annotation
     ``<image name without extension>.json`` beside it, ``{"target_object": [names], "bbox": [[x, y, w, h] pixels,
     one per target], "question": str, "options": [str, ...]}``, the correct option first. The evaluation script
     scores every option's likelihood, so their order does not matter to it; a model that answers with a letter
     would find the answer always at (A), so ``vstar_option_order: shuffled`` (default) presents the options in
     a seeded per-question order (``seed`` and the image's path; the answer index follows the correct option),
     ``as_released`` keeps the file's order.

  Target boxes: wherever an image has its annotation ``.json`` beside it (layout 3; in layouts 1 and 2 when the
  release's annotation files are kept next to the images), its ``bbox`` list becomes
  ``target_boxes`` (``[x, y, x + w, y + h]``, clipped to the image as the release's ``normalize_bbox`` clips), so
  HiDe's ``box_iou`` is measured on the benchmark; without one, ``target_boxes`` is empty.
* ``hr_bench`` (HR-Bench 4K / 8K, ``DreamMr/HR-Bench``): ``data_dir`` holds the TSV (``hr_bench_file``, e.g.
  ``hr_bench_4k.tsv``) with columns ``index, question, A, B, C, D, answer, category, image`` (base64 JPEG).

Real benchmarks are test-only (``test`` / ``predict``); the training loader of the embedded data trains the toy
MLLM. Errors: a missing or unreadable image, a row without options, an answer letter outside the options, a
missing annotation file, a malformed ``bbox`` or a box outside its image are one `UserInputError` naming the file
and row.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import math
import re
import sys
import zlib
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.readers import require_data_dir
from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

COLOURS = {"red": (215, 45, 40), "green": (40, 175, 60), "blue": (45, 80, 225), "yellow": (225, 205, 40)}
COLOUR_NAMES = list(COLOURS)
POSITIONS = ["left", "right"]
SHAPES = ("disc", "ring", "cross", "triangle", "bar")
LETTERS = "ABCDEFGH"
SPLITS = {"train": 0, "val": 1, "test": 2}
VSTAR_FOLDERS = ("direct_attributes", "relative_position")   # the release's test types (vstar_bench_eval.py)
VSTAR_ORDERS = ("shuffled", "as_released")
OPTION_ORDER_STREAM = 7                                       # seed stream of the shuffled V* option order


# ============================================================================================ the generator
def _shape_mask(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    c = size / 2
    r = np.hypot(yy - c, xx - c)
    if shape == "square":
        return np.ones((size, size), dtype=bool)
    if shape == "disc":
        return r <= c
    if shape == "ring":
        return (r <= c) & (r >= c - max(1.5, size / 4))
    if shape == "cross":
        t = max(1, size // 4)
        lo, hi = size // 2 - t // 2 - t % 2, size // 2 + t // 2 + 1
        m = np.zeros((size, size), dtype=bool)
        m[lo:hi, :] = True
        m[:, lo:hi] = True
        return m
    if shape == "triangle":
        return xx >= np.abs(yy - c) * 1.0 + (size - 2 * c) if rng.random() < 0.5 else \
            yy >= np.abs(xx - c) * 1.0
    # bar: a long thin rectangle, horizontal or vertical
    m = np.zeros((size, size), dtype=bool)
    t = max(2, size // 3)
    if rng.random() < 0.5:
        m[size // 2 - t // 2: size // 2 - t // 2 + t, :] = True
    else:
        m[:, size // 2 - t // 2: size // 2 - t // 2 + t] = True
    return m


def _background(size: int, rng: np.random.Generator) -> np.ndarray:
    """Unsaturated texture: a base grey, a smooth low-frequency field, oriented stripes and pixel noise."""
    low = rng.normal(0, 1, (6, 6))
    field = np.kron(low, np.ones((size // 6 + 1, size // 6 + 1)))[:size, :size]
    yy, xx = np.mgrid[0:size, 0:size]
    angle, period = rng.uniform(0, np.pi), rng.uniform(6, 20)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)
    grey = rng.uniform(95, 160) + 18 * field + 10 * stripes + rng.normal(0, 6, (size, size))
    tint = rng.normal(0, 4, 3)
    return np.clip(grey[..., None] + tint, 0, 255)


def _free_spot(occupied: list, size: int, canvas: int, rng: np.random.Generator, gap: int = 2,
               tries: int = 200) -> tuple[int, int] | None:
    for _ in range(tries):
        x, y = int(rng.integers(0, canvas - size + 1)), int(rng.integers(0, canvas - size + 1))
        if all(x + size + gap <= a or a + s + gap <= x or y + size + gap <= b or b + s + gap <= y
               for a, b, s in occupied):
            return x, y
    return None


def generate_example(seed: int, canvas_size: int = 128, target_size: int = 8, distractor_size: int = 9,
                     clutter: int = 8, question: Literal["colour", "position"] = "colour") -> dict:
    """One synthetic high-resolution question (deterministic given ``seed``)."""
    rng = np.random.default_rng(seed)
    image = _background(canvas_size, rng)
    occupied: list[tuple[int, int, int]] = []
    targets = []
    colours = rng.choice(len(COLOURS), size=2, replace=False) if question == "position" else [rng.integers(4)]
    for colour in colours:
        for _ in range(50):
            spot = _free_spot(occupied, target_size, canvas_size, rng, gap=4)
            if spot is None:
                raise RuntimeError("no free spot for a target")  # cannot happen on an empty canvas
            if question != "position" or not targets or abs(spot[0] - targets[0][1][0]) >= 2 * target_size:
                break
        occupied.append((spot[0], spot[1], target_size))
        targets.append((int(colour), spot))
    for _ in range(clutter):
        spot = _free_spot(occupied, distractor_size, canvas_size, rng)
        if spot is None:
            break
        occupied.append((spot[0], spot[1], distractor_size))
        mask = _shape_mask(SHAPES[rng.integers(len(SHAPES))], distractor_size, rng)
        x, y = spot
        image[y:y + distractor_size, x:x + distractor_size][mask] = COLOURS[COLOUR_NAMES[rng.integers(4)]]
    boxes = []
    for colour, (x, y) in targets:
        image[y:y + target_size, x:x + target_size] = COLOURS[COLOUR_NAMES[colour]]
        boxes.append([x, y, x + target_size, y + target_size])
    if question == "colour":
        text, options, answer = "what colour is the square", list(COLOUR_NAMES), targets[0][0]
    else:
        (c1, (x1, _)), (c2, (x2, _)) = targets
        text = f"is the {COLOUR_NAMES[c1]} square left or right of the {COLOUR_NAMES[c2]} square"
        options, answer = list(POSITIONS), int(x1 > x2)
    return {"images": [torch.from_numpy(image.astype(np.uint8))], "question": text, "options": options,
            "answer": int(answer), "category": question, "clutter": int(clutter), "target_boxes": boxes}


def crop_around(image: torch.Tensor, boxes: list, rng: np.random.Generator, hit: bool,
                max_margin: int = 16) -> torch.Tensor:
    """A training crop: the union of ``boxes`` grown by random margins (``hit``), else a random window."""
    h, w = image.shape[:2]
    if hit and boxes:
        x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
        x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
        m = rng.integers(0, max_margin + 1, size=4)
        x0, y0, x1, y1 = max(0, x0 - m[0]), max(0, y0 - m[1]), min(w, x1 + m[2]), min(h, y1 + m[3])
    else:
        cw, ch = int(rng.integers(12, w // 2 + 1)), int(rng.integers(12, h // 2 + 1))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        x1, y1 = x0 + cw, y0 + ch
    return image[y0:y1, x0:x1].clone()


class SyntheticHighResolution(Dataset):
    """Seeded examples of one split; ``levels`` gives the clutter of each (fixed per index for val/test)."""

    def __init__(self, split: str, size: int, seed: int, levels: list[int], position_prob: float,
                 canvas_size: int, target_size: int, distractor_size: int, pair_prob: float = 0.0,
                 crop_hit_prob: float = 0.8) -> None:
        self.split, self.size, self.seed, self.levels = split, size, seed, levels
        self.position_prob, self.pair_prob, self.crop_hit_prob = position_prob, pair_prob, crop_hit_prob
        self.geometry = dict(canvas_size=canvas_size, target_size=target_size, distractor_size=distractor_size)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        rng = np.random.default_rng(mix_seed(self.seed, SPLITS[self.split], index))
        if self.split == "train":
            clutter = int(rng.integers(0, max(self.levels) + 1))
        else:
            clutter = self.levels[index % len(self.levels)]
        question = "position" if rng.random() < self.position_prob else "colour"
        example = generate_example(int(rng.integers(2 ** 62)), clutter=clutter, question=question, **self.geometry)
        example["id"] = f"{self.split}-{index}"
        if self.pair_prob > 0 and rng.random() < self.pair_prob:
            example["images"].append(crop_around(example["images"][0], example["target_boxes"], rng,
                                                 hit=rng.random() < self.crop_hit_prob))
        return example


# ============================================================================================ real benchmarks
_OPTION = re.compile(r"^\s*\(?([A-H])[\).:]\s*(.+?)\s*$")


def parse_options(text: str, where: str) -> tuple[str, list[str]]:
    """Split a V*-style question into (stem, options) from its ``(A) ...`` lines."""
    stem, options = [], []
    for line in text.splitlines():
        match = _OPTION.match(line)
        if match and match.group(1) == LETTERS[len(options)]:
            options.append(match.group(2))
        elif not options:
            stem.append(line)
    if len(options) < 2:
        raise UserInputError(f"{where}: the question has no '(A) ...' / '(B) ...' option lines; every multiple-"
                             "choice row needs at least two options.")
    return "\n".join(stem).strip(), options


def answer_index(letter: str, options: list[str], where: str) -> int:
    letter = str(letter).strip().strip("()").upper()[:1]
    if not letter or letter not in LETTERS[:len(options)]:
        raise UserInputError(f"{where}: answer {letter!r} is not one of the options "
                             f"{', '.join(LETTERS[:len(options)])}. Fix the row's answer letter.")
    return LETTERS.index(letter)


def _read_image(path: str, where: str) -> torch.Tensor:
    from PIL import Image

    if not os.path.isfile(path):
        raise UserInputError(f"{where}: image '{path}' does not exist. Put the benchmark's images next to its "
                             "question file (as the release lays them out).")
    try:
        with Image.open(path) as img:
            return torch.from_numpy(np.asarray(img.convert("RGB")).copy())
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise UserInputError(f"{where}: image '{path}' could not be read ({type(err).__name__}: {err}). Replace "
                             "it with the file from the benchmark's release.") from None


def _read_annotation(path: str) -> dict:
    """One V* annotation file (``{"target_object", "bbox", "question", "options"}``)."""
    try:
        with open(path) as f:
            annotation = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(f"V* annotation '{path}' is not readable JSON ({type(err).__name__}: {err}). "
                             "Replace it with the release's file.") from None
    if not isinstance(annotation, dict):
        raise UserInputError(f"V* annotation '{path}' holds a {type(annotation).__name__}, expected an object with "
                             "target_object, bbox, question and options.")
    return annotation


def vstar_boxes(bbox, where: str) -> list[list[float]]:
    """The release's ``bbox`` list (``[x, y, w, h]`` pixels per target) as ``[x0, y0, x1, y1]`` boxes."""
    if not isinstance(bbox, list):
        raise UserInputError(f"{where}: 'bbox' must be a list of [x, y, w, h] boxes, got {type(bbox).__name__}.")
    boxes = []
    for box in bbox:
        if not (isinstance(box, list) and len(box) == 4 and
                all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
            raise UserInputError(f"{where}: bbox entry {box!r} is not four finite numbers [x, y, w, h].")
        x, y, w, h = (float(v) for v in box)
        if w <= 0 or h <= 0:
            raise UserInputError(f"{where}: bbox entry {box!r} has a width or height <= 0 ([x, y, w, h] pixels).")
        boxes.append([x, y, x + w, y + h])
    return boxes


def _sidecar_boxes(image_path: str, where: str) -> list[list[float]]:
    """Target boxes from the image's annotation ``.json`` beside it, if there is one (else none)."""
    path = os.path.splitext(image_path)[0] + ".json"
    if not os.path.isfile(path):
        return []
    annotation = _read_annotation(path)
    return vstar_boxes(annotation["bbox"], f"{where} (annotation '{path}')") if "bbox" in annotation else []


def clip_boxes(boxes: list, height: int, width: int, where: str) -> list[list[float]]:
    """Boxes clipped to a ``height x width`` image; a box with nothing inside the image is an error."""
    out = []
    for x0, y0, x1, y1 in boxes:
        box = [max(0.0, x0), max(0.0, y0), min(float(width), x1), min(float(height), y1)]
        if box[2] <= box[0] or box[3] <= box[1]:
            raise UserInputError(f"{where}: target box {[x0, y0, x1, y1]} lies outside the {width} x {height} "
                                 "image. Check the annotation's bbox (x, y, w, h in pixels of this image).")
        out.append(box)
    return out


def option_permutation(seed: int, key: str, count: int) -> list[int]:
    """The shuffled V* option order of one question: a pure function of (``seed``, ``key``)."""
    rng = np.random.default_rng(mix_seed(seed, OPTION_ORDER_STREAM, zlib.crc32(key.encode())))
    return [int(i) for i in rng.permutation(count)]


def load_vstar_annotations(root: str, option_order: str = "shuffled", seed: int = 0) -> list[dict]:
    """The first V* release: ``direct_attributes/`` and ``relative_position/`` with an annotation ``.json`` beside
    each image (module docstring), read as ``vstar_bench_eval.py`` reads them: every non-JSON file of a folder is
    a question image, its annotation is the same path with ``.json``, the correct option is ``options[0]``."""
    if option_order not in VSTAR_ORDERS:
        raise UserInputError(f"vstar_option_order={option_order!r}: choose one of {', '.join(VSTAR_ORDERS)}.")
    for category in VSTAR_FOLDERS:
        folder = os.path.join(root, category)
        if not os.path.isdir(folder):
            raise UserInputError(f"V* Bench: '{folder}' is missing; the release has the folders "
                                 f"{' and '.join(VSTAR_FOLDERS)}, each image with its annotation .json beside it.")
    examples = []
    for category in VSTAR_FOLDERS:
        folder = os.path.join(root, category)
        images = sorted(f for f in os.listdir(folder) if not f.startswith(".") and ".json" not in f)
        if not images:
            raise UserInputError(f"V* Bench: '{folder}' has no question images.")
        for name in images:
            image_path = os.path.join(folder, name)
            path = os.path.splitext(image_path)[0] + ".json"
            if not os.path.isfile(path):
                raise UserInputError(f"V* Bench: image '{image_path}' has no annotation '{path}' (the release "
                                     "pairs every image with a .json of the same name).")
            annotation = _read_annotation(path)
            missing = [k for k in ("question", "options", "bbox") if k not in annotation]
            if missing:
                raise UserInputError(f"V* annotation '{path}' lacks {', '.join(missing)} (expected target_object, "
                                     "bbox, question, options).")
            question, options = annotation["question"], annotation["options"]
            if not isinstance(question, str) or not question.strip():
                raise UserInputError(f"V* annotation '{path}': 'question' must be a non-empty string.")
            if not (isinstance(options, list) and 2 <= len(options) <= len(LETTERS) and
                    all(isinstance(o, str) and o.strip() for o in options)):
                raise UserInputError(f"V* annotation '{path}': 'options' must be a list of 2 to {len(LETTERS)} "
                                     "non-empty strings (the correct one first).")
            key = f"{category}/{name}"
            order = (option_permutation(seed, key, len(options)) if option_order == "shuffled"
                     else list(range(len(options))))
            examples.append({"id": key, "path": image_path, "where": f"V* annotation '{path}'",
                             "question": question.strip(), "options": [options[i].strip() for i in order],
                             "answer": order.index(0), "category": category, "clutter": -1,
                             "target_boxes": vstar_boxes(annotation["bbox"], f"V* annotation '{path}'")})
    return examples


def load_vstar(data_dir: str, option_order: str = "shuffled", seed: int = 0) -> list[dict]:
    """V* Bench from ``data_dir``: ``test_questions.jsonl``, a HiDe-style ``*.json`` list, or the first release's
    folders with an annotation ``.json`` beside each image (module docstring; ``option_order`` and ``seed`` apply
    to the last)."""
    root = require_data_dir(data_dir, "vstar", "test_questions.jsonl, a JSON list or the release's "
                            f"{' and '.join(VSTAR_FOLDERS)} folders, with the benchmark's images")
    jsonl = os.path.join(root, "test_questions.jsonl")
    lists = sorted(f for f in os.listdir(root) if f.endswith(".json"))
    if os.path.isfile(jsonl):
        path = jsonl
        with open(jsonl) as f:
            rows = []
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append((line_no, json.loads(line)))
                    except json.JSONDecodeError as err:
                        raise UserInputError(f"{jsonl}, line {line_no}: not JSON ({err.msg}).") from None
    elif lists:
        path = os.path.join(root, lists[0])
        with open(path) as f:
            rows = list(enumerate(json.load(f), 1))
    elif any(os.path.isdir(os.path.join(root, folder)) for folder in VSTAR_FOLDERS):
        return load_vstar_annotations(root, option_order, seed)
    else:
        raise UserInputError(f"V* Bench: '{root}' has neither test_questions.jsonl, a JSON question list, nor the "
                             f"release's {' and '.join(VSTAR_FOLDERS)} folders (images with annotation .json files).")
    examples = []
    for line_no, row in rows:
        where = f"{path}, row {line_no}"
        text = row.get("text", row.get("question"))
        image = row.get("image", row.get("image_path"))
        label = row.get("label", row.get("labels"))
        if text is None or image is None or label is None:
            raise UserInputError(f"{where}: needs fields text/question, image/image_path and label/labels.")
        stem, options = parse_options(text, where)
        image_path = image if os.path.isabs(image) else os.path.join(root, image)
        if not os.path.isfile(image_path) and "/" in image:  # HiDe's paths start with the benchmark folder
            image_path = os.path.join(root, image.split("/", 1)[1])
        examples.append({"id": str(row.get("question_id", row.get("id", line_no))), "path": image_path,
                         "where": where, "question": stem, "options": options,
                         "answer": answer_index(label, options, where),
                         "category": str(row.get("category", os.path.basename(os.path.dirname(image_path)))),
                         "clutter": -1, "target_boxes": _sidecar_boxes(image_path, where)})
    return examples


def load_hr_bench(data_dir: str, file: str) -> list[dict]:
    """HR-Bench 4K/8K: the TSV with base64 images (``index, question, A..D, answer, category, image``)."""
    root = require_data_dir(data_dir, "hr_bench", f"the HR-Bench TSV '{file}'")
    path = os.path.join(root, file)
    if not os.path.isfile(path):
        raise UserInputError(f"HR-Bench: '{path}' does not exist; set data.init_args.hr_bench_file to the TSV "
                             "(hr_bench_4k.tsv or hr_bench_8k.tsv).")
    csv.field_size_limit(sys.maxsize)
    examples = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        missing = {"question", "answer", "image"} - set(reader.fieldnames or [])
        if missing:
            raise UserInputError(f"{path}: missing column(s) {sorted(missing)}; expected index, question, A-D, "
                                 "answer, category, image.")
        for line_no, row in enumerate(reader, 2):
            where = f"{path}, line {line_no}"
            options = [row[k] for k in LETTERS if row.get(k) not in (None, "", "nan")]
            if len(options) < 2:
                raise UserInputError(f"{where}: the row has fewer than two options in columns A, B, C, D.")
            if not row["image"]:
                raise UserInputError(f"{where}: the image column is empty (expected a base64 image).")
            examples.append({"id": str(row.get("index", line_no)), "b64": row["image"], "where": where,
                             "question": row["question"], "options": options,
                             "answer": answer_index(row["answer"], options, where),
                             "category": row.get("category") or "all", "clutter": -1, "target_boxes": []})
    return examples


def decode_base64_image(data: str, where: str) -> torch.Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(base64.b64decode(data))) as img:
            return torch.from_numpy(np.asarray(img.convert("RGB")).copy())
    except (ValueError, UnidentifiedImageError) as err:
        raise UserInputError(f"{where}: the image column is not a base64 image ({err}).") from None


class BenchmarkDataset(Dataset):
    """Real-benchmark rows; images are read when an example is requested."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = dict(self.rows[index])
        where = row.pop("where")
        image = _read_image(row.pop("path"), where) if "path" in row else decode_base64_image(row.pop("b64"), where)
        row["target_boxes"] = clip_boxes(row["target_boxes"], image.shape[0], image.shape[1], where)
        return {**row, "images": [image]}


def collate_examples(examples: list[dict]) -> list[dict]:
    """Batches are lists of example dicts (images differ in size and number)."""
    return list(examples)


class HighResolutionVQADataModule(LightningDataModule):
    """Embedded synthetic high-resolution questions, or V* Bench / HR-Bench from ``data_dir`` (test only)."""

    def __init__(self, dataset: Literal["synthetic", "vstar", "hr_bench"] = "synthetic", data_dir: str | None = None,
                 hr_bench_file: str = "hr_bench_4k.tsv", num_train: int = 4000, num_val: int = 100,
                 num_test: int = 200, clutter_levels: list[int] = (0, 8, 24), position_prob: float = 0.25,
                 pair_prob: float = 0.5, crop_hit_prob: float = 0.8, canvas_size: int = 128,
                 target_size: int = 8, distractor_size: int = 9, batch_size: int = 32,
                 eval_batch_size: int = 16, seed: int = 0, num_workers: int = 0,
                 vstar_option_order: Literal["shuffled", "as_released"] = "shuffled") -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataset not in ("synthetic", "vstar", "hr_bench"):
            raise UserInputError(f"dataset={dataset!r} is unknown; use synthetic, vstar or hr_bench.")
        if vstar_option_order not in VSTAR_ORDERS:
            raise UserInputError(f"vstar_option_order={vstar_option_order!r}: choose one of "
                                 f"{', '.join(VSTAR_ORDERS)}.")
        check_range("position_prob", position_prob, 0, 1)
        check_range("pair_prob", pair_prob, 0, 1)
        check_range("crop_hit_prob", crop_hit_prob, 0, 1)
        if not clutter_levels or min(clutter_levels) < 0:
            raise UserInputError(f"clutter_levels={list(clutter_levels)} must be a non-empty list of counts >= 0.")
        if canvas_size < 4 * max(target_size, distractor_size):
            raise UserInputError(f"canvas_size={canvas_size} is too small for {target_size}-px targets; use at "
                                 f"least {4 * max(target_size, distractor_size)}.")
        self.clutter_levels = list(clutter_levels)
        self.splits: dict[str, Dataset] = {}

    def _synthetic(self, split: str, size: int, pair_prob: float = 0.0) -> Dataset:
        h = self.hparams
        return SyntheticHighResolution(split, size, h.seed, self.clutter_levels, h.position_prob, h.canvas_size,
                                       h.target_size, h.distractor_size, pair_prob, h.crop_hit_prob)

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if self.splits:
            return
        if h.dataset == "synthetic":
            self.splits = {"train": self._synthetic("train", h.num_train, h.pair_prob),
                           "val": self._synthetic("val", h.num_val * len(self.clutter_levels)),
                           "test": self._synthetic("test", h.num_test * len(self.clutter_levels))}
            return
        rows = (load_vstar(h.data_dir, h.vstar_option_order, h.seed) if h.dataset == "vstar"
                else load_hr_bench(h.data_dir, h.hr_bench_file))
        benchmark = BenchmarkDataset(rows)
        self.splits = {"val": benchmark, "test": benchmark}

    def train_dataloader(self) -> DataLoader:
        if "train" not in self.splits:
            raise UserInputError(f"dataset={self.hparams.dataset!r} is an evaluation benchmark: run `test` or "
                                 "`predict` (HiDe is training-free), or fit on dataset=synthetic.")
        data = self.splits["train"]
        return DataLoader(data, batch_size=self.hparams.batch_size, collate_fn=collate_examples,
                          sampler=training_sampler(len(data), self.hparams.seed, self._trainer_or_none()),
                          num_workers=self.hparams.num_workers, drop_last=True)

    def _trainer_or_none(self):
        return getattr(self, "trainer", None)

    def _eval(self, split: str) -> DataLoader:
        data = self.splits[split]
        return DataLoader(data, batch_size=self.hparams.eval_batch_size, collate_fn=collate_examples,
                          sampler=evaluation_sampler(data, self._trainer_or_none()),
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval("test")
