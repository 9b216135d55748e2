"""Evaluation that does not depend on the number of processes.

Every module whose validation, test or predict draws random samples (RNA-FM and its Gaussian baselines, coupled
diffusion, spectral guidance and its denoiser, TIVDiff, GRPO's pass@k, multi-answer RL, the SFT warm-up's sampled
accuracy) draws each example's noise from generators seeded by (seed, the example's global index)
(`lightning_modules.shared.example_rng`, or keyed rollouts for the RLVR modules) and pools examples exactly across
ranks. The fast tests show, per module, that an example's draws do not depend on the batch it is in; the slow ones
run ``validate`` / ``test`` of a quick config on one and on two CPU processes (gloo, `conftest.TWO_PROCESSES`)
from the same checkpoint and require every metric to agree.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.spawn import ProcessExitedException

from conftest import TWO_PROCESSES, config_path, run_cli
from datamodules.verifiable_tasks import CharTokenizer, collate_prompts
from lightning_modules.shared.example_rng import (ExactMeans, ExampleGenerators, draw_integers, draw_normal,
                                                  example_seed, gather_examples, gather_objects)


# ============================================================================================ the generators
def test_an_example_draws_the_same_numbers_in_any_batch_position():
    first = ExampleGenerators(7, [4, 9, 2], stream=1)
    second = ExampleGenerators(7, [2, 4], stream=1)
    a, b = first.randn((3, 5)), second.randn((2, 5))
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    # later draws continue each example's own stream, whatever the batch draws in between
    ta, tb = draw_integers(0, 1000, (3,), first), draw_integers(0, 1000, (2,), second)
    assert ta[0] == tb[1] and ta[2] == tb[0]
    # another seed, stream or index is another stream
    assert not torch.equal(ExampleGenerators(8, [4], 1).randn((1, 5))[0], a[0])
    assert not torch.equal(ExampleGenerators(7, [4], 2).randn((1, 5))[0], a[0])
    assert not torch.equal(a[0], a[1])
    assert len({example_seed(0, i, s) for i in range(50) for s in range(3)}) == 150
    with pytest.raises(ValueError, match="batch size"):
        draw_normal((4, 5), first)


def test_gather_examples_orders_by_index_and_drops_repeated_examples():
    index = torch.tensor([5, 1, 3, 1])  # a padding copy of example 1
    values = torch.tensor([[50.0], [10.0], [30.0], [10.0]])
    got_index, got = gather_examples(index, values)
    assert got_index.tolist() == [1, 3, 5] and got[:, 0].tolist() == [10.0, 30.0, 50.0]
    ids, records = gather_objects([5, 1, 1], ["e", "a", "a"])
    assert ids == [1, 5] and records == ["a", "e"]


def test_exact_means_weight_batches_by_their_size():
    means = ExactMeans()
    means.add("val/loss", torch.tensor(1.0), 3)
    means.add("val/loss", 4.0, 1)
    means.add("val/other", 2.0, 0)  # no weight: not reported
    assert means.compute() == {"val/loss": 1.75} and means.compute() == {}


# ============================================================================================ per module (fast)
def test_rna_fm_samples_and_losses_depend_only_on_the_slide_index():
    from lightning_modules.rna_fm.rna_fm import RNAFM

    torch.manual_seed(0)
    model = RNAFM(hidden_dim=8, depth=1, num_heads=2, graph_heads=2, cond_heads=1, dropout=0.0)
    model._build({"num_genes": 6, "feature_dim": 4, "num_clusters": 3, "groups": [[0, 1, 2], [2, 3], [4, 5]]})
    model.eval()
    features, expression = torch.randn(3, 3, 4), torch.randn(3, 6)
    index = torch.tensor([11, 4, 7])
    whole = {"features": features, "expression": expression, "index": index}
    part = {"features": features[[2, 0]], "expression": expression[[2, 0]], "index": index[[2, 0]]}
    with torch.no_grad():
        _, samples = model.distribution(features, 4, model._generators(whole, 1))
        _, samples_part = model.distribution(part["features"], 4, model._generators(part, 1))
        loss = model.loss(whole, model._generators(whole, 0), reduction="none")
        loss_part = model.loss(part, model._generators(part, 0), reduction="none")
    torch.testing.assert_close(samples_part, samples[[2, 0]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_part, loss[[2, 0]], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(samples[0], samples[1])  # distinct slides, distinct noise


def test_he2rna_predictive_samples_depend_only_on_the_slide_index():
    from lightning_modules.rna_fm.expression_regressors import HE2RNARegressor

    torch.manual_seed(0)
    model = HE2RNARegressor(ks=[2])
    model._build({"num_genes": 5, "feature_dim": 4, "num_clusters": 3, "groups": None})
    model.eval()
    features, index = torch.randn(3, 3, 4), torch.tensor([0, 8, 3])
    with torch.no_grad():
        _, samples = model.distribution(features, 6, ExampleGenerators(42, index, 1))
        _, samples_part = model.distribution(features[1:], 6, ExampleGenerators(42, index[1:], 1))
    torch.testing.assert_close(samples_part, samples[1:], rtol=1e-5, atol=1e-6)


def test_coupled_diffusion_samples_depend_only_on_the_example_index():
    from lightning_modules.coupled_diffusion.coupled_diffusion import CoupledDiffusion

    torch.manual_seed(0)
    model = CoupledDiffusion(num_train_timesteps=20, sampling_steps=5, condition_sampling_steps=5,
                             signal_hidden_dim=16, signal_depth=1, logit_hidden_dim=16, logit_depth=1, feature_dim=4,
                             feature_hidden_dim=8, time_dim=8, classifier_hidden_dim=16, coupling_iterations=3,
                             nested_block_size=5, nested_refresh_every=2, nested_refresh_from=4,
                             alternating_iterations=2).eval()
    pixels = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels, index = torch.tensor([1, 2, 3]), torch.tensor([30, 1, 12])
    whole = (pixels, pixels, labels, index)
    part = (pixels[[2, 1]], pixels[[2, 1]], labels[[2, 1]], index[[2, 1]])
    out = model.sample(pixels * 2 - 1, generator=model._generator(whole, 0, 1))
    out_part = model.sample(pixels[[2, 1]] * 2 - 1, generator=model._generator(part, 5, 1))
    torch.testing.assert_close(out_part["images"], out["images"][[2, 1]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_part["logits"], out["logits"][[2, 1]], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        x, y = model.losses(pixels * 2 - 1, pixels * 2 - 1, generator=model._generator(whole, 0, 0))
    assert math.isfinite(float(x)) and math.isfinite(float(y))


def test_spectral_guidance_and_denoiser_noise_depend_only_on_the_example_index():
    from lightning_modules.shared.denoisers import MLPDenoiser
    from lightning_modules.spectral_guidance.diffusion_denoiser import DiffusionDenoiser, evaluation_generators
    from lightning_modules.spectral_guidance.spectral_guidance import SpectralGuidanceEncoder, TimeConditionedMLPEncoder

    torch.manual_seed(0)
    x0, labels, index = torch.randn(4, 2), torch.zeros(4, dtype=torch.long), torch.tensor([3, 0, 9, 5])
    encoder = SpectralGuidanceEncoder(TimeConditionedMLPEncoder(data_dim=2, num_features=2, hidden_dim=8, time_dim=8))
    part = (x0[[2, 1]], labels[:2], index[[2, 1]])
    views = encoder._noisy_views(x0, 100, evaluation_generators((x0, labels, index), 0))
    views_part = encoder._noisy_views(part[0], 100, evaluation_generators(part, 3))
    assert all(torch.equal(p, v[[2, 1]]) for p, v in zip(views_part, views))
    denoiser = DiffusionDenoiser(MLPDenoiser(data_dim=2, hidden_dim=8, time_dim=8), sample_steps=4, sample_eta=1.0)
    samples = denoiser.predict_step((x0, labels, index), 0)
    samples_part = denoiser.predict_step(part, 7)
    torch.testing.assert_close(samples_part, samples[[2, 1]], rtol=1e-5, atol=1e-6)  # eta = 1: step noise too


def test_tivdiff_evaluation_noise_depends_only_on_the_example_index():
    from lightning_modules.tivdiff.tivdiff import TIVDiff

    torch.manual_seed(0)
    model = TIVDiff(num_train_identities=4, image_resolution=8, embedding_dim=8, encoder_channels=8, vip_hidden=16,
                    unet_base_channels=8, num_inference_steps=10, watermark_bits=8).eval()
    g = torch.Generator().manual_seed(0)
    batch = {"image": torch.rand(3, 1, 8, 8, generator=g), "geometry": torch.rand(3, 1, 8, 8, generator=g),
             "identity": torch.tensor([0, 1, 2]), "key": torch.tensor([5, 6, 7]), "index": torch.tensor([4, 40, 2])}
    part = {k: v[[2, 0]] for k, v in batch.items()}
    with torch.no_grad():
        e, e_part = model.embed(batch["image"]), model.embed(part["image"])
        v, v_part = model.virtual_identity(e, batch["key"]), model.virtual_identity(e_part, part["key"])
        _, z = model.watermarked_noise(v, batch["key"], model._example_generators(batch, 0, 1))
        _, z_part = model.watermarked_noise(v_part, part["key"], model._example_generators(part, 9, 1))
        torch.testing.assert_close(z_part, z[[2, 0]], rtol=1e-5, atol=1e-5)
        loss = [model.diffusion_loss(b["image"], b["geometry"], model.embed(b["image"]),
                                     model._example_generators(b, 0, 0)) for b in (batch, part)]
    assert all(math.isfinite(float(x)) for x in loss)


def _prompt_batch(ids):
    texts = {0: "1+2=", 1: "12+345=", 2: "7+7=", 3: "40+2="}
    return collate_prompts([{"prompt_id": i, "prompt": texts[i], "answers": ["0"]} for i in ids], CharTokenizer())


def test_grpo_evaluation_samples_depend_only_on_the_prompt_id():
    from lightning_modules.rlvr.grpo import GRPO
    from lightning_modules.shared.tiny_gpt import TinyGPT

    torch.manual_seed(0)
    model = GRPO(TinyGPT(n_layer=1, d_model=32, n_head=2, context_length=24), eval_samples=3, max_new_tokens=5,
                 rollout_seed=0)
    model.set_tokenizer(CharTokenizer())
    whole, part = _prompt_batch([0, 1, 2]), _prompt_batch([2, 3, 0])
    rows = {}
    for name, batch, batch_idx in (("whole", whole, 0), ("part", part, 4)):
        counts = torch.full((3,), 3, dtype=torch.long)
        tokens, mask, group = model.generate(batch, counts, 1.0, model.evaluation_generator(batch_idx, 1),
                                             keyed=model.keyed_evaluation)
        ids = batch["prompt_ids"][group].tolist()
        rows[name] = {i: [t[m].tolist() for t, m, j in zip(tokens, mask, ids) if j == i] for i in set(ids)}
    assert rows["whole"][0] == rows["part"][0] and rows["whole"][2] == rows["part"][2]
    assert rows["whole"][0] != rows["whole"][2] or rows["whole"][0][0] != rows["whole"][0][1]


def test_multi_answer_sets_depend_only_on_the_prompt_id():
    from datamodules.many_answer_tasks import ManyAnswerDataModule
    from lightning_modules.multi_answer_rl.multi_answer_rl import MultiAnswerGRPO, MultiAnswerReward
    from lightning_modules.shared.tiny_gpt import TinyGPT

    dm = ManyAnswerDataModule(eval_batch_size=6)
    torch.manual_seed(0)
    policy = TinyGPT(vocab_size=dm.tokenizer.vocab_size, n_layer=1, d_model=16, n_head=2, context_length=24)
    module = MultiAnswerGRPO(policy=policy, reward=MultiAnswerReward(mode="rlcr"), max_new_tokens=6)
    module.set_tokenizer(dm.tokenizer)
    batch = next(iter(dm.val_dataloader()))
    part = {k: v[3:] for k, v in batch.items()}  # the same prompts in other batch positions
    sets = module.sample_sets(batch, 2, 1.0, module.evaluation_generator(0, 1), keyed=True)
    sets_part = module.sample_sets(part, 2, 1.0, module.evaluation_generator(1, 1), keyed=True)
    assert [r["completions"] for r in sets_part] == [r["completions"] for r in sets[3:]]


# ============================================================================================ 1 vs 2 processes
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.logger=false"]
SHORT_FIT = ["--trainer.max_epochs=1", "--trainer.max_steps=-1", "--trainer.limit_train_batches=2",
             "--trainer.limit_val_batches=0", "--trainer.val_check_interval=1.0", "--trainer.check_val_every_n_epoch=1",
             *QUIET]
WITHIN_BATCH = "pair-margin / linkability / MMD losses over the pairs of a batch: a statistic of the batch, not a draw"
# family: (config, extra flags, stages, metrics that are statistics of a batch's composition (not required equal))
FAMILIES = {
    "rna_fm": ("configs/rna_fm/quick.yaml", [], ("validate", "test"), ()),
    "he2rna": ("configs/rna_fm/he2rna_quick.yaml", [], ("validate", "test"), ()),
    "coupled_diffusion": ("configs/coupled_diffusion/quick.yaml", [], ("validate", "test"), ()),
    "spectral_guidance": ("configs/spectral_guidance/quick.yaml", ["--data.init_args.num_val=256"], ("validate",), ()),
    "diffusion_denoiser": ("configs/spectral_guidance/denoiser_quick.yaml", ["--data.init_args.num_val=256"],
                           ("validate",), ()),
    "tivdiff": ("configs/tivdiff/quick.yaml", [], ("validate",), ("val/vip_", "val/loss")),
    "grpo": ("configs/grpo/quick.yaml", ["--data.init_args.test_pool_size=64"], ("validate", "test"), ()),
    "multi_answer_rl": ("configs/multi_answer_rl/quick.yaml", [], ("validate", "test"), ()),
    "sft": ("configs/grpo/sft_quick.yaml", ["--data.init_args.test_pool_size=64"], ("validate", "test"), ()),
}
EXACT = ("n_significant",)  # counts: equal, not only close


def _in(directory: Path, *args: str):
    directory.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        return run_cli(*args)
    finally:
        os.chdir(cwd)


def _metrics(directory: Path, args: list[str]) -> dict[str, float]:
    try:
        cli = _in(directory, *args)
    except ProcessExitedException as err:  # a rank aborting in gloo's teardown after its work: run it again
        if err.signal_name != "SIGABRT":
            raise
        cli = _in(directory.with_name(directory.name + "_again"), *args)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items()}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_processes_evaluate_exactly_as_one(family, tmp_path, prerequisite_args):
    config, extra, stages, batch_statistics = FAMILIES[family]
    common = ["--config", config_path(config), *prerequisite_args(config), *extra]
    fit = _in(tmp_path / "fit", "fit", *common, *SHORT_FIT)
    ckpt = str(tmp_path / "short.ckpt")
    fit.trainer.save_checkpoint(ckpt)
    for stage in stages:
        results = {}
        for devices, strategy in ((1, "auto"), (2, TWO_PROCESSES)):
            args = [stage, *common, f"--ckpt_path={ckpt}", f"--trainer.devices={devices}",
                    f"--trainer.strategy={strategy}", "--trainer.limit_val_batches=1.0",
                    "--trainer.limit_test_batches=1.0", *QUIET]
            results[devices] = _metrics(tmp_path / f"{stage}{devices}", args)
        assert results[1], f"{stage} logged nothing"
        assert results[2].keys() == results[1].keys()
        assert all(math.isfinite(v) for v in results[1].values()), results[1]
        compared = {k for k in results[1] if not k.startswith(batch_statistics or ("\0",))}
        different = {k: (results[1][k], results[2][k]) for k in compared
                     if (results[2][k] != results[1][k] if k.split("/")[-1] in EXACT
                         else results[2][k] != pytest.approx(results[1][k], rel=1e-5, abs=1e-6))}
        assert not different, f"{stage}: 1 process vs 2 processes: {different}"
