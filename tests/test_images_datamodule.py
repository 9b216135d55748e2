"""Tests for `datamodules.images`: fake CIFAR-10/100 pickles and a fake ImageFolder tree written to tmp_path,
plus the embedded scikit-learn digits. Nothing here reads files outside tmp_path or downloads anything."""
from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch import LightningModule, Trainer

from datamodules.images import ImageClassificationDataModule, random_crop_flip
from datamodules.readers import stratified_split
from datamodules.sampling import EpochShuffleSampler
from lightning_modules.shared.errors import UserInputError

torch.set_num_threads(1)

CIFAR10_PER_CLASS_PER_BATCH, CIFAR100_PER_CLASS = 2, 3


# ------------------------------------------------------------------------------------------- fake data
def _write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def _cifar_batch(num_classes, per_class, rng, label_key, value=None):
    labels = np.repeat(np.arange(num_classes), per_class)
    rng.shuffle(labels)
    data = (rng.integers(0, 256, (len(labels), 3072)) if value is None
            else np.full((len(labels), 3072), value)).astype(np.uint8)
    return {b"batch_label": b"fake", b"data": data, label_key.encode(): labels.tolist(),
            b"filenames": [b"x.png"] * len(labels)}


def make_cifar10(root, seed=0):
    """cifar-10-batches-py with 5 x 20 training images (10 per class) and 20 all-white test images."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = [_cifar_batch(10, CIFAR10_PER_CLASS_PER_BATCH, rng, "labels") for _ in range(5)]
    for i, batch in enumerate(batches, 1):
        _write_pickle(folder / f"data_batch_{i}", batch)
    _write_pickle(folder / "test_batch", _cifar_batch(10, 2, rng, "labels", value=255))
    pixels = np.concatenate([b[b"data"] for b in batches]).reshape(-1, 3, 32, 32)
    labels = np.concatenate([b[b"labels"] for b in batches])
    return folder, pixels, labels


def make_cifar100(root, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    _write_pickle(folder / "train", _cifar_batch(100, CIFAR100_PER_CLASS, rng, "fine_labels"))
    _write_pickle(folder / "test", _cifar_batch(100, 1, rng, "fine_labels"))
    return folder


def make_image_folder(root, classes=("cat", "ant", "bee"), train_per_class=4, test_per_class=2):
    """Tiny PNG tree; images have different sizes (resized by the datamodule) and a class-dependent colour."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                size = (10 + 3 * i, 12 + 2 * c)
                array = rng.integers(0, 256, (size[1], size[0], 3)).astype(np.uint8)
                Image.fromarray(array).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture
def cifar10(tmp_path):
    return make_cifar10(tmp_path)


@pytest.fixture(scope="module")
def digits():
    dm = ImageClassificationDataModule(forget_class=3)
    dm.setup()
    return dm


def _all(loader):
    xs, ys = zip(*loader)
    return torch.cat(xs), torch.cat(ys)


# ------------------------------------------------------------------------------------ shapes and sizes
def test_digits_attributes_shapes_and_sizes(digits):
    fresh = ImageClassificationDataModule()
    assert (fresh.num_classes, fresh.in_channels, fresh.image_size) == (10, 1, 8)   # before setup
    assert len(digits.train_set) + len(digits.val_set) + len(digits.test_set) == 1797
    assert 355 <= len(digits.test_set) <= 365          # 20 % of every class
    x, y = digits.train_set[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long and y.ndim == 0
    xb, yb = next(iter(digits.train_dataloader()))
    assert xb.shape == (64, 1, 8, 8) and yb.shape == (64,)
    assert len(digits.predict_dataloader().dataset) == len(digits.test_set)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
@pytest.mark.parametrize("point_at", ["folder", "parent"])
def test_cifar_attributes_and_shapes(tmp_path, dataset, point_at):
    folder = make_cifar10(tmp_path)[0] if dataset == "cifar10" else make_cifar100(tmp_path)
    data_dir = folder if point_at == "folder" else tmp_path
    dm = ImageClassificationDataModule(dataset=dataset, data_dir=str(data_dir), batch_size=8)
    classes, train_total, test_total = (10, 100, 20) if dataset == "cifar10" else (100, 300, 100)
    assert (dm.num_classes, dm.in_channels, dm.image_size) == (classes, 3, 32)
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == train_total and len(dm.test_set) == test_total
    x, y = dm.test_set[0]
    assert x.shape == (3, 32, 32) and y.dtype == torch.long
    assert set(dm.train_set.labels.tolist()) == set(range(classes))
    xb, _ = next(iter(dm.val_dataloader()))
    assert xb.shape[1:] == (3, 32, 32)


def test_imagefolder_classes_sizes_and_labels(tmp_path):
    root = make_image_folder(tmp_path)
    dm = ImageClassificationDataModule(dataset="imagefolder", data_dir=str(root), resize_to=16, batch_size=4)
    assert (dm.num_classes, dm.in_channels, dm.image_size) == (3, 3, 16)
    assert dm.class_names == ["ant", "bee", "cat"]                 # sorted by name
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == 12 and len(dm.test_set) == 6
    x, y = dm.test_set[0]
    assert x.shape == (3, 16, 16) and int(y) == 0                   # first test file is ant/0.png
    assert dm.test_set.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert ImageClassificationDataModule(dataset="imagefolder", data_dir=str(root)).image_size == 32
    xs, _ = _all(dm.train_dataloader())
    assert xs.shape == (len(dm.train_set), 3, 16, 16)
    assert xs.mean(dim=(0, 2, 3)).abs().max() < 1e-4                 # stats from all training images


# ------------------------------------------------------------------------------------ normalisation
def test_cifar_stats_come_from_the_training_part_only(cifar10):
    folder, pixels, _ = cifar10
    dm = ImageClassificationDataModule(dataset="cifar10", data_dir=str(folder))
    dm.setup()
    train = pixels[dm.train_set.indices.numpy()] / 255.0
    assert torch.allclose(dm.mean, torch.tensor(train.mean(axis=(0, 2, 3)), dtype=torch.float32), atol=1e-6)
    assert torch.allclose(dm.std, torch.tensor(train.std(axis=(0, 2, 3)), dtype=torch.float32), atol=1e-6)
    with_val = pixels[np.r_[dm.train_set.indices.numpy(), dm.val_set.indices.numpy()]] / 255.0
    assert not np.allclose(dm.mean.numpy(), with_val.mean(axis=(0, 2, 3)), atol=1e-6)
    # the all-white test images map to (1 - mean) / std: the test split did not enter the statistics
    x, _ = dm.test_set[0]
    assert torch.allclose(x, ((1 - dm.mean) / dm.std).view(3, 1, 1).expand(3, 32, 32), atol=1e-5)


def test_digits_normalised_train_set_is_standardised_and_invertible(digits):
    xs, _ = _all(digits.train_dataloader())
    assert abs(xs.mean()) < 1e-4 and abs(xs.std() - 1) < 1e-3
    val, _ = _all(digits.val_dataloader())
    assert abs(val.mean()) > 1e-4                                   # val was not used for the statistics
    pixels = digits.denormalize(xs)
    assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6
    assert torch.allclose(pixels * 16, (pixels * 16).round(), atol=1e-4)   # raw digits are integers / 16
    assert torch.allclose(digits.normalize(pixels), xs, atol=1e-5)


# ---------------------------------------------------------------------------------------------- splits
def test_splits_are_deterministic_given_seed_and_differ_across_seeds():
    def build(seed):
        dm = ImageClassificationDataModule(seed=seed)
        dm.setup()
        return dm
    a, b, c = build(0), build(0), build(1)
    assert torch.equal(a.train_set.indices, b.train_set.indices)
    assert torch.equal(a.val_set.indices, b.val_set.indices)
    assert not torch.equal(a.val_set.indices, c.val_set.indices)
    assert torch.equal(a.test_set.source.data, c.test_set.source.data)   # digits test set is fixed
    both = torch.cat([a.train_set.indices, a.val_set.indices])
    assert both.unique().numel() == both.numel() == len(a.train_set.source.labels)   # disjoint, complete


def test_stratified_split_counts_by_hand():
    labels = torch.tensor([0] * 10 + [1] * 5 + [2] * 1 + [3] * 2)
    kept, held = stratified_split(labels, 0.2, seed=7)
    assert torch.bincount(labels[held], minlength=4).tolist() == [2, 1, 0, 1]   # round(.2n) in [1, n-1]
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(len(labels)))


def test_validation_split_is_stratified(digits):
    pool = torch.bincount(digits.train_set.source.labels, minlength=10)
    val = torch.bincount(digits.val_set.labels, minlength=10)
    assert torch.equal(val, torch.floor(0.1 * pool.double() + 0.5).long())
    test = torch.bincount(digits.test_set.labels, minlength=10)
    full = pool + test
    assert torch.equal(test, torch.floor(0.2 * full.double() + 0.5).long())


# ------------------------------------------------------------------------------------ forget / retain
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_forget_and_retain_loaders_hold_exactly_the_right_labels(digits, split):
    _, forget = _all(digits.forget_dataloader(split))
    _, retain = _all(digits.retain_dataloader(split))
    labels = getattr(digits, f"{split}_set").labels
    assert forget.unique().tolist() == [3] and len(forget) == int((labels == 3).sum())
    assert 3 not in retain.tolist() and len(retain) == int((labels != 3).sum())


def test_train_on_retain_drops_forget_class_but_forget_loader_keeps_it(digits):
    dm = ImageClassificationDataModule(forget_class=3, train_on="retain")
    dm.setup()
    _, train = _all(dm.train_dataloader())
    _, val = _all(dm.val_dataloader())
    assert 3 not in train.tolist() and 3 not in val.tolist()
    assert len(train) == int((digits.train_set.labels != 3).sum())
    assert len(val) == int((digits.val_set.labels != 3).sum())
    forget_x, forget_y = _all(dm.forget_dataloader("train"))
    reference_x, _ = _all(digits.forget_dataloader("train"))        # same examples as with train_on="all"
    assert len(forget_y) > 0 and torch.equal(forget_x, reference_x)
    _, test = _all(dm.test_dataloader())
    assert 3 in test.tolist()                                        # the test split is never filtered


# ----------------------------------------------------------------------------------- shuffle / resume
def test_shuffle_order_is_a_function_of_seed_and_epoch():
    walked = EpochShuffleSampler(50, seed=5)
    orders = []
    for epoch in range(3):
        walked.set_epoch(epoch)
        orders.append(list(walked))
    fresh = EpochShuffleSampler(50, seed=5)
    fresh.set_epoch(2)
    assert list(fresh) == orders[2] and sorted(orders[2]) == list(range(50))
    assert orders[0] != orders[1] != orders[2]
    other = EpochShuffleSampler(50, seed=6)
    other.set_epoch(2)
    assert list(other) != orders[2]
    restored = pickle.loads(pickle.dumps(walked))                    # ddp_spawn pickles samplers
    assert list(restored) == orders[2]


def test_shuffle_under_lightning_distributed_wrapper_is_per_epoch_and_complete():
    def ranks(epoch):
        shards = []
        for rank in range(2):
            wrapper = DistributedSamplerWrapper(EpochShuffleSampler(20, seed=1), num_replicas=2, rank=rank,
                                                shuffle=True, seed=0)
            wrapper.set_epoch(epoch)
            shards.append(list(wrapper))
        return shards
    e1, e1_again, e2 = ranks(1), ranks(1), ranks(2)
    assert e1 == e1_again and e1 != e2
    assert sorted(e1[0] + e1[1]) == list(range(20))


class _OrderRecorder(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)
        self.seen: dict[int, list[torch.Tensor]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.setdefault(self.current_epoch, []).append(x.flatten(1).sum(1))
        return F.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(max_epochs, ckpt_path=None, save_to=None):
    module = _OrderRecorder()
    trainer = Trainer(max_epochs=max_epochs, limit_train_batches=3, limit_val_batches=0, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=ImageClassificationDataModule(seed=3, batch_size=16), ckpt_path=ckpt_path)
    if save_to:
        trainer.save_checkpoint(save_to)
    return {epoch: torch.cat(batches) for epoch, batches in module.seen.items()}


def test_resuming_from_a_checkpoint_reproduces_the_data_order(tmp_path):
    straight = _fit(3)
    ckpt = str(tmp_path / "epoch1.ckpt")
    _fit(1, save_to=ckpt)
    resumed = _fit(3, ckpt_path=ckpt)
    assert sorted(resumed) == [1, 2]
    for epoch in (1, 2):
        assert torch.equal(resumed[epoch], straight[epoch])
    assert not torch.equal(straight[0], straight[1])


# ------------------------------------------------------------------------------------- augmentation
def test_augmentation_is_a_padded_shift_or_flip_and_training_only(cifar10):
    dm = ImageClassificationDataModule(dataset="cifar10", data_dir=str(cifar10[0]), augment=True)
    dm.setup()
    assert torch.equal(dm.val_set[0][0], dm.val_set[0][0])          # no augmentation outside training
    pixels = dm.train_set.source.pixels(int(dm.train_set.indices[0]))
    torch.manual_seed(0)
    draws = [random_crop_flip(pixels, 4) for _ in range(20)]
    assert any(not torch.equal(draws[0], d) for d in draws[1:])
    padded = F.pad(pixels, (4, 4, 4, 4))
    crops = {(t, s): padded[:, t:t + 32, s:s + 32] for t in range(9) for s in range(9)}
    candidates = {(t, s, flip): crop.flip(-1) if flip else crop
                  for (t, s), crop in crops.items() for flip in (False, True)}
    found = [[key for key, c in candidates.items() if torch.equal(draw, c)] for draw in draws]
    assert all(len(keys) == 1 for keys in found)                    # every draw is one padded crop (+ flip)
    assert {keys[0][2] for keys in found} == {False, True}          # both flipped and unflipped occur
    assert len({keys[0][:2] for keys in found}) > 5                 # and the crop offset varies
    x, _ = dm.train_set[0]
    assert x.shape == (3, 32, 32)


def test_datamodule_pickles_after_setup(digits):
    clone = pickle.loads(pickle.dumps(digits))
    assert torch.equal(clone.val_set[5][0], digits.val_set[5][0])
    assert torch.equal(next(iter(clone.train_dataloader()))[0], next(iter(digits.train_dataloader()))[0])


# -------------------------------------------------------------------------------------------- errors
def _raises(match, **kwargs):
    with pytest.raises(UserInputError, match=match):
        dm = ImageClassificationDataModule(**kwargs)
        dm.setup()


@pytest.mark.parametrize("kwargs, match", [
    ({"dataset": "mnist"}, "dataset='mnist' is unknown"),
    ({"dataset": "cifar10"}, "needs data_dir"),
    ({"dataset": "imagefolder"}, "needs data_dir"),
    ({"dataset": "cifar10", "data_dir": "/nonexistent/cifar"}, "'/nonexistent/cifar' does not exist"),
    ({"data_dir": "/tmp"}, "digits.*reads no files"),
    ({"augment": True}, "augment=True is not allowed for dataset='digits'"),
    ({"resize_to": 16}, "resize_to=16 does not match.*8x8"),
    ({"forget_class": 10}, r"forget_class=10 is out of range.*\[0, 9\]"),
    ({"forget_class": -1}, "forget_class=-1 is out of range"),
    ({"forget_class": True}, "forget_class=True must be an integer"),
    ({"train_on": "retain"}, "train_on='retain'.*forget_class is null"),
    ({"train_on": "forget"}, "train_on='forget' is unknown"),
    ({"val_fraction": 0.0}, "val_fraction=0.0 is out of range"),
    ({"val_fraction": 0.6}, "val_fraction=0.6 is out of range"),
    ({"batch_size": 0}, "batch_size=0 is out of range"),
    ({"num_workers": -1}, "num_workers=-1 is out of range"),
    ({"seed": -3}, "seed=-3 is out of range"),
])
def test_bad_arguments_raise_user_input_error(kwargs, match):
    _raises(match, **kwargs)


def test_loader_helpers_reject_bad_use(digits):
    with pytest.raises(UserInputError, match="split='validation' is unknown"):
        digits.forget_dataloader("validation")
    with pytest.raises(UserInputError, match="forget_class is null"):
        ImageClassificationDataModule().retain_dataloader("train")


def test_cifar_missing_file_is_named(cifar10):
    folder = cifar10[0]
    os.remove(folder / "data_batch_3")
    os.remove(folder / "test_batch")
    _raises(r"lacks data_batch_3, test_batch.*cifar-10-batches-py/data_batch_1", dataset="cifar10",
            data_dir=str(folder.parent))
    _raises("lacks train, test", dataset="cifar100", data_dir=str(folder.parent))   # wrong dataset folder
    _raises("resize_to=64 does not match.*32x32", dataset="cifar10", data_dir=str(folder), resize_to=64)


@pytest.mark.parametrize("corrupt, match", [
    (lambda b: {k: v for k, v in b.items() if k != b"labels"}, r"data_batch_2' has no key b'labels'"),
    (lambda b: {k: v for k, v in b.items() if k != b"data"}, r"data_batch_2' has no key b'data'"),
    (lambda b: {**b, b"data": b[b"data"][:, :1000]},
     r"data_batch_2'.*shape \(20, 1000\), expected \(N, 3072\)"),
    (lambda b: {**b, b"labels": b[b"labels"][:-1]}, r"data_batch_2'.*must be 20 integer labels"),
    (lambda b: {**b, b"labels": [10] * 20}, r"data_batch_2'.*labels outside \[0, 9\]"),
    (lambda b: [b], r"data_batch_2' holds a list, expected a dict"),
    (None, r"data_batch_2' is not a readable pickle"),
])
def test_cifar_malformed_pickle_is_named(cifar10, corrupt, match):
    path = cifar10[0] / "data_batch_2"
    if corrupt is None:
        path.write_bytes(b"this is not a pickle")
    else:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        _write_pickle(path, corrupt(batch))
    _raises(match, dataset="cifar10", data_dir=str(cifar10[0]))


def test_cifar100_needs_fine_labels(tmp_path):
    folder = make_cifar100(tmp_path)
    with open(folder / "test", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    batch[b"labels"] = batch.pop(b"fine_labels")
    _write_pickle(folder / "test", batch)
    _raises(r"cifar-100-python/test' has no key b'fine_labels'", dataset="cifar100", data_dir=str(folder))


def test_imagefolder_unreadable_image_is_named(tmp_path):
    root = make_image_folder(tmp_path)
    (root / "train" / "bee" / "broken.png").write_bytes(b"not a png")
    _raises(r"bee/broken.png' could not be read", dataset="imagefolder", data_dir=str(root))
    os.remove(root / "train" / "bee" / "broken.png")
    (root / "test" / "cat" / "2.jpg").write_bytes(b"\xff\xd8 truncated jpeg")   # test images load lazily
    dm = ImageClassificationDataModule(dataset="imagefolder", data_dir=str(root), batch_size=2)
    dm.setup()
    with pytest.raises(UserInputError, match=r"cat/2.jpg' could not be read"):
        _all(dm.test_dataloader())


@pytest.mark.parametrize("damage, match", [
    (lambda r: os.rename(r / "test" / "bee", r / "test" / "wasp"),
     r"test classes do not match.*missing in test/: \['bee'\].*only in test/: \['wasp'\]"),
    (lambda r: os.rename(r / "test", r / "eval"), r"test' is missing"),
    (lambda r: (r / "train" / "ant" / "notes.txt").write_text("x"), r"ant/notes.txt' is not a .png"),
    (lambda r: (r / "train" / "labels.csv").write_text("x"), r"only class subfolders.*labels.csv"),
    (lambda r: [os.remove(p) for p in (r / "train" / "ant").iterdir()], r"ant' has no images"),
])
def test_imagefolder_layout_errors(tmp_path, damage, match):
    root = make_image_folder(tmp_path)
    damage(root)
    _raises(match, dataset="imagefolder", data_dir=str(root))


def test_imagefolder_bad_image_size(tmp_path):
    root = make_image_folder(tmp_path)
    _raises("resize_to=0 is out of range", dataset="imagefolder", data_dir=str(root), resize_to=0)
    _raises(r"forget_class=3 is out of range.*\[0, 2\]", dataset="imagefolder", data_dir=str(root),
            forget_class=3)


# ------------------------------------------------------------------ release pickles, as the release writes them
class _Python2Pickler(pickle._Pickler):
    """Writes every string (keys, numpy's dtype codes, the pixel buffer) as a Python 2 ``str`` (SHORT_BINSTRING /
    BINSTRING), as the cPickle that wrote the CIFAR release did; ``encoding='bytes'`` reads them back as bytes."""
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj):
        obj = obj.encode("latin1") if isinstance(obj, str) else obj
        n = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj if n < 256
                   else pickle.BINSTRING + n.to_bytes(4, "little") + obj)
        self.memoize(obj)

    dispatch[bytes] = dispatch[str] = _save_py2_str


def _write_release_pickle(path, obj, protocol):
    if protocol == "python2":
        buffer = io.BytesIO()
        _Python2Pickler(buffer, protocol=2).dump(obj)
        data = buffer.getvalue()
    elif protocol == "numpy2":   # numpy 2 names its array reconstructor numpy._core.multiarray._reconstruct
        data = pickle.dumps(obj, protocol=2).replace(b"numpy.core.multiarray\n", b"numpy._core.multiarray\n")
        assert b"numpy.core" not in data
    else:
        data = pickle.dumps(obj, protocol=protocol)
    path.write_bytes(data)


@pytest.mark.parametrize("protocol", ["python2", "numpy2", 2, 4, 5])
def test_cifar_release_pickles_load_through_the_restricted_unpickler(tmp_path, protocol):
    """The official layout (torchvision's reader reads the same files): batches with b'data' uint8 (N, 3072) and
    b'labels' / b'fine_labels' lists, plus the class-name files, in every pickle dialect numpy arrays come in."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    batches = {name: _cifar_batch(100, per, rng, "fine_labels") for name, per in (("train", 3), ("test", 1))}
    for name, batch in batches.items():
        batch[b"coarse_labels"] = [c % 20 for c in batch[b"fine_labels"]]
        _write_release_pickle(folder / name, batch, protocol)
    fine_names = [f"class_{c:02d}".encode() for c in range(100)]
    _write_release_pickle(folder / "meta", {b"fine_label_names": fine_names,
                                            b"coarse_label_names": [b"super"] * 20}, protocol)
    dm = ImageClassificationDataModule(dataset="cifar100", data_dir=str(tmp_path), batch_size=8)
    assert dm.class_names == [n.decode() for n in fine_names]          # the release's own names, label order
    dm.setup()
    test = batches["test"]
    assert torch.equal(dm.test_set.labels, torch.tensor(test[b"fine_labels"]))
    expected = torch.from_numpy(test[b"data"][:1].reshape(3, 32, 32)).float() / 255
    assert torch.allclose(dm.test_set.source.pixels(0), expected)


def test_cifar10_class_names_come_from_batches_meta(tmp_path):
    folder = make_cifar10(tmp_path)[0]
    assert ImageClassificationDataModule(dataset="cifar10", data_dir=str(folder)).class_names[0] == "airplane"
    names = [f"name{c}".encode() for c in range(10)]
    _write_release_pickle(folder / "batches.meta", {b"num_cases_per_batch": 20, b"label_names": names,
                                                    b"num_vis": 3072}, "python2")
    assert ImageClassificationDataModule(dataset="cifar10", data_dir=str(folder)).class_names == \
        [f"name{c}" for c in range(10)]
    _write_release_pickle(folder / "batches.meta", {b"label_names": names[:9]}, 4)
    _raises(r"batches.meta' must be a dict whose b'label_names' lists 10 class names", dataset="cifar10",
            data_dir=str(folder))


class _RunsCode:
    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


@pytest.mark.parametrize("call", [os.system, open])
@pytest.mark.parametrize("file_name", ["data_batch_3", "batches.meta"])
def test_cifar_pickle_that_runs_code_is_refused_without_running_it(cifar10, tmp_path, call, file_name):
    marker = tmp_path / "ran"
    args = (f"touch {marker}",) if call is os.system else (str(marker), "w")
    payload = {b"data": np.zeros((20, 3072), np.uint8), b"labels": [0] * 20, b"x": _RunsCode(call, args)}
    _write_pickle(cifar10[0] / file_name, payload)
    with pytest.raises(UserInputError, match=rf"{file_name}' refers to .*(system|open), which the official release "
                                             r"never contains: refused"):
        dm = ImageClassificationDataModule(dataset="cifar10", data_dir=str(cifar10[0]))
        dm.setup()
    assert not marker.exists()


def _write_imagenet32_pickles(root, keep, rows=5):
    """The pickle release of downsampled ImageNet 32x32 as its authors' loader reads it: Imagenet32_train/
    train_data_batch_1..10 and Imagenet32_val/val_data, dicts with 'data' (N, 3072) uint8, 'labels' (1-based
    ints) and 'mean' (the training mean image)."""
    rng = np.random.default_rng(0)
    other = next(c for c in range(1000) if c not in keep)
    labels = ([k + 1 for k in keep] * rows)[:rows] + [other + 1]     # 1-based, one row of another class
    files = {}
    for folder, name in [("Imagenet32_train", f"train_data_batch_{i}") for i in range(1, 11)] + \
            [("Imagenet32_val", "val_data")]:
        (root / folder).mkdir(exist_ok=True)
        data = rng.integers(0, 256, (len(labels), 3072)).astype(np.uint8)
        files[name] = data
        _write_release_pickle(root / folder / name, {"data": data, "labels": labels,
                                                     "mean": data.mean(0)}, 3)
    return files, labels


def test_imagenet32_pickle_release_is_read(tmp_path):
    from datamodules.corrupted_images import CorruptedImageDataModule, imagenet32_subset_classes, load_imagenet32
    keep = imagenet32_subset_classes(2, 42)
    files, labels = _write_imagenet32_pickles(tmp_path, keep)
    train, test = load_imagenet32(str(tmp_path), num_classes=2, subset_seed=42)
    assert train.data.shape == (50, 3, 32, 32) and test.data.shape == (5, 3, 32, 32)   # the other class dropped
    assert test.labels.tolist() == [keep.index(y - 1) for y in labels[:5]]
    assert torch.equal(test.data[0], torch.from_numpy(files["val_data"][0].reshape(3, 32, 32)))
    data = CorruptedImageDataModule(dataset="imagenet32", data_dir=str(tmp_path), imagenet_num_classes=2)
    data.setup()
    assert data.train_set[0][0].shape == (3, 32, 32)
    # refused, not run: the pickle release goes through the same restricted unpickler as CIFAR
    marker = tmp_path / "ran"
    _write_pickle(tmp_path / "Imagenet32_val" / "val_data", {"data": _RunsCode(os.system, (f"touch {marker}",))})
    with pytest.raises(UserInputError, match=r"val_data' refers to .*system.*refused"):
        load_imagenet32(str(tmp_path), num_classes=2, subset_seed=42)
    assert not marker.exists()
    _write_release_pickle(tmp_path / "Imagenet32_val" / "val_data", {"data": files["val_data"]}, 4)
    with pytest.raises(UserInputError, match=r"val_data' must be a dict with 'data'.*and 'labels'.*found keys"):
        load_imagenet32(str(tmp_path), num_classes=2, subset_seed=42)
    (tmp_path / "Imagenet32_val" / "val_data").unlink()
    with pytest.raises(UserInputError, match=r"lacks val_data.npz \(in either form\).*the pickle release "
                                             r"\(Imagenet32_train/train_data_batch_\{1..10\}, Imagenet32_val/val_data"):
        load_imagenet32(str(tmp_path), num_classes=2, subset_seed=42)
