"""The bf16 mixed-precision path that `configs/trainer/gpu.yaml` trains with, exercised on CPU autocast.

`precision="bf16-mixed"` runs every forward pass (and what the module computes under it) in an autocast context
with bfloat16 matmuls, while the weights and the optimiser stay in fp32. CPU autocast takes the same path as on a
GPU as far as dtypes go, so a module that mixes dtypes where autocast does not reach (sparse products, in-place
writes into fp32 buffers, hand-made casts) fails here before it fails on a cluster. Every quick config gets a
`fast_dev_run` fit under bf16-mixed; its first backward pass must give every trainable parameter a finite gradient,
and the weights must still be fp32 afterwards.
"""
from __future__ import annotations

import pytest
import torch
import yaml
from lightning.pytorch.plugins.precision import MixedPrecision

from conftest import QUICK_CONFIGS, GradientProbe, config_path, run_cli

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _with_a_backward_pass(cli_args: list[str]) -> list[str]:
    """GRPO's zero-variance filter drops every group of the barely trained warm-up policy in the one batch of
    `fast_dev_run` (DARS configs), which leaves no backward pass to check: keep the groups (zero advantages, but the
    backward pass still runs through every layer under autocast), and take 4 prompts instead of 32 so that DARS's
    extra rollouts for the unsolved prompts stay cheap."""
    return [*cli_args, "--model.init_args.drop_zero_variance_groups=false", "--data.init_args.batch_size=4"]


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_fast_dev_run_in_bf16_mixed_precision(config, prerequisite_args):
    args = ["--config", config_path(config), "--trainer.fast_dev_run=1", "--trainer.precision=bf16-mixed", *QUIET,
            *prerequisite_args(config)]
    with open(config_path(config)) as f:
        if (yaml.safe_load(f)["model"].get("init_args") or {}).get("drop_zero_variance_groups"):
            args = _with_a_backward_pass(args)
    cli = run_cli(*args, run=False)
    assert isinstance(cli.trainer.precision_plugin, MixedPrecision)
    assert cli.trainer.precision_plugin.precision == "bf16-mixed"
    probe = GradientProbe()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.state.finished
    assert probe.bad == [], f"parameters without a finite gradient under bf16-mixed: {probe.bad}"
    not_fp32 = [name for name, p in cli.model.named_parameters() if p.dtype != torch.float32]
    assert not_fp32 == [], f"mixed precision must keep the weights in fp32: {not_fp32}"
