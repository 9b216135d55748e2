"""TIVDiff at small scale (a RECONSTRUCTION; no paper text or code exists): ``python -m experiments tivdiff``.

Paper: "Towards Trustworthy and Identifiable Virtual Face Generation" (TIVDiff, ICML 2026; no arXiv id). The
method here is the collection's reconstruction from the paper's title and abstract-level description (see
``lightning_modules/tivdiff/tivdiff.py``, which lists every reconstructed piece); this experiment shows its two
mechanisms on the embedded parametric faces, not the paper's face results (none are known).

The protocol is ``configs/tivdiff/experiment.yaml`` (sizes, steps, seeds, the smoke overlay); this module holds its
hooks. Per seed S (data, keys, weights and sampling noise all change with the seed):
1. synthetic faces (60 identities x 12 images at 16x16; 25% of identities held out; data seed S), stage 1 (arm
   ``encoder``, a helper run: ``row: false``): the identity encoder (CosFace; ``configs/tivdiff/encoder_quick.yaml``,
   200 steps, model seed S), stage 2 (arm ``VIP (trained)``): VIP + geometry-conditioned DDPM on the frozen encoder
   (``configs/tivdiff/quick.yaml``, 700 steps, model seed S + 1000, ``init_from`` stage 1's last checkpoint, set by
   `prepare`), with the config's callbacks plus ``EMAWeights`` (decay 0.995, warm-up); no validation. The
   experiment overrides the data sizes, the number of training identities, the VIP width (64 in both stages: stage
   2 starts from stage 1's weights), the lr (2e-3), the DDIM steps (50) and the watermark bits (32).
`evaluate` (on stage 2, with the EMA weights) measures, as the run's own row and derived rows:
2. **VIP** on ``settings.vip_identities`` fresh unseen people (4 images each, a new data seed; each person has user
   key A and a second key B): ``verif_auc`` (same key, same vs different person), ``linkability_auc`` (key A vs
   key B, same vs different person; 0.5 = unlinkable), ``cos_e_v`` (mean cos of a face's original embedding and
   its virtual identity) and ``reid_auc`` (original embedding vs virtual identity, same vs different person;
   0.5 = no re-identification), for the original embedding (no projection), the untrained keyed orthogonal
   projection and the trained VIP;
3. **IGGW**: ``settings.faces`` virtual faces of held-out people generated with DDIM (the model's
   ``num_inference_steps``) from watermarked noise, verified by DDIM inversion: bit accuracy with the right key, a
   wrong key (attacker key: other VID and key stream), after Gaussian pixel noise (sigma 0.05, 0.1) and blur (sigma
   0.7 px), for unwatermarked faces checked with the right key, and with only ``settings.few_steps`` DDIM steps;
   ``verify_auc`` separates watermarked from unwatermarked faces by bit accuracy. ``exact`` is the round trip
   without diffusion (noise -> bits);
4. **quality with / without the watermark**: virtual faces (``face_verif_auc``: the encoder verifies two virtual
   faces of the same person+key against different people; ``face_reid_auc``: a virtual face against the person's
   real embedding; ``frechet``: Frechet distance of encoder embeddings of generated vs real held-out faces), also
   for virtual faces from the untrained orthogonal projection, and faces generated from real identities of
   training people (``id_accuracy`` of the encoder's classifier).

`report` puts the rows in that order and adds the pairs of ``settings.paired`` after the runner's (every row minus
the original embedding); `plot` draws seed 0's samples and the bit accuracies. Outputs: a markdown table (mean ±
std over seeds), ``results/tivdiff.json`` and ``results/tivdiff.png``.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import linalg
from sklearn.metrics import roc_auc_score

from callbacks.ema import EMAWeights
from datamodules.face_renderer import gaussian_blur, synthetic_faces
from datamodules.synthetic_faces import key_for_identities
from experiments import kit, runner
from experiments.runner import ExperimentError
from icml26.paired import paired_block
from lightning_modules.tivdiff.tivdiff import MAX_KEY, bit_accuracy, extract_message, message_bits

ENCODER_ARM = "encoder"   # stage 1, read by `prepare` (init_from) and never a row
_SAMPLES: dict = {}       # seed 0's sample faces, kept by `report` for `plot` (tensors are no JSON)


def pair_auc(a: torch.Tensor, b: torch.Tensor, labels_a: torch.Tensor, labels_b: torch.Tensor,
             same_set: bool) -> float:
    """AUC of cosine similarity for same-person vs different-person pairs (i != j when a and b are one set)."""
    sims = (a @ b.T).numpy()
    same = (labels_a[:, None] == labels_b[None, :]).numpy()
    mask = ~np.eye(len(a), dtype=bool) if same_set else np.ones_like(same)
    return float(roc_auc_score(same[mask], sims[mask]))


def frechet(x: torch.Tensor, y: torch.Tensor) -> float:
    """Frechet distance between Gaussians fitted to two feature sets (the FID formula on encoder features)."""
    x, y = x.double().numpy(), y.double().numpy()
    mu_x, mu_y = x.mean(0), y.mean(0)
    cov_x, cov_y = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    root = linalg.sqrtm(cov_x @ cov_y).real
    return float(((mu_x - mu_y) ** 2).sum() + np.trace(cov_x + cov_y - 2 * root))


def projection_metrics(e: torch.Tensor, v_a: torch.Tensor, v_b: torch.Tensor, labels: torch.Tensor) -> dict:
    return {"verif_auc": pair_auc(v_a, v_a, labels, labels, True),
            "linkability_auc": pair_auc(v_a, v_b, labels, labels, False),
            "cos_e_v": float((e * v_a).sum(-1).mean()),
            "reid_auc": pair_auc(e, v_a, labels, labels, False)}


def prepare(run) -> dict:
    """Stage 2 starts from stage 1's weights: ``init_from`` = the encoder run's last checkpoint (every weight matches
    by name and shape, as the quick config's comment runs it by hand)."""
    if run.arm.name == ENCODER_ARM:
        return {}
    encoder = run.earlier.get(ENCODER_ARM)
    if encoder is None or not encoder.fitted:
        raise ExperimentError(f"tivdiff: the arm {run.arm.name!r} needs the '{ENCODER_ARM}' arm run before it on "
                              "the same seed (list it first in configs/tivdiff/experiment.yaml)")
    last = [c for c in encoder.trainer.checkpoint_callbacks if not getattr(c, "monitor", None)]
    path = last[0].best_model_path if last else ""
    if not path:
        raise ExperimentError("tivdiff: the encoder run saved no checkpoint; keep the monitor-less ModelCheckpoint "
                              "of configs/tivdiff/encoder_quick.yaml")
    return {"model.init_args.init_from": path}


def _setting(run, key: str) -> int:
    value = run.settings.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExperimentError(f"tivdiff: settings.{key} must be a positive integer, got {value!r}")
    return value


def evaluate(run) -> dict[str, float]:
    """Stage 1: nothing (a helper run). Stage 2: the VIP, IGGW and quality measurements (module docstring) with
    the EMA weights; returns the trained VIP's metrics and adds the other rows as ``run.derived``."""
    if run.arm.name == ENCODER_ARM:
        return {}
    with torch.no_grad():
        arms, samples = measure(run)
    run.extra["rows"] = list(arms)
    if run.seed == 0:
        run.extra["samples"] = samples
    own = arms.pop(run.arm.name)
    run.derived.update(arms)
    return own


@torch.no_grad()
def measure(run) -> tuple[dict, dict]:
    model, data, seed = run.model, run.datamodule, run.seed
    vip_identities, n_faces, n_few_steps = (_setting(run, k) for k in ("vip_identities", "faces", "few_steps"))
    bits = model.watermark_bits
    ema = [c for c in run.trainer.callbacks if isinstance(c, EMAWeights)]
    if not ema:
        raise ExperimentError("tivdiff: stage 2 has no EMAWeights callback; add it to the arm's trainer.callbacks")
    for name, p in model.named_parameters():  # evaluate with the EMA weights
        if name in ema[0].averages:
            p.copy_(ema[0].averages[name])
    model.eval()

    val, test = data.split_tensors("val"), data.split_tensors("test")
    head = torch.nn.functional.normalize(model.identity_head, dim=-1)
    e_val, e_test = model.embed(val["image"]), model.embed(test["image"])
    labels = test["identity"]
    key_a = test["key"]
    v_a = model.virtual_identity(e_test, key_a)

    # ---- VIP on a fresh set of unseen people (more pairs than the held-out split: tighter AUCs)
    fresh_images, _, fresh_ids, _, _ = synthetic_faces(vip_identities, 4, 16, seed=10_000 + seed)
    e_fresh = model.embed(fresh_images)
    fresh_a = key_for_identities(fresh_ids, seed)
    fresh_b = key_for_identities(fresh_ids, seed + 1)  # every person's second (different) user key
    arms: dict[str, dict] = {
        "original embedding (no projection)": projection_metrics(e_fresh, e_fresh, e_fresh, fresh_ids),
        "keyed orthogonal projection (VIP untrained)": projection_metrics(
            e_fresh, model.virtual_identity(e_fresh, fresh_a, trained=False),
            model.virtual_identity(e_fresh, fresh_b, trained=False), fresh_ids),
        "VIP (trained)": projection_metrics(e_fresh, model.virtual_identity(e_fresh, fresh_a),
                                            model.virtual_identity(e_fresh, fresh_b), fresh_ids),
        "real faces (reference)": {
            "id_accuracy": float(((e_val @ head.T).argmax(-1) == val["identity"]).float().mean()),
            "verif_auc": pair_auc(e_fresh, e_fresh, fresh_ids, fresh_ids, True)},
    }

    # ---- IGGW on virtual faces of held-out people (a seeded subset)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(labels), generator=gen)[:n_faces]
    v, keys, geometry, lab, e_sub = v_a[rows], key_a[rows], test["geometry"][rows], labels[rows], e_test[rows]
    message, z_wm = model.watermarked_noise(v, keys, gen)
    z_plain = torch.randn(z_wm.shape, generator=gen)
    faces_wm = model.generate(v, geometry, z_wm)
    faces_plain = model.generate(v, geometry, z_plain)

    def accuracy(faces, cond, key, msg):
        return bit_accuracy(extract_message(model.invert(faces, cond, geometry), key, bits), msg)

    right = accuracy(faces_wm, v, keys, message)
    wrong_keys = (keys * 69621 + 7) % MAX_KEY
    v_wrong = model.virtual_identity(e_sub, wrong_keys)
    wrong = accuracy(faces_wm, v_wrong, wrong_keys, message_bits(v_wrong, wrong_keys, bits))
    noise_gen = torch.Generator().manual_seed(seed + 1)
    noisy05 = accuracy((faces_wm + 0.05 * torch.randn(faces_wm.shape, generator=noise_gen)).clamp(0, 1), v, keys,
                       message)
    noisy10 = accuracy((faces_wm + 0.1 * torch.randn(faces_wm.shape, generator=noise_gen)).clamp(0, 1), v, keys,
                       message)
    blurred = accuracy(gaussian_blur(faces_wm, 0.7), v, keys, message)
    unmarked = accuracy(faces_plain, v, keys, message)
    few = model.invert(model.generate(v, geometry, z_wm, steps=n_few_steps), v, geometry, steps=n_few_steps)
    few_steps = bit_accuracy(extract_message(few, keys, bits), message)
    exact = bit_accuracy(extract_message(z_wm, keys, bits), message)
    scores = torch.cat([right, unmarked]).numpy()
    truth = np.r_[np.ones(len(right)), np.zeros(len(unmarked))]
    arms["IGGW watermark"] = {
        "bit_acc_exact_no_diffusion": float(exact.mean()), "bit_acc_right_key": float(right.mean()),
        "bit_acc_wrong_key": float(wrong.mean()), "bit_acc_noise_0.05": float(noisy05.mean()),
        "bit_acc_noise_0.10": float(noisy10.mean()), "bit_acc_blur_0.7px": float(blurred.mean()),
        "bit_acc_unwatermarked": float(unmarked.mean()), "verify_auc": float(roc_auc_score(truth, scores)),
        f"bit_acc_right_key_{n_few_steps}_ddim_steps": float(few_steps.mean())}

    # ---- quality with / without the watermark
    e_real = model.embed(test["image"])
    faces_orthogonal = model.generate(model.virtual_identity(e_sub, keys, trained=False), geometry, z_plain)
    for name, faces in (("no watermark", faces_plain), ("IGGW", faces_wm),
                        ("orthogonal projection (VIP untrained), no watermark", faces_orthogonal)):
        f = model.embed(faces)
        arms[f"virtual faces, {name}"] = {
            "face_verif_auc": pair_auc(f, f, lab, lab, True),
            "face_reid_auc": pair_auc(f, e_sub, lab, lab, False),
            "frechet": frechet(f, e_real)}
    rows_val = torch.randperm(len(val["identity"]), generator=gen)[:n_faces]
    cond, geo_val, lab_val = e_val[rows_val], val["geometry"][rows_val], val["identity"][rows_val]
    keys_val = val["key"][rows_val]
    _, z_val_wm = model.watermarked_noise(cond, keys_val, gen)
    for name, z in (("no watermark", torch.randn(z_val_wm.shape, generator=gen)), ("IGGW", z_val_wm)):
        faces = model.generate(cond, geo_val, z)
        f = model.embed(faces)
        arms[f"faces of real identities, {name}"] = {
            "id_accuracy": float(((f @ head.T).argmax(-1) == lab_val).float().mean()),
            "frechet": frechet(f, e_val)}
    samples = {"real": test["image"][rows[:8]], "geometry": geometry[:8], "virtual_key_a": faces_wm[:8],
               "virtual_plain": faces_plain[:8],
               "virtual_key_b": model.generate(model.virtual_identity(e_sub[:8], (keys[:8] * 48271 + 11) % MAX_KEY),
                                               geometry[:8], z_wm[:8])}
    return arms, samples


def report(result: dict, records: list[dict], spec) -> dict:
    """The rows in the order of the measurements, and the pairs of ``settings.paired`` (``{baseline, arms}``, every
    metric the two share) after the runner's."""
    kept = [extra for seed in records for extra in seed.get("", {}).values() if "rows" in extra]
    order = kept[0]["rows"] if kept else []
    per_seed = [{arm: row[arm] for arm in [*order, *row] if arm in row} for row in result["per_seed"]]
    _SAMPLES.clear()
    _SAMPLES.update(next((extra["samples"] for extra in kept if "samples" in extra), {}))
    block = {}
    for pair in spec.settings.get("paired", []):
        if not isinstance(pair, dict) or not isinstance(pair.get("baseline"), str) or \
                not isinstance(pair.get("arms"), list):
            raise ExperimentError(f"tivdiff: settings.paired entries are {{baseline: ARM, arms: [ARM, ...]}}, "
                                  f"got {pair!r}")
        block.update(paired_block(per_seed, pair["baseline"], None, pair["arms"]))
    return {"arms": kit.summarise(per_seed), "per_seed": per_seed, "paired": block}


def plot(result: dict, path) -> None:
    """Seed 0's faces (real, geometry, virtual with key A with / without IGGW, key B) and the IGGW bit
    accuracies (mean ± std over seeds)."""
    arms, samples = result["arms"], dict(_SAMPLES)
    if not samples:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(14, 5))
    names = list(samples)
    for r, name in enumerate(names):
        for c in range(8):
            ax = fig.add_axes([0.06 + c * 0.055, 0.76 - r * 0.165, 0.05, 0.14])
            ax.imshow(samples[name][c, 0].numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([]), ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name.replace("_", "\n"), fontsize=7)
    ax = fig.add_axes([0.68, 0.1, 0.3, 0.78])
    wm = arms["IGGW watermark"]
    keys = [k for k in wm if k.startswith("bit_acc")]
    ax.barh(range(len(keys)), [wm[k]["mean"] for k in keys], xerr=[wm[k]["std"] for k in keys])
    ax.set_yticks(range(len(keys)), [k.replace("bit_acc_", "") for k in keys], fontsize=8)
    ax.axvline(0.5, color="gray", ls="--")
    ax.set_xlim(0, 1.05)
    ax.set_title("IGGW bit accuracy (mean ± std over seeds)", fontsize=9)
    fig.suptitle("TIVDiff reconstruction: real faces, geometry maps, virtual faces (key A with IGGW / plain noise; "
                 "key B)", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.tivdiff [--smoke] [--seeds N] [--out DIR]
    import sys

    sys.exit(runner.experiment_command(["tivdiff", *sys.argv[1:]]))
