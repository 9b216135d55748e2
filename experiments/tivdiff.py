"""TIVDiff at small scale (a RECONSTRUCTION; no paper text or code exists): ``python -m experiments.tivdiff``.

Paper: "Towards Trustworthy and Identifiable Virtual Face Generation" (TIVDiff, ICML 2026; no arXiv id). The
method here is the collection's reconstruction from the paper's title and abstract-level description (see
``lightning_modules/tivdiff/tivdiff.py``, which lists every reconstructed piece); this script shows its two mechanisms
on the embedded parametric faces, not the paper's face results (none are known).

Per seed (data, keys, weights and sampling noise all change with the seed):
1. synthetic faces (``--identities`` x ``--images`` at 16x16; 25% of identities held out), stage 1: the identity
   encoder (CosFace; ``configs/tivdiff/encoder_quick.yaml``), stage 2: VIP + geometry-conditioned DDPM (EMA of the
   weights) on the frozen encoder (``configs/tivdiff/quick.yaml``); the experiment overrides the data sizes, the
   number of training identities, the VIP width (64 in both stages: stage 2 starts from stage 1's weights), the
   lr, the DDIM steps and the watermark bits (its command-line options);
2. **VIP** on ``--vip-identities`` fresh unseen people (4 images each, a new data seed; each person has user
   key A and a second key B): ``verif_auc`` (same key, same vs different person), ``linkability_auc`` (key A vs
   key B, same vs different person; 0.5 = unlinkable), ``cos_e_v`` (mean cos of a face's original embedding and
   its virtual identity) and ``reid_auc`` (original embedding vs virtual identity, same vs different person;
   0.5 = no re-identification), for the original embedding (no projection), the untrained keyed orthogonal
   projection and the trained VIP;
3. **IGGW**: ``--faces`` virtual faces of held-out people generated with DDIM (``--steps``) from watermarked
   noise, verified by DDIM inversion: bit accuracy with the right key, a wrong key (attacker key: other VID and key
   stream), after Gaussian pixel noise (sigma 0.05, 0.1) and blur (sigma 0.7 px), for unwatermarked faces checked
   with the right key, and with only ``--few-steps`` DDIM steps; ``verify_auc`` separates watermarked from
   unwatermarked faces by bit accuracy. ``exact`` is the round trip without diffusion (noise -> bits);
4. **quality with / without the watermark**: virtual faces (``face_verif_auc``: the encoder verifies two virtual
   faces of the same person+key against different people; ``face_reid_auc``: a virtual face against the person's
   real embedding; ``frechet``: Frechet distance of encoder embeddings of generated vs real held-out faces), also
   for virtual faces from the untrained orthogonal projection, and faces generated from real identities of
   training people (``id_accuracy`` of the encoder's classifier).

Outputs: a markdown table (mean ± std over seeds), ``results/tivdiff.json`` and ``results/tivdiff.png``
(samples and bit accuracies).
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
from lightning.pytorch import seed_everything
from scipy import linalg
from sklearn.metrics import roc_auc_score

from callbacks.ema import EMAWeights
from datamodules.face_renderer import gaussian_blur, synthetic_faces
from datamodules.synthetic_faces import FaceDataModule, key_for_identities
from experiments import kit
from lightning_modules.tivdiff.tivdiff import MAX_KEY, TIVDiff, bit_accuracy, extract_message, message_bits

ENCODER_CONFIG = "configs/tivdiff/encoder_quick.yaml"   # stage 1: the identity encoder
GENERATOR_CONFIG = "configs/tivdiff/quick.yaml"         # stage 2: VIP + generator on the frozen encoder

PAPER = "Towards Trustworthy and Identifiable Virtual Face Generation (TIVDiff, ICML 2026; reconstruction)"


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


def data_overrides(args, seed: int) -> list[str]:
    return [f"--data.init_args.num_identities={args.identities}", f"--data.init_args.images_per_identity={args.images}",
            "--data.init_args.heldout_identity_fraction=0.25", "--data.init_args.batch_size=64",
            f"--data.init_args.seed={seed}"]


def make_model(config: str, args, num_train: int, seed: int | bool) -> TIVDiff:
    """The config's TIVDiff with the experiment's sizes; ``seed`` is the CLI's seed_everything (False: none)."""
    model, _ = kit.from_config(
        config, f"--seed_everything={str(seed).lower()}", f"--model.init_args.num_train_identities={num_train}",
        f"--model.init_args.embedding_dim={args.dim}", "--model.init_args.vip_hidden=64",
        f"--model.init_args.unet_base_channels={args.unet_channels}",
        f"--model.init_args.num_inference_steps={args.steps}", f"--model.init_args.watermark_bits={args.bits}",
        f"--model.init_args.optimizer.init_args.lr={args.lr}")
    return model


def fit(model: TIVDiff, data: FaceDataModule, steps: int, seed: int, callbacks=()) -> None:
    seed_everything(seed, workers=True, verbose=False)
    kit.quiet_trainer(callbacks, max_steps=steps, limit_val_batches=0).fit(model, datamodule=data)


@torch.no_grad()
def run_seed(seed: int, args) -> tuple[dict, dict]:
    stages = kit.progress(None, f"seed {seed}: encoder, generator, evaluation", total=3)
    _, data = kit.from_config(ENCODER_CONFIG, *data_overrides(args, seed))
    data.setup("fit")
    # the model's initialisation draws from the global RNG: seeded with `seed` (the data draws from its own streams)
    encoder_stage = make_model(ENCODER_CONFIG, args, data.num_train_identities, seed)
    with torch.enable_grad():
        fit(encoder_stage, data, args.encoder_steps, seed)
    stages.update()
    # no reseeding: every weight is overwritten by stage 1's below, and fit() seeds the training
    model = make_model(GENERATOR_CONFIG, args, data.num_train_identities, False)
    model.load_state_dict(encoder_stage.state_dict())  # the frozen encoder of stage 1 (init_from in the configs)
    ema = EMAWeights(decay=args.ema, warmup=True)
    with torch.enable_grad():
        fit(model, data, args.generator_steps, seed + 1000, [ema])
    stages.update()
    for name, p in model.named_parameters():  # evaluate with the EMA weights
        if name in ema.averages:
            p.copy_(ema.averages[name])
    model.eval()

    val, test = data.split_tensors("val"), data.split_tensors("test")
    head = torch.nn.functional.normalize(model.identity_head, dim=-1)
    e_val, e_test = model.embed(val["image"]), model.embed(test["image"])
    labels = test["identity"]
    key_a = test["key"]
    v_a = model.virtual_identity(e_test, key_a)

    # ---- VIP on a fresh set of unseen people (more pairs than the held-out split: tighter AUCs)
    fresh_images, _, fresh_ids, _, _ = synthetic_faces(args.vip_identities, 4, 16, seed=10_000 + seed)
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
    rows = torch.randperm(len(labels), generator=gen)[:args.faces]
    v, keys, geometry, lab, e_sub = v_a[rows], key_a[rows], test["geometry"][rows], labels[rows], e_test[rows]
    message, z_wm = model.watermarked_noise(v, keys, gen)
    z_plain = torch.randn(z_wm.shape, generator=gen)
    faces_wm = model.generate(v, geometry, z_wm)
    faces_plain = model.generate(v, geometry, z_plain)

    def accuracy(faces, cond, key, msg):
        return bit_accuracy(extract_message(model.invert(faces, cond, geometry), key, args.bits), msg)

    right = accuracy(faces_wm, v, keys, message)
    wrong_keys = (keys * 69621 + 7) % MAX_KEY
    v_wrong = model.virtual_identity(e_sub, wrong_keys)
    wrong = accuracy(faces_wm, v_wrong, wrong_keys, message_bits(v_wrong, wrong_keys, args.bits))
    noise_gen = torch.Generator().manual_seed(seed + 1)
    noisy05 = accuracy((faces_wm + 0.05 * torch.randn(faces_wm.shape, generator=noise_gen)).clamp(0, 1), v, keys,
                       message)
    noisy10 = accuracy((faces_wm + 0.1 * torch.randn(faces_wm.shape, generator=noise_gen)).clamp(0, 1), v, keys,
                       message)
    blurred = accuracy(gaussian_blur(faces_wm, 0.7), v, keys, message)
    unmarked = accuracy(faces_plain, v, keys, message)
    few = model.invert(model.generate(v, geometry, z_wm, steps=args.few_steps), v, geometry, steps=args.few_steps)
    few_steps = bit_accuracy(extract_message(few, keys, args.bits), message)
    exact = bit_accuracy(extract_message(z_wm, keys, args.bits), message)
    scores = torch.cat([right, unmarked]).numpy()
    truth = np.r_[np.ones(len(right)), np.zeros(len(unmarked))]
    arms["IGGW watermark"] = {
        "bit_acc_exact_no_diffusion": float(exact.mean()), "bit_acc_right_key": float(right.mean()),
        "bit_acc_wrong_key": float(wrong.mean()), "bit_acc_noise_0.05": float(noisy05.mean()),
        "bit_acc_noise_0.10": float(noisy10.mean()), "bit_acc_blur_0.7px": float(blurred.mean()),
        "bit_acc_unwatermarked": float(unmarked.mean()), "verify_auc": float(roc_auc_score(truth, scores)),
        f"bit_acc_right_key_{args.few_steps}_ddim_steps": float(few_steps.mean())}

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
    rows_val = torch.randperm(len(val["identity"]), generator=gen)[:args.faces]
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
    stages.update()
    stages.close()
    return arms, samples


def markdown_table(arms: dict) -> str:
    lines = ["| arm | metric | mean ± std |", "|---|---|---|"]
    for arm, metrics in arms.items():
        for metric, stat in metrics.items():
            lines.append(f"| {arm} | {metric} | {stat['mean']:.3f} ± {stat['std']:.3f} |")
    return "\n".join(lines)


def plot(arms: dict, samples: dict, path: str) -> None:
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


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--identities", type=int, default=60)
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--unet-channels", type=int, default=16)
    parser.add_argument("--encoder-steps", type=int, default=200)
    parser.add_argument("--generator-steps", type=int, default=700)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ema", type=float, default=0.995)
    parser.add_argument("--steps", type=int, default=50, help="DDIM sampling = inversion steps")
    parser.add_argument("--few-steps", type=int, default=20, help="the DDIM step ablation of the watermark")
    parser.add_argument("--vip-identities", type=int, default=200, help="unseen people for the VIP metrics")
    parser.add_argument("--bits", type=int, default=32)
    parser.add_argument("--faces", type=int, default=128, help="generated faces per seed and arm")
    args = parser.parse_args(argv)
    if args.smoke:  # the pipeline in seconds
        args.identities, args.images, args.encoder_steps, args.generator_steps = 8, 4, 2, 2
        args.steps, args.few_steps, args.vip_identities, args.faces = 4, 2, 8, 8  # steps must divide T = 1000
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    start = time.time()
    per_seed, samples = [], None
    for seed in kit.progress(range(args.seeds), "seeds"):
        arms, seed_samples = run_seed(seed, args)
        per_seed.append(arms)
        samples = samples or seed_samples
    arms = kit.summarise(per_seed)
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out")}
    config.update(encoder_config=ENCODER_CONFIG, generator_config=GENERATOR_CONFIG)
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name="tivdiff")
    plot(arms, samples, os.path.join(args.out, "tivdiff.png"))
    print(markdown_table(arms))
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
