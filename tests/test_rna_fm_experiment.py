"""The RNA-FM experiment as configuration (configs/rna_fm/experiment.yaml + the hooks in experiments/rna_fm.py): the
protocol's rows, grid and sizes, a small smoke overlay, the hooks' checks and their one-line errors, the report in
the landed JSON's layout (results/rna_fm.json, read by the card's check), and the smoke run through the runner."""
from __future__ import annotations

import json

import pytest
import yaml

from experiments import kit, rna_fm, runner
from icml26.claims import evaluate_check
from lightning_modules.shared.errors import UserInputError

ROWS = ["RNA-FM", "RNA-FM, CFG 1", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite"]
TEST_METRICS = ["pearson", "pearson_1sample", "rmse", "n_significant", "top20", "top100", "coverage",
                "coverage_bimodal", "coverage_unimodal", "energy", "energy_bimodal", "energy_unimodal", "crps",
                "crps_bimodal", "crps_unimodal"]


def _run(name: str, smoke: bool = False, earlier: dict | None = None, set_overrides: dict | None = None,
         spec=None):
    spec = spec or runner.load_spec("rna_fm", smoke=smoke)
    spec.set_overrides = dict(set_overrides or {})
    arm = next(a for a in spec.arms if a.name == name)
    return runner.Run(spec, arm, None, 0, None, None, earlier=earlier or {})


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    assert "rna_fm" in runner.available()
    spec = runner.load_spec("rna_fm")
    assert [arm.name for arm in spec.arms if arm.row] == ROWS
    assert len(spec.arms) == len(ROWS) + 4 * 5  # five learning rates for each trained row
    assert spec.seeds == 3 and spec.baseline == "tRNAsformer-lite" and spec.metrics == TEST_METRICS
    assert spec.title == "rna_fm"  # the JSON's "paper" key, as the script wrote it; the report adds the title
    sizes = {k.rpartition(".")[2]: v for k, v in spec.overrides.items()}
    assert sizes == dict(num_slides=600, num_pathway_genes=400, num_pathways=20, num_background_genes=40,
                         num_clusters=32, feature_dim=32, eval_batch_size=128, max_epochs=40,
                         check_val_every_n_epoch=8, gradient_clip_val=1.0, num_sanity_val_steps=0)
    configs = {"RNA-FM": "quick", "HE2RNA-lite": "he2rna_quick", "tRNAsformer-lite": "trnasformer_quick"}
    widths = {"RNA-FM": {"model.init_args.hidden_dim": 64}, "HE2RNA-lite": {"model.init_args.hidden_dim": 64},
              "tRNAsformer-lite": {"model.init_args.dim": 64, "model.init_args.mlp_dim": 128}}
    for arm in spec.arms:
        family = next(f for f in configs if arm.name.startswith(f))
        assert arm.configs == [f"configs/rna_fm/{configs[family]}.yaml"] and arm.seed_offset == 0, arm.name
        assert widths[family].items() <= arm.overrides.items(), arm.name
        if family == "RNA-FM":
            assert arm.overrides["model.init_args.pathway_tokens"] is ("flat token" not in arm.name)
            assert arm.overrides.get("model.init_args.cfg_scale", 2.0) == (1.0 if "CFG 1" in arm.name else 2.0)
        else:  # the regressors get quick.yaml's EMA callback appended
            ema = arm.overrides["trainer.callbacks+"][0]
            assert ema == {"class_path": "callbacks.ema.EMAWeights", "init_args": {"decay": 0.999, "warmup": True}}
    assert spec.settings == {"checkpoint_from": {"RNA-FM, CFG 1": "RNA-FM"},
                             "paired": {"RNA-FM, flat token": ["RNA-FM"], "HE2RNA-lite": ["RNA-FM"]}}
    smoke = runner.load_spec("rna_fm", smoke=True)
    assert smoke.seeds == 1 and smoke.smoke_overrides["trainer.max_epochs"] == 1
    assert smoke.smoke_overrides["data.init_args.num_slides"] <= 40
    assert [arm.name for arm in smoke.arms if arm.row] == ROWS
    assert [arm.name for arm in smoke.arms if not arm.row] == [f"{row} @ lr={lr}" for row in ROWS
                                                                if row != "RNA-FM, CFG 1" for lr in (0.001, 0.003)]
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_prepare_checks_each_arm_and_computes_nothing():
    grid = _run("RNA-FM @ lr=0.003")
    assert rna_fm.prepare(grid) == {} and rna_fm.learning_rate(grid) == 0.003
    assert rna_fm.learning_rate(_run("RNA-FM @ lr=0.003", set_overrides={rna_fm.LR_KEY: "0.02"})) == 0.02
    assert rna_fm.prepare(_run("RNA-FM", earlier={"RNA-FM @ lr=0.003": grid})) == {}
    assert rna_fm.prepare(_run("RNA-FM, CFG 1", earlier={"RNA-FM @ lr=0.003": grid})) == {}
    with pytest.raises(UserInputError, match=r"row 'RNA-FM, CFG 1' tests the checkpoint chosen among the arms "
                                             r"'RNA-FM @ lr=\.\.\.', none of which ran before it") as err:
        rna_fm.prepare(_run("RNA-FM, CFG 1", earlier={"RNA-FM, flat token @ lr=0.003": grid}))
    assert "\n" not in str(err.value)
    spec = runner.load_spec("rna_fm")
    spec.arms[0].overrides.pop(rna_fm.LR_KEY)
    with pytest.raises(UserInputError, match=r"grid arm 'RNA-FM @ lr=0.0003' must set model.init_args.optimizer"):
        rna_fm.prepare(_run("RNA-FM @ lr=0.0003", spec=spec))
    spec = runner.load_spec("rna_fm")
    spec.arms[5].fit = True
    with pytest.raises(runner.ExperimentError, match="row 'RNA-FM' must say fit: false"):
        rna_fm.prepare(_run("RNA-FM", spec=spec, earlier={"RNA-FM @ lr=0.003": grid}))
    spec.arms[0].row = True
    with pytest.raises(UserInputError, match="grid arm 'RNA-FM @ lr=0.0003' must be fitted and say row: false"):
        rna_fm.prepare(_run("RNA-FM @ lr=0.0003", spec=spec))
    spec.settings["checkpoint_from"] = ["RNA-FM"]
    with pytest.raises(UserInputError, match="settings.checkpoint_from must map a row"):
        rna_fm.prepare(_run("RNA-FM, CFG 1", spec=spec, earlier={"RNA-FM @ lr=0.003": grid}))


def _records(seeds: int = 3) -> list[dict]:
    """The runner's records as `evaluate` leaves them: per seed, the grid points' candidates and the rows' records."""
    out = []
    for seed in range(seeds):
        kept = {"RNA-FM @ lr=0.001": {"candidate": {"lr": 0.001}}}
        for i, row in enumerate(ROWS):
            metrics = {m: -0.1 * i + 0.01 * seed + (0.05 if m == "pearson" and row == "RNA-FM" else 0.0)
                       for m in TEST_METRICS}
            kept[row] = {"seed": seed, "record": {**metrics, "val_pearson": 0.5, "best_epoch": 39, "lr": 0.003,
                                                  "ema": True, "train_s": 1.0}}
        out.append({"": kept})
    return out


def test_report_writes_the_landed_layout_that_the_card_check_reads():
    spec = runner.load_spec("rna_fm")
    records = _records()
    added = rna_fm.report({"arms": {}, "per_seed": []}, records, spec)
    assert set(added) == {"per_seed", "title", "chosen_lr", "paired"} and added["title"] == rna_fm.TITLE
    assert [row["seed"] for row in added["per_seed"]] == [0, 1, 2]
    assert all(list(row["runs"]) == ROWS for row in added["per_seed"])  # the grid points are no rows
    assert added["chosen_lr"] == {row: [0.003] * 3 for row in ROWS}
    assert list(added["paired"]) == ["RNA-FM - RNA-FM, flat token", "RNA-FM - HE2RNA-lite"]
    cell = added["paired"]["RNA-FM - RNA-FM, flat token"]["pearson"]
    assert list(added["paired"]["RNA-FM - HE2RNA-lite"]) == TEST_METRICS
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(0.05 + 0.2) and cell["lo"] == pytest.approx(cell["mean"])
    card = yaml.safe_load((kit.REPO_ROOT / "configs" / "rna_fm" / "card.yaml").read_text())
    arms = kit.summarise([row["runs"] for row in added["per_seed"]])
    outcomes = evaluate_check(card["check"], {"arms": arms, "per_seed": added["per_seed"]})
    # RNA-FM above every other row, by the same amount on each seed
    assert [o.verdict for o in outcomes] == ["held", "held", "held"]
    spec.settings["paired"] = {"HE2RNA-lite": "RNA-FM"}
    with pytest.raises(UserInputError, match="settings.paired must map a baseline row to a list of rows"):
        rna_fm.report({"arms": {}, "per_seed": []}, records, spec)


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """Two grid points per trained row and five test-only rows (13 runs, ~10 s): the JSON has the landed keys, the
    per-seed records of the script, the runner's pairs against tRNAsformer-lite and the report's; nothing lands in
    ./runs."""
    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("rna_fm", smoke=True, out=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "rna_fm.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert set(written) == {"paper", "seeds", "wall_s", "config", "arms", "per_seed", "machine", "paired", "title",
                            "chosen_lr"} and written["paper"] == "rna_fm"
    assert list(written["arms"]) == ROWS and list(written["arms"]["RNA-FM"]) == [*TEST_METRICS, "val_pearson",
                                                                                "train_s"]
    (row,) = written["per_seed"]
    assert row["seed"] == 0 and list(row["runs"]) == ROWS
    fm, cfg1 = row["runs"]["RNA-FM"], row["runs"]["RNA-FM, CFG 1"]
    assert [r["lr"] for r in fm["grid"]] == [0.001, 0.003] and all(r["ema"] for r in fm["grid"])
    assert fm["val_pearson"] == max(r["val_pearson"] for r in fm["grid"]) and fm["train_s"] > 0
    assert {k: cfg1[k] for k in ("lr", "val_pearson", "best_epoch")} == {k: fm[k] for k in ("lr", "val_pearson",
                                                                                             "best_epoch")}
    assert cfg1["train_s"] == 0.0 and "grid" not in cfg1
    shown = written["config"]["arms"]
    assert "--model.init_args.cfg_scale=1.0" in shown["RNA-FM, CFG 1"] and "(test only, no fit)" in shown["RNA-FM"]
    assert written["chosen_lr"] == {arm: [row["runs"][arm]["lr"]] for arm in ROWS}
    assert list(written["paired"]) == [*(f"{arm} - tRNAsformer-lite" for arm in ROWS[:-1]),
                                       "RNA-FM - RNA-FM, flat token", "RNA-FM - HE2RNA-lite"]
    cell = written["paired"]["RNA-FM - tRNAsformer-lite"]["coverage_bimodal"]
    assert cell["n"] == 1 and cell["lo"] is None
    assert cell["mean"] == pytest.approx(fm["coverage_bimodal"] - row["runs"]["tRNAsformer-lite"]["coverage_bimodal"])
    assert (tmp_path / "out" / "rna_fm.png").is_file() and not (tmp_path / "runs").exists()
