"""The README's Layout block and the paper cards together name every file of the collection's packages, so the map
a new reader uses cannot fall behind the tree (a paper's files are in its card, the shared ones in the Layout)."""
from __future__ import annotations

import re

from conftest import REPO
from icml26 import registry


def layout_block() -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(r"^## Layout\n\n```\n(.*?)^```", readme, flags=re.S | re.M)
    assert match, "README.md has no fenced block under '## Layout'"
    return match.group(1)


def test_every_module_file_is_in_the_layout_or_in_a_card():
    block = layout_block()
    in_cards = {path for card in registry.papers() for path in card["files"]}
    missing = [str(path.relative_to(REPO)) for package in ("lightning_modules", "datamodules", "callbacks")
               for path in sorted((REPO / package).rglob("*.py"))
               if path.name != "__init__.py" and str(path.relative_to(REPO)) not in in_cards
               and not re.search(rf"\b{re.escape(path.name)}\b", block)]
    assert not missing, f"neither README.md's Layout nor a paper card (its 'files') names {missing}"


def test_every_experiment_file_is_in_the_layout_or_run_by_the_docs():
    """Paper scripts are run by a documented ``python -m experiments.<name>`` command; anything else (the kit,
    shared helpers, tools) is named in the Layout."""
    block = layout_block()
    docs = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    missing = [path.name for path in sorted((REPO / "experiments").glob("*.py"))
               if path.name != "__init__.py" and f"experiments.{path.stem}" not in docs
               and not re.search(rf"\b{re.escape(path.name)}\b", block)]
    assert not missing, f"experiments/{missing}: neither run by a documented command nor named in the Layout"
