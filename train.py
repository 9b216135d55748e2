"""The collection's one entry point: a thin LightningCLI over every paper module and datamodule.

    python train.py fit --config configs/trew/classifier_quick.yaml
    python train.py fit --config configs/tamed_sgd/quick.yaml --trainer.max_steps=100
    python train.py fit --config configs/trew/paper.yaml --config configs/trainer/gpu.yaml
    icml26 fit --config configs/trew/classifier_quick.yaml       # the same, as the installed console script

Every module of ``lightning_modules``, ``datamodules`` and ``callbacks`` is imported here (`import_collection`),
so short class names (``--model ImageClassifier``) work. W&B runs offline unless ``WANDB_MODE`` is set. Bad user input
(a missing data folder, an out-of-range value, a foreign checkpoint) ends with one ``error:`` line and
exit status 2, not a library traceback. Configs may interpolate other keys of the final config
(``dirpath: ${trainer.default_root_dir}/checkpoints``), resolved after every ``--config`` file and flag is applied.
A ``--config`` path that does not exist relative to the working directory is looked up among the collection's own
configs (`resolve_config_paths`), so the console script works from any directory after a regular install.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import json
import logging
import os
import pkgutil
import re
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")  # online W&B without an API key fails; opt in explicitly

from lightning.pytorch import LightningDataModule, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback  # noqa: E402
from lightning.pytorch.callbacks import ProgressBar  # noqa: E402
from lightning.pytorch.loggers import WandbLogger  # noqa: E402
from lightning.pytorch.utilities import rank_zero_only  # noqa: E402
from jsonargparse import set_parsing_settings  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

import callbacks  # noqa: E402
import datamodules  # noqa: E402
import lightning_modules  # noqa: E402
from callbacks.progress import default_progress_bar  # noqa: E402
from lightning_modules.base import read_checkpoint  # noqa: E402
from lightning_modules.errors import UserInputError, one_line  # noqa: E402

COLLECTION_PACKAGES = (lightning_modules, datamodules, callbacks)
log = logging.getLogger("train")

DISTRIBUTION = "icml26-lightning"
try:  # the one version number lives in setup.cfg; an installed copy (editable or not) carries it in its metadata
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# The folder holding ``configs/``: the repository root in a checkout, site-packages after a regular install (the
# configs are shipped as package data next to this module).
INSTALL_ROOT = Path(__file__).resolve().parent


def import_collection() -> list[str]:
    """Import every module of the collection's packages; returns their names.

    jsonargparse resolves a short class name (``--model ImageClassifier``, ``class_path: KnapsackAllocator``)
    among the subclasses that are already imported, and the package ``__init__`` files import nothing (so that
    loading one datamodule does not load every model), so the CLI imports the modules here. A new paper's file
    is picked up without being listed.
    """
    names = sorted(f"{package.__name__}.{info.name}" for package in COLLECTION_PACKAGES
                   for info in pkgutil.iter_modules(package.__path__))
    for name in names:
        importlib.import_module(name)
    return names


COLLECTION_MODULES = import_collection()


WANDB_RUN_CONFIG_FILENAME = "run_config.yaml"  # W&B keeps config.yaml in its run folder for itself


class RunConfigSaver(SaveConfigCallback):
    """Write the resolved config into the run's *own* directory and, with W&B, into the W&B run.

    Lightning's default writes ``config.yaml`` into ``trainer.log_dir``, which for WandbLogger is the
    logger's shared ``save_dir``: the second run (e.g. of a sweep) then crashes. Here the file goes to
    the version directory of CSV/TensorBoard loggers, or to the W&B run's files directory, and the
    config is also stored as the W&B run config (so sweeps and the W&B UI show every value). The file is named
    ``run_config.yaml`` in a W&B run folder, where W&B reserves ``config.yaml`` for its own record of the run
    config (Lightning's ``config.yaml`` elsewhere).
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # broadcasts: must be called on every rank
        if trainer.is_global_zero:
            logger = trainer.logger
            wandb = isinstance(logger, WandbLogger)
            run_dir = logger.experiment.dir if wandb else log_dir
            os.makedirs(run_dir, exist_ok=True)
            filename = WANDB_RUN_CONFIG_FILENAME if wandb else self.config_filename
            self.parser.save(self.config, os.path.join(run_dir, filename), overwrite=True,
                             multifile=False)
            if isinstance(logger, WandbLogger):  # one W&B config entry per dotted key, as sweeps name them
                config = json.loads(self.parser.dump(self.config, format="json"))
                logger.experiment.config.update(_flatten(config), allow_val_change=True)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def _flatten(config: dict, prefix: str = "") -> dict:
    """{"model": {"init_args": {"lr": 1}}} -> {"model.init_args.lr": 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _class_of(class_path: str) -> type | str:
    """The class a dotted path names (jsonargparse and checkpoints may spell one class by different modules)."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return class_path


def _check_checkpoint_classes(ckpt_path: str, checkpoint: dict, config, check_data: bool) -> None:
    """Refuse a ``--ckpt_path`` whose saved LightningModule (or, when resuming a fit, datamodule) class differs
    from the configured one: LightningCLI would otherwise rebuild the checkpoint's model from its saved
    hyper-parameters and carry on as a different paper. Checkpoints that name no class are left to the state-dict
    check in ``before_fit``."""
    parts = [("LightningModule", "hyper_parameters", "model")]
    if check_data:
        parts.append(("datamodule", "datamodule_hyper_parameters", "data"))
    differences = []
    for what, saved_key, config_key in parts:
        saved = checkpoint.get(saved_key)
        saved = saved.get("_class_path") if isinstance(saved, dict) else None
        configured = config.get(config_key)
        configured = configured.get("class_path") if configured is not None and hasattr(configured, "get") else None
        if isinstance(saved, str) and isinstance(configured, str) and _class_of(saved) is not _class_of(configured) \
                and saved != configured:
            differences.append(f"its {what} is {saved.rpartition('.')[2]} ({saved}) but the config builds "
                               f"{configured.rpartition('.')[2]} ({configured})")
    if differences:
        raise UserInputError(
            f"--ckpt_path '{ckpt_path}' was written by another run: {'; '.join(differences)}. --ckpt_path only "
            "resumes the run that wrote it, with that run's config; to start this config from the checkpoint's "
            f"weights use --model.init_args.init_from={ckpt_path} instead (README: 'Fine-tuning vs resuming').")


def _leaves_of(node, prefix: str) -> dict:
    """{'model.init_args.lr': 0.1, ...} for a parsed config node (a jsonargparse Namespace or a plain value)."""
    if node is None:
        return {}
    if hasattr(node, "as_dict"):
        node = node.as_dict()
    return _flatten(node, f"{prefix}.") if isinstance(node, dict) else {prefix: node}


def _report_replaced_values(ckpt_path: str, before: dict, after: dict) -> None:
    """Warn (once, on rank 0) about configured model values that the checkpoint's hyper-parameters replaced."""
    replaced = [f"{key}={before[key]!r} (checkpoint: {after.get(key)!r})" for key in before
                if key in after and _differs(before[key], after[key])]
    replaced += [f"{key}={before[key]!r} (checkpoint: not set)" for key in before if key not in after]
    if replaced and rank_zero_only.rank == 0:
        log.warning(
            "warning: --ckpt_path '%s' restores the checkpoint's model hyper-parameters, so these values from the "
            "config files and flags are ignored: %s. To change them, start a new run from the weights with "
            "--model.init_args.init_from instead of resuming.", ckpt_path, "; ".join(replaced))


def _differs(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    return a != b


def _find_user_error(err: BaseException | None) -> UserInputError | None:
    """The UserInputError somewhere in an exception's cause/context chain, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserInputError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


# ------------------------------------------------------------------------------------------- parse errors
def _known_class_names() -> list[str]:
    """Short names a user may give for a class: the collection's classes, Lightning's callbacks and loggers,
    torch's optimisers and schedules."""
    import lightning.pytorch.callbacks as pl_callbacks
    import lightning.pytorch.loggers as pl_loggers
    import torch.optim
    import torch.optim.lr_scheduler
    modules = [sys.modules[name] for name in COLLECTION_MODULES]
    modules += [pl_callbacks, pl_loggers, torch.optim, torch.optim.lr_scheduler]
    return sorted({name for module in modules for name, value in vars(module).items()
                   if isinstance(value, type) and not name.startswith("_")})


def _accepted_arguments(class_path: str) -> list[str]:
    """The ``__init__`` argument names of a class and of every base class its ``**kwargs`` reach."""
    cls = _class_of(class_path)
    names: list[str] = []
    for klass in (cls.__mro__ if isinstance(cls, type) else ()):
        try:
            parameters = inspect.signature(klass.__init__).parameters if "__init__" in vars(klass) else {}
        except (TypeError, ValueError):  # a builtin without a readable signature
            parameters = {}
        names += [name for name, p in parameters.items()
                  if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    return list(dict.fromkeys(names))


def _option_keys(parser) -> list[str]:
    """Every ``--dotted.key`` the parser and its subcommand parsers accept, without the dashes."""
    keys, stack = [], [parser]
    while stack:
        current = stack.pop()
        keys += [option[2:] for option in current._option_string_actions if option.startswith("--")]
        stack += [choice for action in current._actions
                  for choice in (getattr(action, "choices", None) or {}).values()
                  if isinstance(choice, LightningArgumentParser)]
    return sorted(set(keys))


def _did_you_mean(name: str, candidates: list[str]) -> str:
    """' (did you mean A or B?)' for the closest candidates, compared on the last dotted part too."""
    short = {candidate.rpartition(".")[2]: candidate for candidate in candidates}
    matches = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    matches += [short[m] for m in difflib.get_close_matches(name.rpartition(".")[2], list(short), n=3, cutoff=0.6)]
    matches = list(dict.fromkeys(matches))[:3]
    return f" (did you mean {' or '.join(matches)}?)" if matches else ""


def explain_parse_error(message: str, parser) -> str:
    """jsonargparse's multi-line parse error as one line naming the bad key or value and the closest valid ones.

    Handles the paths users meet most: an unknown option (``--trainer.max_epochz``, ``trainer: {max_epoch: 3}`` in
    a YAML file), an argument a class does not accept (``--model.init_args.lrr``), and an unknown class name
    (``--model ImageClasifier``). Anything else is jsonargparse's own message with its lines joined.
    """
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    top_key = re.search(r'Parser key "([^"]+)"', message)
    nested = re.search(r"NestedArg\(key='([^']+)'", message)
    where = (f"--{top_key.group(1)}" + (f".init_args.{nested.group(1)}" if nested else "") + ": ") if top_key else ""
    unknown_option = (re.search(r"does not accept option '([^']+)'", message)
                      or re.search(r"unrecognized arguments: (?:\w+ )?--([^=\s]+)", message))
    if unknown_option:
        key = unknown_option.group(1)
        group = re.match(r"Group '([^']+)' does not accept", message)
        key = f"{group.group(1)}.{key}" if group else key
        return f"unknown option '{key}'{_did_you_mean(key, _option_keys(parser))}."
    not_accepted = re.search(r"Option '([^']+)' is not accepted", message)
    if not_accepted:
        class_paths = re.findall(r"class_path(?:=| )'([^']+)'", message[: not_accepted.start()]) \
            + re.findall(r"class_path='([^']+)'", message[not_accepted.end():])
        owner = class_paths[-1] if class_paths else ""
        key = not_accepted.group(1)
        accepted = _accepted_arguments(owner) if owner else []
        return (f"{where}{owner.rpartition('.')[2] or 'the class'} does not accept the argument '{key}'"
                f"{_did_you_mean(key, accepted)}.")
    unknown_class = re.search(r"Expected a dot import path string: (\S+)", message) \
        or re.search(r"has no attribute '[^']+'\. Got value: (\S+)", message)
    if unknown_class:
        name = unknown_class.group(1)
        return f"{where}'{name}' is not a known class{_did_you_mean(name, _known_class_names())}."
    return text


def _without_subcommand(key: str) -> str:
    """'fit.trainer.max_epochs' -> 'trainer.max_epochs': users write a subcommand's keys without its name."""
    head, _, rest = key.partition(".")
    return rest if rest and head in LightningCLI.subcommands() else key


def explain_interpolation_error(err: OmegaConfBaseException, parser) -> str:
    """One line for a ``${...}`` in a config that does not resolve, named by its key and the key it refers to."""
    key = _without_subcommand(str(getattr(err, "full_key", "") or "")) or "config"
    reason = str(getattr(err, "msg", "") or err).splitlines()[0]
    # a file's ${a.b} is rewritten relative to its own key when read; OmegaConf then reports the key it reached
    reached = re.search(r"\(resolved to '([^']+)'\)", reason)
    if reached:
        target = _without_subcommand(reached.group(1))
        reason = f"the interpolated key '{target}' does not exist{_did_you_mean(target, _option_keys(parser))}"
    return f"{key}: {reason} (an interpolation names a key of the final config, e.g. ${{trainer.default_root_dir}})."


class CollectionArgumentParser(LightningArgumentParser):
    """A parser whose errors are one ``error:`` line (exit status 2) with the closest valid names; the full usage
    only on ``--help``."""

    def parse_args(self, *args, **kwargs):
        """Parse; an interpolation that does not resolve is a parse error, not an OmegaConf traceback."""
        try:
            return super().parse_args(*args, **kwargs)
        except OmegaConfBaseException as err:
            self.error(explain_interpolation_error(err, self), err)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            return super().error(message, ex)  # jsonargparse tries alternatives through these errors
        parser = getattr(ex, "subcommand_parser", None) or self
        command = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {explain_parse_error(message, parser)} ('{command} --help' lists every option)\n")
        self.exit(2)


# --------------------------------------------------------------------------------------- run-time errors
# Lightning's own refusals of a config value that already name the fix: shown as one error line, not a traceback.
LIGHTNING_INPUT_ERRORS = ("`val_check_interval`",)


def _is_config_option(arg: str) -> bool:
    return arg in ("--config", "-c")


def resolve_config_paths(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config`` file that does not exist relative to the working directory replaced by the
    collection's own file of that relative path (``configs/trew/quick.yaml``), when there is one.

    A file that exists where the user runs the command always wins, so a local edited copy of a config is used as
    given; only a missing relative path is looked up next to this module (the repository root in a checkout, the
    installed configs after ``pip install``). Anything else is left for the parser to report.
    """
    def resolve(path: str) -> str:
        if os.path.isabs(path) or os.path.exists(path):
            return path
        shipped = INSTALL_ROOT / path
        return str(shipped) if shipped.is_file() else path

    resolved = list(argv)
    for i, arg in enumerate(resolved):
        if _is_config_option(arg) and i + 1 < len(resolved):
            resolved[i + 1] = resolve(resolved[i + 1])
        elif arg.startswith("--config="):
            resolved[i] = "--config=" + resolve(arg.split("=", 1)[1])
    return resolved


def _prerequisites(argv: list[str]) -> list[str]:
    """The ``# prerequisite: <config>`` lines of the config files named on the command line."""
    configs = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if _is_config_option(arg)]
    configs += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    found = []
    for config in configs:
        try:
            with open(config, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        found += [m.group(1) for m in (re.match(r"#\s*prerequisite:\s*(\S+)\s*$", line) for line in lines) if m]
    return found


def explain_run_error(err: BaseException, argv: list[str], program: str = "python train.py") -> str | None:
    """The one error line for a user-input failure (None for anything else, which keeps its traceback)."""
    if isinstance(err, UserInputError):
        message = str(err)
        prerequisites = _prerequisites(argv)
        if prerequisites and "does not exist" in message and "init_from" in message:
            message += " This config starts from the checkpoint of " + " and ".join(prerequisites) \
                + ": run " + "; ".join(f"'{program} fit --config {p}'" for p in prerequisites) + " first."
        return message
    if isinstance(err, ValueError) and str(err).lstrip().startswith(LIGHTNING_INPUT_ERRORS):
        return f"trainer: {one_line(err)}"
    return None


class _DropLitLoggerTip(logging.Filter):
    """Lightning advertises a cloud logger on every run; the collection's runs stay quiet by default."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_DropLitLoggerTip())
# Lightning 2.6's pytree helper calls an API that torch >= 2.10 deprecates, once per fit; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


class CollectionCLI(LightningCLI):
    """LightningCLI with the data-derived links and checkpoint validation of this collection."""

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with the collection's progress bar (`callbacks.progress`) unless the config disables the
        bar or brings its own."""
        config = self._get(self.config_init, "trainer", default={})
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        if config.get("enable_progress_bar") is not False and not config.get("fast_dev_run") \
                and not any(isinstance(callback, ProgressBar) for callback in configured) \
                and "callbacks" not in self.trainer_defaults:
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": [default_progress_bar()]}
        return super().instantiate_trainer(**kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                                 help="Print the version of the collection and exit.")

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"seed_everything": 42})

    def instantiate_classes(self) -> None:
        """Instantiate, surfacing our own validation error instead of jsonargparse's Union wrapper."""
        try:
            super().instantiate_classes()
        except Exception as err:  # noqa: BLE001 - re-raised unchanged unless it wraps a UserInputError
            user_error = _find_user_error(err)
            if user_error is None:
                raise
            raise user_error from None

    def _parse_ckpt_path(self) -> None:
        """Read ``--ckpt_path`` safely, refuse a checkpoint of another model or datamodule class, then apply its
        hyper-parameters as LightningCLI does and say which configured values they replaced.

        LightningCLI's own version would load the file a second time (``torch.load`` with no error handling) and
        silently turn the run into whatever class the checkpoint names, so it is replaced here.
        """
        self._resume_checkpoint = None
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not isinstance(ckpt_path, str) or ckpt_path in ("last", "best", "hpc", "registry"):
            return  # no file yet: Lightning resolves these names itself when the run starts
        config = self.config[subcommand]
        weights_only = config.get("weights_only")
        checkpoint = read_checkpoint(ckpt_path, trusted=weights_only is False, what="--ckpt_path")
        self._resume_checkpoint = checkpoint
        if subcommand == "fit" and not {"optimizer_states", "loops"} <= set(checkpoint):
            raise UserInputError(
                f"--ckpt_path '{ckpt_path}' is a weights-only file, not a full Lightning training checkpoint, "
                "so training cannot resume from it. To start from these weights with a new config use "
                "--model.init_args.init_from instead.")
        _check_checkpoint_classes(ckpt_path, checkpoint, config, check_data=subcommand == "fit")
        hparams = checkpoint.get("hyper_parameters")
        hparams = {k: v for k, v in hparams.items() if k != "_instantiator"} if isinstance(hparams, dict) else {}
        if not hparams:
            return
        if "_class_path" in hparams:  # as LightningCLI._parse_ckpt_path does
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        before = _leaves_of(config.get("model"), "model")
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise
        _report_replaced_values(ckpt_path, before, _leaves_of(self.config[subcommand].get("model"), "model"))

    def _check_checkpoint_fits_model(self) -> None:
        """Refuse a ``--ckpt_path`` written by a different model before Lightning fails on it."""
        if self._resume_checkpoint is None:
            return
        own, state = self.model.state_dict(), self._resume_checkpoint["state_dict"]
        missing = [k for k in own if k not in state]
        mismatched = [k for k in own if k in state and state[k].shape != own[k].shape]
        if missing or mismatched:
            raise UserInputError(
                f"--ckpt_path does not fit {type(self.model).__name__} as configured ({len(missing)} missing "
                f"tensors, e.g. {missing[:3]}; {len(mismatched)} shape mismatches, e.g. {mismatched[:3]}). "
                "--ckpt_path resumes the *same* run; to fine-tune a different configuration use "
                "--model.init_args.init_from.")

    def before_fit(self) -> None:
        self._check_checkpoint_fits_model()

    before_validate = before_test = before_predict = before_fit


# "omegaconf+" resolves ``${...}`` once, on the final config (every --config file and flag applied), so overriding
# --trainer.default_root_dir moves every path that interpolates it. The config of a subcommand sits under its name
# (``fit.trainer...``); rewriting each file's absolute references relative to their own key lets a file say
# ``${trainer.default_root_dir}`` as it would with a single parser.
set_parsing_settings(omegaconf_absolute_to_relative_paths=True)

CLI_KWARGS = dict(
    model_class=LightningModule,
    datamodule_class=LightningDataModule,
    subclass_mode_model=True,
    subclass_mode_data=True,
    auto_configure_optimizers=False,
    save_config_callback=RunConfigSaver,
    parser_class=CollectionArgumentParser,
    parser_kwargs={"parser_mode": "omegaconf+"},
)


def main(args: list[str] | dict | None = None, run: bool = True, cli_class: type = CollectionCLI) -> LightningCLI:
    """Build (and with ``run=True`` execute) the CLI; ``args`` replaces ``sys.argv[1:]`` (tests)."""
    if isinstance(args, list):
        args = resolve_config_paths(args)
    return cli_class(args=args, run=run, **CLI_KWARGS)


def console_main() -> None:
    """``python train.py ...`` and the ``icml26`` console script: the CLI on ``sys.argv``, with ``--config`` paths
    resolved (`resolve_config_paths`); a user-input failure ends with one ``error:`` line and exit status 2."""
    sys.argv[1:] = resolve_config_paths(sys.argv[1:])
    program = "icml26" if Path(sys.argv[0]).stem == "icml26" else "python train.py"
    try:
        main()
    except ValueError as err:  # UserInputError, and Lightning's refusals of a config value
        explained = explain_run_error(err, sys.argv[1:], program)
        if explained is None:
            raise
        print(f"error: {explained}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    console_main()
