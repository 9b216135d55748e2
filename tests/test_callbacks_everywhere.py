"""Cross-paper tricks run against every quick config they apply to, so a new paper that breaks one fails at once.

Each callback of ``callbacks/`` is either a trick documented to attach to any module (or to any module with a
stated contract), listed in TRICKS with a check that it actually did its work, or a paper's own driver, listed in
PAPER_SPECIFIC with the reason (those are run by their paper's quick configs and tests). A new callback has to be
put in one of the two (test_every_callback_is_classified).

For every (trick, quick config) pair the config is fitted for one step and one validation batch
(``fast_dev_run=1``) with the trick added to its callbacks; where the trick does not apply, the test skips with
the reason read off the built module (manual optimisation, a missing attribute of the trick's contract).
"""
from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import Checkpoint

from conftest import QUICK_CONFIGS, config_path, run_cli
from test_coverage import collection_classes

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

PAPER_SPECIFIC = {
    "LayerProbing": "per-layer linear probes of an audio encoder's hidden states (needs the module's layer_states and "
                    "the data's per-clip attributes); configs/pclm/pretrain_quick.yaml and tests/test_pclm.py run it",
    "ConceptInterventions": "test-time concept interventions of the concept models (needs their concept_outputs / "
                            "intervene hooks); configs/ec_cem/*quick.yaml and tests/test_concept_models.py run it",
    "OfflineEvaluation": "runs an offline-RL policy in its real environment after validation (needs the policy's act "
                         "and the data's environment); configs/phyb/quick.yaml and tests/test_phyb.py run it",
    "RSIRSelfImprovement": "one round of RSIR's data loop for sequential recommenders (reloads the best "
                           "checkpoint and generates sequences at the end of fit); configs/rsir/*quick.yaml and "
                           "tests/test_rsir.py run it",
    # not tricks: the progress bar train.py attaches to every run with a bar (tests/test_cli.py checks it)
    "RunProgressBar": "the default progress bar of train.py (Rich)",
    "RunTQDMProgressBar": "the default progress bar of train.py where Rich is not installed",
    # not a trick: it acts only in `predict`, which this fit-based harness never runs
    "PredictionWriter": "writes the outputs of `predict` to files; tests/test_prediction_writer.py runs it for "
                        "every module family",
}


class NotApplicable(Exception):
    """Raised by a probe when the running module turns out to be outside the trick's contract."""


def _tracked(module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}


# {(check, config): reason to skip or None}. A check reads what a module's class and init arguments fix (manual
# optimisation, the attributes of a trick's contract), so its answer is remembered from the first build of a config
# and a pair that does not apply skips without building the config again.
_APPLICABILITY: dict[tuple[object, str], str | None] = {}
_CHECKS: list = []  # every check, run on every build so that later tricks find their answer


def _fit_with(config: str, extra: list[str], callbacks: list[Callback], *overrides: str, check=None):
    """Build `config` as the CLI does, put `callbacks` before its checkpoint callbacks (replacing any callback of
    the same classes), call `check(cli)` (which returns a reason to skip, or None), then fit one step."""
    if check is not None and (reason := _APPLICABILITY.get((check, config))):
        pytest.skip(reason)
    cli = run_cli("--config", config_path(config), "--trainer.fast_dev_run=1", *QUIET, *extra, *overrides,
                  run=False)
    for known in _CHECKS:
        _APPLICABILITY.setdefault((known, config), known(cli))
    if check is not None and (reason := check(cli)):
        pytest.skip(reason)
    kinds = tuple({type(c) for c in callbacks})
    kept = [c for c in cli.trainer.callbacks if not isinstance(c, kinds)]
    position = next((i for i, c in enumerate(kept) if isinstance(c, Checkpoint)), len(kept))
    cli.trainer.callbacks[:] = kept[:position] + list(callbacks) + kept[position:]
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except NotApplicable as reason:
        pytest.skip(str(reason))
    assert cli.trainer.state.finished
    return cli


# ------------------------------------------------------------------------------------------ EMA weights
class EMAProbe(Callback):
    """Placed right after `EMAWeights`: offsets the freshly started average (so that the average differs from the
    training weights even for a parameter the first step leaves unchanged) and records the weights the module
    holds after the step, during validation and after validation."""

    OFFSET = 1e-2

    def __init__(self, ema) -> None:
        self.ema = ema
        self.start = self.after_step = self.average = self.in_validation = self.after_validation = None

    def on_train_start(self, trainer, pl_module):
        self.start = _tracked(pl_module)
        for value in self.ema.averages.values():
            value.add_(self.OFFSET)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.after_step is None:
            self.after_step = _tracked(pl_module)
            self.average = {name: value.clone() for name, value in self.ema.averages.items()}

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.in_validation is None:
            self.in_validation = _tracked(pl_module)

    def on_validation_end(self, trainer, pl_module):
        self.after_validation = _tracked(pl_module)


def check_ema(config: str, extra: list[str]) -> None:
    from callbacks.ema import EMAWeights

    ema = EMAWeights(decay=0.5)
    probe = EMAProbe(ema)
    cli = _fit_with(config, extra, [ema, probe])
    if cli.trainer.global_step == 0:  # the average only moves after an optimiser step
        pytest.skip(f"{type(cli.model).__name__} made no optimiser step in its first batch (e.g. GRPO's zero-variance "
                    "group filter dropped every group), so there is no EMA update to check")
    assert ema.updates == 1 and probe.after_step is not None
    names = sorted(probe.start)
    assert names and sorted(ema.averages) == names
    for name in names:  # one update: (start + offset) moved halfway to the weights after the step
        expected = torch.lerp(probe.start[name] + EMAProbe.OFFSET, probe.after_step[name], 0.5)
        torch.testing.assert_close(probe.average[name], expected, msg=name)
    assert probe.in_validation is not None, "validation never ran, so the EMA swap could not be checked"
    for name in names:  # validation saw the average, and the training weights came back afterwards
        assert torch.equal(probe.in_validation[name], probe.average[name]), name
        assert torch.equal(probe.after_validation[name], probe.after_step[name]), name
    assert any(not torch.equal(probe.average[n], probe.after_step[n]) for n in names)


# ------------------------------------------------------------------------------------------ SGD taming
class GradientRecorder(Callback):
    """Records the gradients and learning rates seen in the first on_before_optimizer_step; with
    ``require_plain_sgd`` it also stops the run (NotApplicable) when the module's optimiser is not plain SGD."""

    def __init__(self, require_plain_sgd: bool = False) -> None:
        self.require_plain_sgd = require_plain_sgd
        self.grads: dict[str, torch.Tensor] | None = None
        self.lrs: dict[str, float] = {}
        self.first_lr: float | None = None  # of the first param group with a gradient (the one SGDTaming logs)

    def on_train_start(self, trainer, pl_module):
        from callbacks.sgd_taming import SGDTaming
        from lightning_modules.shared.errors import UserInputError

        if self.require_plain_sgd:
            for optimizer in trainer.optimizers:
                try:
                    SGDTaming.check_plain_sgd(optimizer)
                except UserInputError as err:
                    raise NotApplicable(f"{type(pl_module).__name__}'s own parameter groups: {err}") from None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.grads is not None:
            return
        group_lr = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        self.lrs = {n: group_lr[id(p)] for n, p in pl_module.named_parameters() if p.grad is not None}
        self.first_lr = next(g["lr"] for g in optimizer.param_groups if any(p.grad is not None for p in g["params"]))


def _not_automatic(cli) -> str | None:
    model = cli.model
    if not model.automatic_optimization:
        return (f"{type(model).__name__} uses manual optimisation (automatic_optimization=False): it runs its own "
                "optimiser steps inside training_step, so there is no single SGD step for the taming to rewrite")
    return None


def check_sgd_taming(config: str, extra: list[str]) -> None:
    from callbacks.sgd_taming import SGDTaming

    taming = SGDTaming(scheme="tamed")
    before, after = GradientRecorder(require_plain_sgd=True), GradientRecorder()
    # the taming is defined for plain SGD: the config's optimiser is replaced by it, and gradient clipping (a
    # second control of the step length that SGDTaming refuses) is switched off, as its error message advises
    cli = _fit_with(config, extra, [before, taming, after], "--model.init_args.optimizer=torch.optim.SGD",
                    "--model.init_args.optimizer.init_args.lr=0.01",
                    "--model.init_args.optimizer.init_args.momentum=0.0",
                    "--model.init_args.optimizer.init_args.weight_decay=0.0", "--trainer.gradient_clip_val=null",
                    check=_not_automatic)
    assert before.grads and sorted(before.grads) == sorted(after.grads)
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in before.grads.values()]))
    assert grad_norm > 0, "a zero gradient cannot show whether the taming acted"
    for name, raw in before.grads.items():  # g / (1 + lr ||g||), one global norm, each group's own lr
        expected = raw * (1.0 / (1.0 + before.lrs[name] * grad_norm))
        torch.testing.assert_close(after.grads[name], expected, msg=name)
    logged = float(cli.trainer.callback_metrics["taming/scale"])
    assert logged == pytest.approx(1.0 / (1.0 + before.first_lr * float(grad_norm)), rel=1e-5) and logged < 1.0


# ------------------------------------------------------------------------------------------ TREW reweighting
def _no_trew_contract(cli) -> str | None:
    missing = [name for name in ("original", "forget_class", "forget_logit_offset") if not hasattr(cli.model, name)]
    if missing:
        return (f"TREWReweighting attaches to unlearning modules with a frozen `original` model; "
                f"{type(cli.model).__name__} has no {', '.join(missing)}")
    return None


def check_trew(config: str, extra: list[str]) -> None:
    from callbacks.trew import TREWReweighting

    beta = 2.0
    trew = TREWReweighting(beta=beta, temperature=1.0, similarity="weights")
    cli = _fit_with(config, extra, [trew], check=_no_trew_contract)
    model = cli.model
    similarity = trew.similarity
    assert similarity is not None and float(similarity[model.forget_class]) == 0.0
    assert float(similarity.sum()) == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(model.forget_logit_offset.cpu().float(), (beta * similarity).cpu().float())
    assert float(model.forget_logit_offset.abs().sum()) > 0


TRICKS = {"EMAWeights": check_ema, "SGDTaming": check_sgd_taming, "TREWReweighting": check_trew}
_CHECKS += [_not_automatic, _no_trew_contract]


def test_every_callback_is_classified():
    from lightning.pytorch import Callback as LightningCallback

    callbacks = {c.__name__ for c in collection_classes()
                 if issubclass(c, LightningCallback) and c.__module__.startswith("callbacks.")}
    assert callbacks, "no callback found: the discovery is broken"
    unclassified = sorted(callbacks - set(TRICKS) - set(PAPER_SPECIFIC))
    assert not unclassified, ("add each new callback to TRICKS (with a check that it did its work) or to "
                              f"PAPER_SPECIFIC (with the reason): {unclassified}")
    assert not (set(TRICKS) | set(PAPER_SPECIFIC)) - callbacks, "TRICKS/PAPER_SPECIFIC name callbacks that are gone"


@pytest.mark.parametrize("config", QUICK_CONFIGS)
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_trick_works_with_config(trick, config, prerequisite_args):
    TRICKS[trick](config, prerequisite_args(config))
