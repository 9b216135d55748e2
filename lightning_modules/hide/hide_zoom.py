"""HiDe's zoom-in algorithm as plain functions on arrays: token-wise attention decoupling (TAD) and layout-preserving
decoupling (LPD). Paper: "HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling"
(Liu et al., arXiv 2510.00054); official code github.com/Tennine2077/HiDe (``Hide/Qwen2.5/Get_box.py``,
``utiles.py``). Any model can use these: they take attention maps (one ``[tokens, h, w]`` array per image, the
rows of one decoder layer averaged over heads) and images (``[H, W, C]`` arrays).

TAD (``tad_boxes``), as the release computes it:

1. ``smooth(M) = norm(G_sigma * M)`` with ``norm(x) = (x - min) / (max - min)`` and ``G_sigma`` a Gaussian filter
   (``scipy.ndimage.gaussian_filter``, the release's choice: same boundary handling and truncation).
2. Noise prior per image: ``N = mean_k smooth(M_k)`` over the *prior* tokens (the release: the first 8 text
   tokens after the last image, i.e. the fixed instruction "Search the following entities in the images:").
3. For every *entity* token: the image whose raw map has the highest peak is chosen; ``a = smooth(M_k) - N``,
   negatives set to 0, the token is skipped when ``max(a) <= 0``, else ``a = norm(a)``.
4. ``a >= threshold``, 8-connected components (``scipy.ndimage.label`` with a 3x3 structure; the release uses
   ``skimage.measure.label(connectivity=2)``, the same labelling), one bounding box per component, sorted by the
   summed attention inside it, boxes normalised to [0, 1] of the token grid. Boxes of every entity token are pooled
   per image.

LPD (``merge_boxes`` + ``compact_image``): boxes scaled to the original image's pixels, any overlapping or
touching boxes merged into their union until none are left, then the canvas is compacted: the sorted unique box
edges cut each axis into intervals, an interval keeps its length iff some box spans it, so empty strips between
boxes vanish while left/right and above/below order is kept; each box's pixels are copied unchanged to the
compacted position. The canvas outside the boxes is transparent in the release (RGBA PNG); here it is ``fill``
(0 = black, what an RGB processor sees of a transparent pixel after ``convert("RGB")``) and ``mask`` says which
pixels were copied.

``raw_attention_boxes`` is the ablation without decoupling (threshold the normalised raw map of each entity token).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1); normalised boxes in [0, 1], pixel boxes half-open


def minmax_normalise(x: np.ndarray) -> np.ndarray:
    """``(x - min) / (max - min)``; a constant map becomes all zeros (the release divides by zero there)."""
    x = np.asarray(x, dtype=np.float64)
    span = x.max() - x.min()
    return np.zeros_like(x) if span <= 0 else (x - x.min()) / span


def smooth(attention: np.ndarray, sigma: float) -> np.ndarray:
    """``norm(G_sigma * M)`` of one 2-D map (sigma 0: no filtering)."""
    attention = np.asarray(attention, dtype=np.float64)
    return minmax_normalise(ndimage.gaussian_filter(attention, sigma) if sigma > 0 else attention)


def noise_prior(prior_maps: np.ndarray, sigma: float) -> np.ndarray:
    """Mean over the prior tokens of their smoothed, normalised maps (``prior_maps``: ``[tokens, h, w]``)."""
    prior_maps = np.asarray(prior_maps)
    if prior_maps.ndim != 3 or len(prior_maps) == 0:
        raise ValueError(f"prior maps must be [tokens >= 1, h, w], got shape {prior_maps.shape}")
    return np.mean([smooth(m, sigma) for m in prior_maps], axis=0)


def purified_map(attention: np.ndarray, prior: np.ndarray, sigma: float) -> np.ndarray | None:
    """``norm(relu(smooth(M) - N))``, or None when nothing is left above the prior (the release skips the token)."""
    a = smooth(attention, sigma) - prior
    a[a < 0] = 0
    if a.max() <= 0:
        return None
    return minmax_normalise(a)


def boxes_from_map(a: np.ndarray, threshold: float, top_n: int | None = None) -> list[Box]:
    """Bounding boxes of the 8-connected components of ``a >= threshold``, sorted by the attention mass inside
    them (largest first), normalised to [0, 1] of the grid: ``(x0, y0, x1, y1)`` with x1/y1 exclusive."""
    a = np.asarray(a, dtype=np.float64)
    h, w = a.shape
    labels, count = ndimage.label(a >= threshold, structure=np.ones((3, 3), dtype=int))
    if count == 0:
        return []
    masses = ndimage.sum(a, labels, index=np.arange(1, count + 1))
    slices = ndimage.find_objects(labels)
    order = np.argsort(-np.asarray(masses), kind="stable")
    if top_n is not None:
        order = order[:top_n]
    return [(slices[i][1].start / w, slices[i][0].start / h, slices[i][1].stop / w, slices[i][0].stop / h)
            for i in order]


def tad_boxes(maps: Sequence[np.ndarray], prior_tokens: Sequence[int], entity_tokens: Sequence[int],
              sigma: float, threshold: float, top_n: int | None = None) -> list[list[Box]]:
    """Token-wise attention decoupling: the pooled normalised boxes of every entity token, one list per image.

    ``maps[i]`` is image i's ``[text tokens, h_i, w_i]`` attention (rows = query tokens, one layer, mean over heads);
    ``prior_tokens`` / ``entity_tokens`` index its rows."""
    if not maps:
        return []
    if len(prior_tokens) == 0:
        raise ValueError("TAD needs at least one prior token to estimate the noise prior")
    priors = [noise_prior(np.asarray(m)[list(prior_tokens)], sigma) for m in maps]
    boxes: list[list[Box]] = [[] for _ in maps]
    for k in entity_tokens:
        image = int(np.argmax([float(np.asarray(m)[k].max()) for m in maps]))
        a = purified_map(np.asarray(maps[image])[k], priors[image], sigma)
        if a is not None:
            boxes[image].extend(boxes_from_map(a, threshold, top_n))
    return boxes


def raw_attention_boxes(maps: Sequence[np.ndarray], entity_tokens: Sequence[int], threshold: float,
                        top_n: int | None = None) -> list[list[Box]]:
    """The ablation without decoupling: boxes of ``norm(M_k) >= threshold`` for every entity token (no smoothing,
    no prior), pooled per image, the image chosen by the peak as in TAD."""
    boxes: list[list[Box]] = [[] for _ in maps]
    for k in entity_tokens:
        image = int(np.argmax([float(np.asarray(m)[k].max()) for m in maps]))
        boxes[image].extend(boxes_from_map(minmax_normalise(np.asarray(maps[image])[k]), threshold, top_n))
    return boxes


def scale_boxes(boxes: Sequence[Box], height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Normalised boxes to integer pixel boxes of an ``height x width`` image (outward rounding, clipped)."""
    out = []
    for x0, y0, x1, y1 in boxes:
        px0, py0 = max(0, int(np.floor(x0 * width))), max(0, int(np.floor(y0 * height)))
        px1, py1 = min(width, int(np.ceil(x1 * width))), min(height, int(np.ceil(y1 * height)))
        if px1 > px0 and py1 > py0:
            out.append((px0, py0, px1, py1))
    return out


def _touch(a, b) -> bool:
    """Half-open boxes that overlap or share an edge/corner."""
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def merge_boxes(boxes: Sequence[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Replace any two overlapping or touching boxes by their union until no two touch (order: by x0, then y0)."""
    boxes = [tuple(b) for b in boxes]
    changed = True
    while changed:
        changed = False
        out: list[tuple] = []
        for box in boxes:
            for i, other in enumerate(out):
                if _touch(box, other):
                    out[i] = (min(box[0], other[0]), min(box[1], other[1]), max(box[2], other[2]),
                              max(box[3], other[3]))
                    changed = True
                    break
            else:
                out.append(box)
        boxes = out
    return sorted(boxes, key=lambda b: (b[0], b[1]))


def _axis_map(starts: Sequence[int], stops: Sequence[int]) -> tuple[dict[int, int], int]:
    """Compaction of one axis: cut points = sorted unique box edges; an interval keeps its length iff a box spans
    it. Returns {cut point: new coordinate} and the kept length."""
    cuts = sorted(set(starts) | set(stops))
    position, mapping = 0, {cuts[0]: 0}
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if any(s <= lo and hi <= e for s, e in zip(starts, stops)):
            position += hi - lo
        mapping[hi] = position
    return mapping, position


def compact_image(image: np.ndarray, boxes: Sequence[tuple[int, int, int, int]], fill: float = 0,
                  merge: bool = True) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, int]]]:
    """Layout-preserving compaction of ``image`` (``[H, W]`` or ``[H, W, C]``) to the pixel ``boxes``.

    Returns ``(canvas, mask, placed)``: the compacted canvas (``fill`` outside the boxes), a boolean mask of the
    copied pixels, and each (merged) box's position on the canvas. Raises ValueError when there is no box."""
    boxes = merge_boxes(boxes) if merge else [tuple(b) for b in boxes]
    if not boxes:
        raise ValueError("compaction needs at least one box")
    x_map, width = _axis_map([b[0] for b in boxes], [b[2] for b in boxes])
    y_map, height = _axis_map([b[1] for b in boxes], [b[3] for b in boxes])
    canvas = np.full((height, width) + image.shape[2:], fill, dtype=image.dtype)
    mask = np.zeros((height, width), dtype=bool)
    placed = []
    for x0, y0, x1, y1 in boxes:
        nx, ny = x_map[x0], y_map[y0]
        canvas[ny:ny + y1 - y0, nx:nx + x1 - x0] = image[y0:y1, x0:x1]
        mask[ny:ny + y1 - y0, nx:nx + x1 - x0] = True
        placed.append((nx, ny, nx + x1 - x0, ny + y1 - y0))
    return canvas, mask, placed


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x0, y0, x1, y1)`` boxes (same units)."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def best_iou(boxes: Sequence[Sequence[float]], target: Sequence[float]) -> float:
    """The IoU of the box that overlaps ``target`` best (0 without boxes)."""
    return max((box_iou(b, target) for b in boxes), default=0.0)
