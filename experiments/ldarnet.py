"""Reproduce LDARNet's learned-vs-fixed boundary claim at small scale: ``python -m experiments.ldarnet``.

Paper: "LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling"
(arXiv 2606.04552). Claim: learned (dynamic) chunking beats a FLOPs-matched fixed grid of boundaries after MLM
pretraining (up to +14 MCC points on histone tasks); the router's compression approaches 1/N.

Setup (the method card's CPU experiment, shortened to fit ~8 min on a shared 2-core machine): embedded synthetic
DNA (`datamodules.genomics`): a 300 kb uniform-random genome with TATAAA / CCAAT / GGGCGG planted once per ~48 bp for
MLM pretraining, and the motif-pair task (label = TATAAA and CCAAT both present; 0-3 motifs at random offsets,
so a fixed grid splits motifs at varying phases) for fine-tuning. Tiny LDARNet: d 32/64, encoder m1t1 (local
window 64), backbone M2 (SwiGLU 128), decoder m1, Mamba-2 d_state 16, headdim 32, N = 4, ratio weight 0.03.
Per seed and arm: MLM pretraining (AdamW 3e-3, batch 32, seq 128, RC augmentation), then full fine-tuning from
those weights (AdamW 1e-3, batch 32, mean pooling -> linear), test MCC/accuracy of the final weights.
Arms: ``learned`` (bidirectional router) and ``fixed`` (boundaries every 4 bases: the same compressed length as
the learned router's target, same network otherwise). All through `LDARNetPretraining` / `LDARNetClassifier` and a
Lightning `Trainer` on CPU.

Measured per run: test MCC and accuracy, MLM accuracy on held-out windows after pretraining, realised compression
F = mean(b) on the test sequences (target 1/N = 0.25), and boundary enrichment at motif edges: P(boundary | within
2 bp of a motif's start or end) / P(boundary | elsewhere), position 0 excluded (fixed grid: ~1 by construction);
both measured with the router after MLM pretraining and after fine-tuning. Note that for 5-6 bp motifs the +-2 bp
edge windows cover almost the whole motif, so this is close to a "boundaries in motifs" enrichment; the PNG's
profile (boundary rate by offset from motif starts) shows where exactly the boundaries sit.

Speed part (``--speed-only`` runs just this): the pure-PyTorch chunked SSD scan vs the straightforward sequential
scan on the same inputs (outputs compared), forward and forward+backward, and the tokens/s of a forward+backward
of the paper's 2.01M "micro" LDARNet (m3t1/[M6]/m3, d 64/128, d_state 128, chunk 256; SwiGLU 384, which gives the
card's 2.01M). Minimum over repeats (the machine is shared). Written to ``results/ldarnet_speed.json``.

Outputs: a markdown table on stdout, ``results/ldarnet.json`` (``{"paper", "seeds", "wall_s", "arms": {arm:
{metric: {"mean", "std"}}}, "runs": [...], "boundary_profile": ...}``) and ``results/ldarnet.png``.
"""
from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Trainer, seed_everything

from datamodules.genomics import DNAClassificationDataModule, DNAPretrainDataModule, motif_edge_mask, motif_hits
from experiments import quiet_single_thread
from lightning_modules.base import load_matching_weights
from lightning_modules.bimamba2 import ssd_chunked, ssd_sequential
from lightning_modules.ldarnet import LDARNetClassifier, LDARNetPretraining

PAPER = ("LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling "
         "(arXiv 2606.04552)")
NET = dict(arch_layout=["m1t1", ["M2"], "m1"], d_model=[32, 64], d_intermediate=[0, 128], d_state=16, headdim=32,
           ssd_chunk_size=32, attn_heads=2, attn_window=64, rotary_dim=8, target_compression=4,
           ratio_loss_weight=0.03, outer_lr_multiplier=1.0)
MICRO = dict(arch_layout=["m3t1", ["M6"], "m3"], d_model=[64, 128], d_intermediate=[0, 384], d_state=128,
             headdim=64, ssd_chunk_size=256, attn_heads=2, attn_window=1023, rotary_dim=32)
PROFILE_OFFSETS = list(range(-6, 13))  # boundary rate relative to a motif start


def _trainer(steps: int, **kw) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                   num_sanity_val_steps=0, **kw)


def boundary_stats(net: torch.nn.Module, tokens: np.ndarray) -> dict:
    """Compression, edge enrichment and the boundary profile around motif starts on (n, L) test tokens."""
    net.eval()
    batch = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        b = torch.cat([net(chunk, torch.ones_like(chunk, dtype=torch.bool))[1]["boundaries"]
                       for chunk in batch.split(128)]).numpy()
    edges = motif_edge_mask(tokens, radius=2)
    inner = np.ones_like(b)
    inner[:, 0] = False  # p_0 = 1 always
    on_edge, background = b[edges & inner].mean(), b[~edges & inner].mean()
    profile = np.zeros(len(PROFILE_OFFSETS))
    counts = np.zeros(len(PROFILE_OFFSETS))
    for motif in ("TATAAA", "CCAAT", "GGGCGG"):
        rows, starts = np.nonzero(motif_hits(tokens, motif))
        for i, off in enumerate(PROFILE_OFFSETS):
            pos = starts + off
            ok = (pos > 0) & (pos < tokens.shape[1])
            profile[i] += b[rows[ok], pos[ok]].sum()
            counts[i] += ok.sum()
    return {"compression": float(b.mean()), "edge_rate": float(on_edge), "background_rate": float(background),
            "enrichment": float(on_edge / max(background, 1e-9)), "profile": (profile / np.maximum(counts, 1)).tolist()}


def run_arm(boundaries: str, seed: int, pretrain_steps: int = 120, finetune_steps: int = 120,
            train_size: int = 2000, test_size: int = 500, seq_len: int = 128, batch_size: int = 32) -> dict:
    """MLM pretraining then fine-tuning of one arm for one seed; returns its metrics."""
    start = time.time()
    seed_everything(seed, verbose=False)
    pre = LDARNetPretraining(**NET, boundaries=boundaries,
                             optimizer=partial(torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01))
    pre_data = DNAPretrainDataModule(seq_len=seq_len, genome_length=300_000, batch_size=batch_size,
                                     eval_batch_size=128, seed=seed)
    trainer = _trainer(pretrain_steps, limit_val_batches=4, val_check_interval=pretrain_steps,
                       check_val_every_n_epoch=None)
    trainer.fit(pre, datamodule=pre_data)
    mlm = trainer.callback_metrics
    mlm_acc, ratio = float(mlm["val/mlm_accuracy"]), float(mlm["val/ratio_loss"])
    pre_compression = float(mlm["val/compression"])
    data = DNAClassificationDataModule(synthetic_train=train_size, synthetic_test=test_size, synthetic_length=seq_len,
                                       batch_size=batch_size, eval_batch_size=128, seed=seed)
    data.setup("fit")
    after_mlm = {f"mlm_{k}": v for k, v in boundary_stats(pre.net, data.test_tokens).items()}
    clf = LDARNetClassifier(**NET, boundaries=boundaries,
                            optimizer=partial(torch.optim.AdamW, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1))
    load_matching_weights(clf, pre.state_dict(), source="pretraining")
    trainer = _trainer(finetune_steps, limit_val_batches=0)
    trainer.fit(clf, datamodule=data)
    test = trainer.test(clf, datamodule=data, verbose=False)[0]
    stats = boundary_stats(clf.net, data.test_tokens)
    return {"arm": boundaries, "seed": seed, "mcc": float(test["test/mcc"]), "accuracy": float(test["test/acc"]),
            "mlm_accuracy": mlm_acc, "pretrain_ratio_loss": ratio, "pretrain_compression": pre_compression,
            **after_mlm, **stats, "wall_s": time.time() - start}


# ============================================================================================ speed
def _best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def speed(repeats: int = 3) -> dict:
    torch.manual_seed(0)
    batch, length, heads, headdim, d_state = 2, 1024, 2, 64, 128  # the micro config's Mamba-2 at d 64
    x = torch.randn(batch, length, heads, headdim)
    a = -torch.rand(batch, length, heads) * 0.1
    b, c = torch.randn(batch, length, heads, d_state), torch.randn(batch, length, heads, d_state)
    out = {"shape": {"batch": batch, "length": length, "heads": heads, "headdim": headdim, "d_state": d_state}}
    ref = ssd_sequential(x.double(), a.double(), b.double(), c.double())
    for name, fn in [("sequential", lambda *t: ssd_sequential(*t)), ("chunked_64", lambda *t: ssd_chunked(*t, 64)),
                     ("chunked_256", lambda *t: ssd_chunked(*t, 256))]:
        with torch.no_grad():
            forward = _best_time(lambda: fn(x, a, b, c), repeats)
            err = float((fn(x, a, b, c).double() - ref).abs().max() / ref.abs().max())

        def fwd_bwd():
            leaves = [t.clone().requires_grad_(True) for t in (x, a, b, c)]
            fn(*leaves).square().sum().backward()

        both = _best_time(fwd_bwd, repeats)
        out[name] = {"forward_s": forward, "forward_backward_s": both, "max_rel_err_vs_fp64_sequential": err,
                     "forward_backward_tokens_per_s": batch * length / both}
    model = LDARNetPretraining(**MICRO)
    params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 4, (4, 1024))
    valid = torch.ones_like(tokens, dtype=torch.bool)

    def micro_step():
        logits, aux = model(tokens, valid)
        (logits.float().logsumexp(-1).mean() + aux["ratio_loss"]).backward()

    micro_step()
    step = _best_time(micro_step, repeats)
    out["micro_ldarnet"] = {"params": params, "batch": 4, "length": 1024, "forward_backward_s": step,
                            "tokens_per_s": 4 * 1024 / step}
    return out


def _summary(runs: list[dict], keys: list[str]) -> dict:
    arms = {}
    for arm in sorted({r["arm"] for r in runs}, key=["learned", "fixed"].index):
        rows = [r for r in runs if r["arm"] == arm]
        arms[arm] = {k: {"mean": float(np.mean([r[k] for r in rows])), "std": float(np.std([r[k] for r in rows]))}
                     for k in keys}
    return arms


def _plot(runs: list[dict], arms: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    names = list(arms)
    for ax, key, title in ((axes[0], "mcc", "test MCC (motif-pair task)"),
                           (axes[1], "mlm_enrichment", "boundary enrichment at motif edges (after MLM)")):
        ax.bar(names, [arms[a][key]["mean"] for a in names], yerr=[arms[a][key]["std"] for a in names],
               color=["tab:blue", "tab:gray"][: len(names)], capsize=4)
        for i, a in enumerate(names):
            ax.scatter([i] * sum(r["arm"] == a for r in runs), [r[key] for r in runs if r["arm"] == a], color="k", s=12)
        ax.set_title(title)
    axes[1].axhline(1.0, color="k", lw=0.5, ls="--")
    for a in names:
        for key, style in (("mlm_profile", "--"), ("profile", "-")):
            profile = np.mean([r[key] for r in runs if r["arm"] == a], axis=0)
            stage = "after MLM" if key == "mlm_profile" else "after fine-tuning"
            axes[2].plot(PROFILE_OFFSETS, profile, style, marker="o", ms=3, label=f"{a}, {stage}")
    axes[2].axvline(0, color="k", lw=0.5)
    axes[2].set_xlabel("offset from motif start (bp)")
    axes[2].set_title("boundary rate around motifs")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pretrain-steps", type=int, default=120)
    parser.add_argument("--finetune-steps", type=int, default=120)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    quiet_single_thread()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    start = time.time()
    if not args.no_speed:
        result = speed()
        (out / "ldarnet_speed.json").write_text(json.dumps(result, indent=2))
        print("## Speed (shared 2-core machine, min over repeats, 1 thread)\n")
        print("| scan | forward s | fwd+bwd s | fwd+bwd tokens/s | max rel err vs fp64 sequential |")
        print("|---|---|---|---|---|")
        for name in ("sequential", "chunked_64", "chunked_256"):
            r = result[name]
            print(f"| {name} | {r['forward_s']:.3f} | {r['forward_backward_s']:.3f} | "
                  f"{r['forward_backward_tokens_per_s']:.0f} | {r['max_rel_err_vs_fp64_sequential']:.1e} |")
        m = result["micro_ldarnet"]
        print(f"\nmicro LDARNet ({m['params'] / 1e6:.2f}M params), batch 4 x 1024, fwd+bwd: "
              f"{m['forward_backward_s']:.2f} s = {m['tokens_per_s']:.0f} tokens/s\n")
    if args.speed_only:
        return
    runs = []
    for seed in range(args.seeds):
        for arm in ("learned", "fixed"):
            runs.append(run_arm(arm, seed, args.pretrain_steps, args.finetune_steps, args.train_size, args.test_size))
            r = runs[-1]
            print(f"seed {seed} {arm:7s}: MCC {r['mcc']:.3f} acc {r['accuracy']:.3f} MLM acc {r['mlm_accuracy']:.3f} "
                  f"F {r['mlm_compression']:.3f} -> {r['compression']:.3f} "
                  f"enrichment {r['mlm_enrichment']:.2f} -> {r['enrichment']:.2f} ({r['wall_s']:.0f} s)",
                  flush=True)
    keys = ["mcc", "accuracy", "mlm_accuracy", "pretrain_compression", "mlm_compression", "mlm_enrichment",
            "mlm_edge_rate", "mlm_background_rate", "compression", "enrichment", "edge_rate", "background_rate",
            "pretrain_ratio_loss"]
    arms = _summary(runs, keys)
    wall = time.time() - start
    print(f"\n## LDARNet: learned vs fixed boundaries ({args.seeds} seeds, {args.pretrain_steps} MLM + "
          f"{args.finetune_steps} fine-tuning steps, wall {wall:.0f} s)\n")
    print("| arm | test MCC | test acc | MLM acc | F after MLM | edge enrichment after MLM | F after fine-tuning | "
          "edge enrichment after fine-tuning | ratio loss (MLM) |\n|---|---|---|---|---|---|---|---|---|")
    for arm, m in arms.items():
        cells = " | ".join(f"{m[k]['mean']:.3f} ± {m[k]['std']:.3f}" for k in
                           ("mcc", "accuracy", "mlm_accuracy", "mlm_compression", "mlm_enrichment", "compression",
                            "enrichment", "pretrain_ratio_loss"))
        print(f"| {arm} | {cells} |")
    result = {"paper": PAPER, "seeds": args.seeds, "wall_s": wall, "arms": arms, "runs": runs,
              "settings": {"net": NET, "pretrain_steps": args.pretrain_steps, "finetune_steps": args.finetune_steps,
                           "train_size": args.train_size, "test_size": args.test_size, "seq_len": 128,
                           "profile_offsets": PROFILE_OFFSETS}}
    (out / "ldarnet.json").write_text(json.dumps(result, indent=2))
    _plot(runs, arms, out / "ldarnet.png")


if __name__ == "__main__":
    main()
