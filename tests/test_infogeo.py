"""InfoGeo (arXiv 2605.07099): the CSRR Procrustes closed form, slot-order invariance, the CACS gate loss, retrieval
metrics on hand examples, evaluation without cross-view modules, the generator, the folder loaders and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.geo_localization import (GeoLocalizationDataModule, UniqueLocationBatchSampler, folder_layout,
                                          synthetic_split)
from lightning_modules.shared.errors import UserInputError
from lightning_modules.infogeo.infogeo import (GeoRetrieval, InfoGeo, gate_loss, procrustes_distance, retrieval_metrics,
                                       structural_loss, top_right_singular_vectors)

TINY = dict(image_size=32, freeze_encoder=False, num_slots=6, slot_dim=16, decoder_dim=16, agg_channels=16,
            cnn_channels=16)


def _orthonormal(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(rows, cols, generator=gen, dtype=torch.float64))[0]


# ============================================================================================ CSRR
def test_procrustes_closed_form_equals_the_svd_solution_of_the_orthogonal_problem():
    gen = torch.Generator().manual_seed(0)
    u_q, u_g = _orthonormal(20, 4, gen), _orthonormal(20, 4, gen)
    p, _, r_t = torch.linalg.svd(u_g.T @ u_q)
    q_star = p @ r_t                                              # argmin_Q ||u_q - u_g Q||, Q orthogonal
    direct = (u_q - u_g @ q_star).square().sum()
    closed = procrustes_distance(u_q, u_g)
    assert closed.item() == pytest.approx(direct.item(), abs=1e-10)
    assert closed.item() == pytest.approx(8 - 2 * torch.linalg.svdvals(u_g.T @ u_q).sum().item(), abs=1e-10)
    for _ in range(20):                                           # no other orthogonal Q does better
        q = _orthonormal(4, 4, gen)
        assert (u_q - u_g @ q).square().sum() >= closed - 1e-10
    rotated = u_g @ _orthonormal(4, 4, gen)                       # same subspace, other basis: distance 0
    assert procrustes_distance(rotated, u_g).item() == pytest.approx(0.0, abs=1e-10)


def test_structural_loss_is_invariant_to_slot_order_and_matches_an_svd_subspace():
    gen = torch.Generator().manual_seed(1)
    maps_q = torch.rand(3, 6, 25, generator=gen, dtype=torch.float64)
    maps_g = torch.rand(3, 6, 25, generator=gen, dtype=torch.float64)
    loss = structural_loss(maps_q, maps_g, 4)
    for _ in range(3):
        perm_q, perm_g = torch.randperm(6, generator=gen), torch.randperm(6, generator=gen)
        assert structural_loss(maps_q[:, perm_q], maps_g[:, perm_g], 4).item() == pytest.approx(loss.item(),
                                                                                              abs=1e-10)
    u = top_right_singular_vectors(maps_q, 4)
    v = torch.linalg.svd(maps_q, full_matrices=False)[2][:, :4].transpose(1, 2)
    torch.testing.assert_close(u @ u.transpose(1, 2), v @ v.transpose(1, 2))        # the same projector
    torch.testing.assert_close(u.transpose(1, 2) @ u, torch.eye(4, dtype=torch.float64).expand(3, 4, 4))


def test_structural_loss_gradient_equals_the_svd_autograd_gradient():
    gen = torch.Generator().manual_seed(2)
    maps = torch.rand(2, 5, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    other = torch.rand(2, 5, 16, generator=gen, dtype=torch.float64)

    def reference(x):
        u_x = torch.linalg.svd(x, full_matrices=False)[2][:, :3].transpose(1, 2)
        u_o = torch.linalg.svd(other, full_matrices=False)[2][:, :3].transpose(1, 2)
        return procrustes_distance(u_x, u_o).mean()

    ours = torch.autograd.grad(structural_loss(maps, other, 3), maps)[0]
    ref = torch.autograd.grad(reference(maps), maps)[0]
    torch.testing.assert_close(ours, ref)
    equal = torch.ones(1, 4, 9, dtype=torch.float64, requires_grad=True)       # rank 1: degenerate eigenvalues
    loss = structural_loss(equal, torch.rand(1, 4, 9, dtype=torch.float64), 2)
    assert torch.isfinite(torch.autograd.grad(loss, equal)[0]).all()


# ============================================================================================ CACS
def test_gate_loss_on_hand_computed_values():
    # W = (0, 1, 0.5): E[W(1-W)] = 0.25 / 3, Var = ((.5)^2 + (.5)^2 + 0) / 3 = 1/6  ->  1/12 - 1/6 = -1/12
    assert gate_loss(torch.tensor([[0.0, 1.0, 0.5]])).item() == pytest.approx(-1 / 12)
    # two views: (0.5, 0.5) -> 0.25 - 0; (0.2, 0.6) -> (0.16 + 0.24) / 2 - 0.04 = 0.16; mean 0.205
    w_q, w_g = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.2, 0.6]])
    assert gate_loss(w_q, w_g).item() == pytest.approx(0.205)
    assert gate_loss(torch.tensor([[0.0, 1.0]])).item() == pytest.approx(-0.25)       # the minimum


# ============================================================================================ metrics
def test_retrieval_metrics_on_a_hand_example():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [0.9, 0.1]])
    gallery_ids = torch.tensor([0, 1, -1, 1])                     # index 2 is junk
    query = torch.tensor([[1.0, 0.05], [0.2, 1.0]])
    query_ids = torch.tensor([1, 1])
    out = retrieval_metrics(query, query_ids, gallery, gallery_ids, ks=(1, 2))
    # University-1652 AP: sum_i (1/n) ((i-1)/p_i + i/(p_i + 1)) / 2 over the matches at 0-based ranks p_i
    # query 0 ranks (junk removed) id0, id1, id1 -> matches at ranks 1, 2: AP = 1/2 ((0 + 1/2)/2 + (1/2 + 2/3)/2)
    # query 1 ranks id1, id1, id0 -> matches at ranks 0, 1: AP = 1/2 ((1 + 1)/2 + (1 + 1)/2) = 1
    ap0 = 0.5 * ((0 + 0.5) / 2 + (0.5 + 2 / 3) / 2)
    ap1 = 1.0
    assert out["r1"] == pytest.approx(50.0) and out["r2"] == pytest.approx(100.0)
    assert out["r_top1pct"] == pytest.approx(50.0)
    assert out["ap"] == pytest.approx(100 * (ap0 + ap1) / 2)
    with pytest.raises(UserInputError, match="no gallery image of their location"):
        retrieval_metrics(query, torch.tensor([1, 5]), gallery, gallery_ids)
    partial = retrieval_metrics(query, torch.tensor([1, 5]), gallery, gallery_ids, strict=False)   # query 0 only
    assert partial["ap"] == pytest.approx(100 * ap0) and partial["r1"] == 0.0
    assert retrieval_metrics(query, torch.tensor([7, 5]), gallery, gallery_ids, strict=False) == {}


def test_geo_retrieval_metric_gathers_then_ranks_once():
    gen = torch.Generator().manual_seed(3)
    desc, ids = torch.randn(30, 8, generator=gen), torch.arange(30) % 10
    is_query = torch.arange(30) >= 10
    metric = GeoRetrieval()
    for part in torch.randperm(30, generator=gen).split(7):      # any order, any batch sizes
        metric.update(desc[part], ids[part], is_query[part])
    got = {k: float(v) for k, v in metric.compute().items()}
    want = retrieval_metrics(desc[is_query], ids[is_query], desc[~is_query], ids[~is_query])
    assert got == pytest.approx(want)


# ============================================================================================ module
def test_evaluation_never_calls_the_cross_view_modules():
    model = InfoGeo(**TINY)
    calls = []
    for name in ("q2g", "g2q", "router"):
        getattr(model.cacs, name).register_forward_hook(lambda *a, n=name: calls.append(n))
    images = torch.randn(4, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        model.validation_step((images, torch.arange(4) % 2, torch.tensor([0, 0, 1, 1]).bool()), 0)
        model.predict_step((images, torch.arange(4), torch.zeros(4, dtype=torch.bool)), 0)
        desc = model(images)
    assert calls == [] and desc.shape == (4, 16 * 4)
    assert torch.allclose(desc.norm(dim=1), torch.ones(4))
    model.train()
    losses = model.training_losses(images, torch.randn(4, 3, 32, 32))
    assert set(calls) == {"q2g", "g2q", "router"}                # the hooks do fire in training
    assert set(losses) == {"rec", "cacs", "struct", "align", "loss"}
    expected = losses["align"] + 0.05 * losses["rec"] + 0.1 * losses["cacs"] + 0.1 * losses["struct"]
    torch.testing.assert_close(losses["loss"], expected)


def test_baseline_and_ablations_are_config_flips():
    baseline = InfoGeo(**TINY, object_centric=False)
    assert not any(hasattr(baseline, n) for n in ("slots", "decoder", "cacs", "fusion"))
    x = torch.randn(3, 3, 32, 32)
    assert set(baseline.training_losses(x, x)) == {"align", "loss"}
    assert set(InfoGeo(**TINY, use_cacs=False).training_losses(x, x)) == {"rec", "struct", "align", "loss"}
    assert set(InfoGeo(**TINY, use_csrr=False).training_losses(x, x)) == {"rec", "cacs", "align", "loss"}
    assert InfoGeo(**TINY, use_fusion=False).fusion is None


def test_evaluation_descriptors_are_deterministic():
    model = InfoGeo(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)


def test_timm_encoder_reads_a_local_weights_file(tmp_path):
    import timm

    source = timm.create_model("test_vit", pretrained=False, num_classes=0)
    path = tmp_path / "test_vit.pth"
    torch.save(source.state_dict(), path)
    model = InfoGeo(encoder="test_vit", encoder_weights=str(path), image_size=32, num_slots=4, slot_dim=8,
                    decoder_dim=8, agg_channels=8, cacs_heads=4)
    net = model.encoder.net
    torch.testing.assert_close(net.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    assert net.pos_embed.shape[1] == 4 + net.num_prefix_tokens   # resampled to the 2 x 2 grid of 32 px
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 32)


def test_bad_model_input_is_one_clear_error():
    with pytest.raises(UserInputError, match="csrr_rank=4 exceeds num_slots=3"):
        InfoGeo(**{**TINY, "num_slots": 3})
    with pytest.raises(UserInputError, match="patch size 16"):
        InfoGeo(encoder="test_vit", image_size=40, num_slots=4)
    with pytest.raises(UserInputError, match="multiple of 8"):
        InfoGeo(**{**TINY, "image_size": 36})
    with pytest.raises(UserInputError, match="does not exist"):
        InfoGeo(encoder="test_vit", encoder_weights="/nonexistent/dinov2.pth", image_size=32, num_slots=4)
    with pytest.raises(UserInputError, match="image_size=32"):
        InfoGeo(**TINY)(torch.randn(1, 3, 48, 48))


# ============================================================================================ data
def test_generator_is_seeded_and_levels_differ():
    a = synthetic_split("test", 3, 2, 24, seed=5, level="clean")
    b = synthetic_split("test", 3, 2, 24, seed=5, level="clean")
    c = synthetic_split("test", 3, 2, 24, seed=6, level="clean")
    shifted = synthetic_split("test", 3, 2, 24, seed=5, level="shifted")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert torch.equal(a[2], shifted[2]) and not torch.equal(a[0], shifted[0])   # same scenes, other drone views
    assert a[0].shape == (6, 3, 24, 24) and a[1].tolist() == [0, 0, 1, 1, 2, 2] and a[3].tolist() == [0, 1, 2]
    assert shifted[0].float().mean() < a[0].float().mean()                        # dusk is darker


def test_batch_sampler_never_repeats_a_location_and_shards_under_ddp():
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 5, 5])
    data = list(range(len(labels)))
    single = UniqueLocationBatchSampler(data, labels, 4, seed=0)
    batches = single.batches()
    assert all(len({int(labels[i]) for i in b}) == len(b) for b in batches)
    assert all(2 <= len(b) <= 4 for b in batches)
    assert sorted(i for b in batches for i in b) == sorted(set(i for b in batches for i in b))
    assert batches == UniqueLocationBatchSampler(data, labels, 4, seed=0).batches()
    single.set_epoch(1)
    assert single.batches() != batches
    shards = [UniqueLocationBatchSampler(data, labels, 4, seed=0, rank=r, world_size=2).batches() for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]) and not {tuple(b) for b in shards[0]} & {tuple(b) for b in shards[1]}
    flipped = list(UniqueLocationBatchSampler(data, labels, 4, seed=0, flip=True))
    assert {f for b in flipped for _, f, _ in b} == {True, False}


def _image(path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 6, 3), value, dtype=np.uint8)).save(path)


def _university(root, query_ids=("0003", "0004")) -> None:
    for i, loc in enumerate(("0001", "0002")):
        _image(root / "train" / "satellite" / loc / f"{loc}.jpg", 10 * i)
        for v in range(2):
            _image(root / "train" / "drone" / loc / f"image-{v}.jpeg", 10 * i + v)
    for loc in ("0003", "0004"):
        _image(root / "test" / "gallery_satellite" / loc / f"{loc}.png", 50)
    for loc in query_ids:
        _image(root / "test" / "query_drone" / loc / "image-01.jpeg", 60)


def test_university_layout_loads_pairs_and_retrieval_sets(tmp_path):
    _university(tmp_path)
    data = GeoLocalizationDataModule(dataset="university1652", data_dir=str(tmp_path), image_size=8, batch_size=2)
    data.setup("fit")
    drone, sat, ids = data.train_set[[(0, False), (2, True)]]
    assert drone.shape == (2, 3, 8, 8) and ids.tolist() == [0, 1]
    assert sat[0].mean() < sat[1].mean()                          # each drone image got its own location's satellite
    assert len(data.val_set) == 4 and int(sum(data.val_set[i][2] for i in range(4))) == 2
    assert folder_layout("sues200", "/d", 250)["query"] == "/d/Testing/250/query_drone"


def test_bad_data_input_is_one_clear_error(tmp_path):
    _university(tmp_path, query_ids=("0003", "0009"))
    with pytest.raises(UserInputError, match="no satellite gallery image"):
        GeoLocalizationDataModule(dataset="university1652", data_dir=str(tmp_path), image_size=8).setup("validate")
    with pytest.raises(UserInputError, match="Testing/150/query_drone|Training/150"):
        GeoLocalizationDataModule(dataset="sues200", data_dir=str(tmp_path), image_size=8).setup("fit")
    with pytest.raises(UserInputError, match="needs data_dir"):
        GeoLocalizationDataModule(dataset="denseuav").setup("fit")
    good = tmp_path / "good"
    _university(good)
    (good / "train" / "drone" / "0001" / "image-0.jpeg").write_bytes(b"not an image")
    data = GeoLocalizationDataModule(dataset="university1652", data_dir=str(good), image_size=8)
    data.setup("fit")
    with pytest.raises(UserInputError, match="could not be read"):
        data.train_set[0]


def test_logit_scale_starts_at_one_over_0_07():
    assert InfoGeo(**TINY).logit_scale.exp().item() == pytest.approx(1 / 0.07)
    assert math.isclose(InfoGeo(**TINY, logit_scale_init=10.0).logit_scale.exp().item(), 10.0, rel_tol=1e-6)
