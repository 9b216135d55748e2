"""TIVDiff (a reconstruction; no paper text exists): keyed randomness, the VIP, the loss terms against hand values,
the IGGW watermark round trip (exact without diffusion, through DDIM sampling + inversion with a deterministic model),
the parametric face generator (determinism, identity/pose separation) and the face loaders (formats and errors)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from datamodules.face_datasets import read_celeba_identities
from datamodules.face_renderer import (geometry_map, identity_parameters, nuisance_parameters, render_faces,
                                       synthetic_faces)
from datamodules.synthetic_faces import FaceDataModule
from lightning_modules.shared.errors import UserInputError
from lightning_modules.tivdiff.tivdiff import (TIVDiff, VirtualIdentityProjection, bit_accuracy, bit_scores,
                                       cosface_loss, cross_key_linkability, ddim_invert, ddim_sample,
                                       extract_message, key_rotation, keyed_bits, keyed_hash, message_bits, mix32,
                                       pair_margin_loss, privacy_loss, rbf_mmd2, scheduler_config, to_epsilon,
                                       watermark_latents)


# ============================================================================================ keyed randomness
def _lowbias32(x: int) -> int:
    """Reference lowbias32 with Python integers."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_matches_the_python_reference_without_overflow():
    values = [0, 1, 2, 12345, 2 ** 31 - 1, 2 ** 32 - 1, 0xDEADBEEF]
    got = mix32(torch.tensor(values, dtype=torch.long)).tolist()
    assert got == [_lowbias32(v) for v in values]


def test_keyed_streams_are_deterministic_and_key_specific():
    keys = torch.tensor([3, 3, 4])
    h = keyed_hash(keys, 64, stream=1)
    assert torch.equal(h[0], h[1]) and not torch.equal(h[0], h[2])
    assert not torch.equal(keyed_hash(keys, 64, stream=2)[0], h[0])
    bits = keyed_bits(torch.arange(200), 512, stream=2).float()
    assert abs(bits.mean().item() - 0.5) < 0.01


def test_key_rotation_is_orthogonal_and_a_function_of_the_key():
    q = key_rotation(torch.tensor([7, 7, 8]), 6)
    eye = torch.eye(6).expand(3, 6, 6)
    torch.testing.assert_close(q @ q.transpose(1, 2), eye, atol=1e-5, rtol=0)
    assert torch.equal(q[0], q[1]) and not torch.allclose(q[0], q[2])


# ============================================================================================ VIP
def test_vip_is_key_consistent_batch_independent_and_key_specific():
    torch.manual_seed(0)
    vip = VirtualIdentityProjection(8, 16)
    e = F.normalize(torch.randn(5, 8), dim=-1)
    keys = torch.tensor([11, 11, 11, 12, 13])
    v = vip(e, keys)
    torch.testing.assert_close(vip(e[:1], keys[:1]), v[:1])  # same person + key -> same VID, whatever the batch
    e_same = e[:1].expand(3, 8)
    out = vip(e_same, torch.tensor([11, 11, 99]))
    assert torch.equal(out[0], out[1])
    assert (out[0] * out[2]).sum() < 0.9  # another key -> another VID
    torch.testing.assert_close(v.norm(dim=-1), torch.ones(5))
    # the untrained keyed orthogonal projection preserves cosine similarities within a key
    w = vip(e, torch.full((5,), 11), trained=False)
    torch.testing.assert_close(w @ w.T, e @ e.T, atol=1e-5, rtol=0)


# ============================================================================================ losses vs hand values
def test_cosface_loss_matches_a_hand_computation():
    e = torch.tensor([[1.0, 0.0]])
    weights = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # unit: (1, 0), (0, 1); cosines 1 and 0
    s, m = 4.0, 0.25
    expected = -math.log(math.exp(s * (1 - m)) / (math.exp(s * (1 - m)) + math.exp(0.0)))
    assert cosface_loss(e, weights, torch.tensor([0]), s, m).item() == pytest.approx(expected, rel=1e-6)


def test_pair_margin_loss_matches_a_hand_computation():
    c = math.cos(math.radians(60))  # 0.5
    v = torch.tensor([[1.0, 0.0], [c, math.sin(math.radians(60))], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    # same pairs (0,1),(1,0): cos 0.5 -> relu(0.8 - 0.5) = 0.3; different pairs: cos(0,2)=0, cos(1,2)=0.866 (x2)
    neg = (2 * max(0.0, 0.0 - 0.2) + 2 * max(0.0, math.sin(math.radians(60)) - 0.2)) / 4
    assert pair_margin_loss(v, labels, 0.8, 0.2).item() == pytest.approx(neg + 0.3, abs=1e-6)
    assert pair_margin_loss(v[:2], torch.tensor([0, 1]), 0.8, 0.2).item() == pytest.approx(0.3, abs=1e-6)


def test_cross_key_linkability_privacy_and_mmd_match_hand_values():
    v_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v_b = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # cos matrix [[1, 1], [0, 0]]; same (diagonal): mean(1, 0) = 0.5, different: mean(1, 0) = 0.5 -> 0
    assert cross_key_linkability(v_a, v_b, torch.tensor([0, 1])).item() == pytest.approx(0.0)
    assert cross_key_linkability(v_a, v_a, torch.tensor([0, 1])).item() == pytest.approx(1.0)  # (1 - 0)^2
    e = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    v = torch.tensor([[0.6, 0.8], [0.6, 0.8]])
    assert privacy_loss(e, v).item() == pytest.approx((0.36 + 1.0) / 2)
    a, b, sigma = torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0]]), 2.0
    assert rbf_mmd2(a, b, sigma).item() == pytest.approx(2 - 2 * math.exp(-25 / 8), rel=1e-6)
    assert rbf_mmd2(a, a, sigma).item() == pytest.approx(0.0, abs=1e-7)


# ============================================================================================ IGGW watermark
def test_watermark_noise_carries_the_keyed_bits_in_its_signs_by_hand():
    message = torch.tensor([[True, False]])
    keys = torch.tensor([42])
    z = watermark_latents(message, keys, (5,), torch.Generator().manual_seed(0))
    stream = keyed_bits(keys, 5, 2)[0]
    expected = torch.tensor([True, False, True, False]) ^ stream[:4]  # element j carries m[j mod 2] XOR s[j]
    assert torch.equal(z[0, :4] > 0, expected)  # element 4 is beyond the last full replica: plain noise


def test_watermark_round_trip_without_diffusion_is_exact_and_wrong_key_is_chance():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2 ** 31 - 1, (256,), generator=gen)
    message = torch.rand(256, 32, generator=gen) > 0.5
    z = watermark_latents(message, keys, (1, 16, 16), gen)
    assert torch.equal(extract_message(z, keys, 32), message)
    assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1) < 0.02  # distribution preserving
    wrong = bit_accuracy(extract_message(z, keys + 1, 32), message)
    assert abs(wrong.mean().item() - 0.5) < 0.03
    scores = bit_scores(z, keys, 32)  # soft votes: every replica agrees, so |score| is the sum of |z|
    assert torch.all(scores.abs() > 0)


def test_message_bits_are_an_lsh_of_the_virtual_identity():
    v = F.normalize(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)), dim=-1)
    keys = torch.tensor([1, 2, 3, 4])
    m = message_bits(v, keys, 64)
    assert torch.equal(m, message_bits(v * 3.0, keys, 64))  # scale-free
    assert torch.equal(message_bits(-v, keys, 64), ~m)  # antipodal VID -> every bit flips
    assert not torch.equal(message_bits(v, keys + 1, 64), m)  # bound to the key


class GaussianOracle(torch.nn.Module):
    """The exact epsilon predictor for data x0 ~ N(0, s^2 I): eps(x_t) = sqrt(1 - a) x_t / (a s^2 + 1 - a)."""

    def __init__(self, alphas_cumprod: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.alphas_cumprod, self.scale = alphas_cumprod, scale

    def forward(self, inputs, t, cond):
        a = self.alphas_cumprod[t[0]]
        return (1 - a).sqrt() * inputs[:, :1] / (a * self.scale ** 2 + 1 - a)


def test_ddim_sample_then_inversion_recovers_the_watermark_with_an_exact_model():
    config = scheduler_config(1000, "linear", 1e-4, 0.02, "epsilon")
    from diffusers import DDIMScheduler

    oracle = GaussianOracle(DDIMScheduler(**config).alphas_cumprod, 0.5)
    gen = torch.Generator().manual_seed(0)
    keys = torch.arange(8) * 7 + 1
    message = torch.rand(8, 16, generator=gen) > 0.5
    z = watermark_latents(message, keys, (1, 8, 8), gen)
    geometry = torch.zeros(8, 1, 8, 8)
    x0 = ddim_sample(oracle, z, None, geometry, config, 50)
    z_hat = ddim_invert(oracle, x0, None, geometry, config, 50)
    assert bit_accuracy(extract_message(z_hat, keys, 16), message).min() > 0.9
    assert abs(bit_accuracy(extract_message(z_hat, keys + 1, 16), message).mean() - 0.5) < 0.15


def test_inversion_refinements_make_ddim_inversion_exact_at_the_fixed_point():
    config = scheduler_config(1000, "linear", 1e-4, 0.02, "epsilon")
    from diffusers import DDIMScheduler

    oracle = GaussianOracle(DDIMScheduler(**config).alphas_cumprod, 0.5)
    z = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    x0 = ddim_sample(oracle, z, None, torch.zeros(4, 1, 8, 8), config, 10)
    errors = [(ddim_invert(oracle, x0, None, torch.zeros(4, 1, 8, 8), config, 10, r) - z).pow(2).mean().item()
              for r in (0, 6)]
    assert errors[0] > 0.05 and errors[1] < 1e-5


def test_to_epsilon_converts_v_and_x0_predictions():
    alphas = torch.tensor([0.36, 0.64])
    x0, eps = torch.tensor([0.5]), torch.tensor([-1.0])
    x = 0.8 * x0 + 0.6 * eps  # t = 1: sqrt(a) = 0.8, sqrt(1 - a) = 0.6
    v = 0.8 * eps - 0.6 * x0
    torch.testing.assert_close(to_epsilon(v, x, 1, alphas, "v_prediction"), eps)
    torch.testing.assert_close(to_epsilon(x0, x, 1, alphas, "sample"), eps)
    torch.testing.assert_close(to_epsilon(eps, x, 1, alphas, "epsilon"), eps)


def _tiny_model(**kwargs) -> TIVDiff:
    torch.manual_seed(0)
    args = dict(num_train_identities=4, image_resolution=8, embedding_dim=8, encoder_channels=8, vip_hidden=16,
                unet_base_channels=8, num_inference_steps=10, watermark_bits=8)
    return TIVDiff(**{**args, **kwargs}).eval()


def test_untrained_v_prediction_model_round_trips_the_watermark_through_ddim():
    """True for the default v-prediction model even untrained (its DDIM map is smooth and near-invertible); an
    untrained epsilon model is not (x0 = (x - sqrt(1-a) eps) / sqrt(a) amplifies its errors), so not tested."""
    model = _tiny_model()
    keys = torch.arange(16) * 1000 + 5
    v = F.normalize(torch.randn(16, 8, generator=torch.Generator().manual_seed(2)), dim=-1)
    geometry = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    _, z = model.watermarked_noise(v, keys, torch.Generator().manual_seed(0))
    faces = model.generate(v, geometry, z)
    assert model.verify(faces, v, keys, geometry).mean() > 0.9
    wrong = (keys + 17) % (2 ** 31 - 1)
    v_wrong = model.virtual_identity(v, wrong)
    assert abs(model.verify(faces, v_wrong, wrong, geometry).mean().item() - 0.5) < 0.2
    plain = model.generate(v, geometry, torch.randn(z.shape, generator=torch.Generator().manual_seed(4)))
    assert model.verify(plain, v, keys, geometry).mean() < 0.75  # no watermark -> near chance


def test_predict_step_is_deterministic_and_returns_verified_virtual_faces():
    model = _tiny_model()
    batch = {"image": torch.rand(3, 1, 8, 8), "geometry": torch.rand(3, 1, 8, 8), "identity": torch.tensor([0, 1, 2]),
             "key": torch.tensor([5, 6, 7])}
    first, second = model.predict_step(batch, 0), model.predict_step(batch, 0)
    for key in first:
        assert torch.equal(first[key], second[key])
    assert first["virtual_face"].shape == (3, 1, 8, 8) and first["virtual_id"].shape == (3, 8)
    assert first["watermark_bit_accuracy"].min() > 0.9


def test_diffusion_loss_targets_follow_the_prediction_type():
    for kind in ("epsilon", "v_prediction", "sample"):
        model = _tiny_model(prediction_type=kind)
        images, geometry = torch.rand(4, 1, 8, 8), torch.rand(4, 1, 8, 8)
        e = F.normalize(torch.randn(4, 8), dim=-1)
        gen = torch.Generator().manual_seed(0)
        loss = model.diffusion_loss(images, geometry, e, gen)
        gen = torch.Generator().manual_seed(0)  # recompute by hand with the same draws
        x0 = images * 2 - 1
        t = torch.randint(0, 1000, (4,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        cond = F.normalize(e + 0.05 * torch.randn(e.shape, generator=gen), dim=-1)
        a = model.noise_scheduler.alphas_cumprod[t].view(-1, 1, 1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        target = {"epsilon": noise, "sample": x0, "v_prediction": a.sqrt() * noise - (1 - a).sqrt() * x0}[kind]
        pred = model.generator(torch.cat([x_t, geometry * 2 - 1], 1), t, cond)
        assert loss.item() == pytest.approx(F.mse_loss(pred, target).item(), rel=1e-5)


def test_module_rejects_bad_configuration_and_inputs():
    with pytest.raises(UserInputError, match="train_parts"):
        _tiny_model(train_parts=["decoder"])
    with pytest.raises(UserInputError, match="divide"):
        _tiny_model(num_inference_steps=30)
    with pytest.raises(UserInputError, match="divisible"):
        _tiny_model(image_resolution=9)
    with pytest.raises(UserInputError, match="watermark_bits"):
        _tiny_model(watermark_bits=65)
    model = _tiny_model()
    with pytest.raises(UserInputError, match="image_size"):
        model.predict_step({"image": torch.rand(2, 1, 16, 16), "geometry": torch.rand(2, 1, 16, 16),
                            "identity": torch.tensor([0, 1]), "key": torch.tensor([1, 2])}, 0)
    with pytest.raises(UserInputError, match="keys"):
        model.virtual_identity(torch.randn(2, 8), torch.tensor([-1, 3]))


def test_frozen_parts_get_no_gradient_and_trained_parts_do():
    model = _tiny_model(train_parts=["vip", "generator"])
    assert not any(p.requires_grad for p in model.encoder.parameters()) and not model.identity_head.requires_grad
    assert all(p.requires_grad for p in model.vip.parameters())
    model.train()
    batch = {"image": torch.rand(6, 1, 8, 8), "geometry": torch.rand(6, 1, 8, 8),
             "identity": torch.tensor([0, 0, 1, 1, 2, 3]), "key": torch.arange(6)}
    model.training_step(batch, 0).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.trainable_parameters())


# ============================================================================================ synthetic faces
def test_synthetic_faces_are_deterministic_and_seed_dependent():
    a = synthetic_faces(5, 3, 16, seed=1)
    b = synthetic_faces(5, 3, 16, seed=1)
    c = synthetic_faces(5, 3, 16, seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (15, 1, 16, 16) and 0 <= a[0].min() and a[0].max() <= 1
    assert torch.equal(a[2], torch.arange(5).repeat_interleave(3))


def test_identity_and_pose_are_separate_factors():
    ids = identity_parameters(2, seed=0)
    nuisance = nuisance_parameters(1, seed=0)
    two_people = {k: v for k, v in ids.items()}
    same_pose = {k: v.expand(2) for k, v in nuisance.items()}
    faces = render_faces(two_people, same_pose, 16)
    assert (faces[0] - faces[1]).abs().mean() > 0.01  # identity changes the face
    geometry = geometry_map(same_pose, 16)
    assert torch.equal(geometry[0], geometry[1])  # the geometry map carries no identity
    poses = nuisance_parameters(2, seed=5)
    one_person = {k: v[:1].expand(2) for k, v in ids.items()}
    posed = render_faces(one_person, poses, 16)
    assert (posed[0] - posed[1]).abs().mean() > 0.005  # pose/expression changes the image ...
    assert not torch.equal(geometry_map(poses, 16)[0], geometry_map(poses, 16)[1])  # ... and the geometry map


def test_identity_is_recoverable_across_poses_by_nearest_class_mean():
    """The rendered identity survives pose/expression: nearest class mean on pixels beats chance by far."""
    images, _, ids, _, _ = synthetic_faces(10, 8, 16, seed=0)
    flat = images.flatten(1)
    means = torch.stack([flat[ids == i][:4].mean(0) for i in range(10)])
    test = torch.cat([torch.nonzero(ids == i).flatten()[4:] for i in range(10)])
    predicted = torch.cdist(flat[test], means).argmin(1)
    assert (predicted == ids[test]).float().mean() > 0.5  # chance is 0.1


def test_datamodule_splits_identities_and_keys():
    data = FaceDataModule(num_identities=10, images_per_identity=5, heldout_identity_fraction=0.2, val_fraction=0.2,
                          batch_size=4)
    data.setup("fit")
    assert data.num_train_identities == 8
    train, val, test = (data.split_tensors(s) for s in ("train", "val", "test"))
    assert set(train["identity"].tolist()) == set(range(8)) == set(val["identity"].tolist())
    assert set(test["identity"].tolist()) == {8, 9}
    assert len(train["identity"]) == 32 and len(val["identity"]) == 8 and len(test["identity"]) == 10
    for split in (train, val, test):  # one key per person
        for person in split["identity"].unique():
            assert split["key"][split["identity"] == person].unique().numel() == 1
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"image", "geometry", "identity", "key", "index"} and batch["image"].shape == (4, 1, 16, 16)


# ============================================================================================ real folders
def _write_png(path, value: int, size: int = 20) -> None:
    from PIL import Image

    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(path)


def _celeba(tmp_path, people: int = 5, per: int = 2, landmarks: bool = True):
    folder = tmp_path / "img_align_celeba"
    folder.mkdir()
    lines, marks = [], ["%d" % (people * per), "lefteye_x lefteye_y righteye_x ..."]
    for i in range(people * per):
        name = f"{i:06d}.png"
        _write_png(folder / name, 20 * i)
        lines.append(f"{name} {100 + i // per}")
        marks.append(f"{name} 6 8 14 8 10 11 7 15 13 15")
    (tmp_path / "identity_CelebA.txt").write_text("\n".join(lines) + "\n")
    if landmarks:
        (tmp_path / "list_landmarks_align_celeba.txt").write_text("\n".join(marks) + "\n")
    return tmp_path


def test_celeba_folder_loads_with_landmark_geometry(tmp_path):
    data = FaceDataModule(source="celeba", data_dir=str(_celeba(tmp_path)), image_size=8,
                          heldout_identity_fraction=0.2, batch_size=2)
    data.setup()
    assert data.images.shape == (10, 1, 8, 8) and data.num_train_identities == 4
    assert data.geometry.amax(dim=(1, 2, 3)).min() > 0.5  # landmark blobs drawn
    # an image's grey value survives (uniform images): file 000003.png was written with 60
    assert any(torch.allclose(img, torch.full_like(img, 60 / 255), atol=2 / 255) for img in data.images)


def test_lfw_folder_loads_and_drops_small_identities(tmp_path):
    for person, count in (("Ann", 3), ("Bob", 2), ("Cid", 2), ("Dee", 2), ("Eve", 1)):
        (tmp_path / person).mkdir()
        for i in range(count):
            _write_png(tmp_path / person / f"{person}_{i:04d}.jpg", 10 * i)
    data = FaceDataModule(source="lfw", data_dir=str(tmp_path), real_geometry="none", image_size=8,
                          heldout_identity_fraction=0.25)
    data.setup()
    assert len(data.images) == 9 and data.identity.max() == 3  # Eve (1 image) dropped
    assert torch.equal(data.geometry, torch.zeros_like(data.geometry))


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(UserInputError, match="img_align_celeba"):
        FaceDataModule(source="celeba", data_dir=str(tmp_path)).setup()
    (tmp_path / "a").mkdir()
    root = _celeba(tmp_path / "a", landmarks=False)
    with pytest.raises(UserInputError, match="list_landmarks_align_celeba"):
        FaceDataModule(source="celeba", data_dir=str(root), image_size=8).setup()
    (root / "identity_CelebA.txt").write_text("000000.png 1\nbroken line here\n")
    with pytest.raises(UserInputError, match="line 2"):
        read_celeba_identities(str(root / "identity_CelebA.txt"))
    (root / "identity_CelebA.txt").write_text("missing.png 1\n")
    with pytest.raises(UserInputError, match="missing"):
        FaceDataModule(source="celeba", data_dir=str(root), real_geometry="none").setup()
    with pytest.raises(UserInputError, match="no images"):
        (tmp_path / "empty").mkdir()
        FaceDataModule(source="lfw", data_dir=str(tmp_path / "empty"), real_geometry="none").setup()
    with pytest.raises(UserInputError, match="real_geometry: none"):
        FaceDataModule(source="lfw", data_dir=str(tmp_path))
    with pytest.raises(UserInputError, match="data_dir"):
        FaceDataModule(source="synthetic", data_dir=str(tmp_path))
    with pytest.raises(UserInputError, match="needs data_dir"):
        FaceDataModule(source="celeba")
    with pytest.raises(UserInputError, match="image_size"):
        FaceDataModule(image_size=4)


# ------------------------------------------------------------------------ release layouts and official splits
def _write_jpg(path, value: int, size=(18, 22)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, dtype=np.uint8)).save(path, quality=95)


def _grey_values(images, step: int = 10) -> list[int]:
    return sorted(round(float(img.mean()) * 255 / step) * step for img in images)


def _celeba_release(root, layout: str):
    """CelebA as torchvision lays it out (``<root>/celeba/img_align_celeba/000001.jpg``, the annotation files in
    ``<root>/celeba/``) or as the release is distributed (``Img/img_align_celeba/``, ``Anno/``, ``Eval/``).
    8 identities x 3 images in file order; identities 101-104 in partition 0, 105-106 in 1, 107-108 in 2
    (identity-disjoint, ordered by file as in the release). Image i has grey value 10 i."""
    base = root / "celeba" if layout == "torchvision" else root
    images = base / "img_align_celeba" if layout == "torchvision" else base / "Img" / "img_align_celeba"
    anno = base if layout == "torchvision" else base / "Anno"
    evals = base if layout == "torchvision" else base / "Eval"
    ids, parts, marks = [], [], ["24", "lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x "
                                       "leftmouth_y rightmouth_x rightmouth_y"]
    for i in range(24):
        name, identity = f"{i + 1:06d}.jpg", 101 + i // 3
        _write_jpg(images / name, 10 * i)
        ids.append(f"{name} {identity}")
        parts.append(f"{name} {0 if identity <= 104 else 1 if identity <= 106 else 2}")
        marks.append(f"{name:<10} 6 8 12 8 9 12 7 16 12 16")
    for folder, file, lines in ((anno, "identity_CelebA.txt", ids), (evals, "list_eval_partition.txt", parts),
                                (anno, "list_landmarks_align_celeba.txt", marks)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("layout", ["torchvision", "release"])
def test_celeba_release_root_and_official_partition(tmp_path, layout):
    root = _celeba_release(tmp_path, layout)
    data = FaceDataModule(source="celeba", data_dir=str(root), image_size=8, val_fraction=0.34)
    data.setup()
    assert data.official_split and data.num_train_identities == 4       # the identities of partition 0
    assert len(data.images) == 18                                       # partition 1 (6 images) is not read
    test = data.split_tensors("test")
    assert _grey_values(test["image"]) == [10 * i for i in range(18, 24)]  # exactly partition 2
    assert set(test["identity"].tolist()) == {4, 5}
    trainval = torch.cat([data.rows["train"], data.rows["val"]])
    assert _grey_values(data.images[trainval]) == [10 * i for i in range(12)]
    assert len(data.rows["val"]) == 4                                   # one image of each training identity
    assert data.geometry.amax(dim=(1, 2, 3)).min() > 0.5                # landmarks found in the release layout
    assert data.verification_pairs() is None
    drawn = FaceDataModule(source="celeba", data_dir=str(root), image_size=8, split="drawn",
                           heldout_identity_fraction=0.25)
    drawn.setup()
    assert not drawn.official_split and len(drawn.images) == 24 and drawn.num_train_identities == 6
    (root / ("celeba" if layout == "torchvision" else "Eval") / "list_eval_partition.txt").unlink()
    with pytest.raises(UserInputError, match=r"split='official' needs CelebA's list_eval_partition.txt"):
        FaceDataModule(source="celeba", data_dir=str(root), image_size=8, split="official").setup()
    auto = FaceDataModule(source="celeba", data_dir=str(root), image_size=8)
    auto.setup()
    assert not auto.official_split and len(auto.images) == 24           # no file: the split is drawn


def test_celeba_partition_errors_name_the_problem(tmp_path):
    root = _celeba_release(tmp_path, "torchvision") / "celeba"
    partition = root / "list_eval_partition.txt"
    lines = partition.read_text().splitlines()
    partition.write_text("\n".join(lines[:5] + ["000006.jpg train"] + lines[6:]) + "\n")
    with pytest.raises(UserInputError, match=r"list_eval_partition.txt, line 6: expected '<file name> <0\|1\|2>'"):
        FaceDataModule(source="celeba", data_dir=str(tmp_path), image_size=8).setup()
    partition.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(UserInputError, match=r"no partition for 1 images.*000024.jpg"):
        FaceDataModule(source="celeba", data_dir=str(tmp_path), image_size=8).setup()
    partition.write_text("\n".join(line[:-1] + "0" for line in lines) + "\n")   # no test partition
    with pytest.raises(UserInputError, match=r"official split of .* holds out no identity"):
        FaceDataModule(source="celeba", data_dir=str(tmp_path), image_size=8).setup()
    partition.write_text("\n".join(lines[:-1] + ["000024.jpg 0"]) + "\n")    # identity 108 in 0 and 2
    with pytest.raises(UserInputError, match=r"identities \[108\] have images in both the training"):
        FaceDataModule(source="celeba", data_dir=str(tmp_path), image_size=8).setup()


LFW_PEOPLE = {"Aaron_Peirsol": 2, "Abel_Pacheco": 3, "Adam_Sandler": 2, "Alan_Ball": 2, "Ali_Naimi": 2,
              "Amber_Tamblyn": 2, "Bill_Gates": 4, "Colin_Powell": 2, "Dalai_Lama": 1, "Gray_Davis": 2}
# LFW's pairs format: a "<folds> <pairs per fold>" header, matched "<name> <n1> <n2>", mismatched
# "<name1> <n1> <name2> <n2>" (tab-separated)
LFW_PAIRS = "1\t2\nBill_Gates\t1\t3\nColin_Powell\t1\t2\nDalai_Lama\t1\tGray_Davis\t2\nBill_Gates\t2\tGray_Davis\t1\n"


def _lfw_release(root, layout: str):
    """LFW as torchvision lays it out (``lfw-py/lfw/<name>/<name>_0001.jpg``, ``lfw-py/pairs.txt``) or as the
    release unpacks (``lfw/<name>/...`` next to ``pairs.txt``). Image k of person p has grey value 8 (3 p + k)."""
    base = root / "lfw-py" if layout == "torchvision" else root
    for p, (name, count) in enumerate(LFW_PEOPLE.items()):
        for k in range(1, count + 1):
            _write_jpg(base / "lfw" / name / f"{name}_{k:04d}.jpg", 8 * (3 * p + k))
    (base / "pairs.txt").write_text(LFW_PAIRS)
    return root


def _lfw_value(name: str, k: int) -> int:
    return 8 * (3 * list(LFW_PEOPLE).index(name) + k)


@pytest.mark.parametrize("layout", ["torchvision", "release", "image_folder"])
def test_lfw_release_root_and_official_pairs(tmp_path, layout):
    root = _lfw_release(tmp_path, "torchvision" if layout == "torchvision" else "release")
    data_dir = root / "lfw" if layout == "image_folder" else root      # the person folders; pairs.txt one up
    data = FaceDataModule(source="lfw", data_dir=str(data_dir), real_geometry="none", image_size=8,
                          val_fraction=0.3)
    data.setup()
    assert data.official_split and data.num_train_identities == 6       # the people no pair names
    test = data.split_tensors("test")
    named = [("Bill_Gates", 1), ("Bill_Gates", 2), ("Bill_Gates", 3), ("Colin_Powell", 1), ("Colin_Powell", 2),
             ("Dalai_Lama", 1), ("Gray_Davis", 1), ("Gray_Davis", 2)]
    assert _grey_values(test["image"], 8) == sorted(_lfw_value(*n) for n in named)   # Bill_Gates_0004 is not read
    pairs = data.verification_pairs()
    assert pairs[:, 2].tolist() == [1, 1, 0, 0]
    expected = [(("Bill_Gates", 1), ("Bill_Gates", 3)), (("Colin_Powell", 1), ("Colin_Powell", 2)),
                (("Dalai_Lama", 1), ("Gray_Davis", 2)), (("Bill_Gates", 2), ("Gray_Davis", 1))]
    for (i, j, _), (a, b) in zip(pairs.tolist(), expected):
        assert _grey_values(test["image"][[i]], 8) == [_lfw_value(*a)]
        assert _grey_values(test["image"][[j]], 8) == [_lfw_value(*b)]
    same_identity = test["identity"][pairs[:, 0]] == test["identity"][pairs[:, 1]]
    assert same_identity.tolist() == [True, True, False, False]
    drawn = FaceDataModule(source="lfw", data_dir=str(data_dir), real_geometry="none", image_size=8, split="drawn")
    drawn.setup()
    assert drawn.verification_pairs() is None and len(drawn.images) == 21   # Dalai_Lama (1 image) dropped


def test_official_split_caps_each_part_and_reports_pairs_left_out(tmp_path, caplog):
    root = _lfw_release(tmp_path, "release")
    data = FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", image_size=8, max_images=7)
    with caplog.at_level("WARNING", logger="datamodules.face_datasets"):
        data.setup()
    assert data.num_train_identities == 3          # the first 7 training images: Aaron 2, Abel 3, Adam 2
    assert len(data.rows["test"]) == 7              # the first 7 of the 8 images the pairs name (Gray_Davis_0002 not)
    assert data.verification_pairs()[:, 2].tolist() == [1, 1, 0]
    assert "1 of 4 pairs.txt pairs name images that max_images did not read" in caplog.text


def test_lfw_pairs_errors_name_the_problem(tmp_path):
    root = _lfw_release(tmp_path, "release")
    (root / "pairs.txt").write_text("1\t2\nBill_Gates\t1\nColin_Powell\t1\t2\n")
    with pytest.raises(UserInputError, match=r"pairs.txt, line 2: expected '<name> <n1> <n2>'"):
        FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", image_size=8).setup()
    (root / "pairs.txt").write_text("1\t1\nBill_Gates\t1\t9\n")
    with pytest.raises(UserInputError, match=r"names '.*Bill_Gates_0009.jpg', which does not exist"):
        FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", image_size=8).setup()
    (root / "pairs.txt").unlink()
    with pytest.raises(UserInputError, match=r"split='official' needs LFW's pairsDevTest.txt"):
        FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", split="official",
                       lfw_pairs="pairsDevTest.txt").setup()
    with pytest.raises(UserInputError, match="lfw_pairs='../pairs.txt' must be a file name"):
        FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", lfw_pairs="../pairs.txt")
    with pytest.raises(UserInputError, match="split='random' is unknown"):
        FaceDataModule(source="lfw", data_dir=str(root), real_geometry="none", split="random")
    with pytest.raises(UserInputError, match="synthetic' has no official split"):
        FaceDataModule(split="official")


# ============================================================================================ the claim (slow)
@pytest.mark.slow
def test_reduced_experiment_reproduces_the_mechanisms(tmp_path):
    """One seed at reduced size through the runner (configs/tivdiff/experiment.yaml with smaller sizes): VIP keeps
    identities verifiable, is unlinkable across keys and far from the original; the watermark is read with the
    right key (> 0.9) and not with a wrong one (~0.5)."""
    import yaml

    from experiments.runner import experiment_path, run_experiment

    spec = yaml.safe_load(experiment_path("tivdiff").read_text())
    spec["overrides"].update({"data.init_args.num_identities": 40, "data.init_args.images_per_identity": 10,
                              "model.init_args.num_train_identities": 30})
    spec["arms"]["encoder"]["overrides"]["trainer.max_steps"] = 150
    stage2 = spec["arms"]["VIP (trained)"]["overrides"]
    stage2["trainer.max_steps"] = 300
    stage2["trainer.callbacks+"]["init_args"]["decay"] = 0.99
    spec["settings"].update(vip_identities=60, faces=48, few_steps=10)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_experiment("tivdiff", seeds=1, out=tmp_path, spec_path=path)
    arms = result["per_seed"][0]
    vip = arms["VIP (trained)"]
    assert vip["verif_auc"] > 0.9 and abs(vip["linkability_auc"] - 0.5) < 0.1 and abs(vip["cos_e_v"]) < 0.2
    wm = arms["IGGW watermark"]
    assert wm["bit_acc_exact_no_diffusion"] == 1.0
    assert wm["bit_acc_right_key"] > 0.9 and abs(wm["bit_acc_wrong_key"] - 0.5) < 0.1
