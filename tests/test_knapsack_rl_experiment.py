"""The Knapsack RL experiment's protocol (``configs/knapsack_rl/experiment.yaml`` + the hooks in
experiments/knapsack_rl.py and experiments/_rlvr.py) without training: the SFT warm-up is a Lightning run of
configs/grpo/sft_quick.yaml whose batches are the former hand-written loop's, both GRPO arms start from its
checkpoint at the documented scale and differ only in the allocator, and the per-step records give the
hand-computed effective ratios. Slow tests run the smoke experiment and pin a reduced run to the numbers of the
pre-conversion script."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from datamodules.sampling import ReplacementSampler
from experiments import _rlvr as rlvr
from experiments import kit, knapsack_rl, runner
from lightning_modules.shared.errors import UserInputError

GRPO_ARMS = ("uniform", "knapsack")


def arms(smoke: bool = False) -> dict[str, runner.Arm]:
    return {arm.name: arm for arm in runner.load_spec("knapsack_rl", smoke=smoke).arms}


def resolved(arm: runner.Arm, smoke: bool = False) -> dict:
    """The arm's effective overrides (experiment, arm, smoke layers) as the runner applies them."""
    return runner.arm_overrides(runner.load_spec("knapsack_rl", smoke=smoke), arm)


def test_spec_arms_and_sizes_are_the_documented_ones():
    spec = runner.load_spec("knapsack_rl")
    assert spec.seeds == 5 and spec.baseline == "uniform" and set(spec.hooks) == set(runner.HOOKS)
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    assert [a.name for a in spec.arms] == ["sft", *GRPO_ARMS]          # the warm-up first: the others need it
    sft, uniform, knapsack = spec.arms
    assert (sft.row, uniform.row, knapsack.row) == (False, True, True)
    assert sft.configs == ["configs/grpo/sft_quick.yaml"] and spec.settings["warm_up"] == "sft"
    assert uniform.configs == knapsack.configs == ["configs/knapsack_rl/quick.yaml"]
    s = resolved(sft)
    assert s["trainer.max_steps"] == 3000 and s["trainer.gradient_clip_val"] == 1.0
    assert s["model.init_args.optimizer.init_args.lr"] == 0.003 and s["data.init_args.sft_sampling"] == "replacement"
    assert s["data.init_args.sft_batch_size"] == 64 and s["data.init_args.sft_extra_fraction"] == 0.2
    for arm in (uniform, knapsack):
        g = resolved(arm)
        assert g["trainer.max_epochs"] == 12 and g["trainer.max_steps"] == -1            # 12 x 256 / 32 = 96 steps
        assert g["model.init_args.rollouts_per_prompt"] == 8 and g["data.init_args.batch_size"] == 32
        assert g["data.init_args.train_pool_size"] == g["data.init_args.test_pool_size"] == 256
        assert g["data.init_args.digit_tiers"] == [2, 3, 4] and g["trainer.limit_val_batches"] == 0
        assert g["trainer.callbacks+"] == "experiments._rlvr.StepRecorder"
    # the arms differ only in the allocator
    differ = {k for k in {**resolved(uniform), **resolved(knapsack)}
              if resolved(uniform).get(k) != resolved(knapsack).get(k)}
    assert differ == {"model.init_args.rollout_allocator", "model.init_args.rollout_allocator.init_args.max_n",
                      "model.init_args.rollout_allocator.init_args.min_history"}


def test_smoke_overlay_is_seconds_long():
    spec = runner.load_spec("knapsack_rl", smoke=True)
    assert spec.seeds == 1 and [a.name for a in spec.arms] == ["sft", *GRPO_ARMS]
    by_name = arms(smoke=True)
    assert resolved(by_name["sft"], smoke=True)["trainer.max_steps"] <= 5
    for name in GRPO_ARMS:
        values = resolved(by_name[name], smoke=True)
        assert values["trainer.max_epochs"] == 1 and values["model.init_args.rollouts_per_prompt"] == 2
        assert values["data.init_args.train_pool_size"] <= 16 and values["data.init_args.digit_tiers"] == [2, 3]


def build(arm_name: str, extra: list[str] = ()):
    spec = runner.load_spec("knapsack_rl")
    arm = arms()[arm_name]
    return runner.build_cli(runner.arm_flags(spec, arm) + runner.QUIET + list(extra), 3, kit.REPO_ROOT / "runs" / "x")


def test_the_arms_build_as_the_cli_builds_them():
    from lightning_modules.rlvr.rollout_allocation import KnapsackAllocator, UniformAllocator

    with runner.isolated():
        sft = build("sft")
        uniform = build("uniform", ["--model.init_args.init_from=/x/sft.ckpt"])
        knapsack = build("knapsack", ["--model.init_args.init_from=/x/sft.ckpt"])
    assert type(sft.model).__name__ == "SupervisedWarmup" and sft.datamodule.hparams.train_split == "sft"
    assert sft.trainer.gradient_clip_val == 1.0 and sft.trainer.max_steps == 3000
    assert sft.datamodule.hparams.seed == 3                                       # one seed: model and data
    assert isinstance(uniform.model.rollout_allocator, UniformAllocator)
    allocator = knapsack.model.rollout_allocator
    assert isinstance(allocator, KnapsackAllocator) and (allocator.max_n, allocator.min_history) == (64, 8)
    for cli in (sft, uniform, knapsack):
        assert any(isinstance(c, rlvr.StepRecorder) for c in cli.trainer.callbacks)
        assert cli.datamodule.digit_tiers == [2, 3, 4]
    assert uniform.trainer.max_epochs == 12 and uniform.model.hparams.rollouts_per_prompt == 8
    assert uniform.model.hparams.init_from == "/x/sft.ckpt"


def test_the_sft_batches_are_the_former_loops_draws_across_epochs():
    """The old warm-up drew ``torch.randint(n, (B,), generator=Generator().manual_seed(seed))`` per step; the
    datamodule's replacement sampler gives the same rows, also past the end of an epoch (set_epoch)."""
    n, batch, seed = 50, 8, 4
    gen = torch.Generator().manual_seed(seed)
    expected = [torch.randint(n, (batch,), generator=gen).tolist() for _ in range(14)]
    sampler = ReplacementSampler(n, seed, batch)
    assert len(sampler) == 48                                   # 6 full batches per epoch
    got = []
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        rows = list(sampler)
        got += [rows[i:i + batch] for i in range(0, len(rows), batch)]
    assert got[:14] == expected[:14] and len(got) == 18
    with pytest.raises(ValueError, match="batch_size"):
        ReplacementSampler(4, 0, 8)


def test_the_sft_loader_reads_the_replacement_stream():
    from datamodules.verifiable_tasks import VerifiableTaskDataModule, collate_sft

    dm = VerifiableTaskDataModule(train_split="sft", sft_batch_size=6, sft_num_examples=200, train_pool_size=8,
                                  test_pool_size=8, digit_tiers=[2, 3], sft_max_digits=1, sft_extra_digits=2,
                                  sft_sampling="replacement", seed=7)
    dm.setup("fit")
    gen = torch.Generator().manual_seed(7)
    loader = iter(dm.train_dataloader())
    for _ in range(3):
        rows = torch.randint(len(dm.sft_dataset), (6,), generator=gen).tolist()
        expected = collate_sft([dm.sft_dataset[i] for i in rows], dm.tokenizer)
        assert torch.equal(next(loader)["input_tokens"], expected["input_tokens"])
    shuffled = VerifiableTaskDataModule(train_split="sft", sft_batch_size=6, sft_num_examples=200, train_pool_size=8,
                                        test_pool_size=8, digit_tiers=[2, 3], sft_max_digits=1, sft_extra_digits=2,
                                        seed=7)
    shuffled.setup("fit")
    assert len(shuffled.train_dataloader().sampler) == len(shuffled.sft_dataset)  # the default is unchanged
    with pytest.raises(UserInputError, match="sft_sampling='random'"):
        VerifiableTaskDataModule(sft_sampling="random")


def fake_run(arm_name: str, earlier: dict | None = None):
    spec = runner.load_spec("knapsack_rl")
    return runner.Run(spec, arms()[arm_name], None, 3, kit.REPO_ROOT, kit.REPO_ROOT, earlier=earlier or {})


class Done:
    def __init__(self, path, tiers=(2, 3, 4)):
        self.path, self.datamodule = path, SimpleNamespace(digit_tiers=list(tiers))

    def best_checkpoint(self):
        return self.path


def test_prepare_starts_the_grpo_arms_from_the_warm_up():
    assert rlvr.prepare(fake_run("sft")) == {}
    assert rlvr.prepare(fake_run("knapsack", {"sft": Done("/x/sft.ckpt", (2, 2, 3, 5))})) == {
        "model.init_args.init_from": "/x/sft.ckpt", "model.init_args.max_new_tokens": 7}   # 5 digits + carry + EOS
    with pytest.raises(runner.ExperimentError, match="not an earlier arm"):
        rlvr.prepare(fake_run("uniform"))
    with pytest.raises(runner.ExperimentError, match="saved no checkpoint"):
        rlvr.prepare(fake_run("uniform", {"sft": Done(None)}))


def step(ids, counts, correct, **extra):
    return {"prompt_ids": torch.tensor(ids), "counts": torch.tensor(counts), "correct": torch.tensor(correct), **extra}


def test_step_summaries_are_hand_computed():
    steps = [step([0, 1, 2], [4, 2, 2], [2, 0, 2]),                  # mixed: prompt 0 only (4 of 8 rollouts)
             step([3, 0, 1], [2, 4, 2], [1, 4, 1])]                  # mixed: prompts 3 and 1 (4 of 8 rollouts)
    rows = rlvr.step_rows(steps, hard_ids={1, 3})
    assert [r["effective_ratio_response"] for r in rows] == [0.5, 0.5]
    assert [r["effective_ratio_prompt"] for r in rows] == pytest.approx([1 / 3, 2 / 3])
    assert [(r["hard_visits"], r["hard_rollouts"], r["hard_positives"], r["hard_solved"]) for r in rows] == [
        (1, 2, 0, 0), (2, 4, 2, 2)]
    summary = rlvr.summarise_steps(rows)
    assert summary["rollouts_total"] == 16 and summary["hard_positives_total"] == 2
    assert summary["hard_positives_per_visit"] == pytest.approx(2 / 3)
    assert summary["eff_ratio_prompt_2nd_half"] == pytest.approx(2 / 3)        # the second of two steps
    assert summary["train_reward_2nd_half"] == pytest.approx(6 / 8)


def test_allocations_keep_valid_second_half_estimates_and_count_them():
    steps = [step([0, 1], [2, 6], [1, 1], p_hat=torch.tensor([0.5, 0.2]), valid=torch.tensor([True, True])),
             step([0, 1], [3, 5], [1, 1], p_hat=torch.tensor([0.52, 0.97]), valid=torch.tensor([True, False])),
             step([0, 1], [4, 4], [1, 1], p_hat=torch.tensor([1.0, 0.01]), valid=torch.tensor([True, True]))]
    assert rlvr.allocations(steps) == [(3, pytest.approx(0.52)), (4, 1.0), (4, pytest.approx(0.01))]
    records = [{"": {"knapsack": {"allocations": rlvr.allocations(steps)}}}]
    table = rlvr.allocation_table(records, "knapsack", bins=4)
    assert table["n_values"] == [3, 4] and table["counts"] == [[0, 0, 1, 0], [1, 0, 0, 1]]


def test_report_keeps_the_landed_keys_and_the_claim():
    spec = runner.load_spec("knapsack_rl")
    per_seed = [{"uniform": {"eff_ratio_response_2nd_half": 0.1}, "knapsack": {"eff_ratio_response_2nd_half": v}}
                for v in (0.2, 0.12)]
    extra = {"curve": {"rollouts": [8], "effective_ratio_response": [0.5], "hard_positives": [0]}, "allocations": [],
             "fit_s": 2.0}
    records = [{"": {"sft": {"hard": [1], "histogram": {"tier2": [1] * 10}, "fit_s": 5.0},
                     "uniform": extra, "knapsack": extra}}] * 2
    out = knapsack_rl.report({"per_seed": per_seed}, records, spec)
    assert set(out) >= {"claim", "timings_s", "sft_pool_histograms", "paired"}
    assert out["paired"]["knapsack - uniform"]["eff_ratio_response_2nd_half"]["mean"] == pytest.approx(0.06)
    assert out["claim"]["difference_per_seed"] == pytest.approx([0.1, 0.02])
    assert out["claim"]["held"] is True and out["claim"]["difference_mean"] == pytest.approx(0.06)
    assert out["timings_s"] == {"sft_s": 10.0, "uniform_s": 4.0, "knapsack_s": 4.0}
    per_seed[0]["knapsack"]["eff_ratio_response_2nd_half"] = 0.1
    assert knapsack_rl.report({"per_seed": per_seed}, records, spec)["claim"]["held"] is False


def test_a_missing_recorder_is_one_line():
    run = fake_run("uniform")
    run.cli = SimpleNamespace(trainer=SimpleNamespace(callbacks=[]))
    with pytest.raises(runner.ExperimentError, match="StepRecorder"):
        rlvr.recorder(run)


@pytest.mark.slow
def test_smoke_experiment_through_the_runner(tmp_path):
    result = runner.run_experiment("knapsack_rl", smoke=True, out=tmp_path)
    assert set(result["arms"]) == set(GRPO_ARMS)                  # the warm-up is no row
    for key in ("claim", "timings_s", "sft_pool_histograms", "paired", "curves", "knapsack_allocations"):
        assert key in result, key
    assert result["arms"]["uniform"]["rollouts_total"]["mean"] == result["arms"]["knapsack"]["rollouts_total"]["mean"]
    assert list(result["paired"]) == ["knapsack - uniform"]
    assert set(result["paired"]["knapsack - uniform"]) == set(result["arms"]["uniform"])   # every metric, as landed
    assert json.loads((tmp_path / "knapsack_rl.json").read_text())["claim"] == result["claim"]
    assert (tmp_path / "knapsack_rl.png").stat().st_size > 0


@pytest.mark.slow
def test_module_entry_point_runs_the_runner():
    done = subprocess.run([sys.executable, "-m", "experiments.knapsack_rl", "--help"], capture_output=True, text=True,
                          cwd=kit.REPO_ROOT, timeout=120)
    assert done.returncode == 0 and "--smoke" in done.stdout and "--set" in done.stdout
