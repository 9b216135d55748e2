"""The RSIR experiment as configuration (configs/rsir/experiment.yaml + the hooks in experiments/rsir.py): the arms,
seeds and sizes of the protocol and its smoke overlay, the rounds' generation in the prepare hook, the report's
claims and pairs, one-line errors, and the smoke run through the runner in the landed JSON's layout."""
from __future__ import annotations

import copy
import json
import math

import pytest

from callbacks.rsir import generate_into
from datamodules.sequences import read_sequence_file
from experiments import kit, rsir, runner
from lightning_modules.shared.errors import UserInputError

ROUNDS = ("rsir_r1", "rsir_r2", "no_fidelity_r1", "no_fidelity_r2")
SETLIKE = ("base", *ROUNDS, "weak_gru4rec", "weak_to_strong_r1")
ARMS = [f"setlike/{a}" for a in SETLIKE] + [f"markov/{a}" for a in ("base", *ROUNDS)]
MODEL_SEED_OFFSETS = {"base": 0, "rsir_r1": 1, "rsir_r2": 2, "no_fidelity_r1": 1, "no_fidelity_r2": 2,
                      "weak_gru4rec": 7, "weak_to_strong_r1": 8}


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    assert "rsir" in runner.available()
    spec = runner.load_spec("rsir")
    assert [arm.name for arm in spec.arms] == ARMS
    assert spec.seeds == 3 and spec.baseline == "setlike/base" and spec.metrics == ["ndcg@10", "recall@10"]
    assert spec.title == "RSIR (arXiv 2602.15659)"  # the JSON's "paper", as before
    assert rsir.early_stopping(spec) == {"val_every": 50, "patience": 8, "min_steps": 600, "max_steps": 6000}
    assert spec.overrides["data.init_args.synthetic_users"] == 1500
    assert spec.overrides["trainer.num_sanity_val_steps"] == 0  # a sanity check would draw from the global RNG
    callbacks = [c["class_path"].rsplit(".", 1)[1] for c in spec.overrides["trainer.callbacks"]]
    assert callbacks == ["EarlyStopping", "ModelCheckpoint", "Timer"]  # the config's RSIRSelfImprovement left out
    for arm in spec.arms:  # model seed 1000 S + k, data seed S
        regime, name = arm.name.split("/")
        assert arm.seed_stride == 1000 and arm.seed_offset == MODEL_SEED_OFFSETS[name], arm.name
        assert arm.fit and arm.row and arm.overrides["data.init_args.regime"] == regime
        weak = name == "weak_gru4rec"
        assert arm.configs == [f"configs/rsir/{'gru4rec_quick' if weak else 'quick'}.yaml"]
        assert arm.overrides.get("trainer.max_steps") == (3000 if weak else None)
    assert runner.Run(spec, spec.arms[2], None, 2, None, None).model_seed == 2002
    smoke = runner.load_spec("rsir", smoke=True)
    assert [arm.name for arm in smoke.arms] == ARMS[:7] and smoke.seeds == 3
    assert rsir.early_stopping(smoke) == {"val_every": 5, "patience": 1, "min_steps": 0, "max_steps": 10}
    assert smoke.smoke_overrides["data.init_args.synthetic_users"] == 150
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_rounds_chain_earlier_arms_of_their_regime_with_the_round_seeds():
    spec = runner.load_spec("rsir")
    names = [arm.name for arm in spec.arms]
    assert spec.settings["generation"] == {"m": 5, "p": 0.5, "min_len": 3}
    assert spec.settings["generation_seed_stride"] == 10
    expected = {"rsir_r1": ("base", 20), "rsir_r2": ("rsir_r1", 20), "no_fidelity_r1": ("base", math.inf),
                "no_fidelity_r2": ("no_fidelity_r1", math.inf), "weak_to_strong_r1": ("weak_gru4rec", 20)}
    for arm in names:
        regime, name = arm.split("/")
        entry = rsir.round_of(spec.settings, arm)
        if name not in expected:
            assert entry is None, arm
            continue
        generator, tau = expected[name]
        assert entry["generator"] == f"{regime}/{generator}" and entry["tau"] == tau
        assert names.index(entry["generator"]) < names.index(arm)  # an earlier run of the same seed
        assert entry["seed_offset"] == MODEL_SEED_OFFSETS[name] - (name == "weak_to_strong_r1")  # 10 S + 7


class _Trained:
    """Stands in for an earlier run: a model, its datamodule and a best checkpoint."""

    def __init__(self, model, datamodule) -> None:
        self.model, self.datamodule, self.loaded = model, datamodule, 0

    def best_checkpoint(self) -> str:
        return "best.ckpt"

    def load_best(self) -> None:
        self.loaded += 1


def _run(name: str, earlier: dict, tmp_path, seed: int = 1, smoke: bool = True):
    spec = runner.load_spec("rsir", smoke=smoke)
    arm = next(a for a in spec.arms if a.name == name)
    return runner.Run(spec, arm, None, seed, tmp_path / name.replace("/", "_"), tmp_path, earlier=earlier)


@pytest.fixture(scope="module")
def untrained():
    return kit.from_config("configs/rsir/quick.yaml", "--seed_everything=0", "--data.init_args.synthetic_users=40")


def test_prepare_generates_from_the_generator_arm_and_passes_the_file(tmp_path, untrained):
    model, data = untrained
    base = _Trained(model, data)
    assert rsir.prepare(_run("setlike/base", {}, tmp_path)) == {}
    run = _run("setlike/rsir_r1", {"setlike/base": base}, tmp_path)
    computed = rsir.prepare(run)
    path = tmp_path / "setlike_rsir_r1" / rsir.SYNTHETIC_FILE
    assert computed == {"data.init_args.synthetic_from": str(path)} and base.loaded == 1
    assert len(data.training_sequences) == 40  # the generator's data is left as it trained
    reference = copy.copy(data)  # the same generation by hand: tau 20, seed 10 S + 1
    reference.training_sequences = list(data.training_sequences)
    stats = generate_into(model, reference, m=5, tau=20.0, p=0.5, min_len=3, seed=11)
    written = read_sequence_file(str(path), data.num_items)
    assert stats["added"] > 0 and [s.tolist() for s in written] == [s.tolist() for s in reference.synthetic_sequences]
    assert run.extra["generation"]["generated"] == stats["added"]
    assert run.extra["generation"]["mean_gen_length"] == stats["mean_length"]
    # round 2 generates from round 1's data (original + round 1) and writes every synthetic sequence so far
    round1 = copy.copy(data)
    round1.training_sequences = list(data.training_sequences) + written
    second = rsir.prepare(_run("setlike/rsir_r2", {"setlike/rsir_r1": _Trained(model, round1)}, tmp_path))
    both = read_sequence_file(second["data.init_args.synthetic_from"], data.num_items)
    assert [s.tolist() for s in both[:len(written)]] == [s.tolist() for s in written] and len(both) > len(written)
    # no fidelity control: tau = inf keeps at least as many sequences from the same model, data and seed
    free = _run("setlike/no_fidelity_r1", {"setlike/base": base}, tmp_path)
    rsir.prepare(free)
    assert free.extra["generation"]["generated"] >= stats["added"]


def test_prepare_errors_are_one_line(tmp_path, untrained):
    with pytest.raises(UserInputError, match=r"generator 'setlike/base' is not an earlier arm of this seed"):
        rsir.prepare(_run("setlike/rsir_r1", {}, tmp_path))
    run = _run("setlike/rsir_r1", {"setlike/base": _Trained(*untrained)}, tmp_path)
    run.spec.settings["rounds"]["setlike/rsir_r1"] = {"generator": "setlike/base", "tau": 0.5, "seed_offset": 1}
    with pytest.raises(runner.ExperimentError, match=r"tau=0.5: must be a number >= 1"):
        rsir.prepare(run)
    run.spec.settings["rounds"]["setlike/rsir_r1"] = {"generator": "setlike/base", "tau": 20}
    with pytest.raises(UserInputError, match=r"write \{generator: ARM, tau: T, seed_offset: K\}"):
        rsir.prepare(run)
    run.spec.settings["rounds"]["setlike/rsir_r1"] = {"generator": "setlike/base", "tau": 20, "seed_offset": 1}
    run.spec.settings["generation"] = {"m": 5}
    with pytest.raises(UserInputError, match=r"settings.generation: write \{m: M, p: P, min_len: L\}"):
        rsir.prepare(run)
    with pytest.raises(UserInputError, match="must be named <regime>/<arm>"):
        rsir.regime_of("base")


def _row(ndcg: dict, generated: dict) -> dict:
    return {f"setlike/{arm}": {"ndcg@10": value, "recall@10": 2 * value, "best_step": 50.0,
                               **({"generated": float(generated[arm])} if arm in generated else {})}
            for arm, value in ndcg.items()}


def test_report_counts_claims_and_keeps_the_pairs_of_the_settings():
    spec = runner.load_spec("rsir")
    rows = [_row({"base": 0.10, "rsir_r1": 0.12, "rsir_r2": 0.11, "no_fidelity_r1": 0.09, "no_fidelity_r2": 0.11,
                  "weak_gru4rec": 0.05, "weak_to_strong_r1": 0.08},
                 {"rsir_r1": 100, "rsir_r2": 200, "no_fidelity_r1": 300, "no_fidelity_r2": 1000}),
            _row({"base": 0.10, "rsir_r1": 0.09, "rsir_r2": 0.08, "no_fidelity_r1": 0.07, "no_fidelity_r2": 0.09,
                  "weak_gru4rec": 0.05, "weak_to_strong_r1": 0.07},
                 {"rsir_r1": 100, "rsir_r2": 400, "no_fidelity_r1": 100, "no_fidelity_r2": 4000})]
    for row in rows:
        row["markov/base"] = {"ndcg@10": 0.3, "recall@10": 0.4}  # a regime without its rounds: no claims
    runner_pairs = runner.paired(rows, spec.baseline, spec.metrics)
    assert "markov/base - setlike/base" in runner_pairs and "setlike/weak_gru4rec - setlike/base" in runner_pairs
    result = {"arms": kit.summarise(rows), "per_seed": rows, "paired": runner_pairs}
    added = rsir.report(result, [], spec)
    assert added["claims"] == {"setlike": {
        "rsir_r1_beats_base_seeds": 1, "rsir_r1_mean_above_base": True, "fidelity_r2_ge_no_fidelity_r2_seeds": 1,
        "growth_ratio_no_fidelity_over_rsir_r1": 2.0, "growth_ratio_no_fidelity_over_rsir_r2": 7.5}}
    assert added["protocol"].endswith("(every 50 steps, patience 8, min 600, max 6000 steps)")
    # the runner's cross-regime pairs are dropped; the settings' pairs of the rows made are added
    assert set(runner_pairs) == {f"setlike/{a} - setlike/base" for a in SETLIKE[1:]}
    assert set(added["paired"]) == {*(f"setlike/{a} - setlike/base" for a in ROUNDS),
                                    "setlike/rsir_r2 - setlike/rsir_r1",
                                    "setlike/rsir_r1 - setlike/no_fidelity_r1",
                                    "setlike/rsir_r2 - setlike/no_fidelity_r2",
                                    "setlike/weak_to_strong_r1 - setlike/weak_gru4rec"}
    cell = added["paired"]["setlike/weak_to_strong_r1 - setlike/weak_gru4rec"]["ndcg@10"]
    assert cell["n"] == 2 and cell["mean"] == pytest.approx(0.025)
    assert rows[0]["setlike/rsir_r1"]["generated"] == 100 and isinstance(rows[0]["setlike/base"]["best_step"], int)
    with pytest.raises(UserInputError, match=r"write \{baseline: ROW, arms: \[ROW, ...\]\}"):
        rsir.paired_differences(rows, [{"baseline": "setlike/base", "arm": "setlike/rsir_r1"}], spec.metrics)


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """The seven set-like arms on 3 seeds (~15 s): every row has the landed JSON's figures, the rounds train on
    their generator's data plus what it generated, the claims and pairs are there; nothing lands in ./runs."""
    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("rsir", smoke=True, out=tmp_path / "out")
    assert list(result["arms"]) == ARMS[:7] and len(result["per_seed"]) == 3
    figures = ["ndcg@10", "recall@10", "val_ndcg@10", "best_step", "steps", "fit_s", "train_sequences"]
    generation = ["generated", "mean_gen_length", "gen_trajectories_per_s"]
    for row in result["per_seed"]:
        for arm, cells in row.items():
            name = arm.split("/")[1]
            assert list(cells) == [*figures, *(generation if rsir.round_of(result["config"]["settings"], arm) else
                                               []), "rel_gain_ndcg@10_%"], arm
            assert isinstance(cells["steps"], int) and 0 < cells["best_step"] <= cells["steps"] <= 10
            assert cells["rel_gain_ndcg@10_%"] == pytest.approx(100 * (cells["ndcg@10"]
                                                                       / row["setlike/base"]["ndcg@10"] - 1))
            generator = (rsir.round_of(result["config"]["settings"], arm) or {}).get("generator")
            if generator is not None:
                assert cells["train_sequences"] == row[generator]["train_sequences"] + cells["generated"], name
            else:
                assert cells["train_sequences"] == 150, name  # the original users (all have >= 4 items)
    assert set(result["claims"]) == {"setlike"} and "patience 1" in result["protocol"]
    assert list(result["paired"])[:6] == [f"setlike/{arm} - setlike/base" for arm in SETLIKE[1:]]
    assert list(result["paired"])[6:] == ["setlike/rsir_r2 - setlike/rsir_r1",
                                          "setlike/rsir_r1 - setlike/no_fidelity_r1",
                                          "setlike/rsir_r2 - setlike/no_fidelity_r2",
                                          "setlike/weak_to_strong_r1 - setlike/weak_gru4rec"]
    written = json.loads((tmp_path / "out" / "rsir.json").read_text())
    assert written["per_seed"] == result["per_seed"] and written["config"]["smoke"] is True
    assert (tmp_path / "out" / "rsir.png").is_file() and not (tmp_path / "runs").exists()
