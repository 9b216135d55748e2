"""Declared dependencies match the code: every third-party package the collection imports is declared (in
``install_requires`` or an extra), every ``install_requires`` entry is used, and packages outside the base
install are only imported where a missing package cannot break ``import train``.

Read from the source with ``ast`` (nothing is imported); the parse and the package scan run once.
"""
from __future__ import annotations

import ast
import configparser
import functools
import importlib.metadata
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_modules", "datamodules", "callbacks", "experiments", "icml26")
LOCAL = {"train", *PACKAGES}
# Optional packages the collection uses when present and never declares (each import is guarded).
UNDECLARED_OPTIONAL = {"recbole": "experiments/recbole_parity.py compares against it when installed",
                       "mamba_ssm": "BiMamba-2's fused CUDA kernel, used when it imports",
                       "gymnasium": "PhyB's evaluation in MuJoCo tasks (D4RL); the embedded environments are numpy"}
# Declared packages that the code reaches through another library, not through an import of its own:
# (file, text that must appear there) shows the use.
USED_THROUGH_LIBRARIES = {"jsonargparse": ("train.py", "LightningCLI"),
                          "omegaconf": ("train.py", "omegaconf"),
                          "wandb": ("configs/logger/wandb.yaml", "WandbLogger")}


def _files() -> list[Path]:
    return [REPO / "train.py", *sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))]


def _requirement_names(lines: str) -> set[str]:
    names = set()
    for line in lines.strip().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower().replace("_", "-"))
    return names


def _declared() -> tuple[set[str], set[str]]:
    """(install_requires, every extra) as normalised distribution names."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    base = _requirement_names(cfg["options"]["install_requires"])
    extras = set()
    for value in cfg["options.extras_require"].values():
        extras |= _requirement_names(value)
    return base, extras


@functools.lru_cache(maxsize=None)
def _imports() -> list[tuple[Path, int, str, bool]]:
    """(file, line, top-level module, guarded) for every import; guarded = inside a function or a try block."""
    found = []

    def visit(node: ast.AST, path: Path, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = guarded or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Try))
            if isinstance(child, ast.Import):
                found.extend((path, child.lineno, alias.name.split(".")[0], guarded) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((path, child.lineno, child.module.split(".")[0], guarded))
            visit(child, path, inner)

    for path in _files():
        visit(ast.parse(path.read_text(), str(path)), path, False)
    return found


@functools.lru_cache(maxsize=None)
def _module_owners() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()  # scans every installed distribution: once


def _distribution(module: str) -> str | None:
    names = _module_owners().get(module)
    return names[0].lower().replace("_", "-") if names else None


def _third_party() -> list[tuple[Path, int, str, bool]]:
    return [(p, n, m, g) for p, n, m, g in _imports()
            if m not in LOCAL and m not in sys.stdlib_module_names and m != "__future__"]


def test_every_imported_package_is_declared():
    base, extras = _declared()
    problems = []
    for path, line, module, _ in _third_party():
        if module in UNDECLARED_OPTIONAL:
            continue
        dist = _distribution(module) or module
        if dist not in base | extras:
            problems.append(f"{path.relative_to(REPO)}:{line} imports {module} ({dist}), which setup.cfg does not "
                            "declare")
    assert not problems, "\n".join(problems)


def test_every_base_dependency_is_used():
    base, _ = _declared()
    imported = {_distribution(m) or m for _, _, m, _ in _third_party()}
    for name, (path, text) in USED_THROUGH_LIBRARIES.items():
        assert text in (REPO / path).read_text(), f"{name} is declared for {text} in {path}, which is gone"
    unused = sorted(base - imported - set(USED_THROUGH_LIBRARIES))
    assert not unused, f"setup.cfg install_requires declares {unused}, which nothing in the collection uses"


def test_packages_outside_the_base_install_are_imported_lazily():
    base, _ = _declared()
    eager = [f"{path.relative_to(REPO)}:{line} imports {module} at import time"
             for path, line, module, guarded in _third_party()
             if not guarded and (_distribution(module) or module) not in base]
    assert not eager, "\n".join(eager)
