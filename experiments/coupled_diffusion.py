"""Coupled diffusion of signals and logits vs enhance-then-classify on digits: ``python -m experiments
coupled_diffusion`` (about 15 min per seed on a shared 2-core machine).

Paper: "Joint Enhancement and Classification using Coupled Diffusion Models of Signals and Logits" (arXiv
2602.15405). Claim: coupling the signal and logit diffusions classifies corrupted inputs better than enhancing
then classifying ("Enhanced"), which in turn beats classifying the corrupted input; the gain grows with the
corruption level.

The protocol is configuration, ``configs/coupled_diffusion/experiment.yaml``, run by `experiments.runner` (every
model built as ``python train.py fit`` builds it, trainer and callbacks from the YAML; one seed S drives model and
data); this module holds its hooks. Data: scikit-learn digits (8x8, fixed 80/20 train/test split, 359 test images),
pixel replacement at the levels of the arms (p = 0.3 and 0.6), a fixed corruption per test image. Per seed S:

1. ``classifier`` (no row): the frozen classifier f, `ImageClassifier` MLP 64-128-10, Adam 1e-3, for
   ``trainer.max_epochs`` (30) epochs on clean images (``classifier_quick.yaml``); `prepare` points every
   diffusion arm's ``init_from`` at its last checkpoint;
2. per level, models trained with one recipe (``quick.yaml`` with the YAML's overrides: AdamW, OneCycle max lr 2e-3,
   batch 128, EMA 0.995 with warm-up from the config's `EMAWeights` callback; T = 50 cosine, v-prediction; MLP
   denoisers width 128, depth 2): ``enhanced`` (x-only conditional DDPM) and ``parallel`` (the coupled training of
   the official code) for ``trainer.max_steps`` (1000) optimiser steps, and a compute-matched ``enhanced_3x``:
   Enhanced trained for ``settings.step_factor`` = 3x the optimiser steps (Parallel runs each network
   ``coupling_iterations`` = 3 times per step, so both then make the same number of enhancer forward/backward
   passes; `prepare` makes the OneCycle schedule span each arm's steps);
3. `evaluate`, with the EMA weights swapped in, on the whole corrupted test set, DDIM with 10 steps (sampling noise
   from a generator seeded ``settings.sample_seed`` + S): Enhanced and Enhanced 3x (f of the enhanced image), the
   Parallel sampler and, with the parallel-trained networks (``settings.also_sampled``), the Alternating (2 rounds)
   and Nested samplers; the parallel run also gives f(x_c) (``corrupted``) and f on the clean images (``clean``).

Compute per arm, measured in the run: the forward calls of each network (signal enhancer, logit denoiser, its image
feature encoder, frozen classifier) in one optimiser step's losses and in sampling one image, counted by forward
hooks (`CallCounter`), and the median wall time of a training step (forward, backward, optimiser step; `StepTimer`,
a callback the YAML adds), the total training time and the sampling time per test image. Wall times come from a
shared 2-core machine and are only comparable within one run.

Deviation of this experiment: Alternating and Nested are SAMPLED with the networks trained by the Parallel scheme
(their own training schemes, which the module implements, cost ~2.3x a Parallel step here: 102-106 ms vs 45 ms at
batch 128, measured on a shared 2-core machine).

Metrics: ``acc`` (argmax of the final logits; for Enhanced and corrupted: of f), ``acc_f_enhanced`` (f on the
enhanced image of that sampler), and the compute: ``train_steps``, ``train_calls_per_step_<network>``,
``train_calls_per_step_denoiser`` (enhancer + logit denoiser), ``train_ms_per_step``, ``train_s``,
``sample_calls_<network>``, ``sample_calls_denoiser`` (per image) and ``sample_ms_per_image``. Rows are
``"<arm> (p=<level>)"``, ``per_seed`` one ``{row: metrics}`` per seed. `report` orders the rows as the earlier script
did, keeps the runner's pairs within a level and adds, per level, every row minus Enhanced and the pairs of
``settings.paired``, and prints the accuracy and compute tables; `plot` writes the bar chart.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

from callbacks.ema import EMAWeights
from experiments.runner import ExperimentError, arm_flags
from lightning_modules.shared.denoisers import to_model_range
from lightning_modules.shared.errors import UserInputError

# the rows of one level, in the order of the result (the earlier script's)
ARMS = ("corrupted", "enhanced", "enhanced_3x", "parallel", "alternating", "nested")
NETWORKS = ("signal_net", "logit_net", "feature_net", "classifier")
ROW = re.compile(r"^(?P<arm>[A-Za-z0-9_]+) \(p=(?P<level>[0-9.]+)\)$")


class SettingError(ExperimentError, UserInputError):
    """A setting of the coupled-diffusion protocol (experiment.yaml or ``--set``) that cannot run: one line."""


class CallCounter:
    """Counts forward calls of the model's networks (`NETWORKS`: the signal enhancer, the logit denoiser, its image
    feature encoder and the frozen classifier) through forward hooks, while used as a context manager."""

    def __init__(self, model) -> None:
        self.model = model
        self.counts = dict.fromkeys(NETWORKS, 0)
        self._hooks = []

    def _hook(self, name):
        def count(module, inputs, output):
            self.counts[name] += 1
        return count

    def __enter__(self) -> CallCounter:
        for name in NETWORKS:
            network = getattr(self.model, name, None)
            if network is not None:
                self._hooks.append(network.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


class StepTimer(Callback):
    """Wall time of every training step (forward, backward and optimiser step) in seconds; experiment.yaml adds it
    to every run's callbacks (``trainer.callbacks+``)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def training_passes(model, data) -> dict[str, int]:
    """Forward calls of each network in one optimiser step's losses, on one training batch (every network a
    training step runs; the trainable ones also run backward once per forward)."""
    clean, corrupted, _ = model._unpack(next(iter(data.train_dataloader())))
    with CallCounter(model) as counter, torch.no_grad():
        model.losses(clean, corrupted, generator=torch.Generator().manual_seed(0))
    return counter.counts


def compute_metrics(prefix: str, counts: dict[str, int]) -> dict[str, float]:
    """``<prefix>_<network>`` per network and ``<prefix>_denoiser`` (signal enhancer + logit denoiser calls)."""
    row = {f"{prefix}_{name}": float(counts[name]) for name in NETWORKS}
    row[f"{prefix}_denoiser"] = float(counts["signal_net"] + counts["logit_net"])
    return row


def test_tensors(data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole corrupted test set of `data` (a fixed corruption per image) in the model range."""
    data.setup()
    clean, corrupted, labels = (torch.stack(items) for items in zip(*[data.test_set[i]
                                                                      for i in range(len(data.test_set))]))
    return to_model_range(clean), to_model_range(corrupted), labels



def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return (logits.argmax(-1) == labels).float().mean().item()


# ------------------------------------------------------------------------------------------- settings
def split_row(name: str) -> tuple[str, str]:
    """``"<arm> (p=<level>)"`` -> ``(arm, level)``; an arm of experiment.yaml named otherwise is one error line."""
    match = ROW.match(name)
    if match is None:
        raise SettingError(f"configs/coupled_diffusion/experiment.yaml: arm {name!r} must be named '<arm> (p=<level>)'"
                           " (e.g. 'parallel (p=0.3)'), or be the arm named by settings.classifier")
    return match["arm"], match["level"]


def _given(run, key: str) -> str | None:
    """The last value of ``--<key>`` among the run's flags as given (experiment.yaml, smoke, ``--set``)."""
    given = [f.partition("=")[2] for f in arm_flags(run.spec, run.arm, run.variant) if f.startswith(f"--{key}=")]
    return given[-1] if given else None


def max_steps(run) -> int:
    """``trainer.max_steps`` as given: each diffusion model's optimiser steps, a positive integer."""
    value = _given(run, "trainer.max_steps")
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1:
        raise SettingError(f"trainer.max_steps={value}: must be a positive integer (each diffusion model's optimiser "
                           "steps), e.g. --set trainer.max_steps=1000")
    return steps


def step_factor(run, arm: str) -> int:
    """``settings.step_factor[arm]`` (default 1): the arm trains for this multiple of ``trainer.max_steps``."""
    factors = run.settings.get("step_factor") or {}
    if not isinstance(factors, dict):
        raise SettingError(f"settings.step_factor={factors!r}: must map arm -> integer, e.g. {{enhanced_3x: 3}}")
    factor = factors.get(arm, 1)
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise SettingError(f"settings.step_factor.{arm}={factor!r}: must be a positive integer (the multiple of "
                           "trainer.max_steps this arm trains for), e.g. 3")
    return factor


def classifier_arm(run) -> str:
    return str(run.settings.get("classifier", "classifier"))


def prepare(run) -> dict:
    """Overrides computed per run: the classifier trains its ``trainer.max_epochs`` whatever ``trainer.max_steps``
    says; a diffusion arm trains ``trainer.max_steps`` x ``settings.step_factor`` optimiser steps (no epoch limit)
    with its OneCycle schedule over exactly those steps, from the same seed's classifier (``init_from`` = its last
    checkpoint)."""
    steps = max_steps(run)
    name = classifier_arm(run)
    if run.arm.name == name:
        return {"trainer.max_steps": -1}
    arm, _ = split_row(run.arm.name)
    classifier = run.earlier.get(name)
    if classifier is None:
        raise SettingError(f"{run.arm.name} starts from the classifier arm {name!r}, which did not run before it on "
                           f"seed {run.seed}: list {name} first in configs/coupled_diffusion/experiment.yaml")
    path = classifier.best_checkpoint()
    if path is None:
        raise SettingError(f"the classifier arm {name!r} saved no checkpoint; its config needs a ModelCheckpoint")
    total = steps * step_factor(run, arm)
    return {"trainer.max_epochs": -1, "trainer.max_steps": total,
            "model.init_args.lr_scheduler.init_args.total_steps": total, "model.init_args.init_from": path}


# ------------------------------------------------------------------------------------------- evaluation
def _callback(run, kind: type):
    found = [c for c in run.trainer.callbacks if isinstance(c, kind)]
    if not found:
        raise SettingError(f"{run.arm.name}: the run has no {kind.__name__} callback (configs/coupled_diffusion/"
                           "quick.yaml's EMAWeights, experiment.yaml's StepTimer); keep it in the trainer's callbacks")
    return found[0]


def _swap_in_ema(run) -> None:
    """Evaluate with the averaged weights: copy the EMAWeights callback's averages into the model."""
    ema = _callback(run, EMAWeights)
    with torch.no_grad():
        for name, p in run.model.named_parameters():
            if name in ema.averages:
                p.copy_(ema.averages[name])


def _sample_row(model, corrupted, labels, strategy: str, seed: int) -> dict[str, float]:
    start = time.perf_counter()
    with CallCounter(model) as counter:  # one call on the whole test set: calls = calls per image
        out = model.sample(corrupted, strategy, torch.Generator().manual_seed(seed))
    return {"acc": _accuracy(out["logits"], labels), "acc_f_enhanced": _accuracy(out["classifier_logits"], labels),
            "sampling": compute_metrics("sample_calls", counter.counts),
            "sample_ms_per_image": 1000 * (time.perf_counter() - start) / len(labels)}


def evaluate(run) -> dict[str, float]:
    """The classifier: nothing (its checkpoint is read by `prepare`). A diffusion arm: its training compute, then,
    with the EMA weights, its own sampler on the corrupted test set (the row), the samplers of
    ``settings.also_sampled`` on the same networks and, for ``settings.references``, f on the corrupted and the
    clean test images (further rows, ``run.derived``)."""
    if run.arm.name == classifier_arm(run):
        return {}
    arm, level = split_row(run.arm.name)
    model, data = run.model, run.datamodule
    if abs(float(data.corruption_level) - float(level)) > 1e-12:
        raise SettingError(f"arm {run.arm.name!r} ran at data.init_args.corruption_level={data.corruption_level}: "
                           f"rename the arm or set its level to {level}")
    timer = _callback(run, StepTimer)
    compute = {"train_steps": float(run.trainer.max_steps),
               **compute_metrics("train_calls_per_step", training_passes(model, data)),
               "train_ms_per_step": 1000 * float(np.median(timer.times)), "train_s": float(np.sum(timer.times))}
    _swap_in_ema(run)
    model.eval()
    clean, corrupted, labels = test_tensors(data)
    seed = int(run.settings.get("sample_seed", 1000)) + run.seed
    samplers = [arm, *(run.settings.get("also_sampled") or {}).get(arm, [])]
    rows = {}
    for sampler in samplers:
        measured = _sample_row(model, corrupted, labels, model.hparams.strategy if sampler == arm else sampler, seed)
        rows[sampler] = {"acc": measured["acc"], "acc_f_enhanced": measured["acc_f_enhanced"], **compute,
                         **measured["sampling"], "sample_ms_per_image": measured["sample_ms_per_image"]}
    if arm == run.settings.get("references"):
        factors = {a: f for a, f in (run.settings.get("step_factor") or {}).items()}
        wrong = {a: f for a, f in factors.items() if f != model.hparams.coupling_iterations}
        if wrong:
            raise SettingError(f"settings.step_factor {wrong} must equal {arm}'s coupling_iterations="
                               f"{model.hparams.coupling_iterations} (the compute-matched Enhanced)")
        with CallCounter(model) as counter:
            corrupted_logits = model.classify(corrupted)
        run.derived[f"corrupted (p={level})"] = {"acc": _accuracy(corrupted_logits, labels),
                                                 **compute_metrics("sample_calls", counter.counts)}
        run.derived[f"clean (p={level})"] = {"acc": _accuracy(model.classify(clean), labels)}
    for sampler in samplers[1:]:
        run.derived[f"{sampler} (p={level})"] = rows[sampler]
    return rows[arm]


# ------------------------------------------------------------------------------------------- report
def levels(names) -> list[str]:
    """The corruption levels of the result's rows, in order of appearance."""
    return list(dict.fromkeys(split_row(n)[1] for n in names if ROW.match(n)))


def row_order(names) -> list[str]:
    """The rows as the earlier script wrote them: per level corrupted, enhanced, enhanced_3x, parallel, alternating,
    nested, clean, then anything else in its order."""
    names = list(names)
    ordered = [f"{arm} (p={level})" for level in levels(names) for arm in (*ARMS, "clean")]
    return [n for n in ordered if n in names] + [n for n in names if n not in ordered]


def _reorder(mapping: dict, order: list[str]) -> None:
    items = [(k, mapping[k]) for k in order]
    mapping.clear()
    mapping.update(items)


def paired_rows(per_seed: list[dict], baseline: str, pairs: dict) -> dict:
    """Per level L: every row of L minus ``"<baseline> (p=L)"`` (the runner's rule within one level), then the pairs
    of ``pairs`` (``settings.paired``: baseline arm -> arms), each ``"<arm> (p=L) - <base> (p=L)"`` on ``acc``
    (`icml26.paired.paired_block`: mean and 95% t interval over seeds). Rows the run did not make are skipped."""
    from icml26.paired import paired_block

    if not isinstance(pairs, dict) or not all(isinstance(v, list) for v in pairs.values()):
        raise SettingError(f"settings.paired={pairs!r}: must map a baseline arm to a list of arms, e.g. "
                           "{enhanced_3x: [parallel]}")
    present = list(dict.fromkeys(name for row in per_seed for name in row))
    base_arm, _ = split_row(baseline)
    block = {}
    for level in levels(present):
        within = [n for n in present if ROW.match(n) and split_row(n)[1] == level]
        base = f"{base_arm} (p={level})"
        if base in within:
            block.update(paired_block(per_seed, base, ["acc"], [n for n in within if n != base]))
        for other, arms in pairs.items():
            other_base = f"{other} (p={level})"
            arms = [f"{a} (p={level})" for a in arms if f"{a} (p={level})" in within]
            if other_base in within and arms:
                block.update(paired_block(per_seed, other_base, ["acc"], arms))
    return block


def table(arms: dict, levels_: list[str]) -> str:
    lines = ["| arm | " + " | ".join(f"acc p={lv}" for lv in levels_) + " | " +
             " | ".join(f"f(x_hat) p={lv}" for lv in levels_) + " |",
             "|---|" + "---|" * (2 * len(levels_))]
    for arm in ("clean",) + ARMS:
        if not all(f"{arm} (p={lv})" in arms for lv in levels_):
            continue
        cells = [arms[f"{arm} (p={lv})"]["acc"] for lv in levels_]
        enhanced = [arms[f"{arm} (p={lv})"].get("acc_f_enhanced") for lv in levels_]
        fmt = [f"{c['mean']:.3f} ± {c['std']:.3f}" for c in cells]
        fmt += [f"{c['mean']:.3f} ± {c['std']:.3f}" if c else "-" for c in enhanced]
        label = "clean test images, f(x)" if arm == "clean" else arm
        lines.append(f"| {label} | " + " | ".join(fmt) + " |")
    return "\n".join(lines)


COMPUTE_COLUMNS = (("train_steps", "optimiser steps", 0),
                   ("train_calls_per_step_signal_net", "enhancer calls / step", 0),
                   ("train_calls_per_step_logit_net", "logit-denoiser calls / step", 0),
                   ("train_calls_per_step_classifier", "classifier calls / step", 0),
                   ("train_ms_per_step", "ms / step", 1), ("train_s", "training s", 1),
                   ("sample_calls_signal_net", "enhancer calls / image", 0),
                   ("sample_calls_logit_net", "logit-denoiser calls / image", 0),
                   ("sample_calls_classifier", "classifier calls / image", 0),
                   ("sample_ms_per_image", "sampling ms / image", 2))


def compute_table(arms: dict, level: str) -> str:
    """Training and sampling compute per arm at one level (means over seeds; "-" where an arm has none)."""
    lines = ["| arm | " + " | ".join(label for _, label, _ in COMPUTE_COLUMNS) + " |",
             "|---|" + "---|" * len(COMPUTE_COLUMNS)]
    for arm in ARMS:
        cells = arms.get(f"{arm} (p={level})")
        if cells is not None:
            lines.append(f"| {arm} | " + " | ".join(f"{cells[key]['mean']:.{digits}f}" if key in cells else "-"
                                                    for key, _, digits in COMPUTE_COLUMNS) + " |")
    return "\n".join(lines)


def report(result: dict, records: list[dict], spec) -> dict:
    """Rows in the earlier script's order (the runner's ``arms``, per-seed rows and pairs, reordered in place); of
    the runner's pairs (every row minus ``baseline``) those within the baseline's level, then per level every row
    minus Enhanced and the pairs of ``settings.paired``; prints the accuracy table and the compute per arm."""
    order = row_order(result["arms"])
    _reorder(result["arms"], order)
    for row in result["per_seed"]:
        _reorder(row, [n for n in order if n in row])
    runner_pairs = result.get("paired")
    if isinstance(runner_pairs, dict):  # the runner adds its block before the report's: drop its cross-level pairs
        for pair in [p for p in runner_pairs if len({split_row(n)[1] for n in p.split(" - ")}) > 1]:
            del runner_pairs[pair]
        _reorder(runner_pairs, sorted(runner_pairs, key=lambda p: order.index(p.split(" - ")[0])))  # rows' order
    pairs = paired_rows(result["per_seed"], spec.baseline, spec.settings.get("paired") or {})
    found = levels(result["arms"])
    print(table(result["arms"], found))
    for level in found:
        print(f"\ncompute per arm, p={level} (training: per optimiser step of batch 128; sampling: per test image)\n")
        print(compute_table(result["arms"], level))
    return {"paired": pairs}


def plot(result: dict, path) -> None:
    """Test accuracy per arm (mean ± std over seeds), one group of bars per corruption level."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, found = result["arms"], levels(result["arms"])
    shown = [arm for arm in ARMS if all(f"{arm} (p={lv})" in arms for lv in found)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(shown)
    for i, arm in enumerate(shown):
        means = [arms[f"{arm} (p={lv})"]["acc"]["mean"] for lv in found]
        stds = [arms[f"{arm} (p={lv})"]["acc"]["std"] for lv in found]
        ax.bar(np.arange(len(found)) + (i - len(shown) / 2 + 0.5) * width, means, width, yerr=stds, label=arm,
               capsize=2)
    ax.set_xticks(np.arange(len(found)), [f"pixel replacement p={lv}" for lv in found])
    ax.set_ylabel("test accuracy (digits)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("Coupled diffusion of signals and logits vs enhance-then-classify")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.coupled_diffusion [runner flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["coupled_diffusion", *sys.argv[1:]]))
