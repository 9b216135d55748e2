"""The harness covers the whole collection: every class a user can put in a config is run by a quick config.

`tests/test_configs.py` runs the contract (fast_dev_run, gradients, checkpoint round trip, determinism) over
``configs/*/*quick.yaml``; a class that no quick config builds is never checked by it. This file finds every
class of the collection by importing every ``.py`` under ``lightning_modules/``, ``datamodules/`` and
``callbacks/`` (so moving a class between files needs no change here) and requires each one of the kinds a
config can name to be built by at least one quick config:

* LightningModules, LightningDataModules and Callbacks;
* ``nn.Module`` sub-networks (policies, encoders, backbones: also the ones a module builds from a string such as
  ``backbone: gru4rec``);
* the collection's plug-in objects: every class of the collection that a LightningModule's ``__init__``
  accepts (rewards, rollout allocators, rollout engines) and their subclasses; learning-rate schedulers.

"Built" is checked on the real objects: each quick config is instantiated as the CLI does (no training), and
the classes of the model's sub-modules, of the collection objects they hold, of the datamodule and of the
trainer's callbacks are collected, together with every ``class_path`` of the resolved config (schedulers are
only built inside ``configure_optimizers``).
"""
from __future__ import annotations

import importlib
import inspect
import json
import typing
from functools import lru_cache

import pytest
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from conftest import QUICK_CONFIGS, REPO, config_path, run_cli

PACKAGES = ("lightning_modules", "datamodules", "callbacks")
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

# Classes that are never built on their own, by design (a class name, so moving its file needs no change here).
EXEMPT = {
    # abstract bases: only their subclasses are instantiated (each of those must be covered)
    "PaperModule": "base class of every paper module (lightning_modules/shared/base.py)",
    "SlideExpressionModule": "shared evaluation base of RNAFM and the two expression regressors",
    "ExpressionRegressor": "shared base of HE2RNARegressor and TRNAsformerRegressor",
    "RewardFunction": "interface of verifiable rewards (ExactMatchReward, MultiAnswerReward)",
    "RolloutAllocator": "interface of rollout allocators (Uniform, Knapsack, DARS)",
    "RolloutEngine": "interface of rollout engines (KVCacheSampler, TransformersGenerate)",
    # a scheduler only the paper-scale LDARNet pretraining config uses: the quick LDARNet configs keep a constant
    # learning rate so that their measured numbers stay those of the README; its math is pinned by
    # tests/test_ldarnet.py
    "WSDSchedule": "LDARNet's warm-up/stable/decay schedule, used by configs/ldarnet/pretrain_paper.yaml",
    # built at the end of each RSIR evaluation epoch from every rank's ranks (not a module attribute the harness
    # sees); the RSIR quick configs run it, and tests/test_ranking_metrics.py pins its math
    "LeaveOneOutMetrics": "RSIR's Recall/NDCG, computed once per evaluation epoch (lightning_modules/rsir)",
    # backbones that need a local model folder (no quick config can build them offline)
    "QwenVLBackbone": "needs a local Qwen2.5-VL folder; tests/test_hide.py runs it on a tiny random model",
    "HFWhisperEncoder": "the paper configs' audio tower from a local folder; tests/test_pclm.py builds one from a "
                        "transformers config",
    "HFLanguageModel": "the paper configs' LM from a local folder; tests/test_pclm.py builds a GPT-2 from a config",
    # test/predict only: there is nothing to fit, so it has a probe.yaml, not a quick config (the harness fits
    # every quick config); tests/test_emotion_probe.py runs probe.yaml through the CLI and on two processes
    "EmotionProbe": "probes a trained LM (configs/emotion_hierarchy/probe.yaml, tests/test_emotion_probe.py)",
    "EmotionTreeMetric": "EmotionProbe's tree metric (tests/test_emotion_probe.py pins it by hand)",
    "RecognitionMetric": "EmotionProbe's recognition metric (tests/test_emotion_probe.py pins it by hand)",
    # progress bars: train.py attaches one to every run that shows a bar (tests/test_cli.py checks it); the config
    # harness runs with the bar off
    "RunProgressBar": "the default progress bar of train.py (Rich)",
    "RunTQDMProgressBar": "the default progress bar of train.py where Rich is not installed",
}


def _is_collection_class(cls: type) -> bool:
    return cls.__module__.split(".")[0] in PACKAGES


@lru_cache(maxsize=None)
def collection_classes() -> tuple[type, ...]:
    """Every public class defined in a .py file of the three packages (each file imported)."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
            found += [obj for name, obj in vars(module).items() if inspect.isclass(obj)
                      and obj.__module__ == module.__name__ and not name.startswith("_")]
    return tuple(found)


def _classes_in_annotation(annotation) -> set[type]:
    if inspect.isclass(annotation):
        return {annotation}
    return set().union(*(_classes_in_annotation(a) for a in typing.get_args(annotation))) \
        if typing.get_args(annotation) else set()


def plugin_bases() -> set[type]:
    """Collection classes (other than modules) that a LightningModule of the collection accepts in ``__init__``."""
    bases = set()
    for cls in collection_classes():
        if issubclass(cls, LightningModule):
            for annotation in typing.get_type_hints(cls.__init__).values():
                bases |= {c for c in _classes_in_annotation(annotation)
                          if _is_collection_class(c) and not issubclass(c, nn.Module)}
    return bases


def required_classes() -> dict[str, type]:
    kinds = (LightningModule, LightningDataModule, Callback, nn.Module, LRScheduler, *plugin_bases())
    return {f"{c.__module__}.{c.__qualname__}": c for c in collection_classes() if issubclass(c, kinds)}


def _class_paths(node) -> set[str]:
    """Every ``class_path`` value in a (nested) resolved config."""
    if isinstance(node, dict):
        own = {node["class_path"]} if isinstance(node.get("class_path"), str) else set()
        return own.union(*(_class_paths(v) for v in node.values()))
    if isinstance(node, (list, tuple)):
        return set().union(*(_class_paths(v) for v in node))
    return set()


def _resolve(class_path: str) -> type | None:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _collection_objects(obj, seen: set[int]) -> set[type]:
    """Classes of `obj` and of the collection objects it holds (sub-modules, rewards, allocators, engines)."""
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    if isinstance(obj, (list, tuple, set)):
        return set().union(*(_collection_objects(v, seen) for v in obj))
    if isinstance(obj, dict):
        return set().union(*(_collection_objects(v, seen) for v in obj.values()))
    if not _is_collection_class(type(obj)) and not isinstance(obj, nn.Module):
        return set()
    found = {type(obj)}
    children = list(obj.children()) if isinstance(obj, nn.Module) else []
    attributes = [v for v in getattr(obj, "__dict__", {}).values() if not isinstance(v, nn.Module)]
    for value in children + attributes:
        found |= _collection_objects(value, seen)
    return found


@lru_cache(maxsize=None)
def built_by(config: str, extra: tuple[str, ...] = ()) -> frozenset[type]:
    """The classes a quick config builds: instantiated as the CLI does, then set up by a fit of zero steps (many
    modules build their networks in ``setup`` from the data, and schedulers are built in ``configure_optimizers``)."""
    cli = run_cli("--config", config_path(config), *QUIET, "--trainer.max_steps=0", "--trainer.num_sanity_val_steps=0",
                  *extra, run=False)
    classes = {type(cli.datamodule)} | {type(callback) for callback in cli.trainer.callbacks}
    resolved = json.loads(cli.parser.dump(cli.config, format="json", skip_check=True))
    classes |= {c for c in map(_resolve, _class_paths(resolved)) if c is not None}
    # the collection's callbacks act at fit start / end (RSIR generates data): they are recorded, not run
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not _is_collection_class(type(c))]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    classes |= _collection_objects(cli.model, set())
    classes |= {type(scheduler.scheduler) for scheduler in cli.trainer.lr_scheduler_configs}
    return frozenset(classes)


def test_every_collection_class_is_built_by_a_quick_config(prerequisite_args):
    required = required_classes()
    assert {"lightning_modules.rsir.sequential_rec.GRU4Rec",
            "lightning_modules.shared.tiny_gpt.HFCausalLM"} <= set(required)
    covered = set().union(*(built_by(config, tuple(prerequisite_args(config))) for config in QUICK_CONFIGS))
    missing = sorted(name for name, cls in required.items() if cls not in covered and cls.__name__ not in EXEMPT)
    assert not missing, ("classes no configs/*/*quick.yaml builds, so the config harness never runs them; add a "
                         f"quick config (or, for an abstract base, an entry in EXEMPT): {missing}")
    stale = sorted(name for name in EXEMPT if not any(cls.__name__ == name and cls not in covered
                                                      for cls in required.values()))
    assert not stale, f"EXEMPT names classes that are gone or now covered; remove them: {stale}"


def test_the_class_discovery_sees_every_kind():
    """The discovery itself can fail: known classes of each kind must be found (guards the test above)."""
    names = {cls.__name__ for cls in required_classes().values()}
    for expected in ("SequentialRecommender", "ImageClassificationDataModule", "EMAWeights",
                     "TimeConditionedConvEncoder", "UniformAllocator", "ExactMatchReward", "TransformersGenerate",
                     "RobbinsMonroLR"):
        assert expected in names, expected
    bases = {cls.__name__ for cls in plugin_bases()}
    assert {"RewardFunction", "RolloutAllocator", "RolloutEngine"} <= bases, bases


# evaluation-only configs (`test` / `predict`, nothing to fit, so the fitting harness cannot run them), each with
# the test that runs it
EVALUATION_CONFIGS = {
    "configs/emotion_hierarchy/probe.yaml": "tests/test_emotion_probe.py::test_lm_training_then_probe_through_the_cli",
}


def test_every_training_config_is_run_by_the_harness():
    """A config under configs/<paper>/ is a quick config (run by the harness), a paper config (parsed) or an
    evaluation-only config run by its paper's test. The paper's card (``card.yaml``, tests/test_registry.py) and its
    experiment protocols (``experiment.yaml``, and ``<stem>.yaml`` of a further experiment ``<paper>/<stem>``) sit
    beside them and are not CLI configs."""
    from experiments import runner

    further = {str(runner.experiment_path(name).relative_to(REPO))  # a paper's further experiments' protocols
               for name in runner.available(secondary=True) if runner.is_secondary(name)}
    stray = sorted(str(p.relative_to(REPO)) for p in REPO.glob("configs/*/*.yaml")
                   if p.parent.name not in ("sweeps", "trainer", "logger")
                   and p.name not in ("card.yaml", "experiment.yaml") and str(p.relative_to(REPO)) not in further
                   and not p.name.endswith(("quick.yaml", "paper.yaml"))
                   and str(p.relative_to(REPO)) not in EVALUATION_CONFIGS)
    for config, test in EVALUATION_CONFIGS.items():
        test_file, test_name = test.split("::")
        assert (REPO / config).is_file() and f"def {test_name}(" in (REPO / test_file).read_text(), config
        assert config.split("configs/")[1] in (REPO / test_file).read_text(), f"{test} does not run {config}"
    assert not stray, f"configs the harness never runs (name them *quick.yaml or *paper.yaml): {stray}"
    assert "configs/trew/retrain_quick.yaml" in QUICK_CONFIGS


@pytest.mark.parametrize("config", ["configs/rsir/gru4rec_quick.yaml", "configs/grpo/hf_quick.yaml",
                                    "configs/spectral_guidance/digits_quick.yaml"])
def test_the_configs_added_for_coverage_build_what_they_are_for(config):
    from lightning_modules.rsir.sequential_rec import GRU4Rec
    from lightning_modules.spectral_guidance.spectral_guidance import TimeConditionedConvEncoder
    from lightning_modules.shared.tiny_gpt import HFCausalLM

    wanted = {"rsir": GRU4Rec, "grpo": HFCausalLM, "spectral_guidance": TimeConditionedConvEncoder}
    assert wanted[config.split("/")[1]] in built_by(config)
