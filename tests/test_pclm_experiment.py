"""The PCLM experiment's protocol (experiments/pclm.py) without training: the equal-data arms continue the right
models on exactly the DPO arms' questions, each seed pre-trains its own encoder, and the paired block carries the
pairs that separate DPO's effect from its data's (DPO arm - PCLM + mix)."""
from __future__ import annotations

import argparse
import os

import pytest
import yaml

from experiments import kit, pclm


def small_args(**kwargs) -> argparse.Namespace:
    values = dict(train=48, val=16, test=16, batch_size=16, pretrain_steps=3, pretrain_lr=0.002, probe_examples=16,
                  sft_steps=5, stage_steps=2, dpo_steps=7, dpo_lr=1e-4)
    return argparse.Namespace(**{**values, **kwargs})


def stages_by_arm(seed: int = 3, folder: str = "/tmp/f") -> dict:
    return {stage.arm: stage for stage in pclm.plan(seed, small_args(), "enc.ckpt", folder) if stage.arm}


def build_data(stage: pclm.Stage, seed: int, args):
    _, data = kit.from_config(stage.config, f"--seed_everything={seed}", *pclm.data_args(seed, args),
                              f"--model.init_args.init_from={stage.init}", *stage.overrides)
    return data


def test_every_arm_is_planned_once_and_the_mix_arms_continue_the_right_models_for_the_dpo_budget():
    stages = pclm.plan(3, small_args(), "enc.ckpt", "/tmp/f")
    assert [s.arm for s in stages if s.arm] == list(pclm.ARMS[:4]) + ["last-layer SFT + mix", "PCLM + mix"]
    arms = stages_by_arm()
    names = {s.name: s for s in stages}
    assert arms["last-layer SFT + mix"].init == arms["last-layer SFT"].name      # the SFT arm's final model
    assert arms["PCLM + mix"].init == arms["PCLM"].name == arms["PCLM + DPO"].init
    for arm in ("last-layer SFT + mix", "PCLM + mix", *pclm.DPO_ARMS):
        assert arms[arm].steps == 7 and arms[arm].init in names                   # --dpo-steps, from a stage
    assert arms["last-layer SFT + mix"].config == pclm.CONFIGS["sft"]             # supervised, SFT's lr
    assert arms["PCLM + mix"].config == pclm.CONFIGS["pclm"]                      # supervised, PCLM's lr
    assert not any("optimizer" in o for o in arms["PCLM + mix"].overrides + arms["last-layer SFT + mix"].overrides)


def test_the_mix_fractions_are_the_dpo_configs_and_the_other_supervised_arms_do_not_see_them():
    with open(kit.REPO_ROOT / pclm.CONFIGS["dpo"]) as f:
        dpo = yaml.safe_load(f)["data"]["init_args"]
    assert dpo["incongruent_fraction"] > 0
    mix = pclm.dpo_mix()
    assert mix == (f"--data.init_args.congruent_fraction={dpo['congruent_fraction']}",
                   f"--data.init_args.incongruent_fraction={dpo['incongruent_fraction']}")
    arms = stages_by_arm()
    for arm in ("last-layer SFT + mix", "PCLM + mix"):
        assert set(mix) <= set(arms[arm].overrides)
    for arm in ("last-layer SFT", "PCLM"):
        assert not any("fraction" in o for o in arms[arm].overrides)


def test_pclm_mix_trains_the_parts_dpo_trains():
    arms = stages_by_arm()
    with open(kit.REPO_ROOT / pclm.CONFIGS["dpo"]) as f:
        dpo_parts = yaml.safe_load(f)["model"]["init_args"]["train_parts"]
    parts = [o.split("=", 1)[1] for o in arms["PCLM + mix"].overrides if o.startswith("--model.init_args.train_parts")]
    assert parts == [f"[{','.join(dpo_parts)}]"] == ["[language_model]"]


def test_the_mix_arms_draw_the_same_training_questions_as_the_dpo_arms(tmp_path):
    seed, args = 2, small_args()
    arms = stages_by_arm(seed, str(tmp_path))
    dpo = build_data(arms["PCLM + DPO"], seed, args)._embedded()
    base = build_data(arms["last-layer SFT"], seed, args)._embedded()
    for arm in ("last-layer SFT + mix", "PCLM + mix"):
        mixed = build_data(arms[arm], seed, args)._embedded()
        assert mixed["train"] == dpo["train"], arm                               # same items, same order
        assert mixed["test"] == dpo["test"] == base["test"]                       # one adversarial test set
    kinds = {r["kind"] for r in dpo["train"]}
    assert "incongruent" in kinds and "incongruent" not in {r["kind"] for r in base["train"]}


def test_each_seed_pretrains_its_own_encoder(monkeypatch, tmp_path):
    calls = []

    class Stop(Exception):
        pass

    def fake_fit(config, seed, steps, out, args, *overrides):
        calls.append((config, seed, out))
        raise Stop

    monkeypatch.setattr(pclm, "fit", fake_fit)
    for seed in (0, 1, 4):
        with pytest.raises(Stop):
            pclm.pretrain(seed, small_args(), str(tmp_path))
    assert [c[1] for c in calls] == [pclm.PRETRAIN_DATA_SEED + s for s in (0, 1, 4)]
    assert all(c[0] == pclm.CONFIGS["pretrain"] for c in calls)
    assert len({os.path.basename(c[2]) for c in calls}) == 3                      # one checkpoint per seed


def test_paired_block_has_the_equal_data_pairs_with_seedwise_differences():
    per_seed = []
    for s in range(3):
        row = {arm: {m: 0.5 for m in pclm.PAIRED_METRICS} for arm in pclm.ARMS}
        row["PCLM + DPO"]["acc_gt"] = 0.6 + 0.01 * s
        row["PCLM + mix"]["acc_gt"] = 0.5 + 0.02 * s
        per_seed.append(row)
    block = pclm.paired(per_seed)
    for key in ("PCLM + DPO - PCLM + mix", "PCLM + DPO (adversarial negatives) - PCLM + mix",
                "PCLM + mix - PCLM", "last-layer SFT + mix - last-layer SFT", "PCLM + DPO - last-layer SFT"):
        assert key in block and block[key]["acc_gt"]["n"] == 3
    cell = block["PCLM + DPO - PCLM + mix"]["acc_gt"]
    assert cell["mean"] == pytest.approx(0.09) and cell["lo"] < 0.09 < cell["hi"]  # 0.1, 0.09, 0.08


def test_probe_drop_is_the_seedwise_final_minus_first_layer_interval():
    encoders = [{"probes": {"pitch": [0.9, 0.8, 0.6 + d], "speed": [1.0, 1.0, 1.0]}} for d in (0.0, 0.02, 0.04)]
    drop = pclm.probe_drop(encoders)
    assert drop["pitch"]["mean"] == pytest.approx(-0.28) and drop["pitch"]["hi"] < 0 and drop["pitch"]["n"] == 3
    assert drop["speed"]["mean"] == 0.0 and drop["speed"]["lo"] == drop["speed"]["hi"] == 0.0
    assert pclm.probe_drop(encoders[:1])["pitch"]["hi"] is None                  # one seed: no interval
