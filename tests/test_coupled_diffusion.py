"""Coupled diffusion: corruptions, logit standardisation, the step ordering and conditioning of every coupling
strategy (mock denoisers), the frozen classifier, init_from, and the corrupted-image loaders with their errors."""
from __future__ import annotations

import math
import pickle
import random

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from datamodules.corrupted_images import (CorruptedImageDataModule, corrupt, gaussian_blur, gaussian_kernel1d,
                                          gaussian_noise, imagenet32_subset_classes, load_imagenet32,
                                          pixel_replacement)
from datamodules.images import ImageClassificationDataModule
from lightning_modules.shared.classifier import ImageClassifier
from lightning_modules.coupled_diffusion.coupled_diffusion import (LOGIT_EPS, LOGIT_SCALE, CoupledDiffusion,
                                                                   logit_statistics, standardize_logits)
from lightning_modules.shared.errors import UserInputError

TINY = dict(num_train_timesteps=20, sampling_steps=5, condition_sampling_steps=5, signal_hidden_dim=16,
            signal_depth=1, logit_hidden_dim=16, logit_depth=1, feature_dim=4, feature_hidden_dim=8, time_dim=8,
            classifier_hidden_dim=16, coupling_iterations=3, nested_block_size=5, nested_refresh_every=2,
            nested_refresh_from=4, alternating_iterations=2)


def tiny_model(**overrides) -> CoupledDiffusion:
    torch.manual_seed(0)
    return CoupledDiffusion(**{**TINY, **overrides})


def images(batch=4, seed=0):
    return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ======================================================================================== corruptions
def test_pixel_replacement_levels_range_and_determinism():
    x = images(64)
    assert torch.equal(pixel_replacement(x, 0.0), x)
    gen = torch.Generator().manual_seed(3)
    out = pixel_replacement(x, 0.3, gen)
    assert out.min() >= -1 and out.max() <= 1
    changed = (out != x).float().mean().item()
    assert 0.25 < changed < 0.35  # 4096 elements: p=0.3 within ~5 standard errors
    assert torch.equal(out, pixel_replacement(x, 0.3, torch.Generator().manual_seed(3)))
    assert not torch.equal(out, pixel_replacement(x, 0.3, torch.Generator().manual_seed(4)))
    # p = 1 replaces everything by clamped N(0, 1): the same draws as a generator in the same state
    gen = torch.Generator().manual_seed(5)
    torch.rand(x.shape, generator=gen)
    expected = torch.randn(x.shape, generator=gen).clamp(-1, 1)
    assert torch.equal(pixel_replacement(x, 1.0, torch.Generator().manual_seed(5)), expected)


def test_gaussian_noise_scale_range_and_determinism():
    x = torch.zeros(256, 1, 8, 8)
    out = gaussian_noise(x, 0.1, torch.Generator().manual_seed(0))
    assert out.std().item() == pytest.approx(0.1, rel=0.05)
    assert torch.equal(gaussian_noise(images(), 0.0), images())
    big = gaussian_noise(images(), 5.0, torch.Generator().manual_seed(0))
    assert big.min() >= -1 and big.max() <= 1 and (big.abs() == 1).float().mean() > 0.5
    assert torch.equal(gaussian_noise(x, 0.3, torch.Generator().manual_seed(2)),
                       gaussian_noise(x, 0.3, torch.Generator().manual_seed(2)))


def test_gaussian_blur_kernel_impulse_and_constants():
    kernel = gaussian_kernel1d(1.0)
    hand = torch.tensor([math.exp(-0.5 * k * k) for k in (-2, -1, 0, 1, 2)])
    torch.testing.assert_close(kernel, hand / hand.sum())
    impulse = torch.zeros(1, 1, 9, 9)
    impulse[0, 0, 4, 4] = 1.0
    torch.testing.assert_close(gaussian_blur(impulse, 1.0)[0, 0, 2:7, 2:7], torch.outer(kernel, kernel))
    constant = torch.full((2, 3, 8, 8), 0.3)
    torch.testing.assert_close(gaussian_blur(constant, 2.0), constant)  # replicate padding keeps constants
    assert torch.equal(gaussian_blur(images(), 0.0), images())
    assert torch.equal(gaussian_blur(images(), 1.5), gaussian_blur(images(), 1.5))  # deterministic
    assert gaussian_blur(images(), 1.5).std() < images().std()


@pytest.mark.parametrize("kind, level", [("pixel_replacement", 1.5), ("pixel_replacement", -0.1),
                                         ("gaussian_noise", -1.0), ("gaussian_blur", -0.5),
                                         ("gaussian_noise", float("nan")), ("salt", 0.1)])
def test_corrupt_rejects_bad_levels_and_kinds(kind, level):
    with pytest.raises(UserInputError):
        corrupt(images(), kind, level)


def test_corrupt_needs_4d_images():
    with pytest.raises(UserInputError, match="B, C, H, W"):
        corrupt(torch.zeros(8, 8), "gaussian_noise", 0.1)


# ============================================================================ logit standardisation
def test_standardisation_hand_values_and_round_trip():
    y = torch.tensor([[1.0, 2.0, 3.0]])  # mean 2, unbiased std 1
    torch.testing.assert_close(standardize_logits(y), torch.tensor([[-0.8, 0.0, 0.8]]) / (1 + 1e-5))
    logits = torch.randn(16, 10, generator=torch.Generator().manual_seed(0)) * 7 + 3
    z = standardize_logits(logits)
    torch.testing.assert_close(z.mean(-1), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(-1), torch.full((16,), 0.8), atol=1e-4, rtol=0)
    assert torch.equal(z.argmax(-1), logits.argmax(-1))
    mean, std = logit_statistics(logits)
    torch.testing.assert_close(z * (std + LOGIT_EPS) / LOGIT_SCALE + mean, logits)  # invertible given the stats
    torch.testing.assert_close(standardize_logits(z), z, atol=1e-4, rtol=0)  # idempotent up to eps
    assert torch.equal(standardize_logits(torch.zeros(2, 5)), torch.zeros(2, 5))  # the "no logits yet" condition


# ============================================================================== coupling orderings
class Recorder:
    """Mock eps_x / eps_y / classify: returns eps = 0 and records every call and its conditioning."""

    def __init__(self, model: CoupledDiffusion):
        self.events: list[dict] = []
        self.model = model
        model.eps_x = self.eps_x
        model.eps_y = self.eps_y
        model.classify = self.classify

    def eps_x(self, x_t, t, corrupted, y_cond):
        self.events.append(dict(kind="x", t=t.clone(), x_t=x_t.clone(), corrupted=corrupted.clone(),
                                y_cond=y_cond.clone()))
        return torch.zeros_like(x_t)

    def eps_y(self, y_t, t, y_cond, image):
        self.events.append(dict(kind="y", t=t.clone(), y_t=y_t.clone(), y_cond=y_cond.clone(), image=image.clone()))
        return torch.zeros_like(y_t)

    @staticmethod
    def classify(imgs):
        return imgs.flatten(1)[:, :10] * 5.0

    def kinds(self) -> str:
        return "".join(e["kind"] for e in self.events)

    def x0_hat(self, event):  # eps = 0: x0_hat = x_t / sqrt(alpha_bar_t) (clamped for images)
        alpha = self.model.alphas_cumprod[event["t"]].view(-1, *([1] * (event["x_t" if event["kind"] == "x"
                                                                             else "y_t"].dim() - 1)))
        if event["kind"] == "x":
            return (event["x_t"] / alpha.sqrt()).clamp(-1, 1)
        return event["y_t"] / alpha.sqrt()


def _std(y):
    return standardize_logits(y)


def test_parallel_sampling_interleaves_y_then_x_and_switches_condition_at_half_T():
    model = tiny_model().eval()
    rec = Recorder(model)
    corrupted = images()
    model.sample(corrupted, "parallel", torch.Generator().manual_seed(0))
    assert rec.kinds() == "yx" * 5
    timesteps = [int(e["t"][0]) for e in rec.events[::2]]
    assert timesteps == [19, 15, 11, 7, 3]
    for i in range(5):
        y_event, x_event = rec.events[2 * i], rec.events[2 * i + 1]
        expected_image = corrupted if timesteps[i] >= 10 else rec.x0_hat(rec.events[2 * i - 1])
        torch.testing.assert_close(y_event["image"], expected_image)
        torch.testing.assert_close(y_event["y_cond"], _std(rec.classify(expected_image)))
        torch.testing.assert_close(x_event["y_cond"], _std(rec.x0_hat(y_event)))  # this step's y0_hat
        torch.testing.assert_close(x_event["corrupted"], corrupted)


def test_alternating_sampling_runs_full_chains_in_rounds():
    model = tiny_model(alternating_iterations=2).eval()
    rec = Recorder(model)
    out = model.sample(images(), "alternating", torch.Generator().manual_seed(0))
    assert rec.kinds() == "x" * 5 + "y" * 5 + "x" * 5 + "y" * 5
    x1, y1, x2, y2 = (rec.events[5 * k:5 * k + 5] for k in range(4))
    assert all(torch.equal(e["y_cond"], torch.zeros(4, 10)) for e in x1)
    x0_first = rec.x0_hat(x1[-1])  # the last DDIM step (t=3 -> alpha_prev 1) returns x0_hat
    for e in y1:
        torch.testing.assert_close(e["image"], x0_first)
        torch.testing.assert_close(e["y_cond"], _std(rec.classify(x0_first)))
    y0_first = rec.x0_hat(y1[-1])
    for e in x2:
        torch.testing.assert_close(e["y_cond"], _std(y0_first))
    torch.testing.assert_close(out["logits"], rec.x0_hat(y2[-1]))


def test_nested_sampling_refreshes_the_x_chain_inside_the_y_chain():
    # S = 5 y steps; refresh when remaining steps r <= 4 and r % 2 == 0: before y steps 2 and 4 (r = 4, 2)
    model = tiny_model().eval()
    rec = Recorder(model)
    model.sample(images(), "nested", torch.Generator().manual_seed(0))
    assert rec.kinds() == "xxxxx" + "y" + "xxxxx" + "yy" + "xxxxx" + "yy"
    assert all(torch.equal(e["y_cond"], torch.zeros(4, 10)) for e in rec.events[:5])
    first_y = rec.events[5]
    torch.testing.assert_close(rec.events[6]["y_cond"], _std(rec.x0_hat(first_y)))  # refresh uses current y0_hat
    x0_refreshed = rec.x0_hat(rec.events[10])
    for e in rec.events[11:13]:
        torch.testing.assert_close(e["image"], x0_refreshed)
        torch.testing.assert_close(e["y_cond"], _std(rec.classify(x0_refreshed)))


def test_enhanced_sampling_uses_only_the_signal_chain_without_logits():
    model = tiny_model(strategy="enhanced").eval()
    assert model.logit_net is None and model.feature_net is None
    rec = Recorder(model)
    out = model.sample(images(), generator=torch.Generator().manual_seed(0))
    assert rec.kinds() == "x" * 5 and all(torch.equal(e["y_cond"], torch.zeros(4, 10)) for e in rec.events)
    torch.testing.assert_close(out["logits"], rec.classify(out["images"]))


def test_parallel_training_conditions_each_iteration_on_the_previous_y0_hat():
    model = tiny_model()
    rec = Recorder(model)
    clean, corrupted = images(16, 1), images(16, 2)
    with torch.no_grad():
        model.losses(clean, corrupted, "parallel", torch.Generator().manual_seed(0))
    assert rec.kinds() == "xy" * 3
    assert torch.equal(rec.events[0]["y_cond"], torch.zeros(16, 10))
    for i in range(3):
        x_event, y_event = rec.events[2 * i], rec.events[2 * i + 1]
        assert torch.equal(x_event["t"], y_event["t"])  # one t per iteration, shared by both losses
        late = (x_event["t"] < 10).view(-1, 1, 1, 1)
        torch.testing.assert_close(y_event["image"], torch.where(late, rec.x0_hat(x_event), corrupted))
        if i:
            torch.testing.assert_close(x_event["y_cond"], _std(rec.x0_hat(rec.events[2 * i - 1])))


def test_nested_training_walks_t_down_in_blocks_and_alternating_training_runs_condition_chains():
    model = tiny_model()
    rec = Recorder(model)
    with torch.no_grad():
        model.losses(images(32, 1), images(32, 2), "nested", torch.Generator().manual_seed(0))
    assert rec.kinds() == "xy" * 4
    for block, event in zip(range(4), rec.events[::2]):
        high = 20 - 5 * block
        assert event["t"].min() >= high - 5 and event["t"].max() < high
    rec.events.clear()
    with torch.no_grad():
        x_loss, y_loss = model.losses(images(8, 1), images(8, 2), "alternating", torch.Generator().manual_seed(0))
    # round 1: x loss, x chain (5), y loss, y chain (5); round 2: x loss, x chain, y loss
    assert rec.kinds() == "x" + "x" * 5 + "y" + "y" * 5 + "x" + "x" * 5 + "y"
    assert torch.isfinite(x_loss) and torch.isfinite(y_loss)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_x0_hat_inverts_the_forward_noising_given_the_exact_target(prediction_type):
    model = tiny_model(prediction_type=prediction_type)
    x0, noise = images(8), torch.randn(8, 1, 8, 8)
    t = torch.arange(8) * 2
    x_t = model.noise_scheduler.add_noise(x0, noise, t)
    target = model._target(x0, noise, t)
    if prediction_type == "v_prediction":  # v = sqrt(a) eps - sqrt(1 - a) x0, by hand
        a = model.alphas_cumprod[t].view(-1, 1, 1, 1)
        torch.testing.assert_close(target, a.sqrt() * noise - (1 - a).sqrt() * x0)
    torch.testing.assert_close(model._x0_hat(x_t, target, t), x0, atol=1e-4, rtol=0)


# ========================================================================= frozen classifier, init_from
def _classifier_checkpoint(path, hidden_dim=16, **hparams):
    clf = ImageClassifier(backbone="mlp", hidden_dim=hidden_dim)
    torch.save({"state_dict": clf.state_dict(),
                "hyper_parameters": {"backbone": "mlp", "hidden_dim": hidden_dim, "num_classes": 10, **hparams}},
               path)
    return clf


def test_init_from_loads_the_classifier_checkpoint_into_the_frozen_classifier(tmp_path):
    clf = _classifier_checkpoint(tmp_path / "clf.ckpt")
    model = tiny_model(init_from=str(tmp_path / "clf.ckpt"))
    report = model.load_initial_weights()
    assert model.classifier_loaded and len(report["loaded"]) == 4
    for key, value in clf.net.state_dict().items():
        assert torch.equal(model.classifier.state_dict()[key], value)
    _classifier_checkpoint(tmp_path / "wide.ckpt", hidden_dim=32)
    with pytest.raises(UserInputError, match="classifier_hidden_dim"):
        tiny_model(init_from=str(tmp_path / "wide.ckpt")).load_initial_weights()
    torch.save({"state_dict": {"encoder.weight": torch.zeros(2)}}, tmp_path / "foreign.ckpt")
    with pytest.raises(UserInputError, match="neither an ImageClassifier"):
        tiny_model(init_from=str(tmp_path / "foreign.ckpt")).load_initial_weights()


def test_classifier_stays_frozen_through_training_and_fit_needs_a_classifier(tmp_path):
    model = tiny_model(validate_sampling=False)
    reference = ImageClassifier(backbone="mlp", hidden_dim=16)
    model.load_classifier_state(reference.net.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = CorruptedImageDataModule(batch_size=32)
    trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    after = model.state_dict()
    for key in before:
        if key.startswith("classifier."):
            assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before["signal_net.input.weight"], after["signal_net.input.weight"])
    assert not model.classifier.training and not any(p.requires_grad for p in model.classifier.parameters())
    torch.testing.assert_close(model.pixel_mean, data.mean)  # the classifier's normalisation comes from the data
    with pytest.raises(UserInputError, match="pretrained frozen classifier"):
        Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                limit_val_batches=0, default_root_dir=tmp_path).fit(tiny_model(), datamodule=data)


@pytest.mark.parametrize("overrides, match", [
    (dict(sampling_steps=3), "divide"), (dict(strategy="cascade"), "unknown"),
    (dict(strategy="enhanced", sampling_strategy="parallel"), "logit denoiser"),
    (dict(y_loss_weight=0.0), "y_loss_weight"), (dict(logit_target="probs"), "logit_target"),
    (dict(signal_denoiser="unet", image_size=6, unet_channel_mults=(1, 2, 4)), "divisible")])
def test_bad_model_arguments_are_user_errors(overrides, match):
    with pytest.raises(UserInputError, match=match):
        tiny_model(**overrides)


def test_unet_signal_denoiser_and_predict_are_deterministic():
    model = tiny_model(signal_denoiser="unet", unet_base_channels=8).eval()
    batch = (images(3).add(1).div(2), images(3, 1).add(1).div(2), torch.tensor([0, 1, 2]))
    first, second = model.predict_step(batch, 0), model.predict_step(batch, 0)
    for key in first:
        assert torch.equal(first[key], second[key])
    assert first["probs"].shape == (3, 10) and first["enhanced"].shape == (3, 1, 8, 8)


# ============================================================================================ data
def test_digits_split_and_statistics_match_the_classification_datamodule():
    data, reference = CorruptedImageDataModule(seed=3), ImageClassificationDataModule(seed=3)
    data.setup()
    reference.setup()
    assert torch.equal(data.mean, reference.mean) and torch.equal(data.std, reference.std)
    assert torch.equal(data.train_set.indices, reference.train_set.indices)
    classification = CorruptedImageDataModule(seed=3, output="classification")
    classification.setup()
    x, y = classification.val_set[0]
    x_ref, y_ref = reference.val_set[0]
    assert torch.equal(x, x_ref) and y == y_ref


def test_evaluation_corruptions_are_fixed_and_training_corruptions_fresh():
    data = CorruptedImageDataModule(corruption="gaussian_noise", corruption_level=0.5, seed=0)
    data.setup()
    clean, corrupted, _ = data.test_set[0]
    assert torch.equal(corrupted, data.test_set[0][1]) and not torch.equal(clean, corrupted)
    assert clean.min() >= 0 and clean.max() <= 1 and corrupted.min() >= 0 and corrupted.max() <= 1
    other_seed = CorruptedImageDataModule(corruption="gaussian_noise", corruption_level=0.5, seed=7)
    other_seed.setup()
    assert torch.equal(other_seed.test_set[0][1], corrupted)  # the test corruption does not depend on seed
    assert not torch.equal(data.train_set[0][1], data.train_set[0][1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset="mnist"), "unknown"), (dict(data_dir="/tmp"), "embedded"), (dict(augment=True), "augment"),
    (dict(corruption="gaussian_blur", corruption_level=-1.0), "sigma"), (dict(output="pairs"), "output"),
    (dict(dataset="cifar10"), "needs data_dir"), (dict(dataset="imagenet32"), "needs data_dir"),
    (dict(imagenet_num_classes=1), "imagenet_num_classes")])
def test_datamodule_rejects_bad_arguments(kwargs, match):
    with pytest.raises(UserInputError, match=match):
        CorruptedImageDataModule(**kwargs)


def _write_imagenet32(root, keep, rows=6, flat=False):
    train_dir = root if flat else root / "Imagenet32_train_npz"
    val_dir = root if flat else root / "Imagenet32_val_npz"
    train_dir.mkdir(parents=True, exist_ok=True)
    val_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    other = next(c for c in range(1000) if c not in keep)
    labels = np.array(([k + 1 for k in keep] * rows)[:rows] + [other + 1])  # 1-based, one row of another class
    for i in range(1, 11):
        np.savez(train_dir / f"train_data_batch_{i}.npz", data=rng.integers(0, 256, (len(labels), 3072), np.uint8),
                 labels=labels)
    np.savez(val_dir / "val_data.npz", data=rng.integers(0, 256, (len(labels), 3072), np.uint8), labels=labels)
    return labels


@pytest.mark.parametrize("flat", [False, True])
def test_imagenet32_reader_keeps_the_class_subset_and_relabels(tmp_path, flat):
    keep = imagenet32_subset_classes(2, 42)
    assert keep == sorted(random.Random(42).sample(range(1000), 2))
    _write_imagenet32(tmp_path, keep, flat=flat)
    train, test = load_imagenet32(str(tmp_path), num_classes=2, subset_seed=42)
    assert train.data.shape == (60, 3, 32, 32) and test.data.shape == (6, 3, 32, 32)
    assert sorted(train.labels.unique().tolist()) == [0, 1]
    data = CorruptedImageDataModule(dataset="imagenet32", data_dir=str(tmp_path), imagenet_num_classes=2,
                                    val_fraction=0.2)
    data.setup()
    clean, corrupted, label = data.train_set[0]
    assert clean.shape == (3, 32, 32) and data.num_classes == 2 and 0 <= int(label) < 2


def test_imagenet32_errors_name_the_problem(tmp_path):
    keep = imagenet32_subset_classes(2, 42)
    _write_imagenet32(tmp_path, keep)
    (tmp_path / "Imagenet32_train_npz" / "train_data_batch_7.npz").unlink()
    with pytest.raises(UserInputError, match="train_data_batch_7.npz"):
        load_imagenet32(str(tmp_path), 2)
    bad = tmp_path / "Imagenet32_train_npz" / "train_data_batch_7.npz"
    np.savez(bad, data=np.zeros((2, 3072), np.uint8))
    with pytest.raises(UserInputError, match="lacks key"):
        load_imagenet32(str(tmp_path), 2)
    np.savez(bad, data=np.zeros((2, 100), np.uint8), labels=np.array([1, 2]))
    with pytest.raises(UserInputError, match="shape"):
        load_imagenet32(str(tmp_path), 2)
    np.savez(bad, data=np.zeros((2, 3072), np.uint8), labels=np.array([0, 2]))
    with pytest.raises(UserInputError, match="1..1000"):
        load_imagenet32(str(tmp_path), 2)
    bad.write_bytes(b"not a zip archive")
    with pytest.raises(UserInputError, match="not a readable npz"):
        load_imagenet32(str(tmp_path), 2)


def test_cifar_through_the_corrupted_datamodule(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(root / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (20, 3072), np.uint8), b"labels": list(range(10)) * 2}, f)
    data = CorruptedImageDataModule(dataset="cifar10", data_dir=str(tmp_path), corruption="gaussian_blur",
                                    corruption_level=1.0)
    data.setup()
    clean, corrupted, _ = data.test_set[0]
    assert clean.shape == corrupted.shape == (3, 32, 32) and corrupted.std() < clean.std()
    (root / "test_batch").unlink()
    with pytest.raises(UserInputError, match="test_batch"):
        CorruptedImageDataModule(dataset="cifar10", data_dir=str(tmp_path))



def _write_image_folder(root, classes=("owl", "cat", "dog"), counts=(("train", 5), ("test", 2))):
    """PNGs of different sizes with a class-dependent colour (resized by the datamodule)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in counts:
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                array = rng.integers(0, 80, (9 + i, 11 + c, 3)) + np.eye(3, dtype=int)[c] * 170
                Image.fromarray(array.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


def test_imagefolder_through_the_corrupted_datamodule(tmp_path):
    root = _write_image_folder(tmp_path / "images")
    data = CorruptedImageDataModule(dataset="imagefolder", data_dir=str(root), resize_to=8, val_fraction=0.2)
    assert (data.num_classes, data.in_channels, data.image_size) == (3, 3, 8)
    assert data.class_names == ["cat", "dog", "owl"]                      # sorted folder names
    data.setup()
    assert len(data.train_set) + len(data.val_set) == 15 and len(data.test_set) == 6
    assert data.test_set.labels.tolist() == [0, 0, 1, 1, 2, 2]
    clean, corrupted, label = data.test_set[0]
    assert clean.shape == corrupted.shape == (3, 8, 8) and int(label) == 0
    # the normalisation comes from the training part only, and equals the classification datamodule's
    train_pixels = torch.stack([data.train_set.source.pixels(int(i)) for i in data.train_set.indices]).double()
    assert torch.allclose(data.mean.double(), train_pixels.mean(dim=(0, 2, 3)), atol=1e-6)
    reference = ImageClassificationDataModule(dataset="imagefolder", data_dir=str(root), resize_to=8,
                                              val_fraction=0.2)
    reference.setup()
    assert torch.equal(data.mean, reference.mean) and torch.equal(data.std, reference.std)
    assert torch.equal(data.train_set.indices, reference.train_set.indices)
    assert CorruptedImageDataModule(dataset="imagefolder", data_dir=str(root)).image_size == 32


def test_imagefolder_errors_name_the_problem(tmp_path):
    root = _write_image_folder(tmp_path / "images")
    with pytest.raises(UserInputError, match="resize_to=16 does not match dataset 'digits'"):
        CorruptedImageDataModule(resize_to=16)
    with pytest.raises(UserInputError, match="needs data_dir"):
        CorruptedImageDataModule(dataset="imagefolder")
    with pytest.raises(UserInputError, match="resize_to=0 is out of range"):
        CorruptedImageDataModule(dataset="imagefolder", data_dir=str(root), resize_to=0)
    one_class = _write_image_folder(tmp_path / "one", classes=("cat",))
    with pytest.raises(UserInputError, match="at least 2 classes"):
        CorruptedImageDataModule(dataset="imagefolder", data_dir=str(one_class))
    singles = _write_image_folder(tmp_path / "singles", classes=("cat", "dog"), counts=(("train", 1), ("test", 1)))
    with pytest.raises(UserInputError, match="at least 2 training images"):
        CorruptedImageDataModule(dataset="imagefolder", data_dir=str(singles)).setup()
    (root / "test").rename(root / "eval")
    with pytest.raises(UserInputError, match="test' is missing"):
        CorruptedImageDataModule(dataset="imagefolder", data_dir=str(root))

# ================================================================================= reduced claim (slow)
@pytest.mark.slow
def test_reduced_experiment_coupled_beats_enhance_then_classify(tmp_path, monkeypatch):
    """One seed, p = 0.3 (the smoke overlay's arms), 600 steps, a 20-epoch classifier: the Parallel coupling is at
    least as accurate as Enhanced (the direction the full experiment measured); every arm is far above chance; the
    results file has the collection's shape."""
    from experiments import runner

    monkeypatch.chdir(tmp_path)
    payload = runner.run_experiment("coupled_diffusion", smoke=True, out=tmp_path / "cd",
                                    overrides={"trainer.max_steps": "600", "trainer.max_epochs": "20"})
    arms = payload["arms"]
    assert {"paper", "seeds", "wall_s", "arms"} <= set(payload) and payload["seeds"] == 1
    assert (tmp_path / "cd" / "coupled_diffusion.json").is_file()
    assert (tmp_path / "cd" / "coupled_diffusion.png").is_file()
    assert arms["parallel (p=0.3)"]["train_steps"]["mean"] == 600
    accuracy = {arm.split(" ")[0]: value["acc"]["mean"] for arm, value in arms.items()}
    assert accuracy["clean"] > 0.9 and min(accuracy.values()) > 0.3
    assert accuracy["parallel"] >= accuracy["enhanced"] - 0.02
