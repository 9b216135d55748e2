"""HiDe on a trained toy MLLM at three clutter levels: ``python -m experiments hide``.

Paper: "HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling" (arXiv
2510.00054). Its claim: a training-free zoom-in (attention of entity tokens minus the prompt's noise prior ->
boxes -> layout-preserving compaction, answered from [original, compact]) beats answering from the full image,
by more when the image is cluttered; magnification alone (upscaling) helps less than removing background; and HiDe
comes close to cropping the ground-truth region.

The protocol is ``configs/hide/experiment.yaml``, run by `experiments.runner`. Per seed S (the model seed and the
data seed):

1. The one configured run trains the toy MLLM of ``configs/hide/toy_mllm_quick.yaml`` as ``python train.py fit``
   builds it (900 AdamW steps on the embedded generator's mixture of single images and [image, crop] pairs,
   validation every 150 steps on single full images), and the config's ModelCheckpoint keeps the weights with the
   best validation accuracy. `evaluate` builds HiDe from ``configs/hide/quick.yaml`` (``settings.hide_config``) with
   ``init_from`` = that checkpoint and the run's ``num_val`` / ``num_test``.
2. HiDe's layer is chosen on the validation split only (the layer whose boxes overlap the targets best, mean IoU);
   sigma and threshold stay at the config's values. The other arms have nothing to tune.
3. On the test split (200 questions per clutter level, 25 % two-target left/right questions), arms ``full image``
   ([image] at the model's 64 px), ``upscaled`` ([image] at 128 px: 4x the visual tokens), ``oracle crop``
   ([image, compaction of the ground-truth boxes grown by ``settings.oracle_margin`` px]) and ``hide`` ([image,
   HiDe's compaction]); metric ``accuracy``, for ``hide`` also ``box_iou`` (best IoU of its merged boxes with each
   target, averaged; a box is at least one token, 16 px, so a perfect hit of an 8 px target scores 0.25),
   ``target_coverage`` (fraction of the target pixels inside HiDe's boxes), ``box_iou_raw`` (the same for boxes of
   the raw attention: no smoothing, no prior subtraction; the TAD ablation) and ``no_zoom_rate``.

The twelve evaluations (four arms x three clutter levels) are of one trained model, so the run is named after the
first (``full image/clutter0``) and `evaluate` adds the other eleven as derived arms (``<arm>/clutter<N>``).
`report` adds ``selected_layers`` (per seed: the chosen layer and the validation box IoU of every layer) and, after
the runner's paired block (every row minus ``full image/clutter0``, across levels), the pairs of ``settings.paired``
per clutter level: the accuracy of every arm minus the full image, of HiDe minus upscaling and minus the oracle
crop, of the oracle crop minus upscaling, seed by seed with a 95% t interval (the collection's rule for a claim).
`plot`: accuracy vs clutter (``results/hide.png``).
"""
from __future__ import annotations

import numpy as np
import torch

from experiments import kit
from experiments.runner import ExperimentError
from icml26.paired import paired_block, paired_table
from lightning_modules.hide.hide_zoom import best_iou, compact_image, merge_boxes, raw_attention_boxes, scale_boxes

ARMS = ("full image", "upscaled", "oracle crop", "hide")
PAIRS = (("hide", "full image"), ("upscaled", "full image"), ("oracle crop", "full image"), ("hide", "upscaled"),
         ("hide", "oracle crop"), ("oracle crop", "upscaled"))  # default of settings.paired


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
def evaluate_arms(hide, examples: list[dict], margin: int) -> dict[str, dict[str, float]]:
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


def build_hide(run):
    """HiDe of ``settings.hide_config`` from the run's best checkpoint (the toy MLLM with the best validation
    accuracy), on the run's seed and validation / test sizes, as ``python train.py test --config ...
    --model.init_args.init_from=<checkpoint>`` builds it."""
    checkpoint = run.best_checkpoint()
    if checkpoint is None:
        raise RuntimeError("the toy MLLM run saved no best checkpoint: its config needs the ModelCheckpoint on "
                           "val/accuracy and at least one validation (trainer.val_check_interval <= max_steps)")
    config = run.settings.get("hide_config", "configs/hide/quick.yaml")
    if not (kit.REPO_ROOT / config).is_file():
        raise ExperimentError(f"settings.hide_config: no config file {config} (paths are relative to the repository "
                              "root)")
    data = run.datamodule.hparams
    cli = run.build(["--config", str(kit.REPO_ROOT / config),
                     f"--data.init_args.num_val={data.num_val}", f"--data.init_args.num_test={data.num_test}",
                     f"--model.init_args.init_from={checkpoint}", "--trainer.logger=false"])
    hide, datamodule = cli.model, cli.datamodule
    hide.load_initial_weights()
    hide.check_backbone()
    hide.eval()
    datamodule.setup("test")
    return hide, datamodule


def checked_pairs(value) -> list[tuple[str, str]]:
    """``settings.paired`` as (method, baseline) pairs of `ARMS`."""
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and set(p) <= set(ARMS) for p in value):
        raise ExperimentError(f"settings.paired must be a list of [method, baseline] pairs of {list(ARMS)}, got "
                              f"{value!r}")
    return [tuple(pair) for pair in value]


def evaluate(run) -> dict[str, float]:
    """HiDe from the run's checkpoint, its layer chosen on validation, then the four arms on the test split at every
    clutter level: returns ``full image/clutter<first>`` (this run's arm) and adds the rest to ``run.derived``."""
    hide, data = build_hide(run)
    val = [data.splits["val"][i] for i in range(len(data.splits["val"]))]
    layer, layer_scores = choose_layer(hide, val)
    test = [data.splits["test"][i] for i in range(len(data.splits["test"]))]
    arms = {}
    for level in data.clutter_levels:
        metrics = evaluate_arms(hide, [e for e in test if e["clutter"] == level], run.settings.get("oracle_margin", 4))
        for arm, values in metrics.items():
            arms[f"{arm}/clutter{level}"] = values
    run.extra.update(selected_layer={"layer": layer, "val_box_iou_by_layer": layer_scores},
                     pairs=checked_pairs(run.settings.get("paired", PAIRS)))
    own = arms.pop(run.arm.name, None)
    if own is None:
        raise RuntimeError(f"the run's arm {run.arm.name!r} is none of the evaluations {sorted(arms)}; name the "
                           f"experiment's arm after one of them, e.g. 'full image/clutter{data.clutter_levels[0]}'")
    run.derived.update(arms)
    return own


def paired(per_seed: list[dict], levels: list[int], pairs=PAIRS) -> dict:
    """The accuracy differences seed by seed with their 95% t interval (`icml26.paired`), per clutter level, for
    every ``(method, baseline)`` of ``pairs`` (default: every arm minus the full image, HiDe minus upscaling
    (magnification alone) and minus the oracle crop, and the oracle crop minus upscaling (removing background vs
    magnifying, with a perfect localiser))."""
    block = {}
    for n in levels:
        for method, baseline in pairs:
            block.update(paired_block(per_seed, f"{baseline}/clutter{n}", ["accuracy"], [f"{method}/clutter{n}"]))
    return block


def report(result: dict, records: list[dict]) -> dict:
    """``selected_layers`` (per seed) and the per-clutter-level pairs (`paired`, printed), which the runner adds to
    its own paired block."""
    runs = [extra for seed in records for extra in seed.get("", {}).values()]
    levels = sorted({int(a.rsplit("clutter", 1)[1]) for a in result["arms"]})
    block = paired(result["per_seed"], levels, runs[0]["pairs"])
    layers = [extra["selected_layer"] for extra in runs]
    print(paired_table(block) + f"\n\nlayers chosen on validation: {[i['layer'] for i in layers]}")
    return {"selected_layers": layers, "paired": block}


def plot(result: dict, path) -> None:
    """Test accuracy of the four arms against clutter (mean ± std over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = result["arms"]
    levels = sorted({int(a.rsplit("clutter", 1)[1]) for a in arms})
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


if __name__ == "__main__":  # the older spelling: python -m experiments.hide [--smoke] [--seeds N] [--out DIR]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["hide", *sys.argv[1:]]))
