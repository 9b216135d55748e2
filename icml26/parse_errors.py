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
from lightning_modules.shared.errors import UserInputError, one_line


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


def known_class_paths(bases: tuple[type, ...] = ()) -> list[str]:
    """Importable dotted paths of the classes `known_class_names` lists (only subclasses of `bases` when given):
    the collection's classes by their defining module, Lightning's and torch's by the public module."""
    import lightning.pytorch.callbacks as pl_callbacks
    import lightning.pytorch.loggers as pl_loggers
    import torch.optim
    import torch.optim.lr_scheduler
    def wanted(attr: str, value) -> bool:
        return isinstance(value, type) and not attr.startswith("_") and (not bases or issubclass(value, bases))

    paths = [f"{name}.{attr}" for name, module in list(sys.modules.items())
             if name.partition(".")[0] in COLLECTION_PACKAGE_NAMES and module is not None
             for attr, value in vars(module).items() if wanted(attr, value) and value.__module__ == name]
    public = (pl_callbacks, pl_loggers, torch.optim, torch.optim.lr_scheduler)
    paths += [f"{module.__name__}.{attr}" for module in public for attr, value in vars(module).items()
              if wanted(attr, value)]
    return sorted(set(paths))


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
    own_key = nested and nested.group(1).partition(".")[0] in ("class_path", "init_args")  # --model.class_path=X
    where = (f"--{top_key.group(1)}.{'' if own_key else 'init_args.'}{nested.group(1)}: " if nested
             else f"--{'.init_args.'.join(_key_chain(message))}: " if top_key else "")
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
    unknown_class = (re.search(r"Problem with given class_path '([^']+)':\s*(?:module '[^']*' has no attribute|"
                               r"No module named)", message)
                     or re.search(r"Expected a dot import path string: (\S+)", message)
                     or re.search(r"has no attribute '[^']+'\. Got value: Namespace\(class_path='([^']+)'", message)
                     or re.search(r"has no attribute '[^']+'\. Got value: (\S+)", message))
    if unknown_class:
        name = unknown_class.group(1)
        return f"{where}'{name}' is not a known class{closest_classes(name, expected_bases(message, nested))}."
    wrong_type = explain_type_error(message)
    if wrong_type:
        return f"{where or 'value: '}{wrong_type}"
    return text


def expected_bases(message: str, nested) -> tuple[type, ...]:
    """The classes a misspelt class had to subclass, read from jsonargparse's message: the return type of a
    callable (an optimizer), else the Union's subtypes of a top-level key (``LightningModule``, ``Callback``)."""
    returns = re.search(r"Type typing\.Callable\[.*\], ([\w.]+)\] expects", message)
    subtypes = re.search(r"Subtypes: \[(.*)\]", message)
    text = returns.group(1) if returns else (subtypes.group(1) if subtypes and not nested else "")
    found = (class_of(name) for name in re.findall(r"[A-Za-z_]\w*(?:\.\w+)+", text)
             if not name.startswith(("typing.", "collections.")))
    return tuple(cls for cls in found if isinstance(cls, type))


def closest_classes(name: str, bases: tuple[type, ...]) -> str:
    """' (did you mean ...?)' among the known classes: dotted paths for a dotted name (the paths whose class name is
    close first, then close whole paths), short names otherwise; subclasses of `bases` first, any known class when
    none of those is close."""
    if "." in name:
        for paths in ([known_class_paths(bases)] if bases else []) + [known_class_paths()]:
            by_class = {}
            for path in paths:
                by_class.setdefault(path.rpartition(".")[2], []).append(path)
            close = difflib.get_close_matches(name.rpartition(".")[2], list(by_class), n=3, cutoff=0.6)
            matches = [path for short in close for path in by_class[short]]
            matches += difflib.get_close_matches(name, paths, n=3, cutoff=0.8)
            matches = list(dict.fromkeys(matches))[:3]
            if matches:
                return f" (did you mean {' or '.join(matches)}?)"
        return ""
    short = sorted({path.rpartition(".")[2] for path in known_class_paths(bases)}) if bases else []
    return (short and did_you_mean(name, short)) or did_you_mean(name, known_class_names())


TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "NoneType": "null",
              "dict": "a mapping", "list": "a list"}


def _type_words(expected: str) -> str:
    """``<class 'int'>`` -> 'an integer', ``<class 'pathlib.Path'>`` -> 'a Path'."""
    name = re.fullmatch(r"<class '([^']+)'>", expected)
    name = name.group(1) if name else expected
    return TYPE_WORDS.get(name, f"a {name.rpartition('.')[2]}")


def _key_chain(message: str) -> list[str]:
    """["model", "optimizer"]: the ``Parser key`` entries leading to the innermost one of a nested message (a class's
    init argument given in a config file is reported under the key of the class)."""
    lines = message.splitlines()
    chain, indent = [], None
    for line in reversed(lines):
        key = re.match(r'(\s*)Parser key "([^"]+)":', line)
        if key and (indent is None or len(key.group(1)) < indent):
            chain.insert(0, key.group(2))
            indent = len(key.group(1))
    return chain


def _innermost_block(message: str) -> list[str]:
    """The lines of the innermost ``Parser key "..."`` entry of a (nested) jsonargparse message."""
    lines = message.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r'\s*Parser key "[^"]+":', line)]
    if not starts:
        return lines
    start = starts[-1]
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return block


def explain_type_error(message: str) -> str | None:
    """'expected an integer or null, got 'abc'.' for a value of the wrong type (None for any other message)."""
    block = _innermost_block(message)
    errors = [line.strip()[2:] for line in block if line.strip().startswith("- ")]
    single = [line.strip() for line in block if line.strip().startswith("Expected a ")]
    expectations = errors if errors else single
    if not expectations or not all(e.startswith("Expected a ") for e in expectations):
        return None
    expected = [re.sub(r"\. Got value: .*$", "", e[len("Expected a "):]).strip() for e in expectations]
    literals = [v for e in expected for v in (re.fullmatch(r"typing\.Literal\[(.*)\]", e) or [None, ""])[1].split(", ")
                if v]
    expected = list(dict.fromkeys(_type_words(e) for e in expected if not e.startswith("typing.Literal[")))
    if literals:
        expected.append(f"one of {', '.join(dict.fromkeys(literals))}" if len(literals) > 1 else literals[0])
    value = re.search(r"(?:Got|Given) value: (.*)$", "\n".join(block), flags=re.MULTILINE)
    got = f", got '{value.group(1).strip()}'" if value else ""
    either = ", ".join(expected[:-1]) + f" or {expected[-1]}" if len(expected) > 1 else expected[0]
    return f"expected {either}{got}."


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
