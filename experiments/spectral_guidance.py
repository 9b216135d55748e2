"""Reproduce the Spectral Guidance claims at small scale: ``python -m experiments spectral_guidance``.

Paper: "Spectral Guidance for Flexible and Efficient Control of Diffusion Models" (arXiv 2605.28900). Claims checked:
the two-view objective recovers the spectrum of the noising operator (S1), and guidance from the learned spectral
basis is at least as accurate as a DPS-style method that backpropagates through the denoiser, with no denoiser
backprops and less time (S2). Both adapted from the official notebooks; everything runs through the collection's
`SpectralGuidanceEncoder` / `DiffusionDenoiser` + `DiffusionToyDataModule` and a Lightning `Trainer` on CPU, built
from ``configs/spectral_guidance/quick.yaml`` (encoder) and ``denoiser_quick.yaml`` (prior, with its EMAWeights
0.999), built as ``train.py fit`` builds them. The protocol is configuration, ``configs/spectral_guidance/
experiment.yaml`` (arms, steps, data sizes, the sampling settings, the smoke overlay); this module holds its hooks:
`evaluate` (S1's spectrum check, S2's samplers on the trained prior + encoder, the digits), `report` (the ``s1`` /
``s2`` / ``digits`` records, the matched-fidelity choices, the pairs of ``settings.paired``) and `plot`. Per seed S
the runs are, in order: S1's encoder (model and data seed S), S2's prior (seed S), S2's encoder (model seed S + 100,
data seed S; its run measures the S2 rows) and, on seed 0 only, the digits prior and encoder (model seeds 0 and 100).
Training times come from a Lightning ``Timer`` callback.

S1 (spectrum recovery; per seed): x0 ~ N(0, Q diag(L) Q^T), 16-D, L = (12, 9, 7, 2.5 * 0.8^k) (L_1 < 2 L_3 so
that the top-3 eigenfunctions are linear at every t, see datamodules/toy_distributions.py), Q from the seed.
Encoder: FiLM-MLP (hidden 64, 4 blocks), K = 3, Adam 1e-3, batch 1024, ridge 1e-3, one t per batch from
{10, ..., 990}. Evaluation on 20k fresh samples per t in EVAL_T: the eigenvalues of the symmetrised cross-correlation
of the whitened two views vs the closed form a L_k / (a L_k + 1 - a) (max abs error over t and k), and the cosines of
the principal angles between the learned span and span{q_k^T x_t, k <= 3} (canonical correlations; mean).

S2 (guidance on a labelled 2-D GMM, 8 components; per seed): DDPM eps-MLP (hidden 128, depth 4, EMA), encoder
FiLM-MLP (hidden 64, 4 blocks) with K = 30 trained without labels; coefficients c_t = Phi~_t^T onehot(y) / N from N
= 10k labelled samples on the grid {10, ..., 990}. 1024 samples (128 per class) with DDIM 50 steps, eta = 1, for:
unguided; spectral guidance s in ``settings.strengths`` (sign fix on; the official sign as an ablation); DPS-style
(grad_{x_t} log p(y | x0_hat) through the denoiser, exact GMM posterior, the same shift rule and strengths).
Metrics: conditional accuracy (argmax of the exact posterior = target), fidelity = mean GMM log-likelihood of the
samples, denoiser backprops per trajectory, wall time of the sampling run. "Matched fidelity": for every method the
most accurate strength whose mean log-likelihood is within ``settings.fidelity_tol`` nats of the unguided sampler's
(none: the strength with the best log-likelihood); "share p <= floor" is how often the spectral estimate p was <=
p_floor, i.e. where the sign fix changes the update. The energy ratio vs t (fraction of Var(1[y = c]) recovered by
the K features) is compared with the exact ratio Var(p(y | x_t)) / Var(1[y = c]) (the GMM stays a GMM under
noising), which shows the phase transition.

Digits (seed 0 only): DDPM UNet (base 16, mults 1-2, EMA) on sklearn's 8x8 digits in [-1, 1], encoder FiLM-MLP K = 32 on
the flattened images; 16 class-guided samples per digit with spectral guidance and with the DPS-style baseline (its
p(y | x0_hat) is a logistic regression on the training digits), s = 3 and 10 (the notebook value). Judged by a
different classifier (an RBF SVC on the training digits), with the mean distance to the nearest training digit
(fidelity) and the within-class spread (diversity). The grid goes to results/spectral_guidance_digits.png. Here the
denoiser (a UNet) is costlier than the encoder (an MLP), which is where the wall-time advantage can show; in S2 both
networks are MLPs of similar size.

Outputs: markdown tables, results/spectral_guidance.json (the experiments' schema; ``per_seed`` holds the S1 and S2
values of each seed, plus "s1": per-t curves, "s2": all strengths, "digits": ...), results/spectral_guidance.png
and the digit grid.
Wall times are measured on a shared machine (noisy): minimum of ``settings.repeats`` timing runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Timer

from callbacks.ema import EMAWeights
from experiments import runner
from experiments.runner import ExperimentError
from icml26.paired import paired_block
from lightning_modules.shared.denoisers import from_model_range
from lightning_modules.spectral_guidance.diffusion_denoiser import make_scheduler
from lightning_modules.spectral_guidance.guided_sampling import DPSStyleGuide, SpectralGuide, guided_ddim_sample
from lightning_modules.spectral_guidance.spectral_guidance import correlation_basis, whitening

EVAL_T = (20, 50, 100, 200, 300, 400, 500, 600, 700, 800, 900)
ETA = 1.0
# the arms of configs/spectral_guidance/experiment.yaml that the hooks read
S1_ARM, S2_PRIOR, S2_ENCODER = "S1 spectrum recovery (K=3)", "S2 prior", "S2 unguided"
DIGITS_PRIOR, DIGITS_ENCODER = "digits prior", "digits encoder"


@dataclass(frozen=True)
class Sampling:
    """The evaluation protocol: ``settings`` of experiment.yaml (smaller in its smoke overlay)."""
    strengths: tuple[float, ...]
    samples_per_class: int
    ddim_steps: int
    repeats: int               # timing runs per sampler (the minimum wall time is kept)
    digits_per_class: int
    digits_strengths: tuple[float, ...]
    s1_num_eval: int           # fresh samples per t for the S1 evaluation
    fidelity_tol: float        # nats below the unguided log-likelihood that still count as matched fidelity


_KINDS = (("strengths", "numbers"), ("samples_per_class", "int"), ("ddim_steps", "int"), ("repeats", "int"),
          ("digits_per_class", "int"), ("digits_strengths", "numbers"), ("s1_num_eval", "int"),
          ("fidelity_tol", "float"))
_EXPECTED = {"numbers": "a list of positive numbers", "int": "a positive integer", "float": "a number >= 0"}


def sampling(settings: dict) -> Sampling:
    """``settings`` as a `Sampling`, each value checked."""
    values = {}
    for name, kind in _KINDS:
        value = settings.get(name)
        if kind == "numbers":
            ok = isinstance(value, list) and bool(value) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
        elif kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise ExperimentError(f"spectral_guidance: settings.{name} must be {_EXPECTED[kind]}, got {value!r}")
        values[name] = tuple(float(v) for v in value) if kind == "numbers" else value
    return Sampling(**values)


def _train_s(run) -> float:
    """Seconds of the run's training, from the Timer callback that experiment.yaml adds."""
    timers = [c for c in run.trainer.callbacks if isinstance(c, Timer)]
    if not timers:
        raise ExperimentError("spectral_guidance: the run has no Timer callback; keep the trainer.callbacks+ Timer "
                              "of configs/spectral_guidance/experiment.yaml")
    return float(timers[0].time_elapsed("train"))


def _earlier(run, arm: str):
    earlier = run.earlier.get(arm)
    if earlier is None or not earlier.fitted:
        raise ExperimentError(f"spectral_guidance: the arm {run.arm.name!r} needs the {arm!r} arm run before it on "
                              "the same seed (keep the arms in the order of configs/spectral_guidance/experiment.yaml)")
    return earlier


def _prior(run, arm: str):
    """The earlier prior run's DiffusionDenoiser with its EMA average swapped in (sampling uses the average), and
    that run's datamodule."""
    prior = _earlier(run, arm)
    model = prior.model
    if not prior.extra.get("ema_swapped"):
        ema = [c for c in prior.trainer.callbacks if isinstance(c, EMAWeights)]
        if not ema:
            raise ExperimentError(f"spectral_guidance: the {arm!r} run has no EMAWeights callback (its config, "
                                  "denoiser_quick.yaml, has one)")
        ema[0]._swap_in(model)
        ema[0]._stashed = None
        prior.extra["ema_swapped"] = True
    return model.eval(), prior.datamodule


def evaluate(run) -> dict[str, float]:
    """S1's metrics (its own run); S2's samplers (the S2 encoder's run: the unguided row, the others derived); the
    digits (kept for `report`); the priors measure nothing (helper runs)."""
    name, settings = run.arm.name, sampling(run.settings)
    if name == S1_ARM:
        s1 = spectrum_recovery(run, settings)
        run.extra["s1"] = s1
        return {key: s1[key] for key in S1_METRICS}
    if name == S2_ENCODER:
        s2 = gmm_guidance(run, settings)
        run.extra["s2"] = s2
        rows = per_seed_arms(s2, settings.fidelity_tol)
        own = rows.pop(name)
        run.derived.update(rows)
        return own
    if name == DIGITS_ENCODER:
        run.extra["digits"] = run_digits(run, settings)
    return {}


# ================================================================================================ S1
def spectrum_recovery(run, settings: Sampling) -> dict:
    """The trained K=3 encoder against the closed-form spectrum of the Gaussian."""
    module, dm, seed, k = run.model.eval(), run.datamodule, run.seed, 3
    train_s, num_eval = _train_s(run), settings.s1_num_eval
    spectrum = dm.spectrum
    gen = torch.Generator().manual_seed(10_000 + seed)
    x0 = spectrum.sample(num_eval, gen).float()
    estimated, truth, cosines = [], [], []
    with torch.no_grad():
        for t in EVAL_T:
            x_a, x_b = module._noisy_views(x0, t, gen)
            phi_a, phi_b = module(x_a, t).double(), module(x_b, t).double()
            mu, w = whitening(phi_a, 0.0)
            a, b = (phi_a - mu) @ w, (phi_b - mu) @ w
            values, _ = correlation_basis(a, b)
            estimated.append(values)
            truth.append(spectrum.correlations(module.alphas_cumprod[t].double())[:k])
            z = x_a.double() @ spectrum.eigenvectors[:, :k]
            basis_learned = torch.linalg.qr(a - a.mean(0))[0]
            basis_true = torch.linalg.qr(z - z.mean(0))[0]
            cosines.append(torch.linalg.svdvals(basis_learned.T @ basis_true))
    estimated, truth, cosines = torch.stack(estimated), torch.stack(truth), torch.stack(cosines)
    errors = (estimated - truth).abs()
    return {"max_eigenvalue_error": float(errors.max()), "mean_eigenvalue_error": float(errors.mean()),
            "mean_principal_cosine": float(cosines.mean()), "min_principal_cosine": float(cosines.min()),
            "min_principal_cosine_t_le_800": float(cosines[torch.tensor(EVAL_T) <= 800].min()),
            "train_s": train_s, "eval_t": list(EVAL_T), "estimated": estimated.tolist(), "closed_form": truth.tolist(),
            "cosines": cosines.tolist()}




# ================================================================================================ S2
class _GMMPosterior:
    """log p(y_b | x0_hat_b) under the exact GMM (the DPS-style baseline's differentiable likelihood)."""

    def __init__(self, gmm, targets: torch.Tensor) -> None:
        self.gmm, self.targets = gmm, targets

    def __call__(self, x0_hat: torch.Tensor) -> torch.Tensor:
        return self.gmm.log_posterior(x0_hat)[torch.arange(len(x0_hat)), self.targets].float()


def exact_energy_ratio(gmm, alphas_cumprod: torch.Tensor, timesteps, n: int, seed: int) -> torch.Tensor:
    """Var(p(y = c | x_t)) / Var(1[y = c]) (mean over classes) at each t, by Monte Carlo over x_t."""
    from datamodules.toy_distributions import LabelledGMM
    gen = torch.Generator().manual_seed(seed)
    x0, _ = gmm.sample(n, gen)
    prior = 1.0 / gmm.num_components
    out = []
    for t in timesteps:
        a = alphas_cumprod[int(t)].double()
        noisy = LabelledGMM(a.sqrt() * gmm.means, a * gmm.covariances + (1 - a) * torch.eye(2, dtype=torch.float64))
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * torch.randn(x0.shape, generator=gen, dtype=torch.float64)
        posterior = noisy.log_posterior(x_t).exp()
        out.append(float(posterior.var(0, unbiased=False).mean() / (prior * (1 - prior))))
    return torch.tensor(out)


def _sample_arm(denoiser_model, guide_factory, gmm, targets: torch.Tensor, seed: int,
                sampling: Sampling) -> dict:
    best, samples, guide = float("inf"), None, None
    for _ in range(sampling.repeats):
        guide = guide_factory() if guide_factory is not None else None
        start = time.perf_counter()
        samples = guided_ddim_sample(denoiser_model.denoiser, make_scheduler("ddim"), (len(targets), 2),
                                     sampling.ddim_steps,
                                     guide, ETA, torch.Generator().manual_seed(20_000 + seed))
        best = min(best, time.perf_counter() - start)
    with torch.no_grad():
        accuracy = float((gmm.log_posterior(samples).argmax(-1) == targets).float().mean())
        loglik = float(gmm.log_prob(samples).mean())
    stats = guide.stats if guide is not None else None
    below = stats.estimates_below_floor / max(stats.estimates, 1) if stats and hasattr(stats, "estimates") else 0.0
    return {"accuracy": accuracy, "loglik": loglik, "wall_s": best,
            "denoiser_backprops": stats.denoiser_backprops if stats else 0,
            "encoder_backprops": stats.encoder_backprops if stats else 0, "p_below_floor": below}


def gmm_guidance(run, settings: Sampling) -> dict:
    """The samplers on S2's prior (the earlier run) and this run's K=30 encoder, both trained on the labelled GMM."""
    sampling, seed = settings, run.seed
    denoiser, dm = _prior(run, S2_PRIOR)
    denoiser_s, encoder_s = _train_s(run.earlier[S2_PRIOR]), _train_s(run)
    encoder = run.model.eval()
    x, y = dm.train_tensors()
    onehot = torch.nn.functional.one_hot(y, dm.num_classes).float()
    start = time.perf_counter()
    encoded = encoder.encode(x, onehot, torch.Generator().manual_seed(30_000 + seed))
    encode_s = time.perf_counter() - start
    gmm = dm.gmm
    targets = torch.arange(dm.num_classes).repeat_interleave(sampling.samples_per_class)
    arms = {"unguided": _sample_arm(denoiser, None, gmm, targets, seed, sampling)}
    for s in sampling.strengths:
        for sign_fix, name in ((True, "spectral"), (False, "spectral (official sign)")):
            arms[f"{name}, s={s:g}"] = _sample_arm(denoiser, lambda s=s, f=sign_fix: SpectralGuide(
                encoder, encoded["coefficients"], targets, strength=s, sign_fix=f), gmm, targets, seed, sampling)
        arms[f"DPS-style, s={s:g}"] = _sample_arm(denoiser, lambda s=s: DPSStyleGuide(
            _GMMPosterior(gmm, targets), encoder.alphas_cumprod, s), gmm, targets, seed, sampling)
    data_x, _ = gmm.sample(len(targets), torch.Generator().manual_seed(40_000 + seed))
    grid = encoded["timesteps"]
    return {"arms": arms, "data_loglik": float(gmm.log_prob(data_x).mean()),
            "energy_ratio": encoded["energy_ratio"].mean(1).tolist(),
            "exact_energy_ratio": exact_energy_ratio(gmm, encoder.alphas_cumprod, grid, 4000, seed).tolist(),
            "timesteps": grid.tolist(), "train_s": {"denoiser": denoiser_s, "encoder": encoder_s, "encode": encode_s}}


def select_matched(arms: dict, method: str, fidelity_tol: float) -> str:
    """The most accurate strength of `method` whose log-likelihood is within fidelity_tol of the unguided one
    (when none is, the strength with the best log-likelihood)."""
    floor = arms["unguided"]["loglik"] - fidelity_tol
    candidates = [name for name in arms if name.startswith(method + ", s=")]
    eligible = [name for name in candidates if arms[name]["loglik"] >= floor]
    if not eligible:
        return max(candidates, key=lambda name: arms[name]["loglik"])
    return max(eligible, key=lambda name: arms[name]["accuracy"])


# ============================================================================================= digits
class _LogisticPosterior:
    """log p(y_b | x0_hat_b) of a multinomial logistic regression (the DPS-style baseline's classifier on digits)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor) -> None:
        self.weight, self.bias, self.targets = weight, bias, targets

    def __call__(self, x0_hat: torch.Tensor) -> torch.Tensor:
        logits = x0_hat.flatten(1) @ self.weight.T + self.bias
        return torch.log_softmax(logits, -1)[torch.arange(len(x0_hat)), self.targets]


def run_digits(run, settings: Sampling) -> dict:
    """Class guidance on sklearn digits: spectral vs DPS-style (through the UNet) vs unguided."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    sampling, seed, out = settings, run.seed, Path(run.out)
    denoiser, dm = _prior(run, DIGITS_PRIOR)
    denoiser_s, encoder_s = _train_s(run.earlier[DIGITS_PRIOR]), _train_s(run)
    encoder = run.model.eval()
    x, y = dm.train_tensors()
    encoded = encoder.encode(x, torch.nn.functional.one_hot(y, 10).float(), torch.Generator().manual_seed(1))
    flat = x.flatten(1)
    guide_classifier = LogisticRegression(max_iter=2000).fit(flat.numpy(), y.numpy())   # DPS-style guidance only
    judge = SVC().fit(flat.numpy(), y.numpy())                                            # evaluation only
    weight = torch.tensor(guide_classifier.coef_, dtype=torch.float32)
    bias = torch.tensor(guide_classifier.intercept_, dtype=torch.float32)
    encoder.attach_denoiser(denoiser)
    per_class = sampling.digits_per_class
    targets = torch.arange(10).repeat_interleave(per_class)
    factories = {"unguided": None}
    for s in sampling.digits_strengths:
        factories[f"spectral, s={s:g}"] = lambda s=s: SpectralGuide(encoder, encoded["coefficients"], targets,
                                                                     strength=s, sign_fix=True)
        factories[f"DPS-style, s={s:g}"] = lambda s=s: DPSStyleGuide(_LogisticPosterior(weight, bias, targets),
                                                                      encoder.alphas_cumprod, s)
    results, grids = {}, {}
    for name, factory in factories.items():
        best = float("inf")
        for _ in range(sampling.repeats):
            guide = factory() if factory is not None else None
            begin = time.perf_counter()
            samples = guided_ddim_sample(denoiser.denoiser, make_scheduler("ddim", clip_sample=True),
                                         (len(targets), 1, 8, 8), sampling.ddim_steps, guide, ETA,
                                         torch.Generator().manual_seed(50_000 + seed))
            best = min(best, time.perf_counter() - begin)
        nearest = torch.cdist(samples.flatten(1), flat).min(dim=1).values
        results[name] = {"accuracy": float((judge.predict(samples.flatten(1).numpy()) == targets.numpy()).mean()),
                         "nn_distance": float(nearest.mean()), "wall_s": best,
                         "diversity": _within_class_spread(samples.flatten(1), targets),
                         "denoiser_backprops": guide.stats.denoiser_backprops if guide else 0,
                         "encoder_backprops": guide.stats.encoder_backprops if guide else 0}
        grids[name] = samples
    real_nn = torch.cdist(dm.val_set.data.float().flatten(1) / 8.0 - 1.0, flat).min(dim=1).values.mean()
    real_spread = _within_class_spread(flat, y)
    if out is not None:
        _digit_grid(grids, per_class, out / "spectral_guidance_digits.png", results)
    return {"arms": results, "val_nn_distance": float(real_nn), "train_diversity": real_spread,
            "judge": "SVC (RBF) trained on the real training digits; DPS-style guides with a logistic regression",
            "train_s": {"denoiser": denoiser_s, "encoder": encoder_s},
            "energy_ratio": encoded["energy_ratio"].mean(1).tolist(),
            "timesteps": encoded["timesteps"].tolist()}


def _within_class_spread(x: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean pairwise L2 distance between samples of the same class (diversity; mode collapse lowers it)."""
    spreads = []
    for c in labels.unique():
        members = x[labels == c]
        d = torch.cdist(members, members)
        spreads.append(float(d.sum() / (len(members) * (len(members) - 1))))
    return float(np.mean(spreads))


def _digit_grid(grids: dict, per_class: int, path: Path, accuracy: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 8
    fig, axes = plt.subplots(1, len(grids), figsize=(3.3 * len(grids), 4.8))
    for ax, (name, samples) in zip(axes, grids.items()):
        images = from_model_range(samples[:, 0]).reshape(10, per_class, 8, 8)[:, :cols]
        images = torch.nn.functional.pad(images, (1, 1, 1, 1))                      # 1-pixel white frame
        canvas = images.permute(0, 2, 1, 3).reshape(10 * 10, cols * 10).numpy()
        ax.imshow(canvas, cmap="gray_r", vmin=0, vmax=1)
        ax.set_title(f"{name}\n(row = target; SVC acc {accuracy[name]['accuracy']:.2f})", fontsize=8)
        ax.set_yticks([10 * r + 4.5 for r in range(10)], [str(r) for r in range(10)])
        ax.set_xticks([])
    fig.suptitle("sklearn digits: class-guided DDIM samples (spectral: no denoiser backprop; DPS-style: through the "
                 "UNet)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================ summary
S1_METRICS = ("max_eigenvalue_error", "mean_eigenvalue_error", "mean_principal_cosine", "min_principal_cosine",
              "min_principal_cosine_t_le_800", "train_s")
S2_METRICS = ("accuracy", "loglik", "denoiser_backprops", "encoder_backprops", "wall_s", "p_below_floor")
MATCHED = ("spectral", "spectral (official sign)", "DPS-style")


def per_seed_arms(s2: dict, fidelity_tol: float) -> dict[str, dict[str, float]]:
    """One seed's S2 rows ``{arm: {metric: value}}``: every sampler, and each method at matched fidelity (S1's row
    is its own run's)."""
    arms = {f"S2 {name}": {m: row[m] for m in S2_METRICS} for name, row in s2["arms"].items()}
    for method in MATCHED:
        chosen = select_matched(s2["arms"], method, fidelity_tol)
        arms[f"S2 {method} @ matched fidelity"] = {m: s2["arms"][chosen][m] for m in S2_METRICS}
    return arms


def markdown(arms: dict, choices: dict, s1_runs: list[dict], s2: list[dict], sampling: Sampling) -> str:
    s1 = arms["S1 spectrum recovery (K=3)"]
    lines = ["S1 (Gaussian, known spectrum; claim: eigenvalue error <= 0.05, span aligned)", "",
             "| max abs eigenvalue error | mean abs error | mean principal cosine | min principal cosine | "
             "min cosine, t <= 800 | train s |",
             "|---|---|---|---|---|---|",
             f"| {s1['max_eigenvalue_error']['mean']:.4f} ± {s1['max_eigenvalue_error']['std']:.4f} | "
             f"{s1['mean_eigenvalue_error']['mean']:.4f} ± {s1['mean_eigenvalue_error']['std']:.4f} | "
             f"{s1['mean_principal_cosine']['mean']:.4f} ± {s1['mean_principal_cosine']['std']:.4f} | "
             f"{s1['min_principal_cosine']['mean']:.4f} ± {s1['min_principal_cosine']['std']:.4f} | "
             f"{s1['min_principal_cosine_t_le_800']['mean']:.4f} ± {s1['min_principal_cosine_t_le_800']['std']:.4f} | "
             f"{s1['train_s']['mean']:.0f} |", "",
             "Per t (mean over seeds): " + ", ".join(
                 f"t={t}: |err| {e:.3f} / min cos {c:.3f}" for t, e, c in zip(
                     s1_runs[0]["eval_t"],
                     np.mean([np.abs(np.subtract(r["estimated"], r["closed_form"])).max(1) for r in s1_runs], 0),
                     np.mean([np.array(r["cosines"]).min(1) for r in s1_runs], 0))), "",
             f"S2 (labelled 2-D GMM, 8 classes, {8 * sampling.samples_per_class} samples, DDIM {sampling.ddim_steps}"
             f" steps, eta {ETA:g};"
             f" data log-lik {np.mean([r['data_loglik'] for r in s2]):.3f})", "",
             "| arm | accuracy | GMM log-lik | denoiser backprops | encoder backprops | wall s | share p <= floor "
             "| chosen per seed |",
             "|---|---|---|---|---|---|---|---|"]
    for name, m in arms.items():
        if not name.startswith("S2"):
            continue
        chosen = ", ".join(c.split("s=")[-1] for c in choices.get(name, []))
        lines.append(f"| {name[3:]} | {m['accuracy']['mean']:.3f} ± {m['accuracy']['std']:.3f} | "
                     f"{m['loglik']['mean']:.3f} ± {m['loglik']['std']:.3f} | {m['denoiser_backprops']['mean']:.0f} | "
                     f"{m['encoder_backprops']['mean']:.0f} | {m['wall_s']['mean']:.2f} ± {m['wall_s']['std']:.2f} | "
                     f"{m['p_below_floor']['mean']:.3f} | {('s=' + chosen) if chosen else ''} |")
    return "\n".join(lines)


def digits_markdown(digits: dict) -> str:
    lines = ["", f"Digits (seed 0; 160 samples, 16 per class; judge: {digits['judge']}; mean NN distance of real "
                 f"validation digits to the training set: {digits['val_nn_distance']:.2f}; within-class spread of the "
                 f"training digits: {digits['train_diversity']:.2f})", "",
             "| arm | class accuracy | NN distance to training set | within-class spread | denoiser backprops | "
             "encoder backprops | wall s |",
             "|---|---|---|---|---|---|---|"]
    for name, m in digits["arms"].items():
        lines.append(f"| {name} | {m['accuracy']:.3f} | {m['nn_distance']:.2f} | {m['diversity']:.2f} | "
                     f"{m['denoiser_backprops']} | {m['encoder_backprops']} | {m['wall_s']:.2f} |")
    return "\n".join(lines)


def _plot(s1: list[dict], s2: list[dict], digits: dict | None, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    est, truth = np.array(s1[0]["estimated"]), np.array(s1[0]["closed_form"])
    for k in range(est.shape[1]):
        ax.plot(s1[0]["eval_t"], truth[:, k], "-", color=f"C{k}", label=f"closed form k={k + 1}")
        ax.plot(s1[0]["eval_t"], est[:, k], "o", color=f"C{k}", ms=4)
    ax.set_xlabel("t")
    ax.set_ylabel("eigenvalue of P_t P_t*")
    ax.set_title("S1: learned (dots) vs closed-form spectrum (seed 0)")
    ax.legend(fontsize=7)
    ax = axes[1]
    for i, r in enumerate(s2):
        ax.plot(r["timesteps"], r["energy_ratio"], color="C0", alpha=0.8, label="spectral K=30" if i == 0 else None)
        ax.plot(r["timesteps"], r["exact_energy_ratio"], "--", color="k", alpha=0.6,
                label="exact Var p(y|x_t) / Var h" if i == 0 else None)
    if digits is not None:
        ax.plot(digits["timesteps"], digits["energy_ratio"], color="C3", label="digits, K=32")
    ax.set_xlabel("t")
    ax.set_ylabel("energy ratio (mean over classes)")
    ax.set_title("Phase transition: recoverable share of 1[y=c] vs t")
    ax.legend(fontsize=7)
    ax = axes[2]
    markers = {"spectral": ("o", "C0"), "spectral (official sign)": ("x", "C1"), "DPS-style": ("s", "C2")}
    labelled = set()
    for i, r in enumerate(s2):
        for name, m in r["arms"].items():
            method = name.split(", s=")[0]
            marker, color = markers.get(method, ("*", "k"))
            ax.scatter(m["loglik"], m["accuracy"], marker=marker, color=color,
                       label=None if method in labelled else method)
            labelled.add(method)
            if i == 0 and ", s=" in name:
                ax.annotate(name.split("s=")[-1], (m["loglik"], m["accuracy"]), fontsize=6)
    ax.set_xscale("symlog", linthresh=10.0)
    ax.set_xlabel("mean GMM log-likelihood (fidelity; symlog axis)")
    ax.set_ylabel("conditional accuracy")
    ax.set_title("S2: accuracy vs fidelity (all seeds, labels = s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(result: dict, records: list[dict], spec) -> dict:
    """The per-seed ``s1`` / ``s2`` records, ``digits`` (seed 0), the strength each method chose at matched fidelity
    per seed, and the pairs of ``settings.paired`` (``{baseline, arms (default: every other row), metrics}``) after
    the runner's; prints the tables."""
    runs = [seed.get("", {}) for seed in records]
    s1 = [extra["s1"] for seed in runs for extra in seed.values() if "s1" in extra]
    s2 = [extra["s2"] for seed in runs for extra in seed.values() if "s2" in extra]
    digits = next((extra["digits"] for seed in runs for extra in seed.values() if "digits" in extra), None)
    settings = sampling(spec.settings)
    choices = {f"S2 {method} @ matched fidelity": [select_matched(r["arms"], method, settings.fidelity_tol)
                                                    for r in s2] for method in MATCHED}
    block = {}
    for pair in spec.settings.get("paired", []):
        if not isinstance(pair, dict) or not isinstance(pair.get("baseline"), str):
            raise ExperimentError(f"spectral_guidance: settings.paired entries are {{baseline: ROW, arms: [ROW, ...], "
                                  f"metrics: [METRIC, ...]}}, got {pair!r}")
        block.update(paired_block(result["per_seed"], pair["baseline"], pair.get("metrics"), pair.get("arms")))
    if s1 and s2:
        print(markdown(result["arms"], choices, s1, s2, settings))
    if digits is not None:
        print(digits_markdown(digits))
    return {"matched_fidelity_choice": choices, "s1": s1, "s2": s2, "digits": digits,
            "note": "wall times measured on a shared 2-core machine (noisy)", "paired": block}


def plot(result: dict, path) -> None:
    """S1's spectrum (seed 0), the energy ratio vs t, S2's accuracy vs fidelity (the digit grid is written by
    `evaluate`)."""
    if result.get("s1") and result.get("s2"):
        _plot(result["s1"], result["s2"], result.get("digits"), Path(path))


if __name__ == "__main__":  # the older spelling: python -m experiments.spectral_guidance [--smoke] [--seeds N] ...
    import sys

    sys.exit(runner.experiment_command(["spectral_guidance", *sys.argv[1:]]))
