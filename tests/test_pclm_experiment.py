"""The PCLM experiment's protocol (``configs/pclm/experiment.yaml`` + the hooks in experiments/pclm.py) without
training: every arm starts from the right checkpoint, the equal-data arms see exactly the DPO arms' questions (and,
for the "(DPO optimiser)" arms, DPO's trainable part and optimiser), each seed pre-trains its own encoder, and the
paired block carries the pairs that separate DPO's effect from its data's. A slow test runs the smoke experiment."""
from __future__ import annotations

import json

import pytest
import yaml

from experiments import kit, pclm, runner

DPO_CONFIG = "configs/pclm/dpo_quick.yaml"
DPO_ARMS = ("PCLM + DPO", "PCLM + DPO (adversarial negatives)", "last-layer SFT + DPO")
MIX_ARMS = ("last-layer SFT + mix", "PCLM + mix", "PCLM + mix (DPO optimiser)", "last-layer SFT + mix (DPO optimiser)")


def arms(smoke: bool = False) -> dict[str, runner.Arm]:
    return {arm.name: arm for arm in runner.load_spec("pclm", smoke=smoke).arms}


def dpo_config() -> dict:
    with open(kit.REPO_ROOT / DPO_CONFIG) as f:
        return yaml.safe_load(f)


def resolved(arm: runner.Arm, smoke: bool = False) -> dict:
    """The arm's effective overrides (experiment, arm, smoke layers) as the runner applies them."""
    return runner.arm_overrides(runner.load_spec("pclm", smoke=smoke), arm)


def test_spec_parses_and_its_smoke_overlay_is_small():
    spec = runner.load_spec("pclm")
    assert spec.seeds == 5 and spec.baseline == "last-layer SFT" and set(spec.hooks) == set(runner.HOOKS)
    assert {"acc_gt", "ala"} <= set(spec.metrics)
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    smoke = runner.load_spec("pclm", smoke=True)
    assert smoke.seeds == 1 and smoke.settings["probe_examples"] <= 16
    assert [a.name for a in smoke.arms] == [a.name for a in spec.arms]             # every arm, tiny
    for arm in smoke.arms:
        values = resolved(arm, smoke=True)
        assert values["trainer.max_steps"] <= 2 and values["data.init_args.num_train"] <= 32, arm.name
        assert values["data.init_args.num_test"] <= 16


def test_every_arm_starts_from_the_right_earlier_arm():
    spec = runner.load_spec("pclm")
    order = [a.name for a in spec.arms]
    parents = spec.settings["init_from"]
    assert set(parents) == set(order) - {"pretrain"}
    for child, parent in parents.items():
        assert order.index(parent) < order.index(child), child                    # made earlier in the seed
    assert parents["PCLM + DPO"] == parents["PCLM + DPO (adversarial negatives)"] == "PCLM"
    assert parents["PCLM + mix"] == parents["PCLM + mix (DPO optimiser)"] == "PCLM"  # DPO's starting point
    assert parents["last-layer SFT + DPO"] == parents["last-layer SFT + mix (DPO optimiser)"] == "last-layer SFT"
    assert parents["last-layer SFT + mix"] == "last-layer SFT"
    assert [a.name for a in spec.arms if not a.row] == ["pretrain", "sft", "pclm_stage1"]


def test_prepare_points_init_from_at_the_parents_checkpoint():
    spec = runner.load_spec("pclm")
    by_name = {a.name: a for a in spec.arms}

    class Done:
        def __init__(self, path):
            self.path = path

        def best_checkpoint(self):
            return self.path

    run = runner.Run(spec, by_name["PCLM + mix (DPO optimiser)"], None, 3, kit.REPO_ROOT, kit.REPO_ROOT,
                     earlier={"PCLM": Done("/x/pclm.ckpt"), "sft": Done("/x/sft.ckpt")})
    assert pclm.prepare(run) == {"model.init_args.init_from": "/x/pclm.ckpt"}
    assert pclm.prepare(runner.Run(spec, by_name["pretrain"], None, 3, kit.REPO_ROOT, kit.REPO_ROOT)) == {}
    with pytest.raises(runner.ExperimentError, match="not an earlier arm"):
        pclm.prepare(runner.Run(spec, by_name["PCLM"], None, 3, kit.REPO_ROOT, kit.REPO_ROOT, earlier={}))


def test_equal_data_arms_train_on_the_dpo_mix_for_the_dpo_budget():
    dpo = dpo_config()["data"]["init_args"]
    assert dpo["incongruent_fraction"] > 0
    by_name = arms()
    steps = {resolved(by_name[a])["trainer.max_steps"] for a in DPO_ARMS + MIX_ARMS}
    assert steps == {60}
    for arm in MIX_ARMS:
        values = resolved(by_name[arm])
        assert values["data.init_args.congruent_fraction"] == dpo["congruent_fraction"], arm
        assert values["data.init_args.incongruent_fraction"] == dpo["incongruent_fraction"], arm
    for arm in ("last-layer SFT", "PCLM", "sft", "pclm_stage1"):                   # never see incongruent items
        assert not any("fraction" in key for key in resolved(by_name[arm])), arm


def test_dpo_optimiser_arms_match_dpo_in_optimiser_and_trainable_part():
    model = dpo_config()["model"]["init_args"]
    by_name = arms()
    dpo_lr = resolved(by_name["PCLM + DPO"])["model.init_args.optimizer.init_args.lr"]
    assert dpo_lr == model["optimizer"]["init_args"]["lr"] == 1e-4
    for arm in ("PCLM + mix (DPO optimiser)", "last-layer SFT + mix (DPO optimiser)"):
        values = resolved(by_name[arm])
        assert values["model.init_args.optimizer.init_args.lr"] == dpo_lr, arm
        assert values["model.init_args.optimizer.init_args.weight_decay"] == model["optimizer"]["init_args"][
            "weight_decay"], arm
        assert values["model.init_args.train_parts"] == model["train_parts"] == ["language_model"], arm
    assert resolved(by_name["last-layer SFT + DPO"])["model.init_args.pclm"] is False
    assert by_name["last-layer SFT + mix (DPO optimiser)"].configs == by_name["last-layer SFT"].configs


def test_the_mix_arms_draw_the_same_training_questions_as_the_dpo_arms(tmp_path):
    """Built as the runner builds them (seed 2): identical training items in the same order, one test set."""
    spec = runner.load_spec("pclm", smoke=True)
    by_name = {a.name: a for a in spec.arms}

    def items(name: str) -> dict:
        cli = runner.build_cli(runner.arm_flags(spec, by_name[name]) + runner.QUIET, 2, tmp_path / name)
        return cli.datamodule._embedded()

    dpo, base = items("PCLM + DPO"), items("last-layer SFT")
    for arm in MIX_ARMS + ("last-layer SFT + DPO",):
        mixed = items(arm)
        assert mixed["train"] == dpo["train"], arm
        assert mixed["test"] == dpo["test"] == base["test"], arm
    assert "incongruent" in {r["kind"] for r in dpo["train"]}
    assert "incongruent" not in {r["kind"] for r in base["train"]}


def test_report_adds_the_equal_data_pairs_probes_and_probe_drop():
    spec = runner.load_spec("pclm")
    names = [a.name for a in spec.arms if a.row]
    per_seed, records = [], []
    for s in range(3):
        row = {arm: {m: 0.5 for m in pclm.PAIRED_METRICS} for arm in names}
        row["PCLM + DPO"]["acc_gt"] = 0.6 + 0.01 * s
        row["PCLM + mix (DPO optimiser)"]["acc_gt"] = 0.5 + 0.02 * s
        per_seed.append(row)
        records.append({"": {"pretrain": {"seed": s, "probes": {"pitch": [0.9, 0.6 + 0.01 * s]},
                                          "val_content_acc": 0.8}}})
    out = pclm.report({"arms": {}, "per_seed": per_seed}, records, spec)
    for key in ("PCLM + DPO - PCLM + mix (DPO optimiser)",
                "last-layer SFT + DPO - last-layer SFT + mix (DPO optimiser)", "PCLM + DPO - PCLM + mix",
                "PCLM + mix - PCLM", "PCLM + DPO - PCLM"):
        assert key in out["paired"] and out["paired"][key]["acc_gt"]["n"] == 3, key
    cell = out["paired"]["PCLM + DPO - PCLM + mix (DPO optimiser)"]["acc_gt"]
    assert cell["mean"] == pytest.approx(0.09) and cell["lo"] < 0.09 < cell["hi"]  # 0.1, 0.09, 0.08
    assert [e["seed"] for e in out["probes_per_seed"]] == [0, 1, 2]                 # one encoder per seed
    assert out["probes"]["pitch"] == pytest.approx([0.9, 0.61])
    assert out["probe_drop"]["pitch"]["mean"] == pytest.approx(-0.29) and out["probe_drop"]["pitch"]["hi"] < 0


def test_probe_drop_is_the_seedwise_final_minus_first_layer_interval():
    encoders = [{"probes": {"pitch": [0.9, 0.8, 0.6 + d], "speed": [1.0, 1.0, 1.0]}} for d in (0.0, 0.02, 0.04)]
    drop = pclm.probe_drop(encoders)
    assert drop["pitch"]["mean"] == pytest.approx(-0.28) and drop["pitch"]["hi"] < 0 and drop["pitch"]["n"] == 3
    assert drop["speed"]["mean"] == 0.0 and drop["speed"]["lo"] == drop["speed"]["hi"] == 0.0
    assert pclm.probe_drop(encoders[:1])["pitch"]["hi"] is None                  # one seed: no interval


@pytest.mark.slow
def test_smoke_experiment_runs_through_the_runner_and_writes_the_json(tmp_path):
    """``python -m experiments pclm --smoke --seeds 2``: every arm fitted and tested, one encoder per seed."""
    assert runner.experiment_command(["pclm", "--smoke", "--seeds", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "pclm.json").read_text())
    rows = [a.name for a in runner.load_spec("pclm").arms if a.row]
    assert list(result["arms"]) == rows and result["seeds"] == 2
    assert [e["seed"] for e in result["probes_per_seed"]] == [0, 1]
    assert result["probes_per_seed"][0]["probes"] != result["probes_per_seed"][1]["probes"]
    for key in ("PCLM + DPO - last-layer SFT", "PCLM + DPO - PCLM + mix (DPO optimiser)",
                "last-layer SFT + DPO - last-layer SFT + mix (DPO optimiser)"):
        assert result["paired"][key]["acc_gt"]["n"] == 2, key
    assert (tmp_path / "pclm.png").is_file()
