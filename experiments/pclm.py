"""Do audio LLMs listen or read? Last-layer SFT vs PCLM vs PCLM + DPO on espeak-ng speech (``experiments.pclm``).

Paper: "Do Audio LLMs Listen or Read? Analyzing and Mitigating Paralinguistic Failures with VoxParadox" (arXiv
2605.27772). Claim: a model that feeds only the last encoder layer to its LLM answers paralinguistic questions from
the transcript (high ALA on adversarial items); prompt-conditioned layer mixing (PCLM) raises Acc_GT and weights
shallow layers for pitch and speed; DPO lowers ALA further.

Protocol (CPU, embedded data: `datamodules.paralinguistic_speech`, tasks pitch, speed, gender, volume; speech
from espeak-ng, installed with pip):

0. **Encoder pre-training, once** (``configs/pclm/pretrain_quick.yaml`` at ``--pretrain-steps``; its own data
   seed): classify the sentence with pitch/speed/voice/volume drawn at random, so that the deep layers become
   paralinguistically invariant. Then the per-layer linear probes (`callbacks.layer_probing.LayerProbing`:
   logistic regression on mean-pooled states, train clips -> validation clips) are written to ``probes`` in the
   JSON: the diagnostic that must hold before the PCLM claim is read. The encoder is then frozen for every arm and
   seed (as the pre-trained encoder of an audio LLM).
1. Per seed (data and initialisation change with the seed): **last-layer SFT** for ``--sft-steps``
   (``configs/pclm/sft_quick.yaml``; training questions 85% congruent, 15% neutral). Then, from that checkpoint,
   with the same further budget ``--stage-steps`` x 2:

   * ``last-layer SFT``: the same SFT continued for 2 x ``--stage-steps`` (same data, optimiser, lr);
   * ``PCLM``: stage 1 (projectors cloned from the SFT projector + mixer; ``configs/pclm/quick.yaml``) for
     ``--stage-steps``, then stage 2 (LM unfrozen too) for ``--stage-steps``;
   * ``PCLM + DPO``: from the PCLM checkpoint, ``--dpo-steps`` of DPO (``configs/pclm/dpo_quick.yaml``: beta 0.1,
     LM only, frozen reference = the PCLM model, rejected = a random wrong option);
   * ``PCLM + DPO (adversarial negatives)``: the same with rejected = the option the transcript asserts.

   Both DPO arms use the DPO config's training questions (65% congruent, 20% incongruent, 15% neutral: the
   adversarial-negative variant needs questions whose transcript asserts a wrong option), a fresh draw of the same
   seed. The last weights of each arm are tested (no model selection at all, so test data never selects).
2. Test: the adversarial split (every transcript contradicts the audio), ``acc_gt`` and ``ala`` overall and per
   task (``acc_gt/<task>``, ``ala/<task>``); for PCLM arms the mean mixing weight per layer for each task's prompts
   (``alpha/<task>/layer<l>``).

Outputs: a markdown table (mean ± std over seeds), ``results/pclm.json`` (kit schema + ``probes``) and
``results/pclm.png`` (probe accuracy per layer; Acc_GT / ALA per arm; alpha per layer for pitch and speed).
"""
from __future__ import annotations

import logging
import os
import tempfile
import time

import numpy as np

from callbacks.layer_probing import LayerProbing
from datamodules import espeak
from experiments import kit
from lightning_modules.shared.errors import UserInputError

CONFIGS = {"pretrain": "configs/pclm/pretrain_quick.yaml", "sft": "configs/pclm/sft_quick.yaml",
           "pclm": "configs/pclm/quick.yaml", "dpo": "configs/pclm/dpo_quick.yaml"}
ARMS = ("last-layer SFT", "PCLM", "PCLM + DPO", "PCLM + DPO (adversarial negatives)")
TASKS = ("pitch", "speed", "gender", "volume")
PRETRAIN_DATA_SEED = 1000
PAPER = "Do Audio LLMs Listen or Read? VoxParadox / PCLM (arXiv 2605.27772)"


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


def pretrain(args, folder: str) -> tuple[str, dict[str, list[float]], float]:
    """Content-only encoder pre-training (once), its probes, and its validation content accuracy."""
    path = os.path.join(folder, "pretrain.ckpt")
    model, data = fit(CONFIGS["pretrain"], PRETRAIN_DATA_SEED, args.pretrain_steps, path, args,
                      f"--model.init_args.optimizer.init_args.lr={args.pretrain_lr}")
    probing = LayerProbing(max_examples=args.probe_examples)
    data.setup("fit")
    probes = probing.probe(model, data.train_dataloader(), data.val_dataloader())
    trainer = kit.quiet_trainer()
    metrics = trainer.validate(model, datamodule=data, verbose=False)[0]
    return path, probes, float(metrics["val/content_acc"])


def run_seed(seed: int, args, encoder_ckpt: str, folder: str) -> dict[str, dict[str, float]]:
    def path(name: str) -> str:
        return os.path.join(folder, f"{name}_{seed}.ckpt")

    def baseline():
        model, data = fit(CONFIGS["sft"], seed, 2 * args.stage_steps, path("base"), args,
                          f"--model.init_args.init_from={path('sft')}")
        arms["last-layer SFT"] = test(model, data)

    def pclm():
        fit(CONFIGS["pclm"], seed, args.stage_steps, path("pclm1"), args, f"--model.init_args.init_from={path('sft')}")
        model, data = fit(CONFIGS["pclm"], seed, args.stage_steps, path("pclm2"), args,
                          f"--model.init_args.init_from={path('pclm1')}",
                          "--model.init_args.train_parts=[projector,mixer,language_model]")
        arms["PCLM"] = test(model, data)

    def dpo(arm: str, negatives: str):
        model, data = fit(CONFIGS["dpo"], seed, args.dpo_steps, path(f"dpo_{negatives}"), args,
                          f"--model.init_args.init_from={path('pclm2')}", f"--model.init_args.negatives={negatives}",
                          f"--model.init_args.optimizer.init_args.lr={args.dpo_lr}")
        arms[arm] = test(model, data)

    arms: dict[str, dict[str, float]] = {}
    stages = [lambda: fit(CONFIGS["sft"], seed, args.sft_steps, path("sft"), args,
                          f"--model.init_args.init_from={encoder_ckpt}"),
              baseline, pclm, lambda: dpo("PCLM + DPO", "random"),
              lambda: dpo("PCLM + DPO (adversarial negatives)", "adversarial")]
    for stage in kit.progress(stages, f"seed {seed}"):
        stage()
    return arms


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, accs in result["probes"].items():
        axes[0].plot(range(len(accs)), accs, marker="o", label=name)
    axes[0].set(xlabel="encoder hidden state (0 = conv output)", ylabel="linear probe accuracy",
                title="probes of the pre-trained encoder")
    axes[0].legend(fontsize=7)
    arms = result["arms"]
    x = np.arange(len(arms))
    for offset, metric in ((-0.2, "acc_gt"), (0.2, "ala")):
        axes[1].bar(x + offset, [arms[a][metric]["mean"] for a in arms], 0.4,
                    yerr=[arms[a][metric]["std"] for a in arms], label=metric)
    axes[1].set_xticks(x, [a.replace(" (", "\n(") for a in arms], fontsize=7)
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
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
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
    with tempfile.TemporaryDirectory() as folder:
        encoder_ckpt, probes, content_acc = pretrain(args, folder)
        for seed in kit.progress(range(args.seeds), "seeds"):
            per_seed.append(run_seed(seed, args, encoder_ckpt, folder))
    arms = kit.summarise(per_seed)
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config["configs"] = CONFIGS
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="pclm", probes=probes,
                              pretrain_val_content_acc=content_acc)
    plot(result, os.path.join(args.out, "pclm.png"))
    main_metrics = ["acc_gt", "ala", *(f"acc_gt/{t}" for t in TASKS)]
    print(kit.markdown_table(arms, main_metrics))
    print("\nprobe accuracy per encoder layer (pre-trained encoder):")
    for name, accs in probes.items():
        print(f"  {name:8s} " + " ".join(f"{a:.2f}" for a in accs))
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
