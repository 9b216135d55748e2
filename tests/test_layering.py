"""The import floors of the collection, checked on every file so the rule holds as papers move in.

Floors, from the ground up: ``lightning_modules`` (models, losses, injected strategy objects), ``datamodules``
(data; from the models only the shared pure modules in ``DATAMODULE_ALLOWED``), ``callbacks`` (may import both),
then ``train.py``, ``icml26`` (the command's support code) and ``experiments``. Every import counts, including
those inside functions and ``importlib.import_module("...")`` calls with a literal name.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_modules", "datamodules", "callbacks")
PROJECT = {*PACKAGES, "train", "experiments", "icml26", "tests"}
# the only model modules a datamodule may import: the shared error type and the pure answer-checking helpers
# (the RLVR verifier and the multi-answer format, which the SFT targets of many_answer_tasks are written in)
DATAMODULE_ALLOWED = {"lightning_modules.shared.errors", "lightning_modules.rlvr.answers",
                      "lightning_modules.causcibench.causal_methods",
                      "lightning_modules.multi_answer_rl.multi_answer_protocol"}
FORBIDDEN = {
    "lightning_modules": {"datamodules", "callbacks", "experiments", "icml26", "train", "tests"},
    "datamodules": {"lightning_modules", "callbacks", "experiments", "icml26", "train", "tests"},
    "callbacks": {"experiments", "icml26", "train", "tests"},
}
HEAVY_LIBRARIES = ("diffusers", "timm")


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the code of module `module` (dotted)."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                parts = package.split(".")
                base = ".".join(parts[:max(0, len(parts) - node.level + 1)])
                name = ".".join(part for part in (base, node.module) if part)
            else:
                name = node.module
            if name.split(".")[0] in PROJECT and (ROOT / name.replace(".", "/")).is_dir():
                # `from lightning_modules.shared import errors` imports the submodule
                found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(source: str, module: str) -> list[str]:
    """Imports of `module` (e.g. ``datamodules.images``) that cross the agreed boundary."""
    floor = module.split(".")[0]
    bad = []
    for line, name in imported_modules(source, module):
        top = name.split(".")[0]
        if top not in FORBIDDEN.get(floor, ()):
            continue
        if floor == "datamodules" and top == "lightning_modules" and name in DATAMODULE_ALLOWED:
            continue
        bad.append(f"{module}:{line} imports {name}")
    return bad


def collection_files() -> list[tuple[str, Path]]:
    return [(".".join(path.relative_to(ROOT).with_suffix("").parts), path) for package in PACKAGES
            for path in sorted((ROOT / package).rglob("*.py"))]


# --------------------------------------------------------------------------------------------- the checker
@pytest.mark.parametrize("module, source", [
    ("lightning_modules.rlvr.grpo", "from datamodules.verifiable_tasks import answers_match"),
    ("lightning_modules.rlvr.grpo", "import callbacks.rollout_allocation"),
    ("lightning_modules.rlvr.grpo", "def f():\n    from experiments.kit import quiet_trainer"),
    ("lightning_modules.rlvr.grpo", "class A:\n    def f(self):\n        import train"),
    ("lightning_modules.rlvr.grpo", "from ...datamodules import images"),
    ("lightning_modules.rlvr.grpo", "import importlib\nimportlib.import_module('datamodules.images')"),
    ("datamodules.interaction_graph", "from lightning_modules.nt_ssm.nt_ssm import normalized_adjacency"),
    ("datamodules.many_answer_tasks",
     "def f():\n    from lightning_modules.multi_answer_rl.multi_answer_rl import format_completion"),
    ("datamodules.images", "from lightning_modules.shared import classifier"),
    ("datamodules.images", "import lightning_modules"),
    ("datamodules.images", "from callbacks.ema import EMAWeights"),
    ("callbacks.ema", "from experiments import kit"),
    ("callbacks.ema", "import train"),
])
def test_checker_flags_a_crossing_import(module, source):
    assert violations(source, module), source


@pytest.mark.parametrize("module, source", [
    ("lightning_modules.rlvr.grpo",
     "from lightning_modules.rlvr.rollout_allocation import RolloutAllocator\nimport torch"),
    ("lightning_modules.rlvr.grpo", "from . import errors\nfrom .answers import answers_match"),
    ("datamodules.images",
     "from lightning_modules.shared.errors import UserInputError\nfrom datamodules.readers import x"),
    ("datamodules.verifiable_tasks", "from lightning_modules.rlvr import answers"),
    ("datamodules.many_answer_tasks",
     "from lightning_modules.multi_answer_rl.multi_answer_protocol import format_completion"),
    ("callbacks.trew", "from lightning_modules.trew.trew import class_similarity\nfrom datamodules.sequences import w"),
])
def test_checker_accepts_imports_within_the_rule(module, source):
    assert violations(source, module) == []


# --------------------------------------------------------------------------------------------- the collection
def test_no_file_imports_across_the_boundary():
    found = [v for module, path in collection_files() for v in violations(path.read_text(), module)]
    assert found == [], "imports across the layering rule (see tests/test_layering.py):\n" + "\n".join(found)


def test_the_model_modules_datamodules_may_import_are_pure():
    """The allowlist stays light: only the standard library and each other (no torch, no models)."""
    for module in sorted(DATAMODULE_ALLOWED):
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        heavy = [name for _, name in imported_modules(source, module)
                 if name.split(".")[0] not in sys.stdlib_module_names and name not in DATAMODULE_ALLOWED]
        assert heavy == [], f"{module} imports {heavy}"


def test_package_inits_import_nothing_from_the_collection():
    inits = [(module, path) for module, path in collection_files() if module.endswith(".__init__")]
    assert len(inits) > len(PACKAGES)  # the packages and lightning_modules' per-paper subpackages
    for module, path in inits:
        names = [name for _, name in imported_modules(path.read_text(), module) if name.split(".")[0] in PROJECT]
        assert names == [], f"{path.relative_to(ROOT)} imports {names}: importing one module would load them all"


def test_importing_the_data_floor_loads_no_models_and_no_heavy_libraries():
    """Every datamodule imported in a fresh interpreter: no diffusers/timm, no model module beyond the allowlist."""
    modules = [module for module, _ in collection_files() if module.startswith("datamodules.")]
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {modules!r}:
            importlib.import_module(name)
        print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_LIBRARIES!r} + ('lightning_modules',)))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    loaded = set(eval(result.stdout.strip().splitlines()[-1]))  # noqa: S307 - our own printed list
    packages = {"lightning_modules", *(name.rsplit(".", 1)[0] for name in DATAMODULE_ALLOWED)}
    assert loaded <= DATAMODULE_ALLOWED | packages, loaded


def test_importing_the_images_datamodule_does_not_load_diffusers_or_timm():
    code = "import sys, datamodules.images; print([m for m in ('diffusers', 'timm') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# --------------------------------------------------------------------------------------------- short CLI names
def test_train_imports_every_module_of_the_collection():
    import train

    on_disk = {module for module, _ in collection_files() if not module.endswith(".__init__")}
    assert set(train.COLLECTION_MODULES) == on_disk
    assert on_disk <= set(sys.modules)


def _defined_by_a_test(class_path: str) -> bool:
    top = class_path.split(".")[0]
    return top in ("tests", "conftest") or top.startswith("test_")


def _injectable_bases() -> tuple[type, ...]:
    from lightning.pytorch import Callback, LightningDataModule, LightningModule
    from torch.optim.lr_scheduler import LRScheduler

    from lightning_modules.rlvr.grpo import RewardFunction
    from lightning_modules.rlvr.rollout_allocation import RolloutAllocator
    return LightningModule, LightningDataModule, Callback, LRScheduler, RolloutAllocator, RewardFunction


def test_every_collection_class_resolves_by_its_short_name():
    """What jsonargparse does for ``--model GRPO`` or ``class_path: KnapsackAllocator``, for every such class."""
    from jsonargparse._typehints import get_all_subclass_paths

    import train  # noqa: F401 - imports the collection, as the CLI does

    checked, problems = [], []
    for module_name, _ in collection_files():
        if module_name.endswith(".__init__"):
            continue
        module = importlib.import_module(module_name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module_name or inspect.isabstract(cls) or name.startswith("_"):
                continue  # private bases (e.g. a paper's shared LightningModule base) are not CLI choices
            bases = [base for base in _injectable_bases() if issubclass(cls, base) and cls is not base]
            if not bases:
                continue
            path = f"{module_name}.{name}"
            package, _, file = module_name.rpartition(".")
            if package.rpartition(".")[2] == file:  # a paper folder's main file: its folder resolves the name
                path = f"{package}.{name}"  # (lightning_modules.trew.TREW), the shortest path jsonargparse writes
            # the CLI's own candidates for this base; classes defined by test files are not the CLI's concern
            same_name = [p for p in get_all_subclass_paths(bases[0])
                         if p.rsplit(".", 1)[1] == name and not _defined_by_a_test(p)]
            if same_name != [path]:
                problems.append(f"{name}: short name resolves to {same_name}, expected [{path}]")
            checked.append(path)
    assert problems == [], problems
    expected = {"lightning_modules.rlvr.grpo.GRPO", "lightning_modules.shared.classifier.ImageClassifier",
                "lightning_modules.rlvr.rollout_allocation.KnapsackAllocator",
                "lightning_modules.tamed_sgd.schedulers.RobbinsMonroLR",
                "datamodules.images.ImageClassificationDataModule", "callbacks.ema.EMAWeights",
                "callbacks.sgd_taming.SGDTaming", "lightning_modules.rlvr.grpo.ExactMatchReward"}
    assert expected <= set(checked)


@pytest.mark.parametrize("config, flag, class_path", [
    ("configs/knapsack_rl/quick.yaml", "--model.init_args.rollout_allocator=UniformAllocator",
     "lightning_modules.rlvr.rollout_allocation.UniformAllocator"),
    ("configs/tamed_sgd/quick.yaml", "--model.init_args.lr_scheduler=RobbinsMonroLR",
     "lightning_modules.tamed_sgd.schedulers.RobbinsMonroLR"),
    ("configs/trew/classifier_quick.yaml", "--trainer.callbacks+=EMAWeights", "callbacks.ema.EMAWeights"),
])
def test_short_names_work_on_the_command_line(config, flag, class_path, capsys):
    import train

    with pytest.raises(SystemExit) as exit_info:
        train.main(["fit", "--config", str(ROOT / config), flag, "--print_config"])
    assert exit_info.value.code in (0, None)
    assert f"class_path: {class_path}" in capsys.readouterr().out
