"""Spectral Guidance: the two-view objective, whitening, coefficients, the guided DDIM step, the sign fix, and the
promise that guided sampling never backpropagates through the denoiser
(lightning_modules/spectral_guidance/spectral_guidance.py)."""
from __future__ import annotations

import math

import pytest
import torch

from datamodules.toy_distributions import DiffusionToyDataModule, LabelledGMM, make_gmm
from lightning_modules.shared.denoisers import MLPDenoiser
from lightning_modules.shared.errors import UserInputError
from lightning_modules.spectral_guidance.diffusion_denoiser import DiffusionDenoiser, make_scheduler
from lightning_modules.spectral_guidance.guided_sampling import (DPSStyleGuide, SpectralGuide, clamp_norm,
                                                                 guidance_direction, guided_ddim_sample,
                                                                 guided_ddim_step, predict_eps)
from lightning_modules.spectral_guidance.spectral_guidance import (
    SpectralGuidanceEncoder, TimeConditionedConvEncoder, TimeConditionedMLPEncoder, correlation_basis, energy_ratio,
    spectral_coefficients, two_view_correlations, two_view_loss, whitening)


def _gaussian_views(n: int, eigenvalues: list[float], alpha: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    d = len(eigenvalues)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    lam = torch.tensor(eigenvalues, dtype=torch.float64)
    x0 = (torch.randn(n, d, generator=gen, dtype=torch.float64) * lam.sqrt()) @ q.T
    views = [math.sqrt(alpha) * x0 + math.sqrt(1 - alpha) * torch.randn(n, d, generator=gen, dtype=torch.float64)
             for _ in range(2)]
    return q, lam, views


def test_two_view_objective_matches_the_gaussian_closed_form():
    """Linear encoder phi = Q_K^T x on Gaussian data: lambda_hat = a L / (a L + 1 - a) for the top-K directions,
    and no other linear encoder does better (Ky Fan: the optimum of the mean is the mean of the top-K)."""
    alpha, eigen, k = 0.4, [4.0, 2.0, 1.0, 0.5], 2
    q, lam, (xa, xb) = _gaussian_views(200_000, eigen, alpha)
    truth = alpha * lam / (alpha * lam + 1 - alpha)
    loss, lam_hat = two_view_loss(xa @ q[:, :k], xb @ q[:, :k], ridge=0.0, eps=0.0)
    torch.testing.assert_close(lam_hat, truth[:k], atol=6e-3, rtol=0)
    assert abs(float(loss) - (1 - float(truth[:k].mean()))) < 6e-3
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        a = torch.randn(4, k, generator=gen, dtype=torch.float64)
        random_loss, _ = two_view_loss(xa @ a, xb @ a, ridge=0.0, eps=0.0)
        assert float(random_loss) > float(loss) - 3e-3
    # the basis-independent estimate: eigenvalues of the cross-correlation of the whitened views
    phi_a, phi_b = xa @ q, xb @ q
    mu, w = whitening(phi_a, 0.0)
    values, _ = correlation_basis((phi_a - mu) @ w, (phi_b - mu) @ w)
    torch.testing.assert_close(values, truth, atol=6e-3, rtol=0)


def test_two_view_loss_gradient_flows_only_through_the_second_view():
    phi_a = torch.randn(64, 3, requires_grad=True)
    phi_b = (phi_a.detach() + 0.1 * torch.randn(64, 3)).requires_grad_(True)
    loss, _ = two_view_loss(phi_a, phi_b, ridge=1e-3)
    loss.backward()
    assert phi_a.grad is None and phi_b.grad is not None and torch.isfinite(phi_b.grad).all()


def test_whitening_gives_identity_covariance():
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(500, 5, generator=gen, dtype=torch.float64) @ torch.randn(5, 5, generator=gen,
                                                                              dtype=torch.float64) + 3.0
    mu, w = whitening(phi, ridge=0.0)
    white = (phi - mu) @ w
    torch.testing.assert_close(white.T @ white / (len(phi) - 1), torch.eye(5, dtype=torch.float64), atol=1e-9,
                               rtol=0)
    torch.testing.assert_close(mu[0], phi.mean(0))
    ridge = 0.5
    mu, w = whitening(phi, ridge=ridge)
    white = (phi - mu) @ w
    s2 = torch.linalg.svdvals(phi - phi.mean(0)).square() / (len(phi) - 1)
    cov = white.T @ white / (len(phi) - 1)
    torch.testing.assert_close(cov, torch.diag(s2 / (s2 + ridge)), atol=1e-9, rtol=0)


def test_whitened_correlations_hand_example():
    """phi_b = phi_a: every whitened correlation is (N-1)/N (std is the unbiased one, the mean the biased one)."""
    phi = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.0, -2.0]], dtype=torch.float64)
    mu, w = whitening(phi, 0.0)
    lam = two_view_correlations(phi, phi, mu, w, eps=0.0)
    torch.testing.assert_close(lam, torch.full((2,), 3 / 4, dtype=torch.float64))
    lam = two_view_correlations(phi, -phi, mu, w, eps=0.0)
    torch.testing.assert_close(lam, torch.full((2,), -3 / 4, dtype=torch.float64))


def test_coefficients_and_energy_ratio_hand_example():
    phi = torch.tensor([[1.0, 1.0, 0.0], [1.0, -1.0, 1.0], [1.0, 0.0, -1.0]])   # constant column first
    h = torch.tensor([1.0, 0.0, 0.0])
    c = spectral_coefficients(phi, h)
    torch.testing.assert_close(c, torch.tensor([1 / 3, 1 / 3, 0.0]))
    # Var(h) = 1/3 - 1/9 = 2/9; non-constant energy = 1/9 -> ratio 1/2
    torch.testing.assert_close(energy_ratio(c, h), torch.tensor(0.5))
    two = spectral_coefficients(phi, torch.stack([h, 1 - h], dim=1))
    torch.testing.assert_close(two[:, 0], c)
    torch.testing.assert_close(two[:, 1], torch.tensor([2 / 3, -1 / 3, 0.0]))
    with pytest.raises(UserInputError, match="one target value per encoded sample"):
        spectral_coefficients(phi, torch.ones(4))


# ------------------------------------------------------------------------------------------- fixtures
def _encoded_module(k: int = 3, n: int = 256, seed: int = 0, ridge: float = 1e-3
                    ) -> tuple[SpectralGuidanceEncoder, torch.Tensor, dict]:
    torch.manual_seed(seed)
    module = SpectralGuidanceEncoder(TimeConditionedMLPEncoder(2, k, hidden_dim=16, time_dim=16, num_layers=2),
                                     encode_t_step=20, encode_t_min=20, ridge=ridge)
    gmm = make_gmm(3, 4.0, 0.5, 0.25, torch.Generator().manual_seed(seed))
    x, y = gmm.sample(n, torch.Generator().manual_seed(seed + 1))
    out = module.encode(x.float(), torch.nn.functional.one_hot(y, 3).float(), torch.Generator().manual_seed(2))
    return module, x.float(), out


def _denoiser(seed: int = 0) -> MLPDenoiser:
    torch.manual_seed(seed)
    return MLPDenoiser(2, hidden_dim=16, depth=1, time_dim=16)


def test_encode_whitens_orders_and_stores_buffers():
    module, x, out = _encoded_module(ridge=0.0)
    assert bool(module.encoded)
    assert out["coefficients"].shape == (len(module.encode_timesteps), 4, 3)
    assert out["energy_ratio"].shape == (len(module.encode_timesteps), 3)
    corr = out["correlations"]
    assert (corr[:, :-1] >= corr[:, 1:] - 1e-6).all()           # ordered by two-view correlation
    assert ((out["energy_ratio"] >= 0) & (out["energy_ratio"] <= 1 + 1e-4)).all()
    # the constant coefficient of a one-hot target is the class frequency
    y_freq = spectral_coefficients(torch.ones(len(x), 1), torch.eye(3)[torch.arange(len(x)) % 3])
    torch.testing.assert_close(out["coefficients"][:, 0], y_freq.expand(len(module.encode_timesteps), 3))
    # re-encoding the same samples with the same noise reproduces whitened features with identity covariance
    t = int(module.encode_timesteps[5])
    gen = torch.Generator().manual_seed(2)
    full = module.encode(x, generator=gen, return_features=True)["phi"][5]
    white = full[:, 1:]
    torch.testing.assert_close(white.T @ white / len(x), torch.eye(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(white.square().mean(0), torch.ones(3), atol=1e-5, rtol=0)
    assert module.forward_whitened(x[:7], t).shape == (7, 4)


def test_guided_step_with_zero_strength_is_the_plain_diffusers_ddim_step():
    module, _, out = _encoded_module()
    denoiser = _denoiser()
    scheduler = make_scheduler("ddim")
    scheduler.set_timesteps(50)
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(3))
    targets = torch.arange(8) % 3
    for t in scheduler.timesteps[[0, 10, 25, 45]]:
        with torch.no_grad():
            eps = denoiser(x, t.expand(8))
        for eta in (0.0, 1.0):
            expected = scheduler.step(eps, t, x, eta=eta, generator=torch.Generator().manual_seed(4)).prev_sample
            guide = SpectralGuide(module, out["coefficients"], targets, strength=0.0)
            got = guided_ddim_step(scheduler, denoiser, x, t, guide, eta, torch.Generator().manual_seed(4))
            assert torch.equal(got, expected)
            plain = guided_ddim_step(scheduler, denoiser, x, t, None, eta, torch.Generator().manual_seed(4))
            assert torch.equal(plain, expected)
    t = scheduler.timesteps[10]
    index = module.grid_index(int(t))  # a DDIM timestep on the encode grid maps back to itself
    assert index is not None and int(module.encode_timesteps[index]) == int(t)
    strong = guided_ddim_step(scheduler, denoiser, x, t, SpectralGuide(module, out["coefficients"], targets,
                                                                         strength=5.0))
    assert not torch.allclose(strong, scheduler.step(denoiser(x, t.expand(8)).detach(), t, x).prev_sample)


def test_sign_fix_ascends_where_p_is_negative():
    module, _, out = _encoded_module()
    t = 200
    x = torch.randn(1, 2, generator=torch.Generator().manual_seed(5))
    coefficients = out["coefficients"].clone()
    guide = SpectralGuide(module, coefficients, torch.tensor([0]))
    if float(guide.estimate(x, t).detach()) > 0:              # p is linear in c: flip c to force p < 0
        coefficients = -coefficients
    results = {}
    for sign_fix in (True, False):
        guide = SpectralGuide(module, coefficients, torch.tensor([0]), strength=0.05, sign_fix=sign_fix,
                              grad_clip_min=0.01, grad_clip_max=0.01)
        p0 = guide.estimate(x, t).detach()
        assert float(p0) < 0
        x_in = x.clone().requires_grad_(True)
        (grad_p,) = torch.autograd.grad(guide.estimate(x_in, t).sum(), x_in)
        direction = guidance_direction(grad_p, p0, sign_fix=sign_fix)
        results[sign_fix] = (float((direction * grad_p).sum()), float(guide.estimate(x + guide(x, t), t).detach() - p0))
    assert results[True][0] > 0 and results[True][1] > 0      # fixed: ascent on the estimated p(y | x_t)
    assert results[False][0] < 0 and results[False][1] < 0    # official grad p / p: descent when p < 0


def test_guidance_direction_and_clamp_norm_formulas():
    g = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.03, 0.04]])
    torch.testing.assert_close(clamp_norm(g, 0.1, 0.3), torch.tensor([[0.18, 0.24], [0.0, 0.0], [0.06, 0.08]]))
    grad = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    p = torch.tensor([0.5, -2.0, 0.0])
    torch.testing.assert_close(guidance_direction(grad, p, sign_fix=False), torch.tensor(
        [[2.0, 4.0], [-0.5, -1.0], [math.inf, math.inf]]))
    torch.testing.assert_close(guidance_direction(grad, p, sign_fix=True, p_floor=0.1),
                               torch.tensor([[2.0, 4.0], [10.0, 20.0], [10.0, 20.0]]))


class _BackwardCounter:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_full_backward_hook(self)

    def __call__(self, *args) -> None:
        self.calls += 1


def test_spectral_guidance_never_backpropagates_through_the_denoiser():
    module, _, out = _encoded_module()
    denoiser = _denoiser()
    denoiser.requires_grad_(True)                # even a trainable denoiser gets no gradient
    counter = _BackwardCounter(denoiser)
    module.attach_denoiser(denoiser)
    denoiser.requires_grad_(True)
    samples, guide = module.guided_sample(out["coefficients"], torch.arange(6) % 3, (2,), num_inference_steps=50,
                                          generator=torch.Generator().manual_seed(0), strength=3.0)
    assert samples.shape == (6, 2) and torch.isfinite(samples).all()
    assert counter.calls == 0 and guide.stats.denoiser_backprops == 0
    assert all(p.grad is None for p in denoiser.parameters())
    assert all(p.grad is None for p in module.encoder.parameters())
    assert guide.stats.encoder_backprops == guide.stats.guided_steps == 49   # t = 980..20 on the grid; t=0 not
    # the DPS-style baseline does backpropagate through the denoiser, once per guided step
    gmm = make_gmm(3, 4.0, 0.5, 0.25, torch.Generator().manual_seed(0))
    targets = torch.arange(6) % 3
    dps = DPSStyleGuide(lambda x0: gmm.log_posterior(x0)[torch.arange(6), targets], module.alphas_cumprod, 3.0)
    guided_ddim_sample(denoiser, make_scheduler("ddim"), (6, 2), 50, dps, generator=torch.Generator().manual_seed(0))
    assert counter.calls == dps.stats.denoiser_backprops == 49


def test_guided_sampling_is_reproducible_and_raises_off_grid():
    module, _, out = _encoded_module()
    module.attach_denoiser(_denoiser())
    runs = [module.guided_sample(out["coefficients"], torch.arange(4) % 3, (2,), 50,
                                 generator=torch.Generator().manual_seed(7))[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    with pytest.raises(UserInputError, match="nothing would be guided"):
        module.guided_sample(out["coefficients"], torch.arange(4) % 3, (2,), 3)   # 3 steps: t = 666, 333, 0
    with pytest.raises(UserInputError, match="not on the encode grid"):
        module.forward_whitened(torch.zeros(2, 2), 25)


def test_unencoded_and_denoiserless_use_is_refused():
    module = SpectralGuidanceEncoder(TimeConditionedMLPEncoder(2, 3, hidden_dim=8, time_dim=8, num_layers=1))
    with pytest.raises(UserInputError, match="encode"):
        SpectralGuide(module, torch.zeros(99, 4, 2), torch.zeros(3))
    module, _, out = _encoded_module()
    with pytest.raises(UserInputError, match="needs a denoiser"):
        module.guided_sample(out["coefficients"], torch.zeros(2), (2,))
    with pytest.raises(UserInputError, match=r"shape \["):
        SpectralGuide(module, out["coefficients"][:, :2], torch.zeros(2))
    with pytest.raises(UserInputError, match="batch_size > K"):
        module.objective(torch.randn(3, 2), 100)


def test_bad_configuration_is_refused(tmp_path):
    enc = TimeConditionedMLPEncoder(2, 3, hidden_dim=8, time_dim=8, num_layers=1)
    with pytest.raises(UserInputError, match="denoiser_path"):
        SpectralGuidanceEncoder(enc, denoiser_path=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="config.json"):
        DiffusionDenoiser(denoiser_path=str(tmp_path / "empty"))
    with pytest.raises(UserInputError, match="exactly one"):
        DiffusionDenoiser()
    with pytest.raises(UserInputError, match="beta_schedule"):
        SpectralGuidanceEncoder(enc, beta_schedule="cosine")
    with pytest.raises(UserInputError, match="num_features"):
        SpectralGuidanceEncoder(torch.nn.Linear(2, 3))
    with pytest.raises(UserInputError, match="time_dim"):
        TimeConditionedMLPEncoder(2, 3, time_dim=7)
    with pytest.raises(UserInputError, match="data_dir"):
        DiffusionToyDataModule(distribution="cifar10")
    with pytest.raises(UserInputError, match="hflip"):
        DiffusionToyDataModule(distribution="gmm", hflip=True)
    with pytest.raises(UserInputError, match="gaussian_eigenvalues"):
        DiffusionToyDataModule(distribution="gaussian", gaussian_eigenvalues=[1.0, -1.0])
    with pytest.raises(UserInputError, match="reads no files"):
        DiffusionToyDataModule(distribution="digits", data_dir=str(tmp_path))
    with pytest.raises(UserInputError, match="cifar-10-batches-py"):
        DiffusionToyDataModule(distribution="cifar10", data_dir=str(tmp_path))


def test_pretrained_diffusers_unet_is_loaded_from_a_local_folder(tmp_path):
    from diffusers import UNet2DModel
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 8),
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       layers_per_block=1, norm_num_groups=4)
    unet.save_pretrained(tmp_path / "ddpm")
    model = DiffusionDenoiser(denoiser_path=str(tmp_path / "ddpm"))
    assert not any(p.requires_grad for p in model.parameters())
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(model(x, torch.tensor([5, 5])), unet(x, torch.tensor([5, 5])).sample)
    assert predict_eps(unet, x, 5).shape == x.shape


def test_diffusion_denoiser_loss_sampling_and_determinism():
    torch.manual_seed(0)
    model = DiffusionDenoiser(_denoiser(), sample_steps=10)
    batch = (torch.randn(16, 2), torch.zeros(16, dtype=torch.long))
    loss = model.training_step(batch, 0)
    assert loss.dim() == 0 and torch.isfinite(loss)
    model.eval()
    with torch.no_grad():
        a, b = model.predict_step(batch, 3), model.predict_step(batch, 3)
    assert a.shape == (16, 2) and torch.equal(a, b)


def test_encoders_shapes():
    conv = TimeConditionedConvEncoder(3, 32, 5, base_channels=8, channel_mults=[1, 2, 2], max_channels=16,
                                      time_dim=16)
    assert conv(torch.randn(2, 3, 32, 32), torch.tensor([3, 900])).shape == (2, 5)
    mlp = TimeConditionedMLPEncoder(64, 4, hidden_dim=8, time_dim=8, num_layers=1)
    out = mlp(torch.randn(3, 1, 8, 8), torch.tensor([1, 1, 500]))
    assert out.shape == (3, 4)
    # distinct timesteps take the same path as one-t batches
    x = torch.randn(4, 64)
    mixed = mlp(x, torch.tensor([10, 10, 500, 500]))
    torch.testing.assert_close(mixed[:2], mlp(x[:2], torch.tensor([10, 10])))
    torch.testing.assert_close(mixed[2:], mlp(x[2:], torch.tensor([500, 500])))


def test_toy_distributions_match_their_closed_forms():
    dm = DiffusionToyDataModule(distribution="gaussian", num_train=50_000, num_val=10)
    dm.setup()
    x, y = dm.train_tensors()
    spectrum = dm.spectrum
    cov = torch.cov(x.double().T)
    truth = spectrum.eigenvectors @ torch.diag(spectrum.eigenvalues) @ spectrum.eigenvectors.T
    assert (cov - truth).abs().max() < 0.3 and (y == 0).all()
    torch.testing.assert_close(spectrum.correlations(1.0), torch.ones(16, dtype=torch.float64))
    assert float(spectrum.correlations(0.5)[0]) == pytest.approx(12 / 13)
    gmm_dm = DiffusionToyDataModule(distribution="gmm", num_train=64, num_val=8, batch_size=32)
    gmm_dm.setup()
    gmm: LabelledGMM = gmm_dm.gmm
    xs = torch.randn(5, 2, dtype=torch.float64)
    mixture = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(torch.ones(8, dtype=torch.float64)),
        torch.distributions.MultivariateNormal(gmm.means, gmm.covariances))
    torch.testing.assert_close(gmm.log_prob(xs), mixture.log_prob(xs))
    torch.testing.assert_close(gmm.log_posterior(xs).exp().sum(-1), torch.ones(5, dtype=torch.float64))
    x, y = next(iter(gmm_dm.train_dataloader()))
    assert x.shape == (32, 2) and y.dtype == torch.long
    again = DiffusionToyDataModule(distribution="gmm", num_train=64, num_val=8)
    again.setup()
    assert torch.equal(again.train_tensors()[0], gmm_dm.train_tensors()[0])


def test_digits_are_in_model_range():
    dm = DiffusionToyDataModule(distribution="digits", batch_size=16)
    dm.setup()
    x, y = dm.train_tensors()
    assert x.shape[1:] == (1, 8, 8) and float(x.min()) == -1.0 and float(x.max()) == 1.0
    assert len(x) + len(dm.val_set) == 1438 and set(y.tolist()) == set(range(10))



def test_imagefolder_reads_train_only_into_model_range(tmp_path):
    from PIL import Image
    for name, value in (("light", 255), ("dark", 0)):
        (tmp_path / "train" / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (6 + i, 5), (value,) * 3).save(tmp_path / "train" / name / f"{i}.png")
    (tmp_path / "test").mkdir()  # not read (no test stage): an empty test/ is no error
    dm = DiffusionToyDataModule(distribution="imagefolder", data_dir=str(tmp_path), resize_to=4, val_fraction=0.25,
                                batch_size=2, hflip=True)
    assert dm.data_shape == (3, 4, 4) and dm.num_classes == 2 and dm.class_names == ["dark", "light"]
    dm.setup()
    x, y = dm.train_tensors()
    assert x.shape == (6, 3, 4, 4) and len(dm.val_set) == 2
    assert (x[y == 0] == -1.0).all() and (x[y == 1] == 1.0).all() and (y == 0).sum() == 3   # dark, light in [-1, 1]
    assert DiffusionToyDataModule(distribution="imagefolder", data_dir=str(tmp_path)).data_shape == (3, 32, 32)
    with pytest.raises(UserInputError, match="applies to distribution='imagefolder' only"):
        DiffusionToyDataModule(distribution="digits", resize_to=16)
    with pytest.raises(UserInputError, match="needs data_dir"):
        DiffusionToyDataModule(distribution="imagefolder")
    with pytest.raises(UserInputError, match="train' is missing"):
        DiffusionToyDataModule(distribution="imagefolder", data_dir=str(tmp_path / "test"))
    for path in (tmp_path / "train").glob("*/[1-3].png"):
        path.unlink()
    with pytest.raises(UserInputError, match="at least 2 images"):
        DiffusionToyDataModule(distribution="imagefolder", data_dir=str(tmp_path)).setup()


def test_conv_encoder_names_a_wrong_channel_count():
    encoder = TimeConditionedConvEncoder(1, 8, 4, base_channels=8, channel_mults=[1], time_dim=8)
    assert encoder(torch.zeros(2, 1, 8, 8), torch.tensor(5)).shape == (2, 4)
    with pytest.raises(UserInputError, match="in_channels to the data's channels"):
        encoder(torch.zeros(2, 3, 8, 8), torch.tensor(5))


@pytest.mark.slow
def test_reduced_spectrum_recovery_claim(tmp_path):
    """S1 at reduced size (600 steps) through the runner, the other arms left out: the learned eigenvalues match the
    closed form within 0.05 and the span aligns."""
    import yaml

    from experiments.runner import experiment_path, run_experiment
    from experiments.spectral_guidance import S1_ARM

    spec = yaml.safe_load(experiment_path("spectral_guidance").read_text())
    spec["arms"] = {S1_ARM: spec["arms"][S1_ARM]}
    spec["arms"][S1_ARM]["overrides"]["trainer.max_steps"] = 600
    spec.update(baseline=S1_ARM, metrics=["max_eigenvalue_error", "mean_principal_cosine"])
    spec["settings"]["paired"] = []
    spec["smoke"].pop("arms")
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_experiment("spectral_guidance", seeds=1, out=tmp_path, spec_path=path)
    s1 = result["per_seed"][0][S1_ARM]
    assert result["s1"][0]["eval_t"] and s1["max_eigenvalue_error"] < 0.05
    assert s1["mean_principal_cosine"] > 0.95
