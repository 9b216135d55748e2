"""CEM / evi-CEM / EC-CEM math, the intervention callback, the concept data and their bad-input errors."""
from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.integrate import quad
from scipy.stats import multivariate_normal, norm

from callbacks.concept_interventions import ConceptInterventions, check_groups, unit_order
from conftest import config_path, run_cli
from datamodules.concepts import ConceptDataModule, cub_concept_groups, synthetic_data
from lightning_modules.ec_cem.concept_models import (CEM, ECCEM, EXP_EVIDENCE_MAX, EviCEM, GaussianCopula,
                                                     bivariate_normal_cdf, conditional_concept_probs, evidence,
                                                     normal_icdf, pairwise_log_likelihood)
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def small(cls=CEM, **kwargs):
    args = dict(num_concepts=3, num_tasks=2, input_dim=4, hidden_dim=8, depth=2, embedding_size=2)
    return cls(**{**args, **kwargs})


# ============================================================================================ copula math
def test_bivariate_normal_cdf_matches_scipy():
    rng = np.random.default_rng(0)
    h, k, rho = rng.uniform(-3, 3, 40), rng.uniform(-3, 3, 40), rng.uniform(-0.95, 0.95, 40)
    ours = bivariate_normal_cdf(*(torch.tensor(a) for a in (h, k, rho))).numpy()
    reference = [multivariate_normal([0, 0], [[1, r], [r, 1]]).cdf([a, b]) for a, b, r in zip(h, k, rho)]
    np.testing.assert_allclose(ours, reference, atol=1e-6)


def _bvn(a: float, b: float, r: float) -> float:
    return multivariate_normal([0, 0], [[1, r], [r, 1]]).cdf([a, b])


def _cdf(h: np.ndarray, corr: np.ndarray, keep: list[int]) -> float:
    """P(z_keep <= h_keep) for z ~ N(0, corr): scipy for one or two variables; three by integrating the
    bivariate CDF of (z_1, z_2) given z_3 = t against the density of z_3 (scipy quad)."""
    if not keep:
        return 1.0
    if len(keep) == 1:
        return float(norm.cdf(h[keep[0]]))
    if len(keep) == 2:
        return float(_bvn(h[keep[0]], h[keep[1]], corr[keep[0], keep[1]]))
    r12, r13, r23 = corr[0, 1], corr[0, 2], corr[1, 2]
    s1, s2 = math.sqrt(1 - r13 ** 2), math.sqrt(1 - r23 ** 2)
    partial = (r12 - r13 * r23) / (s1 * s2)
    integrand = lambda t: norm.pdf(t) * _bvn((h[0] - r13 * t) / s1, (h[1] - r23 * t) / s2, partial)  # noqa: E731
    return quad(integrand, -10, h[2], epsabs=1e-11)[0]


def _orthant_probability(h: np.ndarray, corr: np.ndarray, bits: tuple[int, ...]) -> float:
    """P(c = bits) with c_i = 1 <=> z_i <= h_i, z ~ N(0, corr), by inclusion-exclusion over CDFs."""
    ones = [i for i, b in enumerate(bits) if b == 1]
    zeros = [i for i, b in enumerate(bits) if b == 0]
    return sum((-1) ** r * _cdf(h, corr, sorted(ones + list(flipped)))
               for r in range(len(zeros) + 1) for flipped in itertools.combinations(zeros, r))


def test_composite_likelihood_matches_brute_force_enumeration_for_three_concepts():
    corr = np.array([[1.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    probs = torch.tensor([[0.3, 0.7, 0.55], [0.9, 0.2, 0.4]], dtype=torch.float64)
    concepts = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    ours = pairwise_log_likelihood(probs, concepts, torch.tensor(corr)).numpy()
    for row in range(2):
        h = normal_icdf(probs[row]).numpy()
        joint = {bits: _orthant_probability(h, corr, bits) for bits in itertools.product((0, 1), repeat=3)}
        assert sum(joint.values()) == pytest.approx(1.0, abs=1e-7)
        c = concepts[row].long().tolist()
        expected = sum(math.log(sum(p for bits, p in joint.items() if bits[i] == c[i] and bits[j] == c[j]))
                       for i, j in itertools.combinations(range(3), 2))
        assert ours[row] == pytest.approx(expected, abs=1e-6)


def test_identity_copula_leaves_non_intervened_concepts_unchanged():
    torch.manual_seed(0)
    probs = torch.rand(16, 5) * 0.9 + 0.05
    mask = (torch.rand(16, 5) < 0.4).float()
    values = torch.randint(0, 2, (16, 5)).float()
    out = conditional_concept_probs(probs, mask, values, torch.eye(5))
    torch.testing.assert_close(out, torch.where(mask.bool(), values, probs), atol=1e-5, rtol=0)
    model = small(ECCEM)
    x = torch.randn(16, 4)
    outputs = model.concept_outputs(x)
    c = torch.randint(0, 2, (16, 3)).float()
    m = (torch.rand(16, 3) < 0.5).float()
    torch.testing.assert_close(model.intervene(outputs, m, c), torch.where(m.bool(), c, outputs["probs"]), atol=1e-5,
                               rtol=0)


@pytest.mark.parametrize("rho", [0.3, 0.8, -0.6])
def test_copula_update_moves_the_partner_like_the_exact_pairwise_conditional(rho):
    torch.manual_seed(1)
    probs = (torch.rand(64, 2) * 0.9 + 0.05).double()
    values = torch.randint(0, 2, (64, 2)).double()
    corr = torch.tensor([[1.0, rho], [rho, 1.0]], dtype=torch.float64)
    ours = conditional_concept_probs(probs, torch.tensor([[1.0, 0.0]]).double().expand(64, 2), values, corr)[:, 1]
    h = normal_icdf(probs)
    p11 = bivariate_normal_cdf(h[:, 0], h[:, 1], torch.tensor(rho, dtype=torch.float64))
    exact = torch.where(values[:, 0] == 1, p11 / probs[:, 0], (probs[:, 1] - p11) / (1 - probs[:, 0]))
    assert (ours - exact).abs().max() < 0.02          # moment matching is an approximation
    moved = torch.sign(ours - probs[:, 1]) * torch.sign(torch.tensor(rho)) * (2 * values[:, 0] - 1)
    assert (moved >= 0).all()                          # positive rho: c_0 = 1 raises p_1, c_0 = 0 lowers it


def test_copula_correlation_is_a_correlation_matrix():
    copula = GaussianCopula(4)
    torch.testing.assert_close(copula.correlation(), torch.eye(4), atol=1e-4, rtol=0)
    with torch.no_grad():
        copula.factor.copy_(torch.randn(4, 4))
    corr = copula.correlation()
    torch.testing.assert_close(corr.diagonal(), torch.ones(4))
    assert torch.linalg.eigvalsh(corr).min() > 0
    torch.testing.assert_close(corr, corr.T)


# ============================================================================================ CEM / evi-CEM formulas
def test_cem_bottleneck_mixes_embeddings_by_probability_and_the_loss_is_the_weighted_bce():
    model = small(CEM, c2y_hidden=[])
    ctx = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, -1.0], [5.0, 5.0, 1.0, 1.0]]])   # m = 2
    probs = torch.tensor([[0.25, 1.0, 0.5]])
    with torch.no_grad():
        model.c2y[0].weight.copy_(torch.arange(12.0).view(2, 6) / 10)
        model.c2y[0].bias.zero_()
    mixed = torch.tensor([0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 4, 0.0, 1.0, 3.0, 3.0])   # p c+ + (1 - p) c-
    expected = torch.arange(12.0).view(2, 6) / 10 @ mixed
    torch.testing.assert_close(model.task_logits({"context": ctx}, probs)[0], expected)
    model.concept_weight.copy_(torch.tensor([2.0, 1.0, 1.0]))
    p, c = torch.tensor([[0.8, 0.4, 0.5]]), torch.tensor([[1.0, 0.0, 1.0]])
    expected_loss = (2 * -math.log(0.8) - math.log(0.6) - math.log(0.5)) / 3
    assert model.concept_losses({"probs": p}, c)["concept"].item() == pytest.approx(expected_loss, rel=1e-5)


def test_evidential_loss_and_misleading_evidence_kl_on_hand_values():
    model = small(EviCEM, annealing_epochs=0, concept_loss_weight=1.0)
    alpha, beta = torch.tensor([[2.0, 2.0, 1.0]]), torch.tensor([[1.0, 1.0, 3.0]])
    c = torch.tensor([[1.0, 0.0, 0.0]])
    terms = model.concept_losses({"alpha": alpha, "beta": beta}, c)
    # psi(a + b) - c psi(a) - (1 - c) psi(b): psi(3) - psi(2) = 1/2; psi(3) - psi(1) = 3/2; psi(4) - psi(3) = 1/3
    assert terms["concept"].item() == pytest.approx((0.5 + 1.5 + 1 / 3) / 3, rel=1e-5)
    # KL(Beta(1, x) || U) = log x + (1 - x) / x with x = beta (c = 1) or alpha (c = 0): x = 1, 2, 1
    assert terms["kl"].item() == pytest.approx((0 + math.log(2) - 0.5 + 0) / 3, rel=1e-5)
    outputs = model.concept_outputs(torch.randn(5, 4))
    torch.testing.assert_close(outputs["probs"], outputs["alpha"] / (outputs["alpha"] + outputs["beta"]))
    assert (outputs["alpha"] >= 1).all() and (outputs["beta"] >= 1).all()
    torch.testing.assert_close(model.concept_uncertainty(outputs), 2 / (outputs["alpha"] + outputs["beta"]))


def test_evidence_activations_on_hand_values():
    pre = torch.tensor([-2.0, 0.0, 3.0, 1e4])
    torch.testing.assert_close(evidence(pre, "relu"), torch.tensor([0.0, 0.0, 3.0, 1e4]))
    torch.testing.assert_close(evidence(pre, "softplus"), torch.log1p(pre.clamp(max=50).exp()).where(pre < 50, pre))
    exp = evidence(pre, "exp")
    torch.testing.assert_close(exp[:3], pre[:3].exp())
    assert exp[3].item() == pytest.approx(math.exp(EXP_EVIDENCE_MAX), rel=1e-5)    # clamped: finite, no overflow
    with pytest.raises(UserInputError, match="evidence_activation='sigmoid'"):
        small(EviCEM, evidence_activation="sigmoid")


@pytest.mark.parametrize("cls", [EviCEM, ECCEM])
def test_default_evidence_head_keeps_a_gradient_when_every_pre_activation_is_negative(cls):
    """The evi-CEM code's ReLU evidence: with w_a^T ctx <= 0 for every input alpha = 1 and no gradient reaches the
    head again (a concept predicted 0 for good); the default (softplus) still pulls alpha up on positive concepts."""
    torch.manual_seed(0)
    x, c = torch.randn(32, 4), torch.ones(32, 3)

    def alpha_head_grad(model) -> float:
        with torch.no_grad():   # alpha pre-activation -3 for every input and concept
            model.alpha_head.weight.zero_()
            model.alpha_head.bias.fill_(-3.0)
        out = model.concept_outputs(x)
        assert (model.alpha_head(out["context"]) < 0).all()
        model.zero_grad()
        sum(model.concept_losses(out, c).values()).backward()
        return model.alpha_head.bias.grad.abs().item()

    default = small(cls)
    assert default.hparams.evidence_activation == "softplus"
    assert alpha_head_grad(default) > 1e-3
    assert alpha_head_grad(small(cls, evidence_activation="exp")) > 1e-3
    assert alpha_head_grad(small(cls, evidence_activation="relu")) == 0.0


@pytest.mark.parametrize(("epochs", "epoch", "weight"), [(10, 0, 0.0), (10, 5, 0.5), (10, 25, 1.0), (0, 0, 1.0)])
def test_kl_annealing_ramps_linearly(epochs, epoch, weight, monkeypatch):
    model = small(EviCEM, annealing_epochs=epochs)
    monkeypatch.setattr(EviCEM, "current_epoch", property(lambda self: epoch))
    assert model.kl_annealing() == weight


@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_randint_mask_is_tiled_over_the_batch_in_the_code_mode(mode):
    torch.manual_seed(0)
    model = small(CEM, intervention_mask=mode, training_intervention_prob=0.5)
    mask = model.random_intervention_mask(torch.zeros(64, 40))
    rows_equal = bool((mask == mask[:1]).all())
    assert rows_equal == (mode == "batch")
    assert 0.3 < mask.mean().item() < 0.7


def test_intervening_on_cem_sets_exactly_the_masked_concepts():
    model = small(CEM)
    outputs = model.concept_outputs(torch.randn(4, 4))
    mask = torch.tensor([[1.0, 0.0, 0.0]]).expand(4, 3)
    c = torch.ones(4, 3)
    new = model.intervene(outputs, mask, c)
    assert (new[:, 0] == 1).all()
    torch.testing.assert_close(new[:, 1:], outputs["probs"][:, 1:])


# ============================================================================================ interventions callback
def test_intervention_curve_ends_at_the_true_concept_accuracy_and_uncertainty_orders_first():
    torch.manual_seed(0)
    model = small(ECCEM).eval()
    x, y, c = torch.randn(32, 4), torch.randint(0, 2, (32,)), torch.randint(0, 2, (32, 3)).float()
    callback = ConceptInterventions(policies=["random", "uncertainty"], num_points=4)
    curves = callback.evaluate(model, [(x[:20], y[:20], c[:20]), (x[20:], y[20:], c[20:])], torch.eye(3))
    with torch.no_grad():
        out = model.concept_outputs(x)
        plain = (model.task_logits(out, out["probs"]).argmax(-1) == y).float().mean().item()
        full = (model.task_logits(out, c).argmax(-1) == y).float().mean().item()
    for curve in curves.values():
        assert [n for n, _ in curve] == [0, 1, 2, 3]
        assert curve[0][1] == pytest.approx(plain) and curve[-1][1] == pytest.approx(full)
    uncertainty = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3]])
    order = unit_order("uncertainty", uncertainty, torch.eye(3), torch.Generator())
    assert order.tolist() == [[1, 2, 0], [0, 2, 1]]
    groups = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])    # group uncertainty = mean of its concepts
    assert unit_order("uncertainty", uncertainty, groups, torch.Generator()).tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("config", ["cem_quick", "evi_cem_quick", "quick"])
def test_callback_logs_the_curve_and_saves_the_plot_for_every_module(config, tmp_path):
    cli = run_cli("--config", config_path(f"configs/ec_cem/{config}.yaml"), *QUIET, "--trainer.max_steps=2",
                  "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp_path}", run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.test(cli.model, datamodule=cli.datamodule)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, ConceptInterventions))
    assert set(callback.curves) == {"random", "uncertainty"}
    assert [n for n, _ in callback.curves["random"]] == [0, 1, 2, 3, 4, 5, 6]
    metrics = cli.trainer.callback_metrics
    assert metrics["intervention/random_acc@0"].item() == pytest.approx(metrics["test/task_acc"].item(), abs=1e-6)
    assert callback.plot_path and (tmp_path / "concept_interventions.png").is_file()


def test_intervention_groups_out_of_range_are_one_error():
    with pytest.raises(UserInputError, match="concept index 7"):
        check_groups([[0, 1], [7]], 6)
    with pytest.raises(UserInputError, match="unknown policy"):
        ConceptInterventions(policies=["oracle"])


def test_callback_refuses_out_of_range_groups_at_test_start(tmp_path):
    cli = run_cli("--config", config_path("configs/ec_cem/cem_quick.yaml"), *QUIET, "--trainer.max_steps=1",
                  "--trainer.limit_val_batches=0", run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, ConceptInterventions))
    callback.level, callback.groups = "group", [[0, 1], [2, 99]]
    with pytest.raises(UserInputError, match="concept index 99"):
        cli.trainer.test(cli.model, datamodule=cli.datamodule)


# ============================================================================================ data
def test_synthetic_generators_follow_the_cem_definitions():
    x, c, y = synthetic_data("xor", 500, torch.Generator().manual_seed(0))
    assert torch.equal(c, (x > 0.5).float()) and torch.equal(y, (c[:, 0] != c[:, 1]).long())
    x, c, y = synthetic_data("dot", 500, torch.Generator().manual_seed(0))
    v1, v3 = (x[:, :2] + x[:, 2:]) / 2, (x[:, :2] - x[:, 2:]) / 2
    assert torch.equal(c[:, 0], (v1.sum(1) > 0).float()) and torch.equal(y, ((v1 * v3).sum(1) > 0).long())
    x, c, y = synthetic_data("trig", 500, torch.Generator().manual_seed(0))
    assert x.shape == (500, 7) and torch.equal(c, (x[:, [0, 2, 4]] > 0).float())   # sin a + a is increasing in a
    _, c, y = synthetic_data("correlated", 20000, torch.Generator().manual_seed(0), pairs=3, rho=0.8)
    phi = np.corrcoef(c.T.numpy())
    assert phi[0, 1] == pytest.approx(2 / math.pi * math.asin(0.8), abs=0.03)   # sign correlation of a pair
    assert abs(phi[0, 2]) < 0.03 and torch.equal(y, (c[:, 0] != c[:, 2]).long())


def test_splits_are_70_10_20_deterministic_and_report_the_imbalance():
    dm = ConceptDataModule(dataset="trig", dataset_size=1000, seed=3)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (700, 100, 200)
    again = ConceptDataModule(dataset="trig", dataset_size=1000, seed=3)
    again.setup("fit")
    assert torch.equal(dm.test_set.tensors[0], again.test_set.tensors[0])
    c = dm.train_set.tensors[2]
    torch.testing.assert_close(dm.concept_imbalance, (1 - c.mean(0)) / c.mean(0))


def _image(path, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(path)


def _fake_cub(root, n=3):
    (root / "class_attr_data_10").mkdir(parents=True)
    for split in ("train", "val", "test"):
        records = []
        for i in range(n):
            rel = f"00{i + 1}.Bird/Bird_{split}_{i}.jpg"
            _image(root / "CUB_200_2011" / "images" / rel)
            records.append({"id": i, "img_path": f"/far/away/CUB_200_2011/images/{rel}", "class_label": i,
                            "attribute_label": [int((i + j) % 3 == 0) for j in range(112)]})
        with open(root / "class_attr_data_10" / f"{split}.pkl", "wb") as f:
            pickle.dump(records, f)


def test_cub_loader_reads_koh_pickles_and_the_28_groups(tmp_path):
    _fake_cub(tmp_path)
    dm = ConceptDataModule(dataset="cub", data_dir=str(tmp_path), image_size=16, batch_size=2)
    dm.setup("fit")
    assert (dm.num_concepts, dm.num_tasks, len(dm.concept_groups)) == (112, 200, 28)
    x, y, c = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 16, 16) and c.shape == (2, 112) and y.dtype == torch.long
    names, groups = cub_concept_groups()
    assert names[0] == "bill_shape" and sorted(i for g in groups for i in g) == list(range(112))


def test_cub_errors_missing_pickles_bad_layout_and_broken_image(tmp_path):
    with pytest.raises(UserInputError, match="class_attr_data_10/train.pkl"):
        ConceptDataModule(dataset="cub", data_dir=str(tmp_path))
    _fake_cub(tmp_path)
    with open(tmp_path / "class_attr_data_10" / "val.pkl", "wb") as f:
        pickle.dump({"not": "a list"}, f)
    dm = ConceptDataModule(dataset="cub", data_dir=str(tmp_path), image_size=16)
    with pytest.raises(UserInputError, match="list of dicts"):
        dm.setup("fit")
    _fake_cub(tmp_path / "again")
    next((tmp_path / "again" / "CUB_200_2011" / "images").rglob("*.jpg")).write_bytes(b"not a jpeg")
    dm = ConceptDataModule(dataset="cub", data_dir=str(tmp_path / "again"), image_size=16)
    dm.setup("fit")
    with pytest.raises(UserInputError, match="could not be read"):
        [part[i] for part in (dm.train_set, dm.val_set, dm.test_set) for i in range(len(part))]


def test_celeba_loader_builds_the_cem_task_from_balanced_attributes(tmp_path):
    folder = tmp_path / "celeba"
    rng = np.random.default_rng(0)
    names = [f"attr_{j}" for j in range(40)]
    freq = np.linspace(0.05, 0.95, 40)
    values = (rng.random((48, 40)) < freq).astype(int) * 2 - 1
    lines = ["48", " ".join(names)] + [f"{i:06d}.jpg " + " ".join(map(str, row)) for i, row in enumerate(values)]
    folder.mkdir()
    (folder / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    for i in range(48):
        _image(folder / "img_align_celeba" / f"{i:06d}.jpg", (20, 24))
    dm = ConceptDataModule(dataset="celeba", data_dir=str(tmp_path), image_size=8, celeba_concepts=2,
                           celeba_hidden=1, celeba_subsample=2, batch_size=4)
    dm.setup("fit")
    balance = np.abs((values > 0).mean(0) - 0.5)
    assert dm.concept_names == [names[j] for j in sorted(np.argsort(balance, kind="stable")[:2])]
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 24
    assert 1 <= dm.num_tasks <= 8   # 3 bits (2 concepts + 1 hidden): at most 8 task values
    x, y, c = dm.train_set[0]
    assert x.shape == (3, 8, 8) and c.shape == (2,)
    (folder / "list_attr_celeba.txt").write_text("48\n" + " ".join(names) + "\n000000.jpg 1 0\n")
    with pytest.raises(UserInputError, match="list_attr_celeba.txt' line 3"):
        ConceptDataModule(dataset="celeba", data_dir=str(tmp_path)).setup("fit")


def test_wrong_number_of_concepts_between_model_and_data_is_one_error():
    with pytest.raises(UserInputError, match="num_concepts=4 but the data has num_concepts=6"):
        run_cli("fit", "--config", config_path("configs/ec_cem/quick.yaml"), *QUIET, "--trainer.fast_dev_run=1",
                "--model.init_args.num_concepts=4")


def test_a_checkpoint_from_before_evidence_activation_is_read_only_as_relu():
    """Old checkpoints were trained with ReLU evidence; reading one as softplus would silently change the model."""
    import pytest as _pytest

    from lightning_modules.ec_cem.concept_models import EviCEM
    from lightning_modules.shared.errors import UserInputError

    old = {"hyper_parameters": {"num_concepts": 2, "num_tasks": 2, "input_dim": 2}, "state_dict": {}}
    with _pytest.raises(UserInputError, match="evidence_activation=relu"):
        EviCEM(num_concepts=2, num_tasks=2, input_dim=2).on_load_checkpoint(old)
    EviCEM(num_concepts=2, num_tasks=2, input_dim=2, evidence_activation="relu").on_load_checkpoint(old)
    EviCEM(num_concepts=2, num_tasks=2, input_dim=2).on_load_checkpoint(
        {"hyper_parameters": {**old["hyper_parameters"], "evidence_activation": "softplus"}, "state_dict": {}})
