"""Shared fixtures: a clean environment per test and helpers that run the real CLI in-process.

Every test runs from its own temporary directory, so the relative paths in configs (``runs/...``) never
write into the repository; configs are passed by absolute path.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["WANDB_MODE"] = "disabled"  # tests never create W&B runs
torch.set_num_threads(1)  # 2-core machines: parallel multi-threaded torch processes slow each other down

import train  # noqa: E402  (after the path and environment set-up above)
from icml26 import registry  # noqa: E402
from lightning.pytorch import Callback, LightningModule  # noqa: E402

QUICK_CONFIGS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("configs/*/*quick.yaml"))
PAPER_CONFIGS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("configs/*/*paper.yaml"))
SWEEP_FILES = sorted(str(p.relative_to(REPO)) for p in REPO.glob("configs/sweeps/*.yaml"))
# the paper registry: one name per configs/<paper>/card.yaml (names only, so one broken card fails only its own
# tests); `registry.card(name)` reads and validates a card
PAPERS = registry.paper_names(REPO)



def _declared_prerequisites() -> dict[str, str]:
    """Configs that fine-tune another config's result declare it in a comment line of their own:

        # prerequisite: configs/<paper>/<stage>_quick.yaml

    The harness first fits the prerequisite for a few steps and passes its checkpoint as
    --model.init_args.init_from.
    """
    found = {}
    for config in QUICK_CONFIGS:
        for line in (REPO / config).read_text().splitlines():
            match = re.match(r"#\s*prerequisite:\s*(\S+)\s*$", line)
            if match:
                if not (REPO / match.group(1)).is_file():
                    raise FileNotFoundError(f"{config} names a prerequisite that does not exist: {match.group(1)}")
                found[config] = match.group(1)
    return found


PREREQUISITES = _declared_prerequisites()

# Warm-up steps of the prerequisite the harness fits for a config, where 2 steps do not suffice. DARS takes an
# optimiser step only on a batch with a mixed group (some rollouts right, some wrong); after a 2-step warm-up nearly
# every rollout is wrong, so a fit waits hundreds of rollout batches for a lucky one (minutes per test). After 200
# warm-up steps mixed groups are common and a few-step fit takes its steps within its first batches.
# GRPO and multi-answer RL after a 2-step warm-up have all-zero advantages (every group all wrong), so a 2-step fit
# moves no weight and a determinism check would compare untouched weights; after 200 steps every tensor moves.
HARNESS_WARM_UP_STEPS = {"configs/dars/quick.yaml": 200, "configs/dars/breadth_quick.yaml": 200,
                         "configs/grpo/quick.yaml": 200, "configs/multi_answer_rl/quick.yaml": 200}


# `.ci/run` runs both suites on two pytest-xdist workers, the slow one with `-n 2 --dist loadgroup`: tests in one
# `xdist_group` run one after another on one worker. The release-format steps at published width
# (tests/test_paper_steps.py) are one group, so no two multi-GiB models are in memory at once, and it is the longest:
# it goes first, while the other worker takes the rest one test at a time.
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)  # stable: otherwise in file order


def _logger_levels() -> dict[str, int]:
    return {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
            if isinstance(logger, logging.Logger)}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """Run from tmp_path, with W&B disabled and pytest's argv hidden from LightningCLI."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["train.py"])
    levels = _logger_levels()  # experiment scripts run in-process quieten loggers; later tests read their records
    yield
    for name, level in _logger_levels().items():
        if level != levels.get(name, logging.NOTSET):
            logging.getLogger(name).setLevel(levels.get(name, logging.NOTSET))
    torch.use_deterministic_algorithms(False)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# The second arm of every 1-vs-2-process equality check. `ddp_fork` starts the two CPU ranks from this process;
# `ddp_spawn` (what configs/trainer/ddp.yaml uses) re-imports torch, Lightning and the collection in each rank:
# measured 0.5 s vs 18 s for one `validate` of the TREW classifier quick config. What only spawn does (pickling the
# module, which moves its CPU tensors to shared memory) keeps spawn runs of its own in
# tests/test_distributed_and_resume.py (a 2-process fit, and the validation of a module with torchmetrics states).
TWO_PROCESSES = "ddp_fork"


def run_cli(*args: str, run: bool = True, cli_class=None):
    """`python train.py <args>` in-process; returns the LightningCLI object."""
    import train

    return train.main(args=list(args), run=run, cli_class=cli_class or train.CollectionCLI)


def config_path(relative: str) -> str:
    return str(REPO / relative)


@pytest.fixture(scope="session")
def prerequisite_checkpoints(tmp_path_factory):
    """Checkpoint of each prerequisite config after `steps` training steps (2 unless a test needs a prerequisite
    that has learnt something; built once per session and step count)."""
    built: dict[tuple[str, int], str] = {}

    def get(prerequisite: str, steps: int = 2) -> str:
        if (prerequisite, steps) not in built:
            out = tmp_path_factory.mktemp("prerequisite")
            cwd = os.getcwd()
            os.chdir(out)
            try:
                cli = run_cli("--config", config_path(prerequisite), f"--trainer.max_steps={steps}",
                              "--trainer.limit_val_batches=1", "--trainer.logger=false",
                              "--trainer.enable_progress_bar=false", run=False)
                cli.trainer.fit(cli.model, datamodule=cli.datamodule)
                built[prerequisite, steps] = str(out / "prerequisite.ckpt")
                cli.trainer.save_checkpoint(built[prerequisite, steps])
            finally:
                os.chdir(cwd)
        return built[prerequisite, steps]

    return get


@pytest.fixture(scope="session")
def prerequisite_args(prerequisite_checkpoints):
    """Extra CLI args a config needs (its prerequisite's checkpoint), as a function of the config; the prerequisite
    is fitted for `steps` steps (by default 2, or the config's entry in HARNESS_WARM_UP_STEPS)."""
    def args_for(config: str, steps: int | None = None) -> list[str]:
        if config not in PREREQUISITES:
            return []
        steps = HARNESS_WARM_UP_STEPS.get(config, 2) if steps is None else steps
        return [f"--model.init_args.init_from={prerequisite_checkpoints(PREREQUISITES[config], steps)}"]

    return args_for


# ------------------------------------------------------------------------------------ shared test helpers
class ParseOnlyCLI(train.CollectionCLI):
    """Parses and validates a config (types, class paths, ranges, --ckpt_path's checks and hyper-parameters)
    without building or running anything."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


class GradientProbe(Callback):
    """Records, after the first backward pass, which trainable parameters lack a finite gradient."""

    def __init__(self):
        self.bad: list[str] | None = None

    def on_after_backward(self, trainer, pl_module):
        if self.bad is None:
            self.bad = [name for name, p in pl_module.named_parameters() if p.requires_grad and
                        (p.grad is None or not torch.isfinite(p.grad).all())]


class ScriptedScores(LightningModule):
    """Logs a fixed validation score per epoch under ``monitor`` and snapshots its weights at every validation end
    (the keep-best / epoch read-off tests)."""

    def __init__(self, scores: list[float], monitor: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.scores, self.monitor, self.snapshots = scores, monitor, []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log(self.monitor, self.scores[self.current_epoch])

    def on_validation_epoch_end(self):
        self.snapshots.append({k: v.detach().clone() for k, v in self.state_dict().items()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


@functools.cache
def checkpoint_writers() -> dict[str, str]:
    """``{checkpoint path: quick config}`` for the ``best.ckpt``/``last.ckpt`` each quick config writes, named
    through the ``<dirpath>/latest`` link to its newest finished fit (`icml26.run_files`; read from the file, its
    ``${...}`` interpolations resolved as the CLI's omegaconf mode does)."""
    from omegaconf import OmegaConf

    writers = {}
    for config in QUICK_CONFIGS:
        written = OmegaConf.to_container(OmegaConf.create((REPO / config).read_text()), resolve=True)
        callbacks = (written.get("trainer") or {}).get("callbacks") or []
        for callback in callbacks:
            args = callback.get("init_args") or {}
            if not callback.get("class_path", "").endswith("ModelCheckpoint") or not args.get("dirpath"):
                continue
            if args.get("filename") in ("best", "last"):
                writers[f"{args['dirpath']}/latest/{args['filename']}.ckpt"] = config
            if args.get("save_last"):
                writers[f"{args['dirpath']}/latest/last.ckpt"] = config
    return writers
