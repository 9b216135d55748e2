"""InfoGeo's paper config: train on University-1652, test on SUES-200 at 150 m (``configs/infogeo/paper.yaml``).

Written as the releases lay them out (every image 512 x 512 RGB):

* ``data/University-1652`` (github.com/layumi/University1652-Baseline, README "About Dataset"):
  ``train/drone/<4-digit id>/image-01.jpeg ...`` (the drone flight's frames), ``train/satellite/<id>/<id>.jpg``,
  ``test/query_drone/<id>/image-NN.jpeg`` and ``test/gallery_satellite/<id>/<id>.jpg`` (the gallery also holds
  locations without queries, the release's distractors); ids as the release numbers them (``0000`` is a test id).
* ``data/SUES-200-512x512`` after the release's ``script/split_datasets.py`` (github.com/Reza-Zhu/SUES-200-Benchmark):
  ``Training/150/{drone,satellite}/<id>/`` and ``Testing/150/{query_drone,gallery_satellite}/<id>/``, drone frames
  ``0.jpg ... 49.jpg`` and one satellite tile ``0.png`` per location; the split script copies every location's tile
  into ``gallery_satellite`` and every frame into ``gallery_drone`` (training locations included), the test
  locations' tiles also into ``query_satellite``.

The frozen DINOv2 ViT-B/14 is built from ``data/weights/vit_base_patch14_dinov2.lvd142m.safetensors`` as the config
says; the released weights are not here, so a randomly initialised timm state_dict of the same model is written in
their place (same names and shapes: the 518 px model's 37 x 37 + 1 position embedding, which timm resamples to
448 px's 32 x 32 when it loads the file, as it does for the released weights).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

SIDE = 512
FORMAT = ("University-1652 (train/drone/<id>/image-NN.jpeg, train/satellite/<id>/<id>.jpg, test/query_drone, "
          "test/gallery_satellite; 4 training locations x 4 drone images, 4 test locations x 2 queries, 5 gallery "
          "tiles) + SUES-200-512x512 split layout (Testing/150/query_drone/<id>/<n>.jpg, gallery_satellite/<id>/0.png; "
          "Training/150/...); 512 x 512 RGB; random DINOv2 ViT-B/14 weights as the config's .safetensors file")


def _scene(rng: np.random.Generator, location: int, view: int) -> np.ndarray:
    """A 512 x 512 x 3 uint8 aerial-looking picture of a location: blocks ("buildings") placed by the location id,
    the view adding a shift and its own lighting."""
    layout = np.random.default_rng(1000 + location)
    image = np.empty((SIDE, SIDE, 3))
    image[:] = layout.uniform(70, 140, 3)
    shift = rng.integers(-40, 41, 2) if view else np.zeros(2, int)
    for _ in range(6):
        x, y = layout.integers(40, SIDE - 140, 2) + shift
        w, h = layout.integers(40, 120, 2)
        image[max(y, 0):max(y + h, 0), max(x, 0):max(x + w, 0)] = layout.uniform(0, 255, 3)
    image = image * rng.uniform(0.85, 1.15) + rng.normal(0, 4, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _save(image: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path, **({"format": "JPEG", "quality": 90} if path.suffix in (".jpg", ".jpeg")
                                         else {"format": "PNG"}))


def university1652(root: Path, train: int = 4, drone_views: int = 4, test: int = 4, queries: int = 2,
                   distractors: int = 1, seed: int = 0) -> Path:
    """University-1652's drone and satellite folders (module docstring) under ``root``."""
    rng = np.random.default_rng(seed)
    for i in range(train):
        loc = f"{i + 1:04d}"
        _save(_scene(rng, i + 1, 0), root / "train" / "satellite" / loc / f"{loc}.jpg")
        for v in range(drone_views):
            _save(_scene(rng, i + 1, v + 1), root / "train" / "drone" / loc / f"image-{v + 1:02d}.jpeg")
    for i in range(test + distractors):
        loc = f"{i:04d}"
        _save(_scene(rng, 500 + i, 0), root / "test" / "gallery_satellite" / loc / f"{loc}.jpg")
        if i < test:
            for v in range(queries):
                _save(_scene(rng, 500 + i, v + 1), root / "test" / "query_drone" / loc / f"image-{v + 1:02d}.jpeg")
    return root


def sues200(root: Path, altitude: int = 150, train: int = 2, test: int = 3, frames: int = 2, seed: int = 1) -> Path:
    """SUES-200-512x512 as ``script/split_datasets.py`` leaves it (module docstring), one altitude."""
    rng = np.random.default_rng(seed)
    for i in range(train + test):
        loc, scene = f"{i + 1:04d}", 2000 + i
        tile = _scene(rng, scene, 0)
        _save(tile, root / "Testing" / str(altitude) / "gallery_satellite" / loc / "0.png")
        split = ("Training", "drone", "satellite") if i < train else ("Testing", "query_drone", "query_satellite")
        _save(tile, root / split[0] / str(altitude) / split[2] / loc / "0.png")
        for f in range(frames):
            frame = _scene(rng, scene, f + 1)
            _save(frame, root / split[0] / str(altitude) / split[1] / loc / f"{f}.jpg")
            _save(frame, root / "Testing" / str(altitude) / "gallery_drone" / loc / f"{f}.jpg")
    return root


def dinov2_weights(path: Path) -> Path:
    """A random ``vit_base_patch14_dinov2`` timm state_dict saved as safetensors (module docstring)."""
    import timm
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    state = timm.create_model("vit_base_patch14_dinov2", pretrained=False, num_classes=0).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def univ_to_sues(folder: Path) -> list[str]:
    """The config's three local inputs under the working folder; returns the data flags."""
    data = folder / "data"
    dinov2_weights(data / "weights" / "vit_base_patch14_dinov2.lvd142m.safetensors")
    return [f"--data.init_args.data_dir={university1652(data / 'University-1652')}",
            f"--data.init_args.test_data_dir={sues200(data / 'SUES-200-512x512')}",
            "--data.init_args.num_workers=0"]


CASES = {"configs/infogeo/paper.yaml": Case(
    univ_to_sues, args=("--trainer.max_epochs=2",), release_format=FORMAT,
    note="max_epochs 2 instead of 1: the step-2 checkpoint is written at the end of a train epoch stopped by "
         "max_steps, so the resumed fit starts the next epoch, which max_epochs=1 leaves no room for (the 3 steps are "
         "far from either epoch limit; the learning-rate schedule is set by total_steps, not by the epochs)",
    test_args=("--model.init_args.image_size=112", "--data.init_args.image_size=112"))}
