"""Released data files read as their official readers read them, or end in one clear error naming the fix.

DenseUAV (InfoGeo, arXiv 2605.07099): the release of github.com/Dmmm1997/DenseUAV (README "About Dataset";
satellite tiles written by ``tool/dataset_preprocess/2-generate_new_croped_resized_images_difheights.py``), read as
``datasets/Dataloader_University.py`` (training) and ``test.py`` (torchvision ``ImageFolder``) read it.
V* Bench (HiDe, arXiv 2510.00054): the first release of github.com/penghao-wu/vstar (README "Benchmark"), read as
``vstar_bench_eval.py`` reads it, and its target boxes fed to HiDe's ``box_iou``.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from PIL import Image

from datamodules.geo_localization import GeoLocalizationDataModule, UniqueLocationBatchSampler
from datamodules.high_resolution_vqa import HighResolutionVQADataModule, load_vstar
from lightning_modules.shared.errors import UserInputError
from lightning_modules.hide.hide import HiDe

HEIGHTS = ("H80", "H90", "H100")
SATELLITE_NAMES = [f"{h}{old}.tif" for h in HEIGHTS for old in ("", "_old")]


# ============================================================================================ DenseUAV
def satellite_value(loc: int, k: int) -> int:
    return 20 * loc + 3 * k + 1


def write_denseuav(root, train=(1, 2, 3), test=(4, 5), side=8):
    """The DenseUAV release: ``train/drone/<6-digit id>/H80.JPG, H90.JPG, H100.JPG`` and
    ``train/satellite/<id>/H80.tif, H90.tif, H100.tif, H80_old.tif, H90_old.tif, H100_old.tif``; the test folders
    ``test/query_drone/<id>/*.JPG`` and ``test/gallery_satellite/<id>/*.tif`` (the gallery holds the training
    locations too). The preprocessing script writes the tiles with ``cv2.imwrite(..., ".tif")``: 8-bit, 3-channel,
    LZW-compressed TIFF (OpenCV's default), written here with PIL the same way. Every satellite tile has its own
    constant colour (`satellite_value`), so the tests can tell which one was read."""
    def tiles(folder, loc):
        folder.mkdir(parents=True)
        for k, name in enumerate(SATELLITE_NAMES):
            pixels = np.full((side, side, 3), satellite_value(loc, k), dtype=np.uint8)
            pixels[..., 1] = 255 - satellite_value(loc, k)
            Image.fromarray(pixels).save(folder / name, compression="tiff_lzw")

    def drones(folder, loc):
        folder.mkdir(parents=True)
        for k, name in enumerate(HEIGHTS):
            Image.fromarray(np.full((side, side, 3), 10 * loc + k, dtype=np.uint8)).save(folder / f"{name}.JPG")

    for loc in train:
        tiles(root / "train" / "satellite" / f"{loc:06d}", loc)
        drones(root / "train" / "drone" / f"{loc:06d}", loc)
    for loc in tuple(train) + tuple(test):
        tiles(root / "test" / "gallery_satellite" / f"{loc:06d}", loc)
    for loc in test:
        drones(root / "test" / "query_drone" / f"{loc:06d}", loc)
    return root


def denseuav(root, **kwargs) -> GeoLocalizationDataModule:
    data = GeoLocalizationDataModule(dataset="denseuav", data_dir=str(root), image_size=8, batch_size=3, **kwargs)
    data.setup("fit")
    return data


def test_denseuav_tif_tiles_read_as_pil_convert_rgb(tmp_path):
    """``Image.open(path).convert("RGB")`` is both official loaders' read; at the file's size nothing is resampled,
    so every pixel must be the file's own."""
    data = denseuav(write_denseuav(tmp_path))
    satellite = data.train_set.satellite.source
    assert len(satellite.paths) == 3 * 6 and all(p.endswith(".tif") for p in satellite.paths)
    for j, path in enumerate(satellite.paths):
        with Image.open(path) as img:
            expected = np.asarray(img.convert("RGB"), dtype=np.float32) / 255
        np.testing.assert_array_equal(satellite.pixels(j).permute(1, 2, 0).numpy(), expected)
    drone, sat, ids = next(iter(data.train_dataloader()))
    assert drone.shape == sat.shape == (3, 3, 8, 8) and len(set(ids.tolist())) == 3


def test_denseuav_random_pairing_draws_every_satellite_tile_of_the_location(tmp_path):
    """``Dataloader_University.sample_from_cls`` draws one of the location's satellite images per sample
    (``np.random.choice`` over all six): over epochs a drone image meets every tile of its location, no other."""
    data = denseuav(write_denseuav(tmp_path))
    train = data.train_set
    assert len(train) == 9                                   # one example per drone image
    paths = train.satellite.source.paths
    seen: dict[int, set[str]] = {}
    for epoch in range(60):
        sampler = UniqueLocationBatchSampler(train, train.ids, 3, seed=0)
        sampler.set_epoch(epoch)
        for batch in sampler:
            for k, _, pick in batch:
                j = train.satellite_index(k, pick)
                assert int(train.ids[k]) == int(train.satellite.source.labels[j])
                seen.setdefault(k, set()).add(paths[j].rsplit("/", 1)[1])
    assert set(seen) == set(range(9))
    assert all(names == set(SATELLITE_NAMES) for names in seen.values())
    # seeded per (seed, epoch): the same epoch draws the same tiles, another epoch other ones
    draws = [[p for b in UniqueLocationBatchSampler(train, train.ids, 3, seed=0) for _, _, p in b] for _ in range(2)]
    assert draws[0] == draws[1]
    other = UniqueLocationBatchSampler(train, train.ids, 3, seed=0)
    other.set_epoch(1)
    assert [p for b in other for _, _, p in b] != draws[0]


def test_denseuav_all_pairing_makes_every_drone_satellite_pair_one_example(tmp_path):
    """Game4Loc's ``DenseUAVDatasetTrain`` (``game4loc/dataset/denseuav_extend.py``): ``for q in query_imgs: for g
    in gallery_imgs: pairs.append((idx, q, g))``."""
    data = denseuav(write_denseuav(tmp_path), satellite_pairing="all")
    train = data.train_set
    assert len(train) == 3 * 3 * 6
    pairs = {(int(train.drone_index[k]), train.satellite_index(k, pick=5)) for k in range(len(train))}
    drone_ids = train.drone.source.labels.tolist()
    sat_ids = train.satellite.source.labels.tolist()
    assert pairs == {(i, j) for i, a in enumerate(drone_ids) for j, b in enumerate(sat_ids) if a == b}
    drone, sat, ids = train[[(0, False, 0), (len(train) - 1, True, 0)]]
    assert ids.tolist() == [0, 2]
    with pytest.raises(UserInputError, match="satellite_pairing='first'"):
        GeoLocalizationDataModule(dataset="denseuav", data_dir=str(tmp_path), satellite_pairing="first")


def test_denseuav_gallery_holds_every_tile_of_every_location(tmp_path):
    """``test.py``: ``ImageFolder(test/query_drone)`` and ``ImageFolder(test/gallery_satellite)``; each gallery
    image is labelled with its folder (location), so a location's six tiles are six gallery images."""
    data = GeoLocalizationDataModule(dataset="denseuav", data_dir=str(write_denseuav(tmp_path)), image_size=8)
    data.setup("test")
    test = data.test_set
    assert test.num_gallery == 5 * 6 and len(test) - test.num_gallery == 2 * 3
    gallery = test.ids[:test.num_gallery].tolist()
    assert all(gallery.count(loc) == 6 for loc in set(gallery))
    value = test[0][0] * torch.tensor((0.229, 0.224, 0.225))[:, None, None] + \
        torch.tensor((0.485, 0.456, 0.406))[:, None, None]
    assert torch.allclose(value[0], torch.full((8, 8), satellite_value(1, 4) / 255), atol=1e-6)   # H100.tif first


def test_denseuav_other_tiff_modes_convert_as_pil_or_are_refused(tmp_path):
    root = write_denseuav(tmp_path)
    folder = root / "train" / "satellite" / "000001"
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8)
    Image.fromarray(grey).save(folder / "H80.tif", compression="tiff_lzw")                 # 8-bit grey: L
    rgba = np.dstack([np.full((8, 8, 3), 77, np.uint8), np.zeros((8, 8), np.uint8)])
    Image.fromarray(rgba).save(folder / "H90.tif", compression="tiff_lzw")                 # RGBA: alpha dropped
    data = denseuav(root)
    source = data.train_set.satellite.source
    by_name = {p.rsplit("/", 1)[1]: j for j, p in enumerate(source.paths) if "000001" in p}
    assert torch.equal(source.pixels(by_name["H80.tif"]), torch.from_numpy(grey).float().div(255).expand(3, 8, 8))
    assert (source.pixels(by_name["H90.tif"]) == 77 / 255).all()
    Image.fromarray((grey.astype(np.uint16) * 256)).save(folder / "H100.tif")              # 16-bit grey: I;16
    with pytest.raises(UserInputError, match="H100.tif' has PIL mode I;16, not 8 bits per channel.*to 8-bit RGB"):
        source.pixels(by_name["H100.tif"])
    (folder / "H100_old.tif").write_bytes(b"II*\x00 truncated")
    with pytest.raises(UserInputError, match="H100_old.tif' could not be read"):
        source.pixels(by_name["H100_old.tif"])


def test_denseuav_stray_files_and_missing_folders_are_one_clear_error(tmp_path):
    root = write_denseuav(tmp_path)
    (root / "train" / "satellite" / "000002" / "notes.txt").write_text("x")
    with pytest.raises(UserInputError, match="notes.txt' is not an image .*Move it out"):
        denseuav(root)
    (root / "train" / "satellite" / "000002" / "notes.txt").unlink()
    (root / "train" / "satellite" / "000002" / ".DS_Store").write_text("x")          # hidden files are ignored
    assert len(denseuav(root).train_set.satellite.source.paths) == 18
    for name in SATELLITE_NAMES:
        (root / "train" / "satellite" / "000003" / name).unlink()
    with pytest.raises(UserInputError, match="000003' has no images"):
        denseuav(root)


def test_single_satellite_datasets_pair_the_same_under_both_rules(tmp_path):
    """University-1652 has one satellite image per location: ``random`` and ``all`` give the same pairs."""
    for loc in ("0001", "0002"):
        for split, satellite, drone in (("train", "satellite", "drone"), ("test", "gallery_satellite", "query_drone")):
            (tmp_path / split / satellite / loc).mkdir(parents=True)
            Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / split / satellite / loc / f"{loc}.jpg")
            (tmp_path / split / drone / loc).mkdir(parents=True)
            for v in range(2):
                Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / split / drone / loc / f"image-{v}.jpeg")
    sets = []
    for pairing in ("random", "all"):
        data = GeoLocalizationDataModule(dataset="university1652", data_dir=str(tmp_path), image_size=4,
                                         satellite_pairing=pairing)
        data.setup("fit")
        train = data.train_set
        sets.append([(int(train.drone_index[k]), train.satellite_index(k, pick=7)) for k in range(len(train))])
    assert sets[0] == sets[1] == [(0, 0), (1, 0), (2, 1), (3, 1)]


# ============================================================================================ V* Bench
VSTAR = {
    "direct_attributes": [("sa_1", "What is the colour of the cup?", ["red", "blue", "green", "white"],
                           ["cup"], [[10, 4, 6, 8]]),
                          ("sa_2", "What is the material of the glove?", ["rubber", "cotton", "leather", "wool"],
                           ["glove"], [[30, 20, 40, 30]])],        # runs past the 60 x 40 image: clipped
    "relative_position": [("sa_3", "Is the dog on the left or right side of the bike?", ["left", "right"],
                           ["dog", "bike"], [[2, 2, 8, 8], [40, 10, 8, 12]]),
                          ("sa_4", "Is the cat on the left or right side of the car?", ["right", "left"],
                           ["cat", "car"], [[44, 8, 8, 8], [4, 16, 8, 8]])],
}


def write_vstar_release(root, questions=VSTAR, size=(40, 60)):
    """The first V* release: ``direct_attributes/`` and ``relative_position/``, each image ``<name>.jpg`` with
    ``<name>.json`` beside it, ``{"target_object": [...], "bbox": [[x, y, w, h], ...], "question": str,
    "options": [...]}``, the correct option first (README "Benchmark"; ``vstar_bench_eval.py`` reads
    ``annotation['question']`` and ``annotation['options']`` and counts option 0 as correct)."""
    for category, rows in questions.items():
        folder = root / category
        folder.mkdir(parents=True)
        for name, question, options, targets, bbox in rows:
            Image.fromarray(np.full((*size, 3), 90, np.uint8)).save(folder / f"{name}.jpg")
            (folder / f"{name}.json").write_text(json.dumps({"target_object": targets, "bbox": bbox,
                                                             "question": question, "options": options}, indent=4))
    return root


def vstar_examples(root, **kwargs) -> list[dict]:
    data = HighResolutionVQADataModule(dataset="vstar", data_dir=str(root), **kwargs)
    data.setup("test")
    return [data.splits["test"][i] for i in range(len(data.splits["test"]))]


def test_vstar_first_release_reads_question_options_answer_and_boxes(tmp_path):
    examples = vstar_examples(write_vstar_release(tmp_path), vstar_option_order="as_released")
    assert [e["id"] for e in examples] == ["direct_attributes/sa_1.jpg", "direct_attributes/sa_2.jpg",
                                           "relative_position/sa_3.jpg", "relative_position/sa_4.jpg"]
    assert [e["category"] for e in examples] == ["direct_attributes"] * 2 + ["relative_position"] * 2
    assert examples[0]["question"] == "What is the colour of the cup?"
    assert examples[0]["options"] == ["red", "blue", "green", "white"] and examples[0]["answer"] == 0
    assert all(e["answer"] == 0 for e in examples) and examples[0]["images"][0].shape == (40, 60, 3)
    # [x, y, w, h] -> [x0, y0, x1, y1] pixels, clipped to the image as normalize_bbox clips
    assert examples[0]["target_boxes"] == [[10, 4, 16, 12]]
    assert examples[1]["target_boxes"] == [[30, 20, 60, 40]]
    assert examples[2]["target_boxes"] == [[2, 2, 10, 10], [40, 10, 48, 22]]


def test_vstar_shuffled_order_is_seeded_and_the_answer_follows_the_correct_option(tmp_path):
    questions = {c: [(f"{c[:3]}_{i}", f"Question {i}?", [f"right {i}", "w1", "w2", "w3"], ["x"], [[1, 1, 2, 2]])
                     for i in range(6)] for c in ("direct_attributes", "relative_position")}
    root = write_vstar_release(tmp_path, questions)
    rows = load_vstar(str(root), "shuffled", seed=0)
    for row in rows:
        i = row["question"].split()[1].rstrip("?")
        assert sorted(row["options"]) == sorted([f"right {i}", "w1", "w2", "w3"])
        assert row["options"][row["answer"]] == f"right {i}"
    assert len({row["answer"] for row in rows}) > 1                  # no longer always (A)
    assert [r["options"] for r in load_vstar(str(root), "shuffled", seed=0)] == [r["options"] for r in rows]
    assert [r["options"] for r in load_vstar(str(root), "shuffled", seed=1)] != [r["options"] for r in rows]


def test_vstar_jsonl_rows_take_boxes_from_the_annotation_beside_the_image(tmp_path):
    """The later ``test_questions.jsonl`` has no boxes; the image's annotation file next to it has them."""
    root = write_vstar_release(tmp_path)
    rows = [{"image": "direct_attributes/sa_1.jpg", "text": "What is the colour of the cup?\n(A) blue\n(B) red",
             "label": "B", "category": "direct_attributes", "question_id": 0},
            {"image": "relative_position/sa_9.jpg", "text": "Left or right?\n(A) left\n(B) right", "label": "A",
             "category": "relative_position", "question_id": 1}]
    Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(root / "relative_position" / "sa_9.jpg")
    (root / "test_questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    examples = vstar_examples(root)
    assert examples[0]["answer"] == 1 and examples[0]["target_boxes"] == [[10, 4, 16, 12]]
    assert examples[1]["target_boxes"] == []                          # no annotation beside it: no boxes


def test_vstar_release_errors_name_the_file_and_the_fix(tmp_path):
    root = write_vstar_release(tmp_path)
    (root / "direct_attributes" / "sa_1.json").unlink()
    with pytest.raises(UserInputError, match="sa_1.jpg' has no annotation .*sa_1.json"):
        load_vstar(str(root))
    (root / "direct_attributes" / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"],
                                                                      "bbox": [[1, 2, 0, 4]]}))
    with pytest.raises(UserInputError, match="sa_1.json'.*width or height <= 0"):
        load_vstar(str(root))
    (root / "direct_attributes" / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": "a",
                                                                      "bbox": []}))
    with pytest.raises(UserInputError, match="'options' must be a list of 2 to 8"):
        load_vstar(str(root))
    (root / "direct_attributes" / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"],
                                                                      "bbox": [[100, 100, 5, 5]]}))
    data = HighResolutionVQADataModule(dataset="vstar", data_dir=str(root))
    data.setup("test")
    with pytest.raises(UserInputError, match="lies outside the 60 x 40 image"):
        data.splits["test"][0]
    (root / "direct_attributes" / "sa_1.json").write_text("{not json")
    with pytest.raises(UserInputError, match="sa_1.json' is not readable JSON"):
        load_vstar(str(root))
    for f in (root / "relative_position").iterdir():
        f.unlink()
    (root / "relative_position").rmdir()
    with pytest.raises(UserInputError, match="relative_position' is missing"):
        load_vstar(str(root))
    with pytest.raises(UserInputError, match="vstar_option_order='sorted'"):
        HighResolutionVQADataModule(dataset="vstar", data_dir=str(root), vstar_option_order="sorted")


class TargetBackbone(torch.nn.Module):
    """A stub MLLM: its entity attention lights up ``cells`` (x0, y0, x1, y1 on a 16 x 16 token grid) per
    question, and it answers the option whose text is the question's correct one."""

    num_layers = 1

    def __init__(self, cells: dict, correct: dict):
        super().__init__()
        self.cells, self.correct = cells, correct

    def prepare(self):
        pass

    def extract_entities(self, question):
        return ["target"]

    def attention_maps(self, images, question, entities, layer):
        maps = np.ones((3, 16, 16))
        x0, y0, x1, y1 = self.cells[question]
        maps[2, y0:y1, x0:x1] = 50.0
        return [maps], [0, 1], [2]

    def answer(self, images, question, options):
        return options.index(self.correct[question])


def test_vstar_boxes_feed_hides_box_iou_through_trainer_test(tmp_path):
    """The release's boxes reach HiDe's ``test/box_iou`` (best IoU of its merged pixel boxes with each target,
    averaged per question): on a 64 x 64 image a 16 x 16 grid cell is 4 px."""
    questions = {"direct_attributes": [("sa_1", "Q1?", ["red", "blue", "green"], ["cup"], [[16, 8, 8, 12]])],
                 "relative_position": [("sa_2", "Q2?", ["left", "right"], ["a", "b"],
                                        [[0, 0, 8, 8], [32, 32, 16, 16]])]}
    root = write_vstar_release(tmp_path, questions, size=(64, 64))
    # Q1: attention exactly on the target -> IoU 1; Q2: on the second target only -> (0 + 1) / 2
    backbone = TargetBackbone({"Q1?": (4, 2, 6, 5), "Q2?": (8, 8, 12, 12)}, {"Q1?": "red", "Q2?": "left"})
    hide = HiDe(backbone, select_layer=1, sigma=0.0, threshold=0.7,
                categories=["direct_attributes", "relative_position"])
    data = HighResolutionVQADataModule(dataset="vstar", data_dir=str(root), eval_batch_size=2)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    metrics = trainer.test(hide, datamodule=data, verbose=False)[0]
    assert metrics["test/box_iou"] == pytest.approx((1.0 + 0.5) / 2)
    assert metrics["test/accuracy"] == 1.0                           # the shuffled answer index is the right one
