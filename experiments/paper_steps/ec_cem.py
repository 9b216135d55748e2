"""EC-CEM's paper config on CUB-200-2011 with Koh et al.'s concept split (``configs/ec_cem/paper.yaml``).

Written as the releases lay it out under the config's ``data/CUB``:

* ``CUB_processed/class_attr_data_10/{train,val,test}.pkl``, the split pickles of Koh et al.'s CodaLab bundle
  (github.com/yewsiang/ConceptBottleneck: ``CUB/data_processing.py`` writes one dict per image, ``id`` (CUB's 1-based
  image id), ``img_path`` (absolute, on the authors' machine), ``class_label`` (0-based), ``attribute_label``,
  ``attribute_certainty`` and ``uncertain_attribute_label`` over the 312 attributes; ``generate_new_data.py::
  get_class_attributes_data`` then replaces ``attribute_label`` by the class-level list of the 112 selected
  attributes as numpy integers, leaving the other two at 312 values);
* ``CUB_200_2011/images/<NNN.Class_name>/<Class_Name>_<NNNN>_<id>.jpg``, the Caltech tarball's RGB JPEGs at their
  own sizes (at most 500 px a side: 500 x 333, 500 x 375, 375 x 500, ...).

The backbone starts from ``data/resnet34_imagenet.pth`` as the config says; the ImageNet weights are not here, so a
randomly initialised ResNet-34 state_dict with the same names and shapes (torchvision's / timm's, classifier
``fc`` included) is written in their place.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from datamodules.concepts import CUB_SELECTED
from experiments.paper_steps import Case

AUTHORS_ROOT = "/juice/scr/scr102/scr/thaonguyen/CUB_supervision/datasets/CUB_200_2011/images"
# (class folder, file-name stem) of real CUB-200-2011 classes; image sizes as the tarball's vary
CLASSES = [("001.Black_footed_Albatross", "Black_Footed_Albatross"), ("002.Laysan_Albatross", "Laysan_Albatross"),
           ("003.Sooty_Albatross", "Sooty_Albatross"), ("004.Groove_billed_Ani", "Groove_Billed_Ani"),
           ("005.Crested_Auklet", "Crested_Auklet"), ("006.Least_Auklet", "Least_Auklet"),
           ("007.Parakeet_Auklet", "Parakeet_Auklet"), ("008.Rhinoceros_Auklet", "Rhinoceros_Auklet")]
SIZES = [(500, 333), (500, 375), (375, 500), (500, 347), (500, 400), (334, 500)]   # (width, height)
SPLITS = {"train": 64, "val": 8, "test": 8}
FORMAT = ("CUB-200-2011 (Koh et al. concept split): CUB_processed/class_attr_data_10/{train,val,test}.pkl (list of "
          "dicts: id, img_path, class_label, 112 class-level attribute_label, 312 attribute_certainty / "
          "uncertain_attribute_label) + CUB_200_2011/images/<class>/<name>.jpg RGB JPEGs up to 500 px; 64/8/8 "
          "images; random ResNet-34 weights as data/resnet34_imagenet.pth")


def _bird(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """An H x W x 3 uint8 picture: a smooth background with an ellipse ("bird") of a random colour."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]
    image = np.empty((height, width, 3))
    image[:] = rng.uniform(60, 200, 3) * (0.7 + 0.3 * yy[..., None] / height)
    cx, cy, rx, ry = rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height, width / 5, height / 4
    image[((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1] = rng.uniform(0, 255, 3)
    return np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)


def cub_release(root: Path, splits: dict[str, int] = SPLITS, seed: int = 0) -> Path:
    """Koh et al.'s split pickles and the CUB images under ``root`` (module docstring); returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    class_attributes = rng.integers(0, 2, (len(CLASSES), len(CUB_SELECTED)))   # class-level, as in _10
    folder = root / "CUB_processed" / "class_attr_data_10"
    folder.mkdir(parents=True, exist_ok=True)
    image_id = 0
    for split, count in splits.items():
        records = []
        for i in range(count):
            image_id += 1
            cls = i % len(CLASSES)
            name, stem = CLASSES[cls]
            relative = f"{name}/{stem}_{image_id:04d}_{700 + 13 * image_id}.jpg"
            path = root / "CUB_200_2011" / "images" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(_bird(rng, SIZES[image_id % len(SIZES)])).save(path, format="JPEG", quality=90)
            certainty = rng.integers(1, 5, 312)
            raw = rng.integers(0, 2, 312)
            uncertain = np.where(raw == 1, np.array([0, 0, 0.5, 0.75, 1])[certainty],
                                 np.array([0, 0, 0.5, 0.25, 0])[certainty])
            records.append({"id": image_id, "img_path": f"{AUTHORS_ROOT}/{relative}", "class_label": cls,
                            "attribute_label": list(class_attributes[cls].astype(np.int64)),
                            "attribute_certainty": [int(c) for c in certainty],
                            "uncertain_attribute_label": [float(u) for u in uncertain]})
        with open(folder / f"{split}.pkl", "wb") as f:
            pickle.dump(records, f, protocol=3)
    return root


def resnet34_weights(path: Path) -> Path:
    """A ResNet-34 ImageNet-format state_dict (``conv1``, ``bn1``, ``layer1..4``, ``fc`` 1000 classes) with random
    values, saved with ``torch.save`` as torchvision's ``resnet34-*.pth`` is."""
    import timm
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(timm.create_model("resnet34", pretrained=False, num_classes=1000).state_dict(), path)
    return path


def cub(folder: Path) -> list[str]:
    """The config's ``data/CUB`` and ``data/resnet34_imagenet.pth`` (relative paths, under the working folder)."""
    root = cub_release(folder / "data" / "CUB")
    resnet34_weights(folder / "data" / "resnet34_imagenet.pth")
    return [f"--data.init_args.data_dir={root}", "--data.init_args.num_workers=0"]


CASES = {
    "configs/ec_cem/paper.yaml": Case(
        cub, args=("--data.init_args.batch_size=64",), release_format=FORMAT,
        note="batch 64 instead of 256: at batch 64 a training step took 34 s on one core and saved 4.1 GB of "
             "activations (65 MB per image), so 256 would need about 16.5 GB of activations and over 2 min a step; "
             "64 is the largest power of two within 8 GiB",
        test_args=("--data.init_args.batch_size=4",)),
}
