"""The ground floor: one LightningModule per paper, its losses, samplers and injected strategy objects
(rollout allocators, rewards, schedulers), plus building blocks shared by several papers.

Import what you need from its module (``from lightning_modules.rlvr.grpo import GRPO``); this package imports
nothing eagerly, so loading one module (or the shared error type and answer checking that the datamodules use)
does not load every model, diffusers or timm. ``train.py`` imports every module of the collection, so short
names (``--model ImageClassifier``) work on the command line. Nothing here imports ``datamodules``,
``callbacks``, ``experiments`` or ``train.py`` (``tests/test_layering.py``).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# Before the per-paper folders every module sat here (``lightning_modules.grpo``); configs, scripts and checkpoints
# written then (a checkpoint stores its module's class path in ``hyper_parameters["_class_path"]``) name those
# paths. They keep resolving, with a FutureWarning, to the module's new home. Modules whose old name is now their
# paper's folder (``lightning_modules.phyb.OfflineModelBasedRL``) resolve through that folder's ``__getattr__``.
MOVED_MODULES = {
    "base": "shared", "errors": "shared", "data_contract": "shared", "classifier": "shared", "denoisers": "shared",
    "ranking_metrics": "shared", "tiny_gpt": "shared",
    "grpo": "rlvr", "sft": "rlvr", "rollouts": "rlvr", "token_logprobs": "rlvr", "answers": "rlvr",
    "rollout_allocation": "rlvr",
    "causal_agent": "causcibench", "causal_estimators": "causcibench", "causal_methods": "causcibench",
    "coupling_strategies": "coupled_diffusion", "concept_models": "ec_cem", "emotion_probe": "emotion_hierarchy",
    "hide_zoom": "hide", "toy_mllm": "hide", "ldarnet_network": "ldarnet", "bimamba2": "ldarnet",
    "multi_answer_protocol": "multi_answer_rl", "answer_set_metrics": "multi_answer_rl",
    "audio_language_model": "pclm", "audio_dpo": "pclm", "dynamics_ensemble": "phyb",
    "expression_eval": "rna_fm", "expression_regressors": "rna_fm", "sequential_rec": "rsir",
    "guided_sampling": "spectral_guidance", "diffusion_denoiser": "spectral_guidance", "schedulers": "tamed_sgd",
}


def _warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; update the path (the old one will stop working in a later release)",
                  FutureWarning, stacklevel=3)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``lightning_modules.<old>`` as the module at its new path (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        new = f"{__name__}.{MOVED_MODULES[name]}.{name}"
        _warn_moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the new module is already executed; Python registers it under the old name too


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def moved_attribute(package: str, name: str):
    """``lightning_modules.phyb.OfflineModelBasedRL``: a name of a paper folder's main file
    (``lightning_modules.phyb.phyb``), looked up lazily. The short path is what the flat layout called the class, so
    old configs and checkpoints resolve; jsonargparse also writes it, being the shortest."""
    if name.startswith("__"):
        raise AttributeError(name)
    module = importlib.import_module(f"{package}.{package.rpartition('.')[2]}")
    value = getattr(module, name, None)
    # only what the main file defines: a name it imports from elsewhere keeps its own (one) path
    if value is None or getattr(value, "__module__", module.__name__) != module.__name__:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return value
