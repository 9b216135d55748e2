"""Turn jsonargparse's and OmegaConf's multi-line messages into one ``error:`` line that names the bad key or value
and the closest valid ones, and turn user-input failures at run time into one line too (`explain_run_error`)."""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from omegaconf.errors import OmegaConfBaseException

from icml26.collection import COLLECTION_PACKAGE_NAMES, is_config_option
from lightning_modules.errors import UserInputError, one_line


def class_of(class_path: str) -> type | str:
    """The class a dotted path names (jsonargparse and checkpoints may spell one class by different modules)."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return class_path


def known_class_names() -> list[str]:
    """Short names a user may give for a class: the collection's classes, Lightning's callbacks and loggers,
    torch's optimisers and schedules."""
    import lightning.pytorch.callbacks as pl_callbacks
    import lightning.pytorch.loggers as pl_loggers
    import torch.optim
    import torch.optim.lr_scheduler
    modules = [module for name, module in list(sys.modules.items())
               if name.partition(".")[0] in COLLECTION_PACKAGE_NAMES and module is not None]
    modules += [pl_callbacks, pl_loggers, torch.optim, torch.optim.lr_scheduler]
    return sorted({name for module in modules for name, value in vars(module).items()
                   if isinstance(value, type) and not name.startswith("_")})


def accepted_arguments(class_path: str) -> list[str]:
    """The ``__init__`` argument names of a class and of every base class its ``**kwargs`` reach."""
    cls = class_of(class_path)
    names: list[str] = []
    for klass in (cls.__mro__ if isinstance(cls, type) else ()):
        try:
            parameters = inspect.signature(klass.__init__).parameters if "__init__" in vars(klass) else {}
        except (TypeError, ValueError):  # a builtin without a readable signature
            parameters = {}
        names += [name for name, p in parameters.items()
                  if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    return list(dict.fromkeys(names))


def option_keys(parser) -> list[str]:
    """Every ``--dotted.key`` the parser and its subcommand parsers accept, without the dashes."""
    keys, stack = [], [parser]
    while stack:
        current = stack.pop()
        keys += [option[2:] for option in current._option_string_actions if option.startswith("--")]
        stack += [choice for action in current._actions
                  for choice in (getattr(action, "choices", None) or {}).values()
                  if isinstance(choice, LightningArgumentParser)]
    return sorted(set(keys))


def did_you_mean(name: str, candidates: list[str]) -> str:
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
        return f"unknown option '{key}'{did_you_mean(key, option_keys(parser))}."
    not_accepted = re.search(r"Option '([^']+)' is not accepted", message)
    if not_accepted:
        class_paths = re.findall(r"class_path(?:=| )'([^']+)'", message[: not_accepted.start()]) \
            + re.findall(r"class_path='([^']+)'", message[not_accepted.end():])
        owner = class_paths[-1] if class_paths else ""
        key = not_accepted.group(1)
        accepted = accepted_arguments(owner) if owner else []
        return (f"{where}{owner.rpartition('.')[2] or 'the class'} does not accept the argument '{key}'"
                f"{did_you_mean(key, accepted)}.")
    unknown_class = re.search(r"Expected a dot import path string: (\S+)", message) \
        or re.search(r"has no attribute '[^']+'\. Got value: (\S+)", message)
    if unknown_class:
        name = unknown_class.group(1)
        return f"{where}'{name}' is not a known class{did_you_mean(name, known_class_names())}."
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
        reason = f"the interpolated key '{target}' does not exist{did_you_mean(target, option_keys(parser))}"
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


# Lightning's own refusals of a config value that already name the fix: shown as one error line, not a traceback.
LIGHTNING_INPUT_ERRORS = ("`val_check_interval`",)


def find_user_error(err: BaseException | None) -> UserInputError | None:
    """The UserInputError somewhere in an exception's cause/context chain, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserInputError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def prerequisites(argv: list[str]) -> list[str]:
    """The ``# prerequisite: <config>`` lines of the config files named on the command line."""
    configs = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if is_config_option(arg)]
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
        needed = prerequisites(argv)
        if needed and "does not exist" in message and "init_from" in message:
            message += " This config starts from the checkpoint of " + " and ".join(needed) \
                + ": run " + "; ".join(f"'{program} fit --config {p}'" for p in needed) + " first."
        return message
    if isinstance(err, ValueError) and str(err).lstrip().startswith(LIGHTNING_INPUT_ERRORS):
        return f"trainer: {one_line(err)}"
    return None
