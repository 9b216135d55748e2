"""Do audio LLMs listen or read? Last-layer SFT vs PCLM vs PCLM + DPO on espeak-ng speech (``experiments.pclm``).

Paper: "Do Audio LLMs Listen or Read? Analyzing and Mitigating Paralinguistic Failures with VoxParadox" (arXiv
2605.27772). Claim: a model that feeds only the last encoder layer to its LLM answers paralinguistic questions from
the transcript (high ALA on adversarial items); prompt-conditioned layer mixing (PCLM) raises Acc_GT and weights
shallow layers for pitch and speed; DPO lowers ALA further.

Protocol (CPU, embedded data: `datamodules.paralinguistic_speech`, tasks pitch, speed, gender, volume; speech
from espeak-ng, installed with pip). Everything below runs once per seed s (data, initialisation and the encoder
change with the seed, so the seed spread includes the encoder's pre-training):

0. **Encoder pre-training** (``configs/pclm/pretrain_quick.yaml`` at ``--pretrain-steps``; seed and data seed
   ``PRETRAIN_DATA_SEED + s``, a data stream of its own): classify the sentence with pitch/speed/voice/volume drawn
   at random, so that the deep layers become paralinguistically invariant. Then the per-layer linear probes
   (`callbacks.layer_probing.LayerProbing`: logistic regression on mean-pooled states, train clips -> validation
   clips): the diagnostic that must hold before the PCLM claim is read; the JSON keeps each seed's probes
   (``probes_per_seed``) and their mean per layer (``probes``). The encoder is then frozen for every arm of that
   seed (as the pre-trained encoder of an audio LLM).
1. **Last-layer SFT** for ``--sft-steps`` (``configs/pclm/sft_quick.yaml``; training questions 85% congruent, 15%
   neutral). Then, from that checkpoint, with the same further budget ``--stage-steps`` x 2:

   * ``last-layer SFT``: the same SFT continued for 2 x ``--stage-steps`` (same data, optimiser, lr);
   * ``PCLM``: stage 1 (projectors cloned from the SFT projector + mixer; ``configs/pclm/quick.yaml``) for
     ``--stage-steps``, then stage 2 (LM unfrozen too) for ``--stage-steps``;
   * ``PCLM + DPO``: from the PCLM checkpoint, ``--dpo-steps`` of DPO (``configs/pclm/dpo_quick.yaml``: beta 0.1,
     LM only, frozen reference = the PCLM model, rejected = a random wrong option, AdamW at ``--dpo-lr``);
   * ``PCLM + DPO (adversarial negatives)``: the same with rejected = the option the transcript asserts.

   Both DPO arms use the DPO config's training questions (65% congruent, 20% incongruent, 15% neutral: the
   adversarial-negative variant needs questions whose transcript asserts a wrong option), a fresh draw of the same
   seed. Two **equal-data arms** separate DPO's effect from that data's: each continues an arm for the same
   ``--dpo-steps`` with the supervised loss on exactly the DPO arms' questions (the fractions are read from the DPO
   config; same data seed and sizes, so the same items in the same order):

   * ``last-layer SFT + mix``: the ``last-layer SFT`` model, its own parts (projector + LM), optimiser and lr
     (``configs/pclm/sft_quick.yaml``: AdamW lr 1e-3, weight decay 0.01);
   * ``PCLM + mix``: the ``PCLM`` model with the parts DPO trains (the LM only; projectors and mixer frozen, as in
     DPO) and PCLM's optimiser and lr rule (``configs/pclm/quick.yaml``: AdamW lr 1e-3, weight decay 0.01, the
     supervised stages' rule; DPO's 1e-4 is a DPO-loss setting). So ``PCLM + DPO - PCLM + mix`` is DPO's effect
     beyond the same questions seen with the supervised loss.

   The last weights of each arm are tested (no model selection at all, so test data never selects).
2. Test: the adversarial split (every transcript contradicts the audio; the same questions for every arm of a
   seed), ``acc_gt`` and ``ala`` overall and per task (``acc_gt/<task>``, ``ala/<task>``); for PCLM arms the mean
   mixing weight per layer for each task's prompts (``alpha/<task>/layer<l>``).

Outputs: a markdown table (mean ± std over seeds), ``results/pclm.json`` (kit schema + ``probes``,
``probes_per_seed``, ``probe_drop`` (final minus first layer's probe, paired over seeds) and the ``paired`` block:
every arm minus ``last-layer SFT``, the DPO arms and ``PCLM + mix`` minus ``PCLM``, the DPO arms minus
``PCLM + mix``, ``PCLM + mix`` minus ``last-layer SFT + mix``) and ``results/pclm.png`` (probe accuracy per layer;
Acc_GT / ALA per arm; alpha per layer for pitch and speed).
"""
from __future__ import annotations

import logging
import os
import tempfile
import textwrap
import time
from typing import NamedTuple

import numpy as np
import yaml

from callbacks.layer_probing import LayerProbing
from datamodules import espeak
from experiments import kit
from icml26.claims import paired_interval
from icml26.paired import paired_block
from lightning_modules.shared.errors import UserInputError

CONFIGS = {"pretrain": "configs/pclm/pretrain_quick.yaml", "sft": "configs/pclm/sft_quick.yaml",
           "pclm": "configs/pclm/quick.yaml", "dpo": "configs/pclm/dpo_quick.yaml"}
ARMS = ("last-layer SFT", "PCLM", "PCLM + DPO", "PCLM + DPO (adversarial negatives)", "last-layer SFT + mix",
        "PCLM + mix")
DPO_ARMS = ("PCLM + DPO", "PCLM + DPO (adversarial negatives)")
TASKS = ("pitch", "speed", "gender", "volume")
PAIRED_METRICS = ("acc_gt", "ala", *(f"acc_gt/{t}" for t in TASKS), *(f"ala/{t}" for t in TASKS))
PRETRAIN_DATA_SEED = 1000  # the encoder of seed s pre-trains with seed PRETRAIN_DATA_SEED + s (its own data stream)
PAPER = "Do Audio LLMs Listen or Read? VoxParadox / PCLM (arXiv 2605.27772)"


class Stage(NamedTuple):
    """One training run of a seed: ``config`` + ``overrides`` for ``steps`` steps from ``init``, saved as ``name``;
    tested and recorded as ``arm`` when that is set."""
    name: str
    config: str
    steps: int
    init: str
    overrides: tuple[str, ...] = ()
    arm: str | None = None


def dpo_mix() -> tuple[str, ...]:
    """The DPO config's training-question fractions as data overrides (what the equal-data arms train on)."""
    with open(kit.REPO_ROOT / CONFIGS["dpo"]) as f:
        data = yaml.safe_load(f)["data"]["init_args"]
    return (f"--data.init_args.congruent_fraction={data['congruent_fraction']}",
            f"--data.init_args.incongruent_fraction={data['incongruent_fraction']}")


def data_args(seed: int, args, split_sizes: bool = True) -> list[str]:
    out = [f"--data.init_args.seed={seed}", f"--data.init_args.batch_size={args.batch_size}"]
    if split_sizes:
        out += [f"--data.init_args.num_train={args.train}", f"--data.init_args.num_val={args.val}",
                f"--data.init_args.num_test={args.test}"]
    return out


def fit(config: str, seed: int, steps: int, out: str, args, *overrides: str):
    """Build from ``config`` (+ overrides), train ``steps`` optimiser steps (no validation), save ``out``."""
    model, data = kit.from_config(config, f"--seed_everything={seed}", *data_args(seed, args), *overrides)
    trainer = kit.quiet_trainer(max_steps=steps, max_epochs=-1, limit_val_batches=0, deterministic=True)
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(out)
    return model, data


def test(model, data) -> dict[str, float]:
    trainer = kit.quiet_trainer(deterministic=True)
    trainer.test(model, datamodule=data, verbose=False)
    return {k.removeprefix("test/"): float(v) for k, v in trainer.callback_metrics.items()
            if k.startswith("test/") and k != "test/loss"}


def pretrain(seed: int, args, folder: str) -> tuple[str, dict[str, list[float]], float]:
    """Content-only encoder pre-training for run seed ``seed`` (seed and data seed ``PRETRAIN_DATA_SEED + seed``),
    its per-layer probes, and its validation content accuracy."""
    path = os.path.join(folder, f"pretrain_{seed}.ckpt")
    model, data = fit(CONFIGS["pretrain"], PRETRAIN_DATA_SEED + seed, args.pretrain_steps, path, args,
                      f"--model.init_args.optimizer.init_args.lr={args.pretrain_lr}")
    probing = LayerProbing(max_examples=args.probe_examples)
    data.setup("fit")
    probes = probing.probe(model, data.train_dataloader(), data.val_dataloader())
    trainer = kit.quiet_trainer()
    metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
    return path, probes, float(metrics["val/content_acc"])


def plan(seed: int, args, encoder_ckpt: str, folder: str) -> list[Stage]:
    """The training runs of one seed in order (each ``init`` is an earlier stage's checkpoint)."""
    def path(name: str) -> str:
        return os.path.join(folder, f"{name}_{seed}.ckpt")

    pclm_all = "--model.init_args.train_parts=[projector,mixer,language_model]"
    dpo_lr = f"--model.init_args.optimizer.init_args.lr={args.dpo_lr}"
    return [
        Stage(path("sft"), CONFIGS["sft"], args.sft_steps, encoder_ckpt),
        Stage(path("base"), CONFIGS["sft"], 2 * args.stage_steps, path("sft"), arm="last-layer SFT"),
        Stage(path("pclm1"), CONFIGS["pclm"], args.stage_steps, path("sft")),
        Stage(path("pclm2"), CONFIGS["pclm"], args.stage_steps, path("pclm1"), (pclm_all,), arm="PCLM"),
        Stage(path("dpo_random"), CONFIGS["dpo"], args.dpo_steps, path("pclm2"),
              ("--model.init_args.negatives=random", dpo_lr), arm="PCLM + DPO"),
        Stage(path("dpo_adversarial"), CONFIGS["dpo"], args.dpo_steps, path("pclm2"),
              ("--model.init_args.negatives=adversarial", dpo_lr), arm="PCLM + DPO (adversarial negatives)"),
        Stage(path("base_mix"), CONFIGS["sft"], args.dpo_steps, path("base"), dpo_mix(), arm="last-layer SFT + mix"),
        Stage(path("pclm_mix"), CONFIGS["pclm"], args.dpo_steps, path("pclm2"),
              ("--model.init_args.train_parts=[language_model]", *dpo_mix()), arm="PCLM + mix"),
    ]


def run_seed(seed: int, args, folder: str) -> tuple[dict[str, dict[str, float]], dict]:
    """Pre-train this seed's encoder, then every stage of `plan`; the tested arms and the encoder's probes."""
    encoder_ckpt, probes, content_acc = pretrain(seed, args, folder)
    arms: dict[str, dict[str, float]] = {}
    for stage in kit.progress(plan(seed, args, encoder_ckpt, folder), f"seed {seed}"):
        model, data = fit(stage.config, seed, stage.steps, stage.name, args,
                          f"--model.init_args.init_from={stage.init}", *stage.overrides)
        if stage.arm is not None:
            arms[stage.arm] = test(model, data)
    return {arm: arms[arm] for arm in ARMS}, {"seed": seed, "probes": probes, "val_content_acc": content_acc}


def probe_drop(encoders: list[dict]) -> dict:
    """Per attribute: final minus first hidden state's probe accuracy over the seeds' encoders, mean and 95% t
    interval (the paper's probing diagnostic: the attribute fades with depth; null bounds with one seed)."""
    out = {}
    for name in encoders[0]["probes"]:
        mean, lo, hi, n = paired_interval([e["probes"][name][-1] - e["probes"][name][0] for e in encoders])
        out[name] = {"mean": mean, "lo": lo if n > 1 else None, "hi": hi if n > 1 else None, "n": n}
    return out


def paired(per_seed: list[dict]) -> dict:
    """The paired block: every arm - last-layer SFT, the later PCLM arms - PCLM, the DPO arms - PCLM + mix (DPO
    against the same questions seen supervised), PCLM + mix - last-layer SFT + mix."""
    metrics = PAIRED_METRICS
    return {**paired_block(per_seed, "last-layer SFT", metrics),
            **paired_block(per_seed, "PCLM", metrics, arms=[*DPO_ARMS, "PCLM + mix"]),
            **paired_block(per_seed, "PCLM + mix", metrics, arms=DPO_ARMS),
            **paired_block(per_seed, "last-layer SFT + mix", metrics, arms=["PCLM + mix"])}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
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
    axes[1].set_xticks(x, [textwrap.fill(a, 14) for a in arms], fontsize=7)
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


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=5)
    parser.add_argument("--train", type=int, default=1200, help="training questions per seed")
    parser.add_argument("--val", type=int, default=200, help="validation questions (probes' held-out clips)")
    parser.add_argument("--test", type=int, default=400, help="adversarial test questions")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--pretrain-lr", type=float, default=0.002)
    parser.add_argument("--probe-examples", type=int, default=600)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--stage-steps", type=int, default=60, help="steps of each PCLM stage (baseline: twice)")
    parser.add_argument("--dpo-steps", type=int, default=60)
    parser.add_argument("--dpo-lr", type=float, default=1e-4)
    args = parser.parse_args(argv)
    if args.smoke:
        args.train, args.val, args.test, args.batch_size = 32, 16, 16, 16
        args.pretrain_steps, args.sft_steps, args.stage_steps, args.dpo_steps, args.probe_examples = 2, 2, 1, 1, 16
    if espeak.backend() is None:
        raise UserInputError("experiments.pclm synthesises its speech with espeak-ng, which is not available: "
                             "`pip install espeakng-loader` (one of this package's requirements).")
    kit.quiet_single_thread()
    for name in ("lightning_modules", "callbacks"):
        logging.getLogger(name).setLevel(logging.ERROR)
    start = time.time()
    per_seed = []
    encoders = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in kit.progress(range(args.seeds), "seeds"):
            arms_of_seed, encoder = run_seed(seed, args, folder)
            per_seed.append(arms_of_seed)
            encoders.append(encoder)
    arms = kit.summarise(per_seed)
    probes = {name: [float(np.mean([e["probes"][name][layer] for e in encoders])) for layer in range(len(accs))]
              for name, accs in encoders[0]["probes"].items()}
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config["configs"] = CONFIGS
    config["mix"] = list(dpo_mix())
    config["pretrain_seeds"] = [PRETRAIN_DATA_SEED + seed for seed in range(args.seeds)]
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="pclm", paired=paired(per_seed), probes=probes,
                              probes_per_seed=encoders, probe_drop=probe_drop(encoders),
                              pretrain_val_content_acc=float(np.mean([e["val_content_acc"] for e in encoders])))
    plot(result, os.path.join(args.out, "pclm.png"))
    main_metrics = ["acc_gt", "ala", *(f"acc_gt/{t}" for t in TASKS)]
    print(kit.markdown_table(arms, main_metrics))
    print(f"\nprobe accuracy per encoder layer (pre-trained encoders, mean over {args.seeds} seeds):")
    for name, accs in probes.items():
        print(f"  {name:8s} " + " ".join(f"{a:.2f}" for a in accs))
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
