"""The paper registry: one card per paper, ``configs/<paper>/card.yaml``, naming where everything of that paper lives.

A card is a small flat YAML mapping (the keys are `FIELDS`): the paper (title, arXiv id, venue, its central claim),
its classes as dotted paths (LightningModules, datamodules, callbacks and injected components), its source files,
configs, sweep, experiment script, docs page, result files and tests. ``icml26 papers`` lists the cards;
``icml26 papers NAME`` prints one; ``python -m icml26.registry --readme`` rewrites README.md's paper table from them.

Loading checks what is cheap (keys, types, that every path exists, that every class's module is one of the card's
``files``); `check_classes` also imports every class and checks its kind (``tests/test_registry.py`` runs both).
A path under a top folder that a regular install does not ship (``docs/``, ``results/``, ``tests/``) is checked only
where that folder exists, so the installed command still shows every card.
"""
from __future__ import annotations

import difflib
import importlib
import re
import sys
import textwrap
from pathlib import Path

import yaml

from lightning_modules.shared.errors import UserInputError, one_line

ROOT = Path(__file__).resolve().parents[1]
CARD_FILE = "card.yaml"
# the folder of the shared GRPO/RLVR core: configs the RLVR papers use, not a paper of its own
SHARED_CONFIG_FOLDERS = ("grpo",)
README_BEGIN = ("<!-- papers:begin (generated from configs/*/card.yaml by `python -m icml26.registry --readme`; "
                "edit the cards, not this table) -->")
README_END = "<!-- papers:end -->"

FIELDS = {
    "name": "the paper's folder name under configs/",
    "title": "the paper's full title",
    "arxiv": "the arXiv id (e.g. '2506.20893'), or null",
    "venue": "where it was published (e.g. 'ICML 2026')",
    "claim": "the central claim in one sentence, as the docs page words it",
    "modules": "LightningModule classes as dotted paths",
    "datamodules": "LightningDataModule classes as dotted paths",
    "callbacks": "Callback classes as dotted paths",
    "components": "other classes injected into the modules (allocators, rewards, networks, schedulers)",
    "files": "the source files that define the paper's classes and helpers",
    "configs": "every config file the paper uses (quick, paper, stage and sweep files)",
    "sweep": "the main W&B sweep file (configs/sweeps/<x>.yaml), or null",
    "experiment": "the experiment script as a module (experiments.<x>), or null",
    "doc": "the docs page (docs/<x>.md)",
    "results": "the result JSON files under results/",
    "tests": "the paper's test files",
}
OPTIONAL_FIELDS = {"check": "the claim as a check on its result file (icml26 claims)"}
TEXT_FIELDS = ("title", "venue", "claim")
CLASS_FIELDS = ("modules", "datamodules", "callbacks", "components")
PATH_FIELDS = {"files": ".py", "configs": ".yaml", "results": ".json", "tests": ".py"}
NON_EMPTY = ("modules", "datamodules", "files", "configs")
NOT_SHIPPED = ("docs", "results", "tests")  # top folders a regular install lacks
ARXIV_ID = re.compile(r"^\d{4}\.\d{4,5}$")
DOTTED_CLASS = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


# ------------------------------------------------------------------------------------------------ loading
def _fail(path: Path, field: str | None, problem: str, fix: str) -> UserInputError:
    where = f"{_relative(path)}" + (f", field '{field}'" if field else "")
    return UserInputError(f"{where}: {problem}; {fix}")


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _closest(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _check_path(path: Path, root: Path, field: str, value, suffix: str) -> None:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in Path(value).parts:
        raise _fail(path, field, f"{value!r} is not a relative path", "give a path relative to the repository root")
    if not value.endswith(suffix):
        raise _fail(path, field, f"{value!r} is not a {suffix} file", f"list only {suffix} files here")
    top = Path(value).parts[0]
    if (top in NOT_SHIPPED and not (root / top).is_dir()) or (root / value).is_file():
        return
    raise _fail(path, field, f"{value} does not exist", "fix the path or create the file")


def _check_list(path: Path, field: str, value) -> list:
    if not isinstance(value, list):
        raise _fail(path, field, f"must be a list, not {type(value).__name__}", "write one '- item' per line")
    if field in NON_EMPTY and not value:
        raise _fail(path, field, "is empty", f"list {FIELDS[field]}")
    repeated = sorted({item for item in value if isinstance(item, str) and value.count(item) > 1})
    if repeated:
        raise _fail(path, field, f"lists {repeated} more than once", "list each entry once")
    return value


def load_card(path: Path, root: Path | None = None) -> dict:
    """Read and validate one card; raises `UserInputError` naming the card and the field."""
    path, root = Path(path), Path(root or ROOT)
    try:
        card = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise _fail(path, None, f"cannot be read as YAML ({one_line(err)})", "fix the file") from None
    if not isinstance(card, dict):
        raise _fail(path, None, "is not a YAML mapping", f"write one 'key: value' line per field: {', '.join(FIELDS)}")
    for key in card:
        if key not in FIELDS and key not in OPTIONAL_FIELDS:
            raise _fail(path, str(key), f"is not a card field{_closest(str(key), [*FIELDS, *OPTIONAL_FIELDS])}",
                        f"the fields are {', '.join([*FIELDS, *OPTIONAL_FIELDS])}")
    missing = [key for key in FIELDS if key not in card]
    if missing:
        raise _fail(path, missing[0], "is missing", f"add it: {FIELDS[missing[0]]}")

    if card["name"] != path.parent.name:
        raise _fail(path, "name", f"{card['name']!r} is not the card's folder name {path.parent.name!r}",
                    f"write name: {path.parent.name}")
    for field in TEXT_FIELDS:
        if not isinstance(card[field], str) or not card[field].strip() or "\n" in card[field].strip():
            raise _fail(path, field, "must be one non-empty line of text", f"write {FIELDS[field]}")
    if card["arxiv"] is not None and not (isinstance(card["arxiv"], str) and ARXIV_ID.match(card["arxiv"])):
        raise _fail(path, "arxiv", f"{card['arxiv']!r} is not an arXiv id",
                    "write it quoted, e.g. '2506.20893', or null")

    for field, suffix in PATH_FIELDS.items():
        for value in _check_list(path, field, card[field]):
            _check_path(path, root, field, value, suffix)
    files = set(card["files"])
    for field in CLASS_FIELDS:
        for value in _check_list(path, field, card[field]):
            if not isinstance(value, str) or not DOTTED_CLASS.match(value):
                raise _fail(path, field, f"{value!r} is not a dotted class path",
                            "write package.module.Class, e.g. lightning_modules.rlvr.grpo.GRPO")
            module_file = value.rsplit(".", 1)[0].replace(".", "/") + ".py"
            if not (root / module_file).is_file():
                raise _fail(path, field, f"{value}: no module file {module_file}", "fix the module part of the path")
            if module_file not in files:
                raise _fail(path, field, f"{value} is defined in {module_file}, which 'files' does not list",
                            f"add {module_file} to files")

    if card["sweep"] is not None:
        _check_path(path, root, "sweep", card["sweep"], ".yaml")
        if not card["sweep"].startswith("configs/sweeps/") or card["sweep"] not in card["configs"]:
            raise _fail(path, "sweep", f"{card['sweep']} is not a configs/sweeps/ file listed in 'configs'",
                        "name a sweep file under configs/sweeps/ and list it in configs too")
    experiment = card["experiment"]
    if experiment is not None:
        if not (isinstance(experiment, str) and re.match(r"^experiments\.\w+$", experiment)):
            raise _fail(path, "experiment", f"{experiment!r} is not a module name experiments.<x>",
                        "write e.g. experiments.trew, or null")
        _check_path(path, root, "experiment", experiment.replace(".", "/") + ".py", ".py")
    if not isinstance(card["doc"], str) or not card["doc"].startswith("docs/"):
        raise _fail(path, "doc", f"{card['doc']!r} is not a page under docs/", "write e.g. docs/trew.md")
    _check_path(path, root, "doc", card["doc"], ".md")
    return card


def paper_names(root: Path | None = None) -> list[str]:
    """The folder names that hold a card, sorted (nothing is read: a broken card still has a name)."""
    return sorted(p.parent.name for p in Path(root or ROOT).glob(f"configs/*/{CARD_FILE}"))


def papers(root: Path | None = None) -> list[dict]:
    """Every card, validated, in a stable order (by name)."""
    return [load_card(Path(root or ROOT) / "configs" / name / CARD_FILE, root) for name in paper_names(root)]


def card(name: str, root: Path | None = None) -> dict:
    """The card of paper `name`; an unknown name is a `UserInputError` with the closest names."""
    names = paper_names(root)
    if name not in names:
        raise UserInputError(f"no paper named {name!r}{_closest(name, names)}; `icml26 papers` lists them")
    return load_card(Path(root or ROOT) / "configs" / name / CARD_FILE, root)


def check_classes(paper: dict) -> None:
    """Import every class of a card and check its kind against its field (a LightningModule under ``modules``, ...)."""
    from lightning.pytorch import Callback, LightningDataModule, LightningModule

    kinds = {"modules": LightningModule, "datamodules": LightningDataModule, "callbacks": Callback,
             "components": object}
    path = ROOT / "configs" / paper["name"] / CARD_FILE
    for field, kind in kinds.items():
        for dotted in paper[field]:
            module_name, _, class_name = dotted.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError) as err:
                raise _fail(path, field, f"{dotted} does not import ({one_line(err)})", "fix the class path") from None
            if not isinstance(cls, type) or not issubclass(cls, kind):
                raise _fail(path, field, f"{dotted} is not a {kind.__name__} class",
                            f"move it to the field of its kind ({', '.join(kinds)})")


# ------------------------------------------------------------------------------------------------ reading a card
def quick_config(paper: dict) -> str | None:
    """The paper's quick config: configs/<name>/quick.yaml, else its first *quick.yaml."""
    quick = [c for c in paper["configs"] if c.endswith("quick.yaml")]
    main = f"configs/{paper['name']}/quick.yaml"
    return main if main in quick else (quick[0] if quick else None)


def prerequisites(config: str, root: Path | None = None) -> list[str]:
    """The configs to fit before `config`, in order: its ``# prerequisite: <config>`` comment line, followed."""
    root, chain, current = Path(root or ROOT), [], config
    while (root / current).is_file():
        found = re.findall(r"^#\s*prerequisite:\s*(\S+)\s*$", (root / current).read_text(), flags=re.M)
        if not found or found[0] in chain or found[0] == config:
            break
        chain.insert(0, found[0])
        current = found[0]
    return chain


def _short(dotted: str) -> str:
    return dotted.rsplit(".", 1)[-1]


def format_card(paper: dict, root: Path | None = None) -> str:
    """A card as text for a terminal: the paper, its claim, how to start, then every field."""
    width = 12
    lines = [f"{paper['name']}: {paper['title']}"]
    source = f"arXiv {paper['arxiv']} (https://arxiv.org/abs/{paper['arxiv']})" if paper["arxiv"] else "no arXiv id"
    lines.append(f"{'':{width}} {source}, {paper['venue']}")

    def row(key: str, values) -> None:
        values = [values] if isinstance(values, str) else list(values)
        for i, value in enumerate(values or ["-"]):
            lines.append(f"{key if i == 0 else '':{width}} {value}")

    row("claim", textwrap.wrap(paper["claim"], 100))
    quick = quick_config(paper)
    if quick:
        before = prerequisites(quick, root)
        row("quick", quick + (f"  (fit first: {', '.join(before)})" if before else ""))
    for field in ("modules", "datamodules", "callbacks", "components", "files", "configs"):
        row(field, paper[field])
    row("sweep", paper["sweep"] or "-")
    row("experiment", f"python -m {paper['experiment']}" if paper["experiment"] else "-")
    protocol = f"configs/{paper['name']}/experiment.yaml"
    if (Path(root or ROOT) / protocol).is_file():
        row("protocol", f"{protocol}  (icml26 experiment {paper['name']})")
    row("doc", paper["doc"])
    row("results", paper["results"])
    row("tests", paper["tests"])
    if "check" in paper:
        row("check", _check_summary(paper["check"]))
    return "\n".join(lines)


def _check_summary(check) -> list[str]:
    """The claim check in a few lines: its result file and the label of every comparison (``icml26 claims``)."""
    def labels(node) -> list[str]:
        if isinstance(node, dict):
            own = [str(node["label"])] if "label" in node else []
            return own + [label for key, value in node.items() if key != "label" for label in labels(value)]
        return [label for value in node for label in labels(value)] if isinstance(node, list) else []

    found = labels(check)
    if not found:
        return yaml.safe_dump(check, sort_keys=False, default_flow_style=True, width=100).rstrip().splitlines()
    result = [f"on {check['result']}"] if isinstance(check, dict) and "result" in check else []
    return result + [f"- {label}" for label in found]


# ------------------------------------------------------------------------------------------------ README table
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def readme_table(cards: list[dict]) -> str:
    """README.md's paper table (between `README_BEGIN` and `README_END`), one row per card."""
    rows = [README_BEGIN,
            "| paper | modules | data | callbacks and injected pieces | configs | experiment |",
            "|---|---|---|---|---|---|"]
    for paper in cards:
        source = f"arXiv {paper['arxiv']}" if paper["arxiv"] else paper["venue"]
        folder = f"configs/{paper['name']}/"
        configs = [folder] + [c for c in paper["configs"] if not c.startswith((folder, "configs/sweeps/"))]
        rows.append("| " + " | ".join([
            _cell(f"[{paper['name']}]({paper['doc']}): {paper['title']} ({source})"),
            ", ".join(f"`{_short(c)}`" for c in paper["modules"]),
            ", ".join(f"`{_short(c)}`" for c in paper["datamodules"]),
            ", ".join(f"`{_short(c)}`" for c in paper["callbacks"] + paper["components"]) or "-",
            ", ".join(f"`{c}`" for c in configs),
            f"`python -m {paper['experiment']}`" if paper["experiment"] else "-",
        ]) + " |")
    rows.append(README_END)
    return "\n".join(rows)


def readme_with_table(readme: str, cards: list[dict]) -> str:
    """`readme` with the text between the two markers replaced by the generated table."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise UserInputError(f"README.md lacks the paper table markers; put {README_BEGIN} and {README_END} "
                             "on their own lines where the table goes")
    return readme[:begin] + readme_table(cards) + readme[end + len(README_END):]


# ------------------------------------------------------------------------------------------------ commands
USAGE = """usage: icml26 papers [NAME] [--check]

  icml26 papers          one line per paper: name, quick config, title
  icml26 papers NAME     the paper's card: claim, classes, files, configs, experiment, docs, results, tests
  icml26 papers --check  validate every card, importing every class it names"""


def papers_command(argv: list[str]) -> int:
    """``icml26 papers [NAME] [--check]``; returns the exit code (2 for a bad name or a broken card)."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        return 0
    options = [arg for arg in argv if arg.startswith("-")]
    names = [arg for arg in argv if not arg.startswith("-")]
    try:
        if set(options) - {"--check"} or len(names) > 1 or (names and options):
            raise UserInputError(f"unexpected arguments {argv}; usage: icml26 papers [NAME] | icml26 papers --check")
        if names:
            print(format_card(card(names[0])))
            return 0
        cards = papers()
        if options:
            for paper in cards:
                check_classes(paper)
            print(f"{len(cards)} paper cards are valid; every class they name imports and has its field's kind")
            return 0
        width = max(len(p["name"]) for p in cards)
        quick_width = max(len(quick_config(p) or "-") for p in cards)
        for paper in cards:
            print(f"{paper['name']:{width}}  {quick_config(paper) or '-':{quick_width}}  {paper['title']}")
        print(f"\n{len(cards)} papers; `icml26 papers NAME` shows where every file of a paper lives")
        return 0
    except UserInputError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m icml26.registry --readme`` rewrites README.md's paper table; other arguments as ``icml26 papers``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--readme"]:
        return papers_command(argv)
    readme = ROOT / "README.md"
    try:
        text = readme.read_text()
        updated = readme_with_table(text, papers())
    except UserInputError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    if updated != text:
        readme.write_text(updated)
    print(f"README.md: paper table {'rewritten' if updated != text else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
