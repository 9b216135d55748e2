"""Cross-view (drone -> satellite) geo-localisation data: an embedded procedural generator and the University-1652,
SUES-200 and DenseUAV folder layouts (InfoGeo, arXiv 2605.07099).

Batches: training ``(drone [B, 3, S, S], satellite [B, 3, S, S], location [B])``, one drone image paired with a
satellite image of its location (``satellite_pairing``, below), from `UniqueLocationBatchSampler` (no location
twice in a batch: the InfoNCE negatives are the other locations); evaluation ``(image, location, is_query)`` over
one set that holds the drone queries (``is_query`` true) and the satellite gallery; prediction the same as test.

Datasets
--------
* ``synthetic`` (embedded, seeded): each location is a scene of 3-6 coloured primitives (rectangles, ellipses,
  triangles from an 8-colour palette) on the unit square. The satellite view is the scene rendered top-down. A drone
  view renders it through a random affine camera (rotation +-45 deg, scale 0.8-1.2, shear +-0.15, shift +-0.1),
  with colour jitter (brightness 0.8-1.2, channel gains 0.9-1.1), 5-15 view-specific clutter primitives from the
  same palette and a weather corruption (none, fog or sensor noise). ``train_locations`` locations with
  ``train_views`` drone views each; validation: ``val_locations`` other locations at the training level; test:
  ``test_locations`` unseen locations with ``eval_views`` drone queries each at ``test_level`` ``clean`` (the
  training distribution) or ``shifted`` (15-25 clutter primitives and an unseen weather: dusk colour cast plus
  rain streaks). Backgrounds are drawn per image, so only the object layout identifies a location.
* ``university1652``: ``data_dir/train/{drone,satellite}/<id>/*`` and
  ``data_dir/test/{query_drone,gallery_satellite}/<id>/*``.
* ``sues200``: ``data_dir/Training/<altitude>/{drone,satellite}/<id>/*`` and
  ``data_dir/Testing/<altitude>/{query_drone,gallery_satellite}/<id>/*`` (the released split script's layout;
  ``altitude`` 150, 200, 250 or 300).
* ``denseuav``: the release of github.com/Dmmm1997/DenseUAV (README "About Dataset"): ``train/drone/<id>/``
  ``H80.JPG, H90.JPG, H100.JPG`` (three flight heights) and ``train/satellite/<id>/`` six 512 x 512 satellite tiles,
  ``H80.tif, H90.tif, H100.tif`` and the older imagery ``H80_old.tif, H90_old.tif, H100_old.tif`` (written by
  ``tool/dataset_preprocess/2-generate_new_croped_resized_images_difheights.py``); the test folders
  ``test/query_drone/<id>/`` and ``test/gallery_satellite/<id>/`` that the release's ``test.py`` reads with
  torchvision's ``ImageFolder`` (the gallery holds every satellite tile of every location, training locations
  included, each a gallery image of its location: a query is answered by any of its location's tiles).

Files are read as the official loaders read them (``PIL.Image.open(path).convert("RGB")``: DenseUAV's
``Dataloader_University.sample_from_cls`` for training, torchvision's ``pil_loader`` in ``test.py``), with the
extensions torchvision's ``ImageFolder`` accepts (``VIEW_EXTENSIONS``, TIFF included). 8-bit images (RGB, RGBA,
grey, palette, CMYK, ...) are converted to RGB; a 16-bit or float image (PIL mode ``I;16``, ``I``, ``F``), which
``convert("RGB")`` would clip to 255, and any other file in a location folder are one `UserInputError` naming the
file.

Training pairs (``satellite_pairing``): a location may have several satellite images (DenseUAV: six).
``random`` (default) pairs each drone image, every time it is visited, with one of its location's satellite images
drawn at random (seeded by ``seed``, epoch and process), as DenseUAV's ``Dataloader_University`` draws a satellite
image of the location per sample; ``all`` makes every (drone image, satellite image) pair of a location one
training example (the pairing of Game4Loc's ``DenseUAVDatasetTrain``, ``game4loc/dataset/denseuav_extend.py`` of
github.com/Yux1angJi/GTA-UAV, the code base InfoGeo's release builds on), so an epoch visits each drone image once
per satellite image. With one satellite image per location (University-1652, SUES-200) both are the same.

The training source is ``dataset`` / ``data_dir``; the test set is ``test_dataset`` / ``test_data_dir`` (defaults:
the same), so the paper's cross-dataset protocol (train on University-1652, test on SUES-200) is one config.
Validation on a folder dataset is the training source's own test split (the cross-dataset target is never used for
selection). Images are resized to ``image_size`` and normalised with the ImageNet statistics (DINOv2's); ``flip``
mirrors a training pair's two images together (the release's p = 0.5). A location folder id ``-1`` marks junk
gallery images (dropped by the metric). Missing folders, unreadable images and query locations absent from the
gallery are one `UserInputError` each.
"""
from __future__ import annotations

import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from datamodules.readers import FileImages, require_data_dir
from datamodules.sampling import evaluation_sampler, mix_seed
from lightning_modules.shared.errors import UserInputError, check_range

DATASETS = ("synthetic", "university1652", "sues200", "denseuav")
PAIRINGS = ("random", "all")
# torchvision's ImageFolder extensions (IMG_EXTENSIONS), with which the releases' test scripts read the view folders
VIEW_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# PIL modes that convert("RGB") maps without loss of range (8 bits per channel); I;16*, I and F are refused
EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"})
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PALETTE = np.array([[0.90, 0.10, 0.10], [0.10, 0.70, 0.15], [0.15, 0.25, 0.90], [0.95, 0.85, 0.10],
                    [0.90, 0.45, 0.05], [0.60, 0.15, 0.75], [0.05, 0.80, 0.85], [0.95, 0.95, 0.95]])
TRAIN_WEATHERS = ("none", "fog", "noise")
STREAMS = {"train": 11, "val": 12, "test": 13}           # seed streams of the synthetic splits
LEVELS = {"train": (5, 15, TRAIN_WEATHERS), "clean": (5, 15, TRAIN_WEATHERS), "shifted": (15, 25, ("dusk_rain",))}


# ============================================================================================ the generator
def random_scene(rng: np.random.Generator, low: int = 3, high: int = 6, extent: float = 0.7,
                 sizes: tuple[float, float] = (0.12, 0.3)) -> list[tuple]:
    """Primitives ``(kind, cx, cy, sx, sy, angle, rgb)`` with centres in [-extent, extent]^2."""
    prims = []
    for _ in range(int(rng.integers(low, high + 1))):
        kind = int(rng.integers(3))
        cx, cy = rng.uniform(-extent, extent, 2)
        sx, sy = rng.uniform(*sizes, 2)
        colour = np.clip(PALETTE[rng.integers(len(PALETTE))] + rng.normal(0, 0.04, 3), 0, 1)
        prims.append((kind, cx, cy, sx, sy, rng.uniform(0, np.pi), colour))
    return prims


def _paint(image: np.ndarray, px: np.ndarray, py: np.ndarray, prims: list[tuple]) -> None:
    for kind, cx, cy, sx, sy, angle, colour in prims:
        c, s = np.cos(angle), np.sin(angle)
        dx, dy = px - cx, py - cy
        u, v = c * dx + s * dy, -s * dx + c * dy
        if kind == 0:
            inside = (np.abs(u) <= sx) & (np.abs(v) <= sy)
        elif kind == 1:
            inside = (u / sx) ** 2 + (v / sy) ** 2 <= 1
        else:
            inside = (v >= -sy) & (v <= sy) & (np.abs(u) <= sx * (sy - v) / (2 * sy))
        image[inside] = colour


def render(prims: list[tuple], size: int, rng: np.random.Generator, camera: np.ndarray | None = None,
           clutter: list[tuple] = (), background_jitter: float = 0.08) -> np.ndarray:
    """H x W x 3 image in [0, 1]: pixel coordinates in [-1, 1]^2 are mapped through ``camera`` (2 x 3 affine,
    image -> scene) before painting the scene; ``clutter`` is painted in image coordinates on top."""
    grid = (np.arange(size) + 0.5) / size * 2 - 1
    gx, gy = np.meshgrid(grid, grid)
    base = np.array([0.45, 0.5, 0.4]) + rng.normal(0, background_jitter, 3)
    image = np.empty((size, size, 3))
    image[:] = np.clip(base, 0, 1)
    image += rng.normal(0, 0.02, (size, size, 3))
    if camera is None:
        sx_, sy_ = gx, gy
    else:
        sx_ = camera[0, 0] * gx + camera[0, 1] * gy + camera[0, 2]
        sy_ = camera[1, 0] * gx + camera[1, 1] * gy + camera[1, 2]
    _paint(image, sx_, sy_, prims)
    _paint(image, gx, gy, list(clutter))
    return image


def drone_view(prims: list[tuple], size: int, rng: np.random.Generator, level: str) -> np.ndarray:
    """One drone image of a scene at ``level`` (``train``/``clean`` or ``shifted``; module docstring)."""
    low, high, weathers = LEVELS[level]
    angle = np.deg2rad(rng.uniform(-45, 45))
    scale = rng.uniform(0.8, 1.2)
    shear = rng.uniform(-0.15, 0.15)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    linear = rot @ np.array([[1.0, shear], [0.0, 1.0]]) / scale
    camera = np.concatenate([linear, rng.uniform(-0.1, 0.1, (2, 1))], 1)
    clutter = random_scene(rng, low, high, extent=0.95, sizes=(0.03, 0.1))
    image = render(prims, size, rng, camera, clutter)
    image = image * rng.uniform(0.8, 1.2) * rng.uniform(0.9, 1.1, 3)
    weather = weathers[int(rng.integers(len(weathers)))]
    if weather == "fog":
        amount = rng.uniform(0.2, 0.5)
        image = (1 - amount) * image + amount * np.array([0.8, 0.8, 0.82])
    elif weather == "noise":
        image = image + rng.normal(0, rng.uniform(0.05, 0.15), image.shape)
    elif weather == "dusk_rain":       # unseen in training: dark blue cast and bright diagonal streaks
        image = image * rng.uniform(0.45, 0.65) * np.array([0.8, 0.9, 1.25])
        yy, xx = np.mgrid[0:size, 0:size]
        phase = rng.uniform(0, 7, size=1)
        streaks = ((xx + 0.6 * yy + phase) % 7 < 1) & (rng.random((size, size)) < 0.6)
        image[streaks] = image[streaks] * 0.3 + 0.7 * np.array([0.85, 0.85, 0.9])
    return np.clip(image, 0, 1)


def synthetic_split(split: str, locations: int, views: int, size: int, seed: int, level: str = "train",
                    first_id: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(drone uint8 [L*views, 3, S, S], drone ids, satellite uint8 [L, 3, S, S], satellite ids)."""
    drones, sats = [], []
    for loc in range(locations):
        rng = np.random.default_rng(mix_seed(seed, STREAMS[split], loc))
        prims = random_scene(rng)
        sats.append(render(prims, size, rng))
        view_rng = np.random.default_rng(mix_seed(seed, STREAMS[split], loc, 1 + ("shifted" == level)))
        drones += [drone_view(prims, size, view_rng, level) for _ in range(views)]

    def pack(images):
        return torch.from_numpy((np.stack(images) * 255).round().astype(np.uint8)).permute(0, 3, 1, 2).contiguous()

    ids = torch.arange(first_id, first_id + locations)
    return pack(drones), ids.repeat_interleave(views), pack(sats), ids


# ============================================================================================ folder layouts
def _id_folders(root: str, what: str) -> list[str]:
    if not os.path.isdir(root):
        raise UserInputError(f"{what}: folder '{root}' is missing (expected <location id>/ subfolders of images).")
    names = sorted(n for n in os.listdir(root) if not n.startswith(".") and os.path.isdir(os.path.join(root, n)))
    if not names:
        raise UserInputError(f"{what}: '{root}' has no location subfolders.")
    return names


def scan_view(root: str, what: str, ids: dict[str, int]) -> tuple[list[str], list[int]]:
    """Image paths (sorted by name) and location indices of ``root/<id>/*`` (ids are registered in ``ids``;
    '-1' = junk). Hidden files are ignored; any other file that is not a `VIEW_EXTENSIONS` image is an error."""
    paths, labels = [], []
    for name in _id_folders(root, what):
        folder = os.path.join(root, name)
        entries = sorted(f for f in os.listdir(folder) if not f.startswith("."))
        files = [f for f in entries if os.path.splitext(f)[1].lower() in VIEW_EXTENSIONS]
        other = [f for f in entries if f not in files]
        if other:
            raise UserInputError(f"{what}: '{os.path.join(folder, other[0])}' is not an image "
                                 f"({', '.join(VIEW_EXTENSIONS)}; {len(other)} such entries in this folder). "
                                 "Move it out of the view folder.")
        if not files:
            raise UserInputError(f"{what}: location folder '{folder}' has no images ({', '.join(VIEW_EXTENSIONS)}).")
        label = -1 if name == "-1" else ids.setdefault(name, len(ids))
        paths += [os.path.join(folder, f) for f in files]
        labels += [label] * len(files)
    return paths, labels


def folder_layout(dataset: str, root: str, altitude: int) -> dict[str, str]:
    """The four view folders of a dataset: train drone / satellite, test query drone / gallery satellite."""
    if dataset in ("university1652", "denseuav"):
        return {"drone": os.path.join(root, "train", "drone"), "satellite": os.path.join(root, "train", "satellite"),
                "query": os.path.join(root, "test", "query_drone"),
                "gallery": os.path.join(root, "test", "gallery_satellite")}
    if dataset == "sues200":
        if altitude not in (150, 200, 250, 300):
            raise UserInputError(f"altitude={altitude}: SUES-200 has 150, 200, 250 and 300 (metres).")
        train, test = os.path.join(root, "Training", str(altitude)), os.path.join(root, "Testing", str(altitude))
        return {"drone": os.path.join(train, "drone"), "satellite": os.path.join(train, "satellite"),
                "query": os.path.join(test, "query_drone"), "gallery": os.path.join(test, "gallery_satellite")}
    raise UserInputError(f"dataset={dataset!r}: choose one of {', '.join(DATASETS)}.")


def check_queries_in_gallery(query_ids: Tensor, gallery_ids: Tensor, where: str) -> None:
    missing = ~torch.isin(query_ids, gallery_ids[gallery_ids != -1])
    if missing.any():
        raise UserInputError(f"{where}: {int(missing.sum())} drone queries belong to locations with no satellite "
                             "gallery image. Every query location needs a gallery folder of the same id.")


# ============================================================================================ datasets, sampler
class ViewImages(FileImages):
    """View images read as the releases read them: ``PIL.Image.open(path).convert("RGB")`` (JPEG, PNG, TIFF, ...),
    then resized to ``size`` x ``size``. Images of more than 8 bits per channel are refused (module docstring)."""

    def pixels(self, i: int) -> Tensor:
        from PIL import Image

        path = self.paths[i]
        try:
            with Image.open(path) as img:
                mode = img.mode
                if mode in EIGHT_BIT_MODES:
                    array = np.asarray(img.convert("RGB").resize((self.size, self.size), Image.BILINEAR),
                                       dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise UserInputError(f"image '{path}' could not be read ({type(err).__name__}: {err}). Replace or "
                                 "remove the file (it is truncated or not an image PIL can read).") from None
        if mode not in EIGHT_BIT_MODES:
            raise UserInputError(f"image '{path}' has PIL mode {mode}, not 8 bits per channel: the release's loader, "
                                 "convert('RGB'), would clip 16-bit or float pixels to 255. Convert the file to 8-bit "
                                 "RGB (rescale to 0-255 first).")
        return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0


class _Images:
    """Uniform access to in-memory uint8 images or files: ``get(i)`` -> normalised float tensor."""

    def __init__(self, source, mean: tuple, std: tuple) -> None:
        self.source = source
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __len__(self) -> int:
        return len(self.source) if isinstance(self.source, Tensor) else len(self.source.paths)

    def get(self, i: int) -> Tensor:
        raw = self.source[i].float() / 255 if isinstance(self.source, Tensor) else self.source.pixels(i)
        return (raw - self.mean) / self.std


class PairDataset(Dataset):
    """Training examples: a drone image and a satellite image of its location (``pairing``, module docstring).

    ``random``: example ``k`` is drone image ``k``; its satellite image is ``satellites[location][pick % n]`` for
    the ``pick`` the batch sampler draws per visit (0 when indexed without one). ``all``: one example per
    (drone image, satellite image) pair of a location. ``ids`` holds each example's location. Indexed by a whole
    batch, a list of ``(index, flip[, pick])`` from `UniqueLocationBatchSampler`, it returns the collated batch."""

    def __init__(self, drone: _Images, drone_ids: Tensor, satellite: _Images, satellite_ids: Tensor,
                 pairing: str = "random") -> None:
        if pairing not in PAIRINGS:
            raise UserInputError(f"satellite_pairing={pairing!r}: choose one of {', '.join(PAIRINGS)}.")
        self.drone, self.satellite, self.pairing = drone, satellite, pairing
        self.satellites: dict[int, list[int]] = {}
        for j, loc in enumerate(satellite_ids.tolist()):
            self.satellites.setdefault(loc, []).append(j)
        missing = sorted(set(drone_ids.tolist()) - set(self.satellites))
        if missing:
            raise UserInputError(f"training: drone locations {missing[:8]} have no satellite image "
                                 "(every drone location folder needs a satellite folder of the same id).")
        drones, sats = [], []
        for i, loc in enumerate(drone_ids.tolist()):
            chosen = self.satellites[loc] if pairing == "all" else [-1]      # -1: drawn per visit
            drones += [i] * len(chosen)
            sats += chosen
        self.drone_index, self.sat_index = torch.tensor(drones), torch.tensor(sats)
        self.ids = drone_ids[self.drone_index]

    def __len__(self) -> int:
        return len(self.ids)

    def satellite_index(self, k: int, pick: int = 0) -> int:
        """The satellite image of example ``k`` (``pick`` selects among its location's images under ``random``)."""
        fixed = int(self.sat_index[k])
        if fixed >= 0:
            return fixed
        options = self.satellites[int(self.ids[k])]
        return options[pick % len(options)]

    def pair(self, k: int, flip: bool = False, pick: int = 0) -> tuple[Tensor, Tensor]:
        drone = self.drone.get(int(self.drone_index[k]))
        sat = self.satellite.get(self.satellite_index(k, pick))
        return (drone.flip(-1), sat.flip(-1)) if flip else (drone, sat)

    def __getitem__(self, batch):
        if isinstance(batch, int):
            return (*self.pair(batch), self.ids[batch])
        pairs = [self.pair(*item) for item in batch]
        index = torch.tensor([item[0] for item in batch])
        return torch.stack([d for d, _ in pairs]), torch.stack([s for _, s in pairs]), self.ids[index]


class RetrievalDataset(Dataset):
    """Gallery images first, then the queries: ``(image, location, is_query)``."""

    def __init__(self, query: _Images, query_ids: Tensor, gallery: _Images, gallery_ids: Tensor) -> None:
        self.query, self.gallery = query, gallery
        self.ids = torch.cat([gallery_ids, query_ids]).long()
        self.num_gallery = len(gallery_ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        is_query = i >= self.num_gallery
        image = self.query.get(i - self.num_gallery) if is_query else self.gallery.get(i)
        return image, self.ids[i], torch.tensor(is_query)


class UniqueLocationBatchSampler(DistributedSampler):
    """Batches of training indices with no location twice, a pure function of (seed, epoch); sharded under DDP.

    Each location's examples are shuffled, then visited in rounds (round j takes the j-th example of every location
    that has one, locations in a fresh random order); the stream of rounds is cut into batches of ``batch_size``,
    closing a batch early where the next example's location is already in it. Batches of one example are dropped
    (InfoNCE needs negatives). Under DDP every process takes every world_size-th batch of the same list, truncated
    to a multiple of world_size. Each yielded batch is a list of ``(index, flip, pick)`` (flip drawn with p = 1/2
    when ``flip``; ``pick`` a random integer that selects the satellite image under ``satellite_pairing: random``,
    from its own seed stream), read whole by `PairDataset` (``DataLoader(batch_size=None)``). It is a
    ``DistributedSampler`` only so that Lightning leaves it in place under DDP (it shards itself)."""

    def __init__(self, dataset: Dataset, labels: Tensor, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, flip: bool = False) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False, seed=seed)
        self.labels, self.batch_size, self.flip = labels.tolist(), int(batch_size), flip

    def batches(self) -> list[list[int]]:
        """This process's batches of indices for the current epoch."""
        rng = np.random.default_rng(mix_seed(self.seed, 22, self.epoch))
        groups: dict[int, list[int]] = {}
        for i, loc in enumerate(self.labels):
            groups.setdefault(loc, []).append(i)
        members = [list(rng.permutation(v)) for v in groups.values()]
        stream = []
        for j in range(max(len(m) for m in members)):
            stream += [int(members[k][j]) for k in rng.permutation(len(members)) if j < len(members[k])]
        batches, current, seen = [], [], set()
        for i in stream:
            if len(current) == self.batch_size or self.labels[i] in seen:
                batches.append(current)
                current, seen = [], set()
            current.append(i)
            seen.add(self.labels[i])
        batches.append(current)
        batches = [b for b in batches if len(b) > 1]
        usable = len(batches) // self.num_replicas * self.num_replicas
        return batches[self.rank:usable:self.num_replicas]

    def __iter__(self):
        batches = self.batches()
        rng = np.random.default_rng(mix_seed(self.seed, 23, self.epoch, self.rank))
        pick_rng = np.random.default_rng(mix_seed(self.seed, 24, self.epoch, self.rank))
        for batch in batches:
            flips = rng.random(len(batch)) < 0.5 if self.flip else np.zeros(len(batch), dtype=bool)
            picks = pick_rng.integers(0, 2 ** 62, len(batch))
            yield [(i, bool(f), int(p)) for i, f, p in zip(batch, flips, picks)]

    def __len__(self) -> int:
        return len(self.batches())


# ============================================================================================ the datamodule
class GeoLocalizationDataModule(LightningDataModule):
    """Drone -> satellite retrieval data (module docstring).

    Args:
        dataset / data_dir: training source (``synthetic`` needs no files).
        test_dataset / test_data_dir: test source (default: the training source).
        altitude: SUES-200 flight height (for either source).
        image_size: side of the square images.
        batch_size: training pairs per batch (distinct locations); eval_batch_size: evaluation images per batch.
        flip: mirror training pairs at random (both views together).
        train_locations / val_locations / test_locations / train_views / eval_views: synthetic sizes.
        test_level: synthetic test difficulty, ``clean`` or ``shifted``.
        seed: generator, sampler and flip seed.
        satellite_pairing: ``random`` or ``all``: which satellite images of a location the training pairs use
            (module docstring).
    """

    def __init__(self, dataset: Literal["synthetic", "university1652", "sues200", "denseuav"] = "synthetic",
                 data_dir: str | None = None, test_dataset: str | None = None, test_data_dir: str | None = None,
                 altitude: int = 150, image_size: int = 32, batch_size: int = 16, eval_batch_size: int = 64,
                 flip: bool = False, train_locations: int = 300, val_locations: int = 50, test_locations: int = 100,
                 train_views: int = 4, eval_views: int = 2, test_level: Literal["clean", "shifted"] = "clean",
                 num_workers: int = 0, seed: int = 42, satellite_pairing: Literal["random", "all"] = "random") -> None:
        super().__init__()
        if dataset not in DATASETS or (test_dataset is not None and test_dataset not in DATASETS):
            raise UserInputError(f"dataset={dataset!r}, test_dataset={test_dataset!r}: choose from "
                                 f"{', '.join(DATASETS)}.")
        if satellite_pairing not in PAIRINGS:
            raise UserInputError(f"satellite_pairing={satellite_pairing!r}: choose one of {', '.join(PAIRINGS)}.")
        if test_level not in ("clean", "shifted"):
            raise UserInputError(f"test_level={test_level!r}: choose clean or shifted.")
        check_range("batch_size", batch_size, 2)
        for name, value in (("image_size", image_size), ("eval_batch_size", eval_batch_size),
                            ("train_locations", train_locations), ("val_locations", val_locations),
                            ("test_locations", test_locations), ("train_views", train_views),
                            ("eval_views", eval_views)):
            check_range(name, value, 1)
        self.save_hyperparameters()
        self.image_size = image_size
        self.train_set: PairDataset | None = None
        self.val_set: RetrievalDataset | None = None
        self.test_set: RetrievalDataset | None = None

    # ------------------------------------------------------------------------------------------ building
    def _stats(self, dataset: str) -> tuple[tuple, tuple]:
        return ((0.5,) * 3, (0.5,) * 3) if dataset == "synthetic" else (IMAGENET_MEAN, IMAGENET_STD)

    def _folder(self, dataset: str, data_dir: str | None) -> dict[str, str]:
        root = require_data_dir(data_dir, dataset, "the dataset's view folders (see datamodules/geo_localization.py)")
        return folder_layout(dataset, root, self.hparams.altitude)

    def _folder_retrieval(self, dataset: str, data_dir: str | None) -> RetrievalDataset:
        layout, ids = self._folder(dataset, data_dir), {}
        mean, std = self._stats(dataset)
        g_paths, g_ids = scan_view(layout["gallery"], f"{dataset} gallery", ids)
        q_paths, q_ids = scan_view(layout["query"], f"{dataset} query", ids)
        g_ids, q_ids = torch.tensor(g_ids), torch.tensor(q_ids)
        check_queries_in_gallery(q_ids, g_ids, f"{dataset} '{layout['query']}'")
        size = self.hparams.image_size
        return RetrievalDataset(_Images(ViewImages(q_paths, q_ids, size), mean, std), q_ids,
                                _Images(ViewImages(g_paths, g_ids, size), mean, std), g_ids)

    def _synthetic_retrieval(self, split: str, level: str) -> RetrievalDataset:
        hp = self.hparams
        locations = hp.val_locations if split == "val" else hp.test_locations
        drone, drone_ids, sat, sat_ids = synthetic_split(split, locations, hp.eval_views, hp.image_size, hp.seed,
                                                         level)
        mean, std = self._stats("synthetic")
        return RetrievalDataset(_Images(drone, mean, std), drone_ids, _Images(sat, mean, std), sat_ids)

    def retrieval_set(self, level: str) -> RetrievalDataset:
        """The test set at ``level`` (``clean`` / ``shifted``; synthetic only) or the configured test source."""
        hp = self.hparams
        test_dataset = hp.test_dataset or hp.dataset
        if test_dataset == "synthetic":
            return self._synthetic_retrieval("test", level)
        return self._folder_retrieval(test_dataset, hp.test_data_dir or hp.data_dir)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if stage in ("fit", None) and self.train_set is None:
            if hp.dataset == "synthetic":
                drone, drone_ids, sat, sat_ids = synthetic_split("train", hp.train_locations, hp.train_views,
                                                                 hp.image_size, hp.seed)
                mean, std = self._stats("synthetic")
                self.train_set = PairDataset(_Images(drone, mean, std), drone_ids, _Images(sat, mean, std), sat_ids,
                                             hp.satellite_pairing)
            else:
                layout, ids = self._folder(hp.dataset, hp.data_dir), {}
                mean, std = self._stats(hp.dataset)
                s_paths, s_ids = scan_view(layout["satellite"], f"{hp.dataset} train satellite", ids)
                d_paths, d_ids = scan_view(layout["drone"], f"{hp.dataset} train drone", ids)
                s_ids, d_ids = torch.tensor(s_ids), torch.tensor(d_ids)
                self.train_set = PairDataset(_Images(ViewImages(d_paths, d_ids, hp.image_size), mean, std), d_ids,
                                             _Images(ViewImages(s_paths, s_ids, hp.image_size), mean, std), s_ids,
                                             hp.satellite_pairing)
        if stage in ("fit", "validate", None) and self.val_set is None:
            self.val_set = (self._synthetic_retrieval("val", "clean") if hp.dataset == "synthetic"
                            else self._folder_retrieval(hp.dataset, hp.data_dir))
        if stage in ("test", "predict", None) and self.test_set is None:
            self.test_set = self.retrieval_set(hp.test_level)

    # ------------------------------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = UniqueLocationBatchSampler(self.train_set, self.train_set.ids, self.hparams.batch_size,
                                             self.hparams.seed, rank, world, self.hparams.flip)
        sampler.set_epoch(trainer.current_epoch if trainer is not None else 0)
        return DataLoader(self.train_set, sampler=sampler, batch_size=None, num_workers=self.hparams.num_workers)

    def eval_loader(self, dataset: RetrievalDataset) -> DataLoader:
        trainer = self.trainer
        return DataLoader(dataset, batch_size=self.hparams.eval_batch_size, shuffle=False,
                          sampler=evaluation_sampler(dataset, trainer), num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        """The test set's drone queries (``predict`` ranks each against `gallery_dataloader`)."""
        test = self.test_set
        return self.eval_loader(Subset(test, range(test.num_gallery, len(test))))

    def gallery_dataloader(self) -> DataLoader:
        """The test set's satellite gallery, whole and in order on every process (``predict`` encodes it once)."""
        test = self.test_set
        return DataLoader(Subset(test, range(test.num_gallery)), batch_size=self.hparams.eval_batch_size,
                          shuffle=False, num_workers=self.hparams.num_workers)
