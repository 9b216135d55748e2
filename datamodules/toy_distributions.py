"""Data with a known answer for diffusion-guidance experiments (Spectral Guidance), plus images in [-1, 1].

Distributions (``distribution=``)
---------------------------------
* ``gaussian`` (embedded): x0 ~ N(0, Q diag(Lambda) Q^T) in ``len(gaussian_eigenvalues)`` dimensions, Q a
  random orthogonal matrix drawn from ``seed``. Under DDPM noising x_t = sqrt(a) x0 + sqrt(1 - a) eps the
  two-view operator P_t P_t^* has the closed-form leading eigenvalues a Lambda_k / (a Lambda_k + 1 - a) with the
  linear eigenfunctions q_k^T x (`GaussianSpectrum.correlations`). The default spectrum (12, 9, 7, then
  2.5 * 0.8^k) keeps Lambda_1 < 2 Lambda_3: then for every t the top-3 eigenfunctions are the three linear ones
  (the quadratic Hermite function of direction 1 has eigenvalue rho_1^4, which beats the third linear one,
  rho_3^2, at small noise when Lambda_1 > 2 Lambda_3; the official notebook's 40 * 0.7^k sits on that edge).
  Labels are all 0.
* ``gmm`` (embedded): a labelled 2-D Gaussian mixture built like the official ``examples/prior.GMM``: means
  ``gmm_mean_scale * N(0, I)`` placed at least ``3 sqrt(cov_scale + 0.5)`` apart and centred, covariances
  ``cov_scale A A^T + 0.5 I``, equal weights, then everything multiplied by ``gmm_rescale`` (default 1/4, so that
  the data have roughly unit scale for a T = 1000 linear DDPM schedule). The label is the component.
  `LabelledGMM` gives the exact log-density and class posterior used by the experiments.
* ``digits`` (embedded): scikit-learn's 8x8 digits through ``datamodules.readers`` (its fixed 80/20 train/test
  split), pixels mapped to [-1, 1] (the range of every diffusion model of the collection).
* ``cifar10``: the official python-version pickles from a local ``data_dir`` (read by ``datamodules.readers``),
  pixels in [-1, 1], optional horizontal flips (the Spectral Guidance paper's only augmentation).
* ``imagefolder``: your own images, one subfolder per class as in torchvision's ``ImageFolder``:
  ``data_dir/train/<class>/*.{png,jpg,jpeg}`` (classes are the sorted folder names; the label is the class
  index). Read by `datamodules.readers` (`scan_image_folder`, `FileImages`): PIL, converted to RGB, resized (not
  cropped) to ``resize_to`` x ``resize_to`` (default 32), then held in memory as 8-bit pixels and mapped to
  [-1, 1] like CIFAR-10 (a fixed map: no statistics are estimated). Only ``train/`` is read (there is no test
  stage); a ``test/`` folder next to it, as the coupled-diffusion and TREW image folders have, is not read.
  Optional horizontal flips as for cifar10.

Splits: the embedded vector data draw ``num_train`` training and ``num_val`` validation samples from
generator streams of ``seed``; images hold out a stratified ``val_fraction`` of the training split (seeded).
Training batches are ``(x, label)``; validation and predict batches ``(x, label, index)`` (the index of each
example in the validation split seeds its evaluation noise). The training loader drops its last incomplete batch
(the whitening of Spectral Guidance needs full batches) unless the split is smaller than one batch.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.readers import (FileImages, TensorImages, find_cifar_dir, load_cifar, load_digits_images,
                                 require_data_dir, scan_image_folder, stratified_split)
from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

DISTRIBUTIONS = ("gaussian", "gmm", "digits", "cifar10", "imagefolder")
IMAGE_FILES = ("cifar10", "imagefolder")  # the distributions read from data_dir
DEFAULT_GAUSSIAN_EIGENVALUES = (12.0, 9.0, 7.0) + tuple(2.5 * 0.8 ** k for k in range(13))
_STREAM_PARAMS, _STREAM_TRAIN, _STREAM_VAL, _STREAM_SPLIT = 11, 12, 13, 14


class GaussianSpectrum:
    """x0 ~ N(0, Q diag(eigenvalues) Q^T); the closed-form spectrum of the DDPM two-view operator."""

    def __init__(self, eigenvalues: Tensor, eigenvectors: Tensor) -> None:
        order = torch.argsort(eigenvalues, descending=True)
        self.eigenvalues, self.eigenvectors = eigenvalues[order].double(), eigenvectors[:, order].double()

    @property
    def dim(self) -> int:
        return len(self.eigenvalues)

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        z = torch.randn(n, self.dim, generator=generator, dtype=torch.float64)
        return (z * self.eigenvalues.sqrt()) @ self.eigenvectors.T

    def correlations(self, alpha_bar: float | Tensor) -> Tensor:
        """Eigenvalues of the linear eigenfunctions at noise level alpha_bar: a L / (a L + 1 - a), descending."""
        a = torch.as_tensor(alpha_bar, dtype=torch.float64)
        return a * self.eigenvalues / (a * self.eigenvalues + 1.0 - a)


class LabelledGMM:
    """Equal-weight Gaussian mixture with labelled components: exact log-density and class posterior."""

    def __init__(self, means: Tensor, covariances: Tensor) -> None:
        self.means, self.covariances = means.double(), covariances.double()
        self._chol = torch.linalg.cholesky(self.covariances)

    @property
    def num_components(self) -> int:
        return len(self.means)

    def component_log_prob(self, x: Tensor) -> Tensor:
        """[N, D] -> [N, C]: log N(x; mu_c, Sigma_c) (differentiable in x)."""
        diff = x.double()[:, None, :] - self.means[None]                          # N, C, D
        chol = self._chol.to(x.device)
        solved = torch.linalg.solve_triangular(chol[None].expand(len(x), -1, -1, -1), diff.unsqueeze(-1),
                                               upper=False).squeeze(-1)
        maha = solved.square().sum(-1)
        log_det = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        return -0.5 * (maha + log_det[None] + x.shape[-1] * math.log(2.0 * math.pi))

    def log_prob(self, x: Tensor) -> Tensor:
        return torch.logsumexp(self.component_log_prob(x), dim=-1) - math.log(self.num_components)

    def log_posterior(self, x: Tensor) -> Tensor:
        """[N, D] -> [N, C]: log p(y = c | x) (equal weights)."""
        return torch.log_softmax(self.component_log_prob(x), dim=-1)

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        labels = torch.arange(n) % self.num_components
        z = torch.randn(n, self.means.shape[1], 1, generator=generator, dtype=torch.float64)
        return self.means[labels] + (self._chol[labels] @ z).squeeze(-1), labels


def make_gmm(num_components: int, mean_scale: float, cov_scale: float, rescale: float,
             generator: torch.Generator, dim: int = 2, max_tries: int = 10_000) -> LabelledGMM:
    """The official example's GMM (rejection-placed means, random covariances), scaled by `rescale`."""
    min_separation = 3.0 * (cov_scale + 0.5) ** 0.5
    means = torch.empty(num_components, dim, dtype=torch.float64)
    placed = 0
    for _ in range(max_tries):
        candidate = mean_scale * torch.randn(dim, generator=generator, dtype=torch.float64)
        if placed == 0 or torch.linalg.norm(means[:placed] - candidate, dim=-1).min() >= min_separation:
            means[placed] = candidate
            placed += 1
            if placed == num_components:
                break
    else:
        raise UserInputError(f"could not place {num_components} GMM means {min_separation:.2f} apart with "
                             f"gmm_mean_scale={mean_scale}: raise gmm_mean_scale or lower gmm_components.")
    means -= means.mean(0, keepdim=True)
    a = torch.randn(num_components, dim, dim, generator=generator, dtype=torch.float64)
    covariances = cov_scale * a @ a.transpose(1, 2) + 0.5 * torch.eye(dim, dtype=torch.float64)
    return LabelledGMM(means * rescale, covariances * rescale ** 2)


def load_image_folder(root: str, size: int) -> TensorImages:
    """``root/train/<class>/*`` (see the module docstring) as in-memory uint8 pixels [N, 3, size, size]."""
    _, [(paths, labels)] = scan_image_folder(root, splits=("train",))
    files = FileImages(paths, labels, size)
    pixels = torch.stack([(files.pixels(i) * 255.0).round().to(torch.uint8) for i in range(len(paths))])
    return TensorImages(pixels, labels, 255.0)


class _Tensors(Dataset):
    """(x, label) pairs from an in-memory tensor; integer pixels are scaled to [-1, 1] on the fly. With
    ``with_index`` (the validation split) items are (x, label, index): the index seeds the example's evaluation
    noise, so that noise does not depend on batching or on the number of processes."""

    def __init__(self, data: Tensor, labels: Tensor, pixel_scale: float | None = None, hflip: bool = False,
                 with_index: bool = False):
        self.data, self.labels, self.pixel_scale, self.hflip = data, labels, pixel_scale, hflip
        self.with_index = with_index

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x = self.data[i]
        if self.pixel_scale is not None:
            x = x.float() / self.pixel_scale * 2.0 - 1.0
        else:
            x = x.float()
        if self.hflip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x, self.labels[i], torch.as_tensor(i, dtype=torch.long)) if self.with_index else (x, self.labels[i])


class DiffusionToyDataModule(LightningDataModule):
    """Embedded Gaussian / labelled GMM / digits, or local CIFAR-10 / image folders, as `(x, label)` batches.

    Args:
        distribution: "gaussian", "gmm", "digits" (embedded), "cifar10" or "imagefolder" (need data_dir).
        data_dir: local CIFAR-10 folder (cifar-10-batches-py or its parent), or your image folder (holding
            train/<class>/*.png|jpg); None for the embedded data.
        num_train, num_val: samples drawn for the embedded vector distributions.
        gaussian_eigenvalues: covariance spectrum of the Gaussian (None: the default, see module doc).
        gmm_components, gmm_mean_scale, gmm_cov_scale, gmm_rescale: the GMM generator (see `make_gmm`).
        val_fraction: images only, stratified share of the training split held out for validation.
        hflip: random horizontal flips of training images (cifar10 and imagefolder only).
        batch_size, num_workers: loader settings.
        seed: draws the distribution's parameters, the samples and the image validation split.
        resize_to: imagefolder only, square side the images are resized to (default 32).
    """

    def __init__(self, distribution: Literal["gaussian", "gmm", "digits", "cifar10", "imagefolder"] = "gmm",
                 data_dir: str | None = None, num_train: int = 20_000, num_val: int = 2_000,
                 gaussian_eigenvalues: list[float] | None = None, gmm_components: int = 8,
                 gmm_mean_scale: float = 4.0, gmm_cov_scale: float = 0.5, gmm_rescale: float = 0.25,
                 val_fraction: float = 0.1, hflip: bool = False, batch_size: int = 1024, num_workers: int = 0,
                 seed: int = 0, resize_to: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        if distribution not in DISTRIBUTIONS:
            raise UserInputError(f"distribution={distribution!r} is unknown: choose one of {', '.join(DISTRIBUTIONS)}.")
        for name, value, low in (("num_train", num_train, 2), ("num_val", num_val, 1), ("batch_size", batch_size, 1),
                                 ("num_workers", num_workers, 0), ("seed", seed, 0),
                                 ("gmm_components", gmm_components, 2)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserInputError(f"{name}={value!r} must be an integer.")
            check_range(name, value, low)
        check_range("gmm_mean_scale", gmm_mean_scale, 0.0, low_inclusive=False)
        check_range("gmm_cov_scale", gmm_cov_scale, 0.0)
        check_range("gmm_rescale", gmm_rescale, 0.0, low_inclusive=False)
        check_range("val_fraction", val_fraction, 0.0, 0.5, low_inclusive=False)
        if hflip and distribution not in IMAGE_FILES:
            raise UserInputError(f"hflip=True is only for cifar10 and imagefolder (a flipped {distribution} sample is "
                                 "another distribution's sample). Set hflip: false.")
        if distribution == "cifar10" and data_dir is None:
            raise UserInputError("distribution='cifar10' needs data_dir: the folder with the official python "
                                 "pickles (cifar-10-batches-py/data_batch_1..5, test_batch). Nothing is downloaded.")
        if data_dir is not None and distribution not in IMAGE_FILES:
            raise UserInputError(f"distribution={distribution!r} is embedded and reads no files, but "
                                 f"data_dir={data_dir!r} was given. Remove data_dir.")
        if resize_to is not None and distribution != "imagefolder":
            raise UserInputError(f"resize_to={resize_to!r} applies to distribution='imagefolder' only; "
                                 f"{distribution!r} has a fixed size. Remove resize_to.")
        if resize_to is not None and (isinstance(resize_to, bool) or not isinstance(resize_to, int)):
            raise UserInputError(f"resize_to={resize_to!r} must be an integer (pixels per side) or null.")
        self.distribution, self.data_dir, self.seed = distribution, data_dir, seed
        self.batch_size, self.num_workers, self.hflip = batch_size, num_workers, hflip
        self.num_train, self.num_val, self.val_fraction = num_train, num_val, float(val_fraction)
        self.spectrum: GaussianSpectrum | None = None
        self.gmm: LabelledGMM | None = None
        params = torch.Generator().manual_seed(mix_seed(seed, _STREAM_PARAMS))
        if distribution == "gaussian":
            eigenvalues = DEFAULT_GAUSSIAN_EIGENVALUES if gaussian_eigenvalues is None else gaussian_eigenvalues
            values = torch.tensor([float(v) for v in eigenvalues], dtype=torch.float64)
            if len(values) < 2 or bool((values <= 0).any()):
                raise UserInputError(f"gaussian_eigenvalues={list(eigenvalues)} must hold >= 2 positive numbers "
                                     "(the covariance spectrum; its length is the data dimension).")
            q, r = torch.linalg.qr(torch.randn(len(values), len(values), generator=params, dtype=torch.float64))
            self.spectrum = GaussianSpectrum(values, q * torch.sign(torch.diagonal(r))[None])
            self.data_shape, self.num_classes = (len(values),), 1
        elif distribution == "gmm":
            self.gmm = make_gmm(gmm_components, gmm_mean_scale, gmm_cov_scale, gmm_rescale, params)
            self.data_shape, self.num_classes = (2,), gmm_components
        elif distribution == "digits":
            self.data_shape, self.num_classes = (1, 8, 8), 10
        elif distribution == "imagefolder":
            size = 32 if resize_to is None else resize_to
            check_range("resize_to", size, 1)
            self.data_dir = require_data_dir(data_dir, "imagefolder", "train/<class>/*.png|jpg subfolders")
            self.class_names, _ = scan_image_folder(self.data_dir, splits=("train",))  # fail before a model is built
            self.data_shape, self.num_classes = (3, size, size), len(self.class_names)
        else:
            self.data_dir = find_cifar_dir("cifar10", data_dir)
            self.data_shape, self.num_classes = (3, 32, 32), 10
        self._built = False

    def setup(self, stage: str | None = None) -> None:
        if self._built:
            return
        if self.distribution in ("gaussian", "gmm"):
            sets = []
            for stream, n in ((_STREAM_TRAIN, self.num_train), (_STREAM_VAL, self.num_val)):
                gen = torch.Generator().manual_seed(mix_seed(self.seed, stream))
                if self.spectrum is not None:
                    x, y = self.spectrum.sample(n, gen), torch.zeros(n, dtype=torch.long)
                else:
                    x, y = self.gmm.sample(n, gen)
                sets.append(_Tensors(x.float(), y, with_index=stream == _STREAM_VAL))
            self.train_set, self.val_set = sets
        else:
            if self.distribution == "digits":
                pool, _ = load_digits_images()
            elif self.distribution == "imagefolder":
                pool = load_image_folder(self.data_dir, self.data_shape[-1])
            else:
                pool, _ = load_cifar("cifar10", self.data_dir)
            train_idx, val_idx = stratified_split(pool.labels, self.val_fraction, mix_seed(self.seed, _STREAM_SPLIT))
            if len(val_idx) == 0:
                raise UserInputError(f"{self.distribution}: no class of train/ has 2 or more images, so no validation "
                                     "image can be held out: give every class at least 2 images.")
            self.train_set = _Tensors(pool.data[train_idx], pool.labels[train_idx], pool.scale, self.hflip)
            self.val_set = _Tensors(pool.data[val_idx], pool.labels[val_idx], pool.scale, with_index=True)
        self._built = True

    def train_tensors(self) -> tuple[Tensor, Tensor]:
        """The whole (un-augmented) training split as tensors (x in model range, labels): for encoding."""
        self.setup()
        s = self.train_set
        x = s.data.float() if s.pixel_scale is None else s.data.float() / s.pixel_scale * 2.0 - 1.0
        return x, s.labels

    def train_dataloader(self) -> DataLoader:
        drop_last = len(self.train_set) >= self.batch_size
        return DataLoader(self.train_set, batch_size=self.batch_size, num_workers=self.num_workers,
                          sampler=training_sampler(len(self.train_set), self.seed, self.trainer), drop_last=drop_last)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers,
                          sampler=evaluation_sampler(self.val_set, self.trainer))

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()
