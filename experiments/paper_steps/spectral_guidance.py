"""Spectral Guidance's paper config on CIFAR-10's python release, with the pretrained DDPM it guides read from a local
diffusers folder laid out as google/ddpm-cifar10-32 ships it (random weights: nothing is downloaded)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from experiments.paper_steps import Case
from experiments.paper_steps._release import cifar10_python

# google/ddpm-cifar10-32's UNet2DModel config.json: the DDPM CIFAR-10 network of Ho et al. 2020 (ch 128, mults
# 1, 2, 2, 2, two res blocks per level, self-attention at 16x16), 35.7M parameters
DDPM_CIFAR10_UNET = {
    "_class_name": "UNet2DModel", "act_fn": "silu", "attention_head_dim": None,
    "block_out_channels": [128, 256, 256, 256], "center_input_sample": False,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"], "downsample_padding": 0,
    "flip_sin_to_cos": False, "freq_shift": 1, "in_channels": 3, "layers_per_block": 2, "mid_block_scale_factor": 1,
    "norm_eps": 1e-06, "norm_num_groups": 32, "out_channels": 3, "sample_size": 32,
    "time_embedding_type": "positional", "up_block_types": ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"]}
DDPM_CIFAR10_SCHEDULER = {"_class_name": "DDPMScheduler", "beta_end": 0.02, "beta_schedule": "linear",
                          "beta_start": 0.0001, "clip_sample": True, "num_train_timesteps": 1000, "trained_betas": None,
                          "variance_type": "fixed_small"}
K = 512                       # the config's num_features: every whitened batch needs more samples than K
FORMAT = ("cifar-10-batches-py: data_batch_1..5, test_batch, batches.meta (python pickles, byte keys; 1,100 images "
          "per batch so that the 10% validation split holds more than K = 512); pretrained/ddpm-cifar10-32: "
          "config.json, diffusion_pytorch_model.safetensors, scheduler_config.json (UNet2DModel, random weights)")


def ddpm_cifar10_folder(folder: Path, seed: int = 0) -> Path:
    """A diffusers folder with google/ddpm-cifar10-32's files (``config.json``, ``diffusion_pytorch_model.safetensors``,
    ``scheduler_config.json``) holding a randomly initialised network of its architecture."""
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    UNet2DModel(**{k: v for k, v in DDPM_CIFAR10_UNET.items() if not k.startswith("_")}).save_pretrained(
        folder, safe_serialization=True)
    (Path(folder) / "scheduler_config.json").write_text(json.dumps(DDPM_CIFAR10_SCHEDULER, indent=2))
    return Path(folder)


def write(folder: Path) -> list[str]:
    data = folder / "dataset" / "cifar10"
    cifar10_python(data, train_per_batch=1100, test=128)
    denoiser = ddpm_cifar10_folder(folder / "pretrained" / "ddpm-cifar10-32")
    return [f"--data.init_args.data_dir={data}", f"--model.init_args.denoiser_path={denoiser}",
            "--data.init_args.num_workers=0"]


CASES = {
    "configs/spectral_guidance/paper.yaml": Case(
        write, release_format=FORMAT,
        args=(f"--data.init_args.batch_size={K + 8}",),
        note=(f"batch {K + 8} instead of 2048: about the smallest batch above K = {K} that the whitening allows; even "
              "so a step takes ~95-120 s and 6.8 GB of activations on one core (at 2048: ~4x both)"),
        test_args=("--data.init_args.batch_size=24", "--model.init_args.encoder.init_args.num_features=16")),
}
