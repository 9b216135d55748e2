"""HiDe on a trained toy MLLM at three clutter levels: ``python -m experiments.hide``.

Paper: "HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling" (arXiv
2510.00054). Its claim: a training-free zoom-in (attention of entity tokens minus the prompt's noise prior ->
boxes -> layout-preserving compaction, answered from [original, compact]) beats answering from the full image,
by more when the image is cluttered; magnification alone (upscaling) helps less than removing background; and HiDe
comes close to cropping the ground-truth region.

Per seed:

1. Train the toy MLLM (``configs/hide/toy_mllm_quick.yaml``; data and initialisation seeded; ``--steps`` AdamW steps
   on the embedded generator's mixture of single images and [image, crop] pairs), keeping the weights with the best
   validation accuracy (single full images); the checkpoint is written and HiDe is built from
   ``configs/hide/quick.yaml`` with ``init_from`` pointing to it.
2. HiDe's layer is chosen on the validation split only (the layer whose boxes overlap the targets best, mean IoU);
   sigma and threshold stay at the config's values. The other arms have nothing to tune.
3. On the test split (``--num-test`` questions per clutter level, 25 % two-target left/right questions), arms
   ``full image`` ([image] at the model's 64 px), ``upscaled`` ([image] at 128 px: 4x the visual tokens),
   ``oracle crop`` ([image, compaction of the ground-truth boxes grown by ``--oracle-margin`` px]) and ``hide``
   ([image, HiDe's compaction]); metric ``accuracy``, for ``hide`` also ``box_iou`` (best IoU of its merged boxes
   with each target, averaged; a box is at least one token, 16 px, so a perfect hit of an 8 px target scores
   0.25), ``target_coverage`` (fraction of the target pixels inside HiDe's boxes), ``box_iou_raw`` (the same for
   boxes of the raw attention: no smoothing, no prior subtraction; the TAD ablation) and ``no_zoom_rate``.

Outputs: ``results/hide.json`` (arms ``<arm>/clutter<N>``; ``paired``: per clutter level, the accuracy of every arm
minus the full image, of HiDe minus upscaling and minus the oracle crop, of the oracle crop minus upscaling, seed by
seed with a 95% t interval, the collection's rule for a claim) and ``results/hide.png`` (accuracy vs clutter).
"""
from __future__ import annotations

import logging
import os
import tempfile
import time

import numpy as np
import torch

from experiments import kit
from icml26.paired import paired_block, paired_table
from lightning_modules.hide.hide_zoom import best_iou, compact_image, merge_boxes, raw_attention_boxes, scale_boxes

TOY_CONFIG = "configs/hide/toy_mllm_quick.yaml"
HIDE_CONFIG = "configs/hide/quick.yaml"
ARMS = ("full image", "upscaled", "oracle crop", "hide")
PAPER = "HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling (arXiv 2510.00054)"


def train_toy(seed: int, args, folder: str) -> str:
    """Fit the toy MLLM with keep-best on val/accuracy; returns the path of its checkpoint."""
    overrides = [f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                 f"--data.init_args.num_val={args.num_val}", f"--data.init_args.num_test={args.num_test}"]
    model, data = kit.from_config(TOY_CONFIG, *overrides)
    keep = kit.KeepBest("val/accuracy", mode="max")
    trainer = kit.quiet_trainer([keep], max_steps=args.steps, val_check_interval=max(1, args.steps // args.evals),
                                check_val_every_n_epoch=None, deterministic=True)
    trainer.fit(model, datamodule=data)
    keep.restore(model)
    path = os.path.join(folder, f"toy_mllm_seed{seed}.ckpt")
    trainer.save_checkpoint(path)
    return path


def oracle_compact(image: torch.Tensor, boxes: list, margin: int) -> torch.Tensor:
    h, w = image.shape[:2]
    grown = [(max(0, b[0] - margin), max(0, b[1] - margin), min(w, b[2] + margin), min(h, b[3] + margin))
             for b in boxes]
    return torch.from_numpy(compact_image(image.numpy(), grown)[0])


def box_scores(hide, example: dict) -> float:
    """Raw-attention box IoU of one example (merged pixel boxes; the TAD ablation)."""
    image = example["images"][0]
    backbone = hide.backbone
    entities = backbone.extract_entities(example["question"])
    maps, prior, entity = backbone.attention_maps([image], example["question"], entities, hide.select_layer - 1)
    raw = merge_boxes(scale_boxes(raw_attention_boxes(maps, entity, hide.threshold)[0], *image.shape[:2]))
    return float(np.mean([best_iou(raw, t) for t in example["target_boxes"]]))


def target_coverage(boxes: list, targets: list, shape: tuple[int, int]) -> float:
    """Fraction of the target pixels inside the union of ``boxes`` (pixel boxes), averaged over the targets."""
    covered = np.zeros(shape, dtype=bool)
    for x0, y0, x1, y1 in boxes:
        covered[y0:y1, x0:x1] = True
    return float(np.mean([covered[y0:y1, x0:x1].mean() for x0, y0, x1, y1 in targets]))


@torch.no_grad()
def evaluate(hide, examples: list[dict], margin: int) -> dict[str, dict[str, float]]:
    backbone = hide.backbone
    out = {arm: [] for arm in ARMS}
    iou, iou_raw, no_zoom, coverage = [], [], [], []
    for e in examples:
        image, q, opts = e["images"][0], e["question"], e["options"]
        out["full image"].append(backbone.answer([image], q, opts) == e["answer"])
        out["upscaled"].append(backbone.answer([image], q, opts, resolution=2 * backbone.resolution) == e["answer"])
        out["oracle crop"].append(backbone.answer([image, oracle_compact(image, e["target_boxes"], margin)], q, opts)
                                  == e["answer"])
        result = hide.answer_example({**e, "images": [image]})
        out["hide"].append(result["prediction"] == e["answer"])
        iou.append(float(np.mean([best_iou(result["boxes"][0], t) for t in e["target_boxes"]])))
        iou_raw.append(box_scores(hide, e))
        no_zoom.append(float(not result["compact"]))
        coverage.append(target_coverage(result["boxes"][0], e["target_boxes"], image.shape[:2]))
    metrics = {arm: {"accuracy": float(np.mean(v))} for arm, v in out.items()}
    metrics["hide"].update(box_iou=float(np.mean(iou)), box_iou_raw=float(np.mean(iou_raw)),
                           target_coverage=float(np.mean(coverage)), no_zoom_rate=float(np.mean(no_zoom)))
    return metrics


@torch.no_grad()
def choose_layer(hide, examples: list[dict]) -> tuple[int, dict[int, float]]:
    """The layer (from 1) whose HiDe boxes overlap the validation targets best (ties: the earlier layer)."""
    scores = {}
    for layer in range(1, hide.backbone.num_layers + 1):
        hide.select_layer = layer
        scores[layer] = float(np.mean([np.mean([best_iou(hide.zoom(e["images"][:1], e["question"])["boxes"][0], t)
                                                for t in e["target_boxes"]]) for e in examples]))
    best = max(scores, key=lambda k: (scores[k], -k))
    hide.select_layer = best
    return best, scores


def run_seed(seed: int, args, folder: str) -> tuple[dict, dict]:
    checkpoint = train_toy(seed, args, folder)
    hide, data = kit.from_config(HIDE_CONFIG, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                 f"--data.init_args.num_val={args.num_val}",
                                 f"--data.init_args.num_test={args.num_test}",
                                 f"--model.init_args.init_from={checkpoint}")
    hide.load_initial_weights()
    hide.check_backbone()
    hide.eval()
    data.setup("test")
    val = [data.splits["val"][i] for i in range(len(data.splits["val"]))]
    layer, layer_scores = choose_layer(hide, val)
    test = [data.splits["test"][i] for i in range(len(data.splits["test"]))]
    arms = {}
    for level in kit.progress(data.clutter_levels, f"seed {seed}: clutter levels"):
        metrics = evaluate(hide, [e for e in test if e["clutter"] == level], args.oracle_margin)
        for arm, values in metrics.items():
            arms[f"{arm}/clutter{level}"] = values
    return arms, {"layer": layer, "val_box_iou_by_layer": layer_scores}


def paired(per_seed: list[dict], levels: list[int]) -> dict:
    """The accuracy differences seed by seed with their 95% t interval (`icml26.paired`), per clutter level:
    every arm minus the full image, HiDe minus upscaling (magnification alone) and minus the oracle crop, and the
    oracle crop minus upscaling (removing background vs magnifying, with a perfect localiser)."""
    block = {}
    for n in levels:
        block.update(paired_block(per_seed, f"full image/clutter{n}", ["accuracy"],
                                  [f"{arm}/clutter{n}" for arm in ("hide", "upscaled", "oracle crop")]))
        for baseline in ("upscaled", "oracle crop"):
            block.update(paired_block(per_seed, f"{baseline}/clutter{n}", ["accuracy"], [f"hide/clutter{n}"]))
        block.update(paired_block(per_seed, f"upscaled/clutter{n}", ["accuracy"], [f"oracle crop/clutter{n}"]))
    return block


def plot(arms: dict, levels: list[int], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for arm in ARMS:
        means = [arms[f"{arm}/clutter{n}"]["accuracy"]["mean"] for n in levels]
        stds = [arms[f"{arm}/clutter{n}"]["accuracy"]["std"] for n in levels]
        ax.errorbar(levels, means, yerr=stds, marker="o", capsize=3, label=arm)
    ax.set_xlabel("distractors (clutter)")
    ax.set_ylabel("test accuracy")
    ax.set_title("HiDe on the toy MLLM (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=5)
    parser.add_argument("--steps", type=int, default=900, help="training steps of the toy MLLM per seed")
    parser.add_argument("--evals", type=int, default=6, help="validations during training (keep-best)")
    parser.add_argument("--num-val", type=int, default=50, help="validation questions per clutter level")
    parser.add_argument("--num-test", type=int, default=200, help="test questions per clutter level")
    parser.add_argument("--oracle-margin", type=int, default=4, help="px added around each true box (oracle)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.evals, args.num_val, args.num_test = 4, 1, 2, 3
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    start = time.time()
    per_seed, layers = [], []
    with tempfile.TemporaryDirectory() as folder:
        for seed in kit.progress(range(args.seeds), "seeds"):
            arms, info = run_seed(seed, args, folder)
            per_seed.append(arms)
            layers.append(info)
    arms = kit.summarise(per_seed)
    levels = sorted({int(a.rsplit("clutter", 1)[1]) for a in arms})
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config["configs"] = {"toy_mllm": TOY_CONFIG, "hide": HIDE_CONFIG}
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="hide", selected_layers=layers,
                              paired=paired(per_seed, levels))
    plot(arms, levels, os.path.join(args.out, "hide.png"))
    print(kit.markdown_table(arms))
    print("\n" + paired_table(result["paired"]))
    print(f"\nlayers chosen on validation: {[i['layer'] for i in layers]}; wall {result['wall_s']:.0f} s "
          f"({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
