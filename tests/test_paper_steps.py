"""Every paper config takes real steps through ``train.py`` on files in its dataset's release format
(`experiments.paper_steps`): fit, a resume from the checkpoint it wrote, and predict (test and predict for the
configs that are only evaluated). The slow test runs every case per paper folder, prerequisites first."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import REPO
from experiments.paper_steps import Case, StepTimer, cases, in_order, paper_configs, run_case

CASES = cases()
PAPERS: dict[str, list[str]] = defaultdict(list)
for _config in paper_configs():
    PAPERS[Path(_config).parent.name].append(_config)


def test_every_paper_config_has_a_release_format_case():
    missing = [config for config in paper_configs() if config not in CASES]
    assert not missing, f"no case in experiments/paper_steps/ for {missing}"
    unknown = [config for config in CASES if not (REPO / config).is_file()]
    assert not unknown, f"cases for configs that do not exist: {unknown}"


@pytest.mark.parametrize("config", sorted(CASES))
def test_a_case_says_what_it_writes_and_what_differs(config):
    case = CASES[config]
    assert case.release_format, f"{config}: say which release files the case writes (release_format)"
    if case.args:
        assert case.note, f"{config}: its args {case.args} change the published run; say how in note"
    for prerequisite in case.after:
        assert prerequisite in CASES, f"{config}: prerequisite {prerequisite} has no case"
        assert Path(prerequisite).parent == Path(config).parent, f"{config}: {prerequisite} is another paper's"


def test_the_timer_counts_saved_activations_once_per_storage():
    """A linear layer saves its input for the weight gradient: batch x features x 4 bytes, parameters excluded."""
    layer = nn.Linear(16, 8)
    module = nn.Module()
    module.layer = layer
    timer = StepTimer()
    timer.on_train_batch_start(None, module, None, 0)
    x = torch.randn(32, 16)
    layer(x).pow(2).sum().backward()
    timer.on_train_batch_end(None, module, None, None, 0)
    assert timer.saved_bytes[0] >= 32 * 16 * 4
    assert timer.saved_bytes[0] < 32 * 16 * 4 + 2 * 32 * 8 * 4 + 1024  # the input, the output for pow, no weight
    assert len(timer.seconds) == 1 and timer.seconds[0] >= 0


def test_a_fit_that_does_not_reach_its_steps_is_an_error(tmp_path):
    """The harness checks the step it ended at: a fit that trains on no batch at all fails."""
    case = Case(lambda folder: ["--trainer.limit_train_batches=0"], release_format="embedded data")
    with pytest.raises(RuntimeError, match="ended at step 0, not 2"):
        run_case("configs/tamed_sgd/quick.yaml", case, tmp_path)


def test_each_stage_frees_the_model_before_the_next_builds_its_own(tmp_path, monkeypatch):
    """fit, resume and predict each build the model at full width: the earlier one must be gone by then (the step
    timer, kept for its figures, held the module through the logging methods Lightning binds to every callback)."""
    import gc
    import weakref

    import experiments.paper_steps as steps

    models, alive_at_build = [], []

    def recording(args):
        gc.collect()
        alive_at_build.append([ref() is not None for ref in models])
        cli = real(args)
        models.append(weakref.ref(cli.model))
        return cli

    real = steps._cli
    monkeypatch.setattr(steps, "_cli", recording)
    run_case("configs/tamed_sgd/quick.yaml", Case(lambda folder: [], release_format="embedded data"), tmp_path)
    assert alive_at_build == [[], [False], [False, False]]

def test_a_case_that_needs_more_memory_than_the_machine_is_not_run_and_says_so(tmp_path):
    def never(folder):
        raise AssertionError("the files of a case that is not run must not be written")

    figures = run_case("configs/tamed_sgd/quick.yaml", Case(never, release_format="x", memory_gib=10 ** 6), tmp_path)
    assert figures["cpu_steps"] == 0 and "1e+06 GiB of CPU memory or more" in figures["not_run"]
    assert Case(never, memory_gib=0.001).too_big() is None


def test_prerequisites_come_first():
    assert in_order(["configs/pclm/dpo_paper.yaml"]) == ["configs/pclm/sft_paper.yaml", "configs/pclm/paper.yaml",
                                                          "configs/pclm/stage2_paper.yaml",
                                                          "configs/pclm/dpo_paper.yaml"]


@pytest.mark.slow
@pytest.mark.xdist_group("published_width")
@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_paper_configs_step_resume_and_predict_on_release_files(paper, tmp_path):
    """One process per config, prerequisites first in the same folder: a 7-8B-wide model's memory goes back to the
    system when its config is done (a paper's chain in one process held over 20 GiB)."""
    done: dict[str, dict] = {}
    try:
        for config in in_order(PAPERS[paper]):
            out = tmp_path / "figures.json"
            command = [sys.executable, "-m", "experiments.paper_steps", "--for-test", "--steps", "2", "--folder",
                       str(tmp_path / "work"), "--json", str(out), f"--config={config}", "--prerequisites-done"]
            run = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
            assert run.returncode == 0 and out.is_file(), f"{config}: {run.stderr[-3000:]}"
            done.update(json.loads(out.read_text()))
            out.unlink()
    finally:  # checkpoints at published width take GBs: one paper's files on disk at a time
        shutil.rmtree(tmp_path / "work", ignore_errors=True)
    not_run = {config: done[config]["not_run"] for config in PAPERS[paper] if "not_run" in done[config]}
    for config in PAPERS[paper]:
        if config in not_run:
            continue
        figures = done[config]
        assert figures["predict_batches"] >= 1, config
        if CASES[config].inference_only:
            assert figures["cpu_steps"] == 0 and figures["test_metrics"], config
        else:
            assert figures["cpu_steps"] == 3 and figures["resumed_from"] == 2 and figures["step_s"] > 0, config
    if not_run:  # every other config of the paper passed above
        pytest.skip(f"{not_run}")
