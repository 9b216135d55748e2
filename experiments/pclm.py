"""Do audio LLMs listen or read? Last-layer SFT vs PCLM vs DPO on espeak-ng speech: ``python -m experiments pclm``.

Paper: "Do Audio LLMs Listen or Read? Analyzing and Mitigating Paralinguistic Failures with VoxParadox" (arXiv
2605.27772). Claim: a model that feeds only the last encoder layer to its LLM answers paralinguistic questions from
the transcript (high ALA on adversarial items); prompt-conditioned layer mixing (PCLM) raises Acc_GT and weights
shallow layers for pitch and speed; DPO lowers ALA further.

The protocol is configuration, ``configs/pclm/experiment.yaml``, run by `experiments.runner` (every arm built as
``python train.py fit`` builds it, with its config's callbacks; one seed S drives model and data). Per seed S:

0. ``pretrain`` (``configs/pclm/pretrain_quick.yaml``, 300 steps, AdamW 2e-3): content-only encoder pre-training
   (classify the sentence, pitch/speed/voice/volume random), so the deep layers become paralinguistically
   invariant; each seed pre-trains its own encoder, so the seed spread includes it. `evaluate` then runs the
   per-layer linear probes (`callbacks.layer_probing.LayerProbing`, ``settings.probe_examples`` clips, train ->
   validation clips: the diagnostic that must hold before the PCLM claim is read) and the validation content
   accuracy. The encoder stays frozen in every later arm.
1. ``sft`` (150 steps, ``configs/pclm/sft_quick.yaml``: 85% congruent, 15% neutral questions), then from it
   ``last-layer SFT`` (120 more steps: PCLM's two stages' budget) and ``pclm_stage1`` -> ``PCLM`` (60 + 60 steps,
   ``configs/pclm/quick.yaml``; stage 2 unfreezes the LM).
2. DPO (``configs/pclm/dpo_quick.yaml``: beta 0.1, LM only, frozen reference = the starting model, AdamW 1e-4, no
   weight decay; 65% congruent, 20% incongruent, 15% neutral questions) for 60 steps: ``PCLM + DPO`` (rejected = a
   random wrong option), ``PCLM + DPO (adversarial negatives)`` (rejected = the transcript's option), and
   ``last-layer SFT + DPO`` (the same DPO from the last-layer SFT model).
3. Equal-data controls: 60 supervised steps on exactly DPO's questions (same data seed and sizes: the same items in
   the same order), from the same checkpoints the DPO arms start from. ``... + mix (DPO optimiser)`` train what DPO
   trains (the LM) with DPO's optimiser (AdamW 1e-4, no weight decay), so ``X + DPO - X + mix (DPO optimiser)`` is
   the loss's effect alone; ``... + mix`` keep their own optimiser (AdamW 1e-3, weight decay 0.01; PCLM: LM only).

Every row is the test of its final weights (no model selection) on the adversarial split (every transcript
contradicts the audio): ``acc_gt``, ``ala`` overall and per task, and for PCLM arms the mean mixing weight per
layer for each task's prompts (``alpha/<task>/layer<l>``). `prepare` points each arm's ``init_from`` at its
parent's checkpoint (``settings.init_from``); `report` adds ``probes``, ``probes_per_seed``, ``probe_drop`` (final
minus first layer's probe, over seeds), ``pretrain_val_content_acc`` and the pairs of ``settings.paired`` to the
runner's ``paired`` block (every arm - ``last-layer SFT``); `plot` writes ``<out>/pclm.png``.
"""
from __future__ import annotations

import sys
import textwrap

import numpy as np

from callbacks.layer_probing import LayerProbing
from datamodules import espeak
from experiments import kit
from icml26.claims import paired_interval
from icml26.paired import paired_block
from lightning_modules.shared.errors import UserInputError

TASKS = ("pitch", "speed", "gender", "volume")
PAIRED_METRICS = ("acc_gt", "ala", *(f"acc_gt/{t}" for t in TASKS), *(f"ala/{t}" for t in TASKS))
PRETRAIN = "pretrain"  # the arm whose encoder the evaluate hook probes


def prepare(run) -> dict:
    """``model.init_args.init_from`` = the final checkpoint of the arm's parent (``settings.init_from``), a run of
    the same seed made earlier; the pre-training arm starts from scratch."""
    if espeak.backend() is None:
        raise UserInputError("the pclm experiment synthesises its speech with espeak-ng, which is not available: "
                             "`pip install espeakng-loader` (one of this package's requirements).")
    parent = (run.settings.get("init_from") or {}).get(run.arm.name)
    if parent is None:
        return {}
    return {"model.init_args.init_from": run.checkpoint_of(parent, "settings.init_from")}


def evaluate(run) -> dict[str, float]:
    """Rows: the test of the final weights (every metric but the loss). The pre-training arm: its encoder's
    per-layer probes and validation content accuracy, kept in ``run.extra`` for `report`; other helper arms
    (``row: false``): nothing. The arm's clips are released afterwards (later arms only need its checkpoint)."""
    try:
        if run.arm.name == PRETRAIN:
            data = run.datamodule
            data.setup("fit")
            probing = LayerProbing(max_examples=int(run.settings.get("probe_examples", 600)))
            probes = probing.probe(run.model, data.train_dataloader(), data.val_dataloader())
            validated = kit.quiet_trainer().validate(run.model, datamodule=data, verbose=False)[0]
            run.extra.update(seed=run.seed, probes=probes, val_content_acc=float(validated["val/content_acc"]))
            return {}
        if not run.arm.row:
            return {}
        return {k: v for k, v in run.test().items() if k != "loss"}  # the losses differ by arm (CE, DPO)
    finally:
        run.datamodule.splits = {}


def probe_drop(encoders: list[dict]) -> dict:
    """Per attribute: final minus first hidden state's probe accuracy over the seeds' encoders, mean and 95% t
    interval (the paper's probing diagnostic: the attribute fades with depth; null bounds with one seed)."""
    out = {}
    for name in encoders[0]["probes"]:
        mean, lo, hi, n = paired_interval([e["probes"][name][-1] - e["probes"][name][0] for e in encoders])
        out[name] = {"mean": mean, "lo": lo if n > 1 else None, "hi": hi if n > 1 else None, "n": n}
    return out


def report(result: dict, records: list[dict], spec) -> dict:
    """The encoders' probes (per seed and mean per layer), their final-minus-first drop, the validation content
    accuracy, and the pairs of ``settings.paired`` (baseline -> arms), added to the runner's paired block."""
    encoders = [seed_records[""][PRETRAIN] for seed_records in records]
    probes = {name: [float(np.mean([e["probes"][name][layer] for e in encoders])) for layer in range(len(accs))]
              for name, accs in encoders[0]["probes"].items()}
    per_seed = result["per_seed"]
    present = {arm for row in per_seed for arm in row}
    pairs: dict = {}
    for baseline, arms in (spec.settings.get("paired") or {}).items():
        arms = [arm for arm in arms if arm in present]
        if baseline in present and arms:
            pairs.update(paired_block(per_seed, baseline, PAIRED_METRICS, arms=arms))
    return {"paired": pairs, "probes": probes, "probes_per_seed": encoders, "probe_drop": probe_drop(encoders),
            "pretrain_val_content_acc": float(np.mean([e["val_content_acc"] for e in encoders]))}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for i, (name, accs) in enumerate(result["probes"].items()):
        line, = axes[0].plot(range(len(accs)), accs, marker="o", label=name, color=f"C{i}")
        for encoder in result.get("probes_per_seed", []):
            axes[0].plot(range(len(accs)), encoder["probes"][name], color=line.get_color(), alpha=0.25, lw=0.8)
    axes[0].set(xlabel="encoder hidden state (0 = conv output)", ylabel="linear probe accuracy",
                title="probes of the pre-trained encoders (mean; thin: per seed)")
    axes[0].legend(fontsize=7)
    arms = result["arms"]
    x = np.arange(len(arms))
    for offset, metric in ((-0.2, "acc_gt"), (0.2, "ala")):
        axes[1].bar(x + offset, [arms[a][metric]["mean"] for a in arms], 0.4,
                    yerr=[arms[a][metric]["std"] for a in arms], label=metric)
    axes[1].set_xticks(x, [textwrap.fill(a, 18) for a in arms], fontsize=6, rotation=40, ha="right")
    axes[1].set(title="adversarial test (all tasks)", ylim=(0, 1))
    axes[1].legend()
    for task, style in (("pitch", "-o"), ("speed", "-s")):
        for arm in ("PCLM", "PCLM + DPO"):
            keys = sorted((k for k in arms.get(arm, {}) if k.startswith(f"alpha/{task}/layer")),
                          key=lambda k: int(k.rsplit("layer", 1)[1]))
            if keys:
                axes[2].plot([k.rsplit("layer", 1)[1] for k in keys], [arms[arm][k]["mean"] for k in keys], style,
                             label=f"{arm}: {task}")
    axes[2].set(xlabel="encoder layer", ylabel="mean alpha", title="PCLM mixing weights")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # ``python -m experiments.pclm [--smoke] [--seeds N] [--out DIR] [--check]``
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["pclm", *sys.argv[1:]]))
