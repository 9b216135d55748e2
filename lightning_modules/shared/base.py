"""Plumbing shared by every paper module: injected optimisers, fine-tuning from a checkpoint, and the model-data
contract (``data`` / ``check_data_matches`` / ``attached_data``: what a module reads from the attached
datamodule, declared per data family in `lightning_modules.shared.data_contract`).

Two ways to start from a checkpoint, and they mean different things:

* ``--ckpt_path run.ckpt`` (Lightning) is an *exact resume*: model weights, optimiser state, epoch,
  callback state and (``PaperModule.on_load_checkpoint``) the global RNG states are restored, and the
  checkpoint's saved hyper-parameters win over the YAML. ``train.py`` refuses a checkpoint written by another
  LightningModule (or, for ``fit``, datamodule) class and warns about every configured model value it replaces.
* ``--model.init_args.init_from run.ckpt`` (this module) is *fine-tuning with a new config*: only the
  weights whose name and shape match the new model are copied, in ``setup`` of whichever stage comes first
  (fit, validate, test or predict: ``train.py test --model.init_args.init_from run.ckpt`` scores those weights);
  everything else (optimiser, schedule, epoch counter, hyper-parameters) comes from the new config. What was
  skipped is logged, and nothing is skipped silently: a checkpoint that matches no parameter at all is an error,
  and so is a path that does not exist. It is loaded once per module instance: ``trainer.fit`` then
  ``trainer.test`` on the same module tests the trained weights. Weights that come from elsewhere win over it
  and it is then not loaded at all: a checkpoint the Trainer call restores (``--ckpt_path``), the checkpoint a
  module was built from (``load_from_checkpoint``) or an explicit ``load_state_dict``.

Checkpoints are read with ``torch.load(weights_only=True)`` so that an untrusted file cannot execute
pickled code. A checkpoint that needs full unpickling (it stores arbitrary Python objects) is refused with
a message; set ``init_from_trusted: true`` only for files you trust.
"""
from __future__ import annotations

import inspect
import logging
import os
import pickle
import random
import re
import zipfile
from typing import Any, TypeVar

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics import Metric

from lightning_modules.shared.data_contract import data_view
from lightning_modules.shared.errors import UserInputError, one_line

log = logging.getLogger(__name__)
T = TypeVar("T")


def read_checkpoint(path: str, trusted: bool = False, what: str = "checkpoint", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint file onto the CPU, turning every way it can be wrong into a `UserInputError`.

    Accepts a Lightning checkpoint (a dict with ``state_dict``) or a bare ``state_dict`` of tensors.
    Returns ``{"state_dict": ..., **rest}``. ``mmap=True`` maps the tensors from the file instead of reading them
    into memory (zip-format files): for callers that only read shapes or copy the tensors into a model at once, so a
    7B checkpoint costs no second copy in memory. Such tensors must not be kept: the file may be rewritten later.
    """
    if not os.path.isfile(path):
        raise UserInputError(f"{what} '{path}' does not exist (or is not a file). Check the path; "
                             "a fit writes <dirpath>/version_<N>/*.ckpt and links the newest finished run as "
                             "<dirpath>/latest/.")
    with open(path, "rb") as handle:
        head = handle.read(4)
    # torch.save writes a zip archive (torch >= 1.6) or, in the legacy format, a pickle (protocol 2+ starts with
    # 0x80); anything else (a text file, an image, an .npz's ...) is refused here with one line instead of torch's
    # multi-line weights-only report
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        kind = "an empty file" if not head else f"a file starting with {head!r}"
        raise UserInputError(f"{what} '{path}' is not a torch checkpoint: it is {kind}, not the zip archive (or "
                             "legacy pickle) that torch.save writes. Point to a .ckpt/.pt file written by a run.")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=not trusted,
                             mmap=mmap and head.startswith(b"PK\x03\x04"))
    except pickle.UnpicklingError as err:
        if not trusted and "global" in str(err).lower():  # a class outside the weights-only allow-list
            raise UserInputError(
                f"{what} '{path}' contains Python objects that weights-only loading refuses to unpickle. "
                "If (and only if) you trust this file, set `init_from_trusted: true` "
                "(for --ckpt_path: `--weights_only=false`).") from None
        # torch's weights-only report spans a dozen lines of advice; its reason is the "WeightsUnpickler error"
        reason = re.search(r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)", str(err), re.DOTALL)
        reason = one_line(reason.group(1)) if reason else one_line(err)
        raise UserInputError(f"{what} '{path}' is not a readable torch checkpoint ({reason}). "
                             "Is it truncated, or a file of another format?") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as err:
        raise UserInputError(f"{what} '{path}' could not be read: it looks truncated or is not a torch "
                             f"checkpoint ({type(err).__name__}: {one_line(err)}). "
                             "Re-copy the file or point to another checkpoint.") from None
    if isinstance(payload, dict) and "state_dict" in payload:
        state = payload["state_dict"]
    elif isinstance(payload, dict) and payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
        payload, state = {"state_dict": payload}, payload
    else:
        raise UserInputError(f"{what} '{path}' holds no model weights: expected a Lightning checkpoint "
                             "(a dict with 'state_dict') or a plain state_dict of tensors.")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserInputError(f"{what} '{path}': its 'state_dict' is not a mapping of names to tensors.")
    return payload


def load_matching_weights(module: torch.nn.Module, state: dict[str, torch.Tensor],
                          source: str = "checkpoint") -> dict[str, list[str]]:
    """Copy every tensor of `state` whose name *and* shape match `module`; report the rest.

    ``load_state_dict(strict=False)`` skips missing names but still fails on shape mismatches, so the
    filtering is done here. Raises if nothing matches (a foreign checkpoint), because fine-tuning from
    nothing is almost always a wrong path rather than an intent.
    """
    own = module.state_dict()
    matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    report = {
        "loaded": sorted(matched),
        "shape_mismatch": sorted(f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                                 for k, v in state.items() if k in own and own[k].shape != v.shape),
        "not_in_model": sorted(k for k in state if k not in own),
        "not_in_checkpoint": sorted(k for k in own if k not in state),
    }
    if not matched:
        raise UserInputError(
            f"{source} shares no parameter (by name and shape) with {type(module).__name__}: it was written "
            f"by a different model. First checkpoint keys: {sorted(state)[:5]}; first model keys: "
            f"{sorted(own)[:5]}.")
    module.load_state_dict(matched, strict=False)
    return report


class PaperModule(LightningModule):
    """Base class of every paper module.

    Args:
        optimizer: optimiser factory, called with the trainable parameters (injected by LightningCLI).
        lr_scheduler: optional scheduler factory, called with the optimiser; stepped every optimiser step.
        init_from: checkpoint to start from (weights matched by name and shape, loaded once, in the first
            ``setup`` of any stage; skipped when the weights come from a restored checkpoint).
        init_from_trusted: allow full unpickling of ``init_from`` (only for files you trust).
    """

    def __init__(self, optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__()
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.init_from = init_from
        self.init_from_trusted = init_from_trusted
        self.init_from_report: dict[str, list[str]] | None = None
        # True once init_from no longer applies: loaded, or the weights came from a checkpoint / load_state_dict
        self._init_from_settled = False

    @property
    def attached_datamodule(self):
        """The trainer's datamodule, or None outside a Trainer (modules check their sizes against it)."""
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    # ----------------------------------------------------------------------------- model-data contract
    def attached_data(self, contract: type[T]) -> T | None:
        """The attached datamodule when it provides every member of ``contract`` (a protocol of
        `lightning_modules.shared.data_contract`), else None (no datamodule, or one of another family)."""
        datamodule = self.attached_datamodule
        return datamodule if datamodule is not None and isinstance(datamodule, contract) else None

    def data(self, contract: type[T]) -> T:
        """The attached datamodule read through ``contract``: ``self.data(SequenceData).num_items`` (typed; None
        when no datamodule is attached or it does not provide the member yet; an undeclared member is an error)."""
        return data_view(contract, self.attached_datamodule)

    def check_data_matches(self, contract: type, expected: dict[str, Any], message: str) -> None:
        """Raise `UserInputError` when the attached data knows a member of ``contract`` (not None) and it differs
        from the model's value. ``expected`` maps member names to the model's values; ``message`` is formatted
        with ``name``, ``model`` and ``data``."""
        view = self.data(contract)
        for name, model_value in expected.items():
            data_value = getattr(view, name)
            if data_value is not None and data_value != model_value:
                raise UserInputError(message.format(name=name, model=model_value, data=data_value))

    # ----------------------------------------------------------------------------- fine-tuning
    # A module without a test stage names the stage to use instead here; `setup("test")` refuses with it.
    no_test_stage: str | None = None

    def setup(self, stage: str) -> None:
        self.unshare_metric_states()
        self.apply_init_from()
        if stage == "test" and self.no_test_stage:
            raise UserInputError(self.no_test_stage)

    def test_step(self, batch, batch_idx):
        """Reached only by a module without a test stage of its own (`setup("test")` refuses first; defined so that
        the refusal is this one line, not Lightning's "no test_step" error)."""
        raise UserInputError(self.no_test_stage or f"{type(self).__name__} has no test stage: use `validate`.")

    def apply_init_from(self) -> None:
        """Load ``init_from`` unless it is settled (called by `setup` in every stage: the first one loads it).

        Settled means: already loaded into this instance (a later ``trainer.test`` after ``trainer.fit`` keeps the
        trained weights), or the weights come from elsewhere, which wins: the checkpoint the running Trainer call
        restores right after ``setup`` (``--ckpt_path``, exact resume), ``load_from_checkpoint`` or an explicit
        ``load_state_dict``. A missing or unreadable file is a `UserInputError` naming the path."""
        if self.init_from is None or self.init_from_settled:
            return
        restoring = self.checkpoint_being_restored()
        if restoring:
            log.info("init_from=%s ignored: the weights come from --ckpt_path %s", self.init_from, restoring)
            self._init_from_settled = True
            return
        self.load_initial_weights()
        self._init_from_settled = True

    @property
    def init_from_settled(self) -> bool:
        """Whether ``init_from`` no longer applies to this instance (see `apply_init_from`)."""
        return self._init_from_settled or self.init_from_report is not None

    def checkpoint_being_restored(self) -> str | None:
        """The checkpoint (``ckpt_path``) that the running ``fit`` / ``validate`` / ``test`` / ``predict`` call
        restores into this module, else None. Lightning restores it right after ``setup`` and records it on the
        trainer only then (during ``setup``, ``trainer.ckpt_path`` still names the previous call's checkpoint), so
        the path is read from that call."""
        return _running_ckpt_path(self._trainer) if self._trainer is not None else None

    def load_state_dict(self, state_dict, *args, **kwargs):
        """`torch.nn.Module.load_state_dict`; weights loaded this way (a checkpoint restore, ``load_from_checkpoint``,
        the weights a ``ddp_spawn`` run sends back) win over ``init_from``, which is then not loaded."""
        self._init_from_settled = True
        return super().load_state_dict(state_dict, *args, **kwargs)

    def unshare_metric_states(self) -> None:
        """Give every torchmetrics state of this module memory of its own process (called by `setup`).

        ``mp.spawn`` (``--trainer.strategy=ddp_spawn``, the CPU multi-process launcher) moves every CPU tensor it
        pickles into shared memory. Lightning copies parameters and buffers back out, but torchmetrics states are
        neither, so a metric that accumulates in place (``MulticlassMatthewsCorrCoef``'s ``confmat += ...``) sums
        every rank's examples into one tensor, which ``compute`` then all-reduces again: each example counts once
        per rank. Ratios of those counts (accuracy, a non-degenerate MCC) hide it; the degenerate-MCC value does not.
        ``Metric.reset`` re-creates each state from its default, so states start empty and private in every rank."""
        for module in self.modules():
            if isinstance(module, Metric):
                module.reset()

    def load_initial_weights(self) -> dict[str, list[str]]:
        """Load `init_from` now (also usable outside a Trainer, where `setup` then leaves it alone); returns and logs
        the match report."""
        payload = read_checkpoint(self.init_from, trusted=self.init_from_trusted, what="init_from", mmap=True)
        report = load_matching_weights(self, payload["state_dict"], source=f"init_from '{self.init_from}'")
        self.init_from_report = report
        self._init_from_settled = True
        skipped = report["shape_mismatch"] + report["not_in_model"]
        fresh = len(self.state_dict()) - len(report["loaded"])
        log.warning("init_from %s: loaded %d tensors; skipped %d checkpoint tensors (%s); %d model tensors keep "
                    "their fresh initialisation (missing from the checkpoint: %s)", self.init_from,
                    len(report["loaded"]), len(skipped), "; ".join(skipped[:5]) or "none", fresh,
                    ", ".join(report["not_in_checkpoint"][:5]) or "none")
        return report

    # ----------------------------------------------------------------------------- optimisation
    def trainable_parameters(self):
        """Parameters handed to the optimiser; override to exclude or group parameters."""
        return [p for p in self.parameters() if p.requires_grad]

    def build_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The injected optimiser over ``parameters``; a value torch refuses (a negative learning rate, betas
        outside [0, 1), an unknown argument) becomes one error line naming the config key, not a traceback."""
        return _build_from_config(self.optimizer_factory, parameters, "optimizer",
                                  " (e.g. --model.init_args.optimizer.init_args.lr=0.001)")

    def build_lr_scheduler(self, optimizer: torch.optim.Optimizer):
        """The injected learning-rate schedule, with the same one-line error as `build_optimizer`."""
        return _build_from_config(self.lr_scheduler_factory, optimizer, "lr_scheduler")

    def configure_optimizers(self):
        optimizer = self.build_optimizer(self.trainable_parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.build_lr_scheduler(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ----------------------------------------------------------------------------- prediction files
    def prediction_fields(self, outputs: Any, batch: Any) -> dict[str, Any]:
        """``predict_step``'s ``outputs`` for ``batch`` as named per-example fields (tensors with one row per
        example, or lists with one entry per example), which `callbacks.prediction_writer.PredictionWriter` saves.
        Names it gives a readable form: ``*probs`` (class probabilities), ``top_items``, images ([N, 1 or 3, H, W]
        in [0, 1]) -> PNG, ``expression`` -> genes x examples CSV, text (``prompt``, ``completion``) -> JSONL.
        The default keeps a dict's keys and names a single tensor ``prediction``."""
        return dict(outputs) if isinstance(outputs, dict) else {"prediction": outputs}

    # ----------------------------------------------------------------------------- resuming
    # Subclasses that override these hooks call super() so that every module's checkpoint carries the RNG states.
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep the global RNG states (torch, numpy, python; CUDA when in use): Lightning restores weights,
        optimiser and loops but not the random streams, so without them a resumed fit would redraw dropout masks,
        diffusion noise, negatives and rollouts from the freshly seeded state instead of continuing the run."""
        checkpoint[RNG_STATES_KEY] = collect_rng_states()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the RNG states when a fit resumes (``--ckpt_path``); ``load_from_checkpoint``, validate and
        test leave the caller's random streams alone. The checkpoint's weights win over ``init_from``."""
        self._init_from_settled = True
        if RNG_STATES_KEY in checkpoint and self._trainer is not None and self.trainer.state.fn == "fit":
            restore_rng_states(checkpoint[RNG_STATES_KEY])


def _build_from_config(factory, argument, key: str, example: str = ""):
    """``factory(argument)``; a ValueError/TypeError from the library becomes one `UserInputError` naming
    ``model.init_args.<key>.init_args`` (the collection's own validation errors pass unchanged)."""
    try:
        return factory(argument)
    except UserInputError:
        raise
    except (ValueError, TypeError) as err:
        raise UserInputError(f"the {key} could not be built from the config: {type(err).__name__}: {one_line(err)}. "
                             f"Fix the value under model.init_args.{key}.init_args{example}.") from None


def _running_ckpt_path(trainer: Trainer) -> str | None:
    """The ``ckpt_path`` argument of ``trainer``'s running ``Trainer._run`` (fit/validate/test/predict resolve
    "last"/"best" before it), or None outside a run."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code is Trainer._run.__code__ and frame.f_locals.get("self") is trainer:
                path = frame.f_locals.get("ckpt_path")
                return str(path) if path else None
            frame = frame.f_back
        return None
    finally:
        del frame


RNG_STATES_KEY = "rng_states"


def collect_rng_states() -> dict[str, Any]:
    """The global torch/numpy/python (and initialised CUDA) RNG states, in types a weights-only load accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = {"torch": torch.get_rng_state(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos),
                                                        int(has_gauss), float(cached)],
              "python": [version, list(internal), gauss_next]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
