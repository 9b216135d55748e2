"""RNA-FM: the flow-matching path and samplers, the pathway machinery (shared-gene mask, ragged per-pathway layers,
averaged overlap heads), CFG, adaLN-Zero, the metrics against scipy / brute force, and the slide datamodule
(synthetic generator, CSV / HDF5 / pathway-JSON loaders and their errors)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from datamodules.slide_expression import SlideExpressionDataModule, read_pathway_json, synthetic_slides
from lightning_modules.shared.errors import UserInputError
from lightning_modules.rna_fm.expression_eval import (benjamini_hochberg, energy_distance_1d, expression_metrics,
                                               interval_coverage, pearson_pvalues, per_gene_pearson, sample_crps,
                                               top_k_genes)
from lightning_modules.rna_fm.expression_regressors import HE2RNARegressor, TRNAsformerRegressor
from lightning_modules.rna_fm.rna_fm import (RNAFM, AdaLNZeroBlock, PathwayGraphBlock, PathwayHeads, PathwayTokenizer,
                                      RaggedLayout, attention_bias, cfg_combine, coverage_counts, integrate,
                                      interpolate, shared_gene_adjacency, target_velocity)

SMALL_DATA = dict(num_slides=60, num_pathway_genes=24, num_pathways=4, num_background_genes=6, num_clusters=8,
                  feature_dim=8, batch_size=16, eval_batch_size=32)


def _built_model(cls=RNAFM, data=None, **kwargs):
    data = data or SlideExpressionDataModule(**SMALL_DATA)
    defaults = dict(hidden_dim=16, depth=1, num_heads=2, graph_heads=2, cond_heads=2, dropout=0.0) if cls is RNAFM \
        else {}
    model = cls(**{**defaults, **kwargs})
    model._build(model.structure_from(data))
    return model, data


# ============================================================================================ flow matching
def test_straight_path_and_target_velocity_by_hand():
    x0 = torch.tensor([[0.0, 2.0], [1.0, -1.0]])
    x1 = torch.tensor([[4.0, 0.0], [3.0, 1.0]])
    t = torch.tensor([0.25, 1.0])
    assert torch.allclose(interpolate(x0, x1, t), torch.tensor([[1.0, 1.5], [3.0, 1.0]]))
    assert torch.equal(target_velocity(x0, x1), torch.tensor([[4.0, -2.0], [2.0, 2.0]]))
    # the path's time derivative is the target velocity
    eps = 1e-3
    numeric = (interpolate(x0, x1, t - eps) - interpolate(x0, x1, t - 2 * eps)) / eps
    assert torch.allclose(numeric, target_velocity(x0, x1), atol=1e-4)


def test_euler_and_heun_on_a_known_linear_field():
    a, steps = -0.7, 5
    x0 = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    h = 1.0 / steps
    euler = integrate(lambda x, t: a * x, x0, steps, "euler")
    assert torch.allclose(euler, x0 * (1 + h * a) ** steps)
    heun = integrate(lambda x, t: a * x, x0, steps, "heun")
    assert torch.allclose(heun, x0 * (1 + h * a + (h * a) ** 2 / 2) ** steps)
    # a time-dependent field dx/dt = t: Euler's left Riemann sum sum_i i h^2 = (1 - h)/2; Heun is exact (1/2)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    field = lambda x, t: t[:, None].to(x)  # noqa: E731
    assert integrate(field, zero, 4, "euler").item() == pytest.approx((1 - 0.25) / 2)
    assert integrate(field, zero, 4, "heun").item() == pytest.approx(0.5)


def test_flow_matching_loss_is_mse_to_x1_minus_x0_with_the_drawn_t_and_noise():
    model, data = _built_model(cfg_drop_prob=0.0)
    batch = next(iter(data.train_dataloader()))
    seen = {}

    def fake_velocity(x, t, features):
        seen["x"], seen["t"] = x, t
        return torch.zeros_like(x)

    model.velocity = fake_velocity
    loss = model.loss(batch, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    x1 = batch["expression"]
    t = torch.rand(x1.shape[0], generator=gen)
    x0 = torch.randn(x1.shape, generator=gen)
    assert torch.allclose(seen["t"], t) and torch.allclose(seen["x"], (1 - t[:, None]) * x0 + t[:, None] * x1)
    assert loss.item() == pytest.approx(((x1 - x0) ** 2).mean().item(), rel=1e-6)


def test_cfg_combination_formula_and_guided_velocity():
    v_c, v_u = torch.tensor([3.0, -1.0]), torch.tensor([1.0, 1.0])
    assert torch.equal(cfg_combine(v_c, v_u, 2.0), torch.tensor([5.0, -3.0]))
    assert torch.equal(cfg_combine(v_c, v_u, 1.0), v_c) and torch.equal(cfg_combine(v_c, v_u, 0.0), v_u)
    model, data = _built_model(cfg_scale=2.0)
    _perturb(model)
    model.eval()
    features = next(iter(data.val_dataloader()))["features"][:5]
    x, t = torch.randn(5, data.num_genes), torch.rand(5)
    cond, empty = model.condition_embeddings(features)
    with torch.no_grad():
        guided = model.guided_velocity(x, t, cond, empty)
        conditional = model.velocity(x, t, features)
        unconditional = model.velocity(x, t, model.empty_condition.expand_as(features))
    assert torch.allclose(guided, unconditional + 2.0 * (conditional - unconditional), atol=1e-5)


def test_condition_dropout_is_per_sample_or_per_batch():
    model, data = _built_model(cfg_drop_prob=0.5)
    model.train()
    features = torch.randn(400, data.num_clusters, data.feature_dim)
    torch.manual_seed(0)
    dropped = (model.drop_condition(features) == model.empty_condition).flatten(1).all(1)
    assert 120 < int(dropped.sum()) < 280  # per sample: a mixture
    model.hparams.cfg_drop = "batch"
    outcomes = set()
    for seed in range(8):
        torch.manual_seed(seed)
        d = (model.drop_condition(features) == model.empty_condition).flatten(1).all(1)
        assert bool(d.all()) or not bool(d.any())
        outcomes.add(bool(d.all()))
    assert outcomes == {True, False}
    model.eval()
    assert torch.equal(model.drop_condition(features), features)


def test_sampling_with_zero_initialised_heads_returns_the_noise():
    model, data = _built_model()
    model.eval()
    features = next(iter(data.val_dataloader()))["features"][:3]
    samples = model.sample(features, 4, torch.Generator().manual_seed(5))
    noise = torch.randn(12, data.num_genes, generator=torch.Generator().manual_seed(5)).reshape(3, 4, -1)
    assert torch.equal(samples, noise)  # v == 0 at init: the heads are zero-initialised


# ============================================================================================ pathway structure
def test_shared_gene_mask_on_a_hand_example():
    groups = [[0, 1], [1, 2], [3], [0, 4]]
    expected = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(shared_gene_adjacency(groups, 5), expected)
    bias = attention_bias(expected)
    assert bias[0, 2].item() == -1e4 and bias[0, 1].item() == 0.0 and bias[2, 2].item() == 0.0


def test_graph_block_attends_only_to_pathways_sharing_a_gene():
    groups = [[0, 1], [1, 2], [3]]
    torch.manual_seed(0)
    block = PathwayGraphBlock(8, 2, attention_bias(shared_gene_adjacency(groups, 4)), dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    changed = x.clone()
    changed[0, 2] += 5.0 * torch.randn(8)  # token 2 shares no gene with 0 or 1
    with torch.no_grad():
        out, out2 = block(x), block(changed)
    assert torch.allclose(out[0, :2], out2[0, :2], atol=1e-6)
    changed = x.clone()
    changed[0, 1] += 5.0 * torch.randn(8)  # token 1 shares gene 1 with token 0
    with torch.no_grad():
        assert not torch.allclose(block(changed)[0, 0], out[0, 0], atol=1e-4)
    assert block.alpha.item() == pytest.approx(0.1)


def test_ragged_tokenizer_equals_a_per_pathway_loop():
    groups = [[0, 1, 2, 3, 4], [4, 5], [5], [6, 7, 8]]
    layout = RaggedLayout(groups)
    assert len(layout) == 4  # sizes 5, 2, 1, 3 fall into buckets 2^3, 2^1, 2^0, 2^2
    torch.manual_seed(0)
    tok = PathwayTokenizer(layout, 6)
    x = torch.randn(3, 9)
    out = tok(x)
    for i, members in enumerate(layout.bucket_members):
        for row, p in enumerate(members):
            n = len(groups[p])
            h = torch.nn.functional.silu(x[:, groups[p]] @ tok.w1[i][row, :n] + tok.b1[i][row])
            expected = h @ tok.w2[i][row] + tok.b2[i][row] + tok.embedding[p]
            assert torch.allclose(out[:, p], expected, atol=1e-5)


def test_heads_average_overlapping_pathways_and_skip_uncovered_genes():
    groups = [[0, 1, 2, 3, 4], [4, 5], [5]]
    layout = RaggedLayout(groups)
    heads = PathwayHeads(layout, groups, 7, hidden=4)
    per_group = {0: [1.0, 2.0, 3.0, 4.0, 5.0], 1: [10.0, 20.0], 2: [30.0]}
    with torch.no_grad():
        for i, members in enumerate(layout.bucket_members):
            for row, p in enumerate(members):
                heads.b[i][row, :len(groups[p])] = torch.tensor(per_group[p])
    out = heads(torch.randn(2, 3, 4), torch.randn(2, 4))  # weights are zero: outputs are the biases
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0, (5.0 + 10.0) / 2, (20.0 + 30.0) / 2, 0.0])
    assert torch.allclose(out, expected.expand(2, -1))
    assert torch.equal(coverage_counts(groups, 7), torch.tensor([1.0, 1, 1, 1, 2, 2, 0]))


def test_adaln_zero_block_is_the_identity_at_init_and_not_after_training_its_modulation():
    torch.manual_seed(0)
    block = AdaLNZeroBlock(8, 2)
    x, c = torch.randn(3, 5, 8), torch.randn(3, 8)
    assert torch.equal(block(x, c), x)
    with torch.no_grad():
        block.modulation[1].bias.normal_()
    assert not torch.allclose(block(x, c), x)


def test_velocity_net_outputs_zero_at_init_and_flat_ablation_has_one_token():
    model, data = _built_model()
    batch = next(iter(data.train_dataloader()))
    v = model.velocity(batch["expression"], torch.rand(len(batch["index"])), batch["features"])
    assert torch.equal(v, torch.zeros_like(v))
    assert len(model.net.tokenizer.embedding) == SMALL_DATA["num_pathways"] + 1  # pathways + background
    flat, _ = _built_model(data=data, pathway_tokens=False)
    assert len(flat.net.tokenizer.embedding) == 1


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))


# ============================================================================================ metrics
def test_pearson_pvalues_and_bh_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    gen = np.random.default_rng(0)
    target = gen.standard_normal((30, 6))
    pred = target * np.linspace(0, 1, 6) + gen.standard_normal((30, 6))
    r = per_gene_pearson(torch.tensor(pred), torch.tensor(target))
    p = pearson_pvalues(r, 30)
    for g in range(6):
        ref = stats.pearsonr(pred[:, g], target[:, g])
        assert r[g].item() == pytest.approx(ref.statistic, abs=1e-10)
        assert p[g].item() == pytest.approx(ref.pvalue, rel=1e-8, abs=1e-14)
    pvals = torch.tensor([0.01, 0.04, 0.03, 0.2, 0.005], dtype=torch.float64)
    assert np.allclose(benjamini_hochberg(pvals).numpy(), stats.false_discovery_control(pvals.numpy()))
    # direct formula: q_i = min over p_j >= p_i of p_j m / rank_j
    ranks = pvals.argsort().argsort() + 1
    direct = [min(min(pvals[j] * 5 / ranks[j] for j in range(5) if pvals[j] >= pvals[i]).item(), 1.0)
              for i in range(5)]
    assert np.allclose(benjamini_hochberg(pvals).numpy(), direct)


def test_constant_gene_has_zero_correlation():
    pred = torch.tensor([[1.0, 2.0], [1.0, 3.0], [1.0, 5.0]])
    r = per_gene_pearson(pred, torch.tensor([[0.0, 1.0], [1.0, 2.0], [2.0, 4.0]]))
    assert r[0].item() == 0.0 and r[1].item() == pytest.approx(1.0)


def test_interval_coverage_by_hand_and_its_sample_count_check():
    samples = torch.arange(1.0, 20.0).view(1, 19, 1).expand(4, 19, 2).clone()  # 19 samples 1..19
    target = torch.tensor([[0.5, 1.0], [19.0, 10.0], [19.5, 3.0], [7.0, -1.0]])
    cov = interval_coverage(samples, target, 0.9)  # [min, max] = [1, 19]
    assert torch.allclose(cov, torch.tensor([0.5, 0.75], dtype=torch.float64))
    cov80 = interval_coverage(samples, target, 0.8)  # j = 2: [2, 18]
    assert torch.allclose(cov80, torch.tensor([0.25, 0.5], dtype=torch.float64))
    with pytest.raises(UserInputError, match="K = 19"):
        interval_coverage(samples[:, :10], target, 0.9)
    # a perfect sampler covers 90% (exchangeability)
    gen = torch.Generator().manual_seed(0)
    draws = torch.randn(20000, 20, 1, generator=gen)
    assert interval_coverage(draws[:, :19], draws[:, 19], 0.9).item() == pytest.approx(0.9, abs=0.01)


def test_energy_distance_against_scipy_and_crps_against_brute_force():
    stats = pytest.importorskip("scipy.stats")
    gen = np.random.default_rng(1)
    u, v = gen.standard_normal((40, 3)), gen.standard_normal((25, 3)) * 2 + 0.5
    ours = energy_distance_1d(torch.tensor(u), torch.tensor(v))
    for g in range(3):
        assert ours[g].item() == pytest.approx(stats.energy_distance(u[:, g], v[:, g]), rel=1e-10)
    samples, target = torch.tensor(gen.standard_normal((5, 7, 2))), torch.tensor(gen.standard_normal((5, 2)))
    brute = torch.zeros(2, dtype=torch.float64)
    for n in range(5):
        for g in range(2):
            s = samples[n, :, g]
            pairs = sum(abs(s[a] - s[b]) for a in range(7) for b in range(7)) / (7 * 6)
            brute[g] += ((s - target[n, g]).abs().mean() - 0.5 * pairs) / 5
    assert torch.allclose(sample_crps(samples, target), brute)


def test_expression_metrics_use_the_validation_chosen_genes():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(50, 4, generator=gen)
    point = target.clone()
    point[:, 0] = torch.randn(50, generator=gen)  # gene 0 unpredictable
    samples = point.unsqueeze(1) + 0.1 * torch.randn(50, 19, 4, generator=gen)
    chosen = top_k_genes(torch.tensor([0.9, 0.1, 0.2, 0.3]), [1, 2])  # validation says gene 0 is best
    metrics, gene_r = expression_metrics(point, samples, target, torch.full((4,), 2.0), chosen,
                                         torch.tensor([True, False, False, True]))
    assert metrics["top1"] == pytest.approx(gene_r[0].item()) and gene_r[0] < 0.5
    assert metrics["top2"] == pytest.approx(gene_r[[0, 3]].mean().item())
    assert metrics["rmse"] == pytest.approx(2.0 * ((point - target) ** 2).mean(0).sqrt().mean().item(), rel=1e-6)
    assert metrics["n_significant"] == 3.0
    assert {"coverage", "coverage_bimodal", "energy_unimodal", "crps"} <= set(metrics)


# ============================================================================================ data
def test_synthetic_generator_is_seeded_and_has_the_promised_structure():
    a, b = synthetic_slides(num_slides=400, seed=3), synthetic_slides(num_slides=400, seed=3)
    assert np.array_equal(a.features, b.features) and np.array_equal(a.expression, b.expression)
    assert a.features.shape == (400, 100, 32) and a.expression.shape == (400, 440)
    member = np.zeros(440, int)
    for p in a.pathways:
        member[p] += 1
    assert set(member[:400]) == {1, 2} and (member[400:] == 0).all() and a.background == list(range(400, 440))
    diff = a.expression[a.subtype == 1].mean(0) - a.expression[a.subtype == 0].mean(0)
    assert (np.abs(diff[a.bimodal_genes]) > 1.0).all() and (np.abs(diff[~a.bimodal_genes]) < 0.8).all()


def test_splits_are_disjoint_and_statistics_come_from_training():
    dm = SlideExpressionDataModule(**SMALL_DATA, seed=4)
    dm.setup("fit")
    parts = [set(dm.splits_of(s).tolist()) for s in ("train", "val", "test")]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert len(set.union(*parts)) == 60
    train = torch.cat([b["expression"] for b in dm.train_dataloader()])
    assert torch.allclose(train.mean(0), torch.zeros(dm.num_genes), atol=1e-5)
    assert torch.allclose(train.std(0, unbiased=False), torch.ones(dm.num_genes), atol=1e-4)
    _, log_expr = dm.split_arrays("val")
    assert np.allclose(next(iter(dm.val_dataloader()))["expression"].numpy(),
                       (log_expr - dm.gene_mean) / dm.gene_std, atol=1e-5)


def _write_files(root, n_patients=6, slides_per_patient=2, clusters=4, dim=3, genes=("A", "B", "C", "D")):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    lines = ["wsi_file_name,patient_id,tcga_project," + ",".join(f"rna_{g}" for g in genes)]
    (root / "features").mkdir()
    for p in range(n_patients):
        for s in range(slides_per_patient):
            slide = f"TCGA-{p:02d}-s{s}"
            lines.append(f"{slide},TCGA-{p:02d},BRCA," + ",".join(str(v) for v in rng.integers(0, 100, len(genes))))
            (root / "features" / slide).mkdir()
            with h5py.File(root / "features" / slide / f"{slide}.h5", "w") as f:
                f["cluster_features"] = rng.standard_normal((clusters, dim)).astype(np.float32)
    (root / "reference.csv").write_text("\n".join(lines) + "\n")
    (root / "pathways.json").write_text(json.dumps({"P1": [0, 1], "P2": ["B", "C"], "UNMAPPED": [3]}))
    return lines


def test_file_loaders_read_csv_hdf5_and_pathways(tmp_path):
    lines = _write_files(tmp_path)
    dm = SlideExpressionDataModule(source="files", data_dir=str(tmp_path), val_fraction=0.2, test_fraction=0.2,
                                   batch_size=4)
    dm.setup("fit")
    assert (dm.num_genes, dm.num_clusters, dm.feature_dim) == (4, 4, 3)
    assert dm.pathways == [[0, 1], [1, 2]] and dm.background == [3]
    first = [float(v) for v in lines[1].split(",")[3:]]
    assert np.allclose(dm.data.expression[0], np.log2(np.asarray(first) + 1))
    assert dm.data.gene_names == ["A", "B", "C", "D"]
    for split in ("train", "val", "test"):  # both slides of a patient land in the same split
        patients = {dm.data.slide_ids[i].split("-s")[0] for i in dm.splits_of(split)}
        assert len(dm.splits_of(split)) == 2 * len(patients)
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape[1:] == (4, 3) and batch["expression"].shape[1] == 4


def test_reference_csv_with_slide_paths_and_rna_file_name(tmp_path):
    """The released reference files name slides by their .svs path and may carry an rna_file_name column
    (RNA-FM pre_processing/generate_ref_file.py, src/read_data_log.py): features/<stem>/<stem>.h5 is read and
    rna_file_name is not a gene."""
    lines = _write_files(tmp_path)
    header, rows = lines[0].split(","), [line.split(",") for line in lines[1:]]
    text = [",".join(["wsi_file_name", "patient_id", "rna_file_name", *header[3:]])]
    for row in rows:
        text.append(",".join([f"/srv/TCGA_BRCA/{row[1]}-uuid/{row[0]}.svs", row[1], f"/rna/{row[1]}.tsv", *row[3:]]))
    (tmp_path / "reference.csv").write_text("\n".join(text) + "\n")
    dm = SlideExpressionDataModule(source="files", data_dir=str(tmp_path), val_fraction=0.2, test_fraction=0.2)
    assert dm.data.gene_names == ["A", "B", "C", "D"] and dm.slide_ids[0] == rows[0][0]
    assert np.allclose(dm.data.expression[0], np.log2(np.asarray([float(v) for v in rows[0][3:]]) + 1))


def test_a_model_trains_on_files_end_to_end(tmp_path):
    from lightning.pytorch import Trainer

    _write_files(tmp_path, n_patients=8)
    dm = SlideExpressionDataModule(source="files", data_dir=str(tmp_path), batch_size=4)
    model = RNAFM(hidden_dim=8, depth=1, num_heads=2, graph_heads=2, cond_heads=1, dropout=0.0, test_samples=19)
    trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    gathered, captured = model._gathered, {}

    def spy(stage):  # the test-set tensors the metrics are computed from
        captured[stage] = gathered(stage)
        return captured[stage]

    model._gathered = spy
    trainer.test(model, datamodule=dm, verbose=False)
    point, samples, target = (x.double().numpy() for x in captured["test"][:3])
    assert samples.shape[1] == 19 and point.shape == target.shape and target.shape[1] == 4
    np.testing.assert_allclose(point, samples.mean(1), rtol=1e-5, atol=1e-6)  # RNA-FM's point = mean of samples
    r = [np.corrcoef(point[:, g], target[:, g])[0, 1] for g in range(target.shape[1])]
    assert model.test_metrics["pearson"] == pytest.approx(float(np.mean(r)), abs=1e-5)
    inside = (target >= samples.min(1)) & (target <= samples.max(1))  # K = 19 at level 0.9: [x_(1), x_(19)]
    assert model.test_metrics["coverage"] == pytest.approx(float(inside.mean(0).mean()), abs=1e-9)


@pytest.mark.parametrize("case, match", [
    ("no_csv", "reference CSV"), ("no_slide_column", "wsi_file_name"), ("not_a_number", "line 2, column rna_A"),
    ("negative", "non-negative"), ("no_h5", "no HDF5 features"), ("wrong_key", "no dataset 'cluster_features'"),
    ("shape_mismatch", "same number of clusters"), ("bad_index", "outside"), ("unknown_gene", "'ZZZ'"),
    ("bad_json", "not valid JSON"), ("no_data_dir", "needs data_dir")])
def test_file_errors_name_the_problem(tmp_path, case, match):
    h5py = pytest.importorskip("h5py")
    _write_files(tmp_path)
    csv_path = tmp_path / "reference.csv"
    text = csv_path.read_text().splitlines()
    if case == "no_csv":
        csv_path.unlink()
    elif case == "no_slide_column":
        csv_path.write_text("\n".join([text[0].replace("wsi_file_name", "slide")] + text[1:]))
    elif case == "not_a_number":
        fields = text[1].split(",")
        fields[3] = "abc"
        csv_path.write_text("\n".join([text[0], ",".join(fields)] + text[2:]))
    elif case == "negative":
        fields = text[1].split(",")
        fields[3] = "-2"
        csv_path.write_text("\n".join([text[0], ",".join(fields)] + text[2:]))
    elif case == "no_h5":
        (tmp_path / "features" / "TCGA-00-s0" / "TCGA-00-s0.h5").unlink()
    elif case in ("wrong_key", "shape_mismatch"):
        with h5py.File(tmp_path / "features" / "TCGA-01-s1" / "TCGA-01-s1.h5", "w") as f:
            f["cluster_features" if case == "shape_mismatch" else "uni_features"] = np.zeros((5, 3), np.float32)
    elif case == "bad_index":
        (tmp_path / "pathways.json").write_text(json.dumps({"P1": [0, 9]}))
    elif case == "unknown_gene":
        (tmp_path / "pathways.json").write_text(json.dumps({"P1": ["A", "ZZZ"]}))
    elif case == "bad_json":
        (tmp_path / "pathways.json").write_text("{not json")
    with pytest.raises(UserInputError, match=match):
        dm = SlideExpressionDataModule(source="files", data_dir=None if case == "no_data_dir" else str(tmp_path))
        dm.setup("fit")


def test_pathway_json_background_collects_unmapped_and_uncovered_genes(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"P1": [0, 1], "empty": [], "UNCLASSIFIED": [2]}))
    assert read_pathway_json(str(path), ["a", "b", "c", "d", "e"]) == ([[0, 1]], [2, 3, 4])


# ============================================================================================ module errors
def test_bad_model_arguments_and_inputs_raise_user_errors():
    with pytest.raises(UserInputError, match="divisible"):
        RNAFM(hidden_dim=10, num_heads=4)
    with pytest.raises(UserInputError, match="sampler"):
        RNAFM(sampler="rk4")
    with pytest.raises(UserInputError, match="cfg_drop_prob"):
        RNAFM(cfg_drop_prob=1.5)
    with pytest.raises(UserInputError, match="ks"):
        HE2RNARegressor(ks=[])
    data = SlideExpressionDataModule(**SMALL_DATA)
    with pytest.raises(UserInputError, match="exceeds"):
        _built_model(HE2RNARegressor, data, ks=[50])
    with pytest.raises(UserInputError, match="not divisible by cond_heads"):
        _built_model(data=data, cond_heads=3)
    model, _ = _built_model(data=data)
    with pytest.raises(UserInputError, match="expects"):
        model.predict_step({"features": torch.zeros(2, 3, 3)}, 0)
    with pytest.raises(UserInputError, match="needs a SlideExpressionDataModule"):
        RNAFM().setup("fit")
    with pytest.raises(UserInputError, match="val_fraction"):
        SlideExpressionDataModule(val_fraction=0.5, test_fraction=0.5)


def test_rna_fm_without_pathways_needs_the_flat_ablation(tmp_path):
    _write_files(tmp_path)
    dm = SlideExpressionDataModule(source="files", data_dir=str(tmp_path), pathway_json=None)
    with pytest.raises(UserInputError, match="needs pathways"):
        _built_model(data=dm, cond_heads=1)
    model, _ = _built_model(data=dm, cond_heads=1, pathway_tokens=False)
    layouts = [m for m in model.modules() if isinstance(m, RaggedLayout)]
    assert layouts and all(layout.sizes == [4] for layout in layouts)  # one flat token over the 4 genes


def test_regressors_predict_deterministically_and_sample_with_residual_std():
    for cls, kwargs in ((HE2RNARegressor, dict(hidden_dim=8, ks=[2])), (TRNAsformerRegressor, dict(dim=8))):
        model, data = _built_model(cls, **kwargs)
        model.eval()
        model.residual_std.fill_(0.5)
        batch = next(iter(data.val_dataloader()))
        point, samples = model.distribution(batch["features"], 200, torch.Generator().manual_seed(0))
        assert samples.shape == (len(batch["index"]), 200, data.num_genes)
        assert (samples - point.unsqueeze(1)).std().item() == pytest.approx(0.5, rel=0.05)
        assert torch.equal(model.predict_step(batch, 0), model.predict_step(batch, 0))


def test_regressors_build_from_the_data_sizes_given_as_arguments(tmp_path):
    """data_sizes builds the network at construction (the paper configs state the published
    sizes, so it can be counted without data): the same parameters as built from the data; fit still takes the
    gene statistics from the data and rejects data of other sizes."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.loggers import CSVLogger

    _write_files(tmp_path, n_patients=8)
    dm = SlideExpressionDataModule(source="files", data_dir=str(tmp_path), pathway_json=None, batch_size=4)
    for cls, kwargs in ((HE2RNARegressor, dict(hidden_dim=8, ks=[2])), (TRNAsformerRegressor, dict(dim=8))):
        eager = cls(**kwargs, data_sizes=dict(num_genes=4, feature_dim=3, num_clusters=4))
        lazy, _ = _built_model(cls, data=dm, **kwargs)
        assert [p.shape for p in eager.parameters()] == [p.shape for p in lazy.parameters()] != []
        # with a logger, so the module's and the datamodule's hyper-parameters are merged (no clashing names)
        trainer = Trainer(max_steps=1, logger=CSVLogger(tmp_path), enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          limit_val_batches=0)
        trainer.fit(eager, datamodule=dm)
        assert np.allclose(eager.gene_mean.numpy(), dm.gene_mean) and np.allclose(eager.gene_std.numpy(), dm.gene_std)
        wrong = cls(**kwargs, data_sizes=dict(num_genes=5, feature_dim=3, num_clusters=4))
        with pytest.raises(UserInputError, match="built for 5 genes .* set model.init_args.data_sizes"):
            Trainer(max_steps=1, logger=False, enable_checkpointing=False).fit(wrong, datamodule=dm)
        with pytest.raises(UserInputError, match="must give exactly num_genes, feature_dim and num_clusters"):
            cls(**kwargs, data_sizes=dict(num_genes=4))


def test_checkpoint_carries_structure_and_validation_gene_ranking():
    model, _ = _built_model()
    model.val_gene_r = torch.linspace(0, 1, model.structure["num_genes"])
    checkpoint = {"state_dict": model.state_dict()}
    model.on_save_checkpoint(checkpoint)
    fresh = RNAFM(**{k: v for k, v in model.hparams.items()})
    fresh.on_load_checkpoint(checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"])
    assert torch.equal(fresh.val_gene_r, model.val_gene_r) and fresh.structure == model.structure


@pytest.mark.slow
def test_reduced_experiment_claim(tmp_path, monkeypatch):
    """Reduced configs/rna_fm/experiment.yaml through the runner (300 slides, 16 clusters, 30 epochs, validation every
    10, width 48, one learning rate 3e-3; RNA-FM and tRNAsformer-lite only): RNA-FM's Pearson r (mean of 19 samples)
    close to the MSE regressor's, and its samples form real predictive intervals (a point regressor's coverage would
    be 0). The full experiment did NOT reproduce better bimodal-gene coverage than a regressor with Gaussian residual
    intervals, so that is not asserted here (see the report in results/rna_fm.json)."""
    import yaml

    from experiments import kit, runner

    raw = yaml.safe_load((kit.REPO_ROOT / "configs" / "rna_fm" / "experiment.yaml").read_text())
    width = {"RNA-FM": {"model.init_args.hidden_dim": 48},
             "tRNAsformer-lite": {"model.init_args.dim": 48, "model.init_args.mlp_dim": 96}}
    raw["arms"] = {name: {**arm, "overrides": {**arm["overrides"], **width[row]}} for name, arm in raw["arms"].items()
                   for row in width if name in (row, f"{row} @ lr=0.003")}
    raw["overrides"].update({"data.init_args.num_slides": 300, "data.init_args.num_clusters": 16,
                             "trainer.max_epochs": 30, "trainer.check_val_every_n_epoch": 10})
    raw["seeds"] = 1
    raw["settings"]["paired"] = {}
    del raw["smoke"]
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    runs = runner.run_experiment("rna_fm", spec_path=path, out=tmp_path / "out")["per_seed"][0]["runs"]
    fm, reg = runs["RNA-FM"], runs["tRNAsformer-lite"]
    assert fm["lr"] == reg["lr"] == 0.003 and list(runs) == ["RNA-FM", "tRNAsformer-lite"]
    assert fm["pearson"] > reg["pearson"] - 0.08, (fm["pearson"], reg["pearson"])
    assert fm["pearson"] > fm["pearson_1sample"]  # averaging samples helps: the samples differ
    assert 0.5 < fm["coverage"] < 1.0
