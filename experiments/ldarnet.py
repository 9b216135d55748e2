"""Reproduce LDARNet's learned-vs-fixed boundary claim at small scale: ``python -m experiments.ldarnet``.

Paper: "LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling"
(arXiv 2606.04552). Claim: learned (dynamic) chunking beats a FLOPs-matched fixed grid of boundaries after MLM
pretraining (up to +14 MCC points on histone tasks); the router's compression approaches 1/N.

Setup (a CPU-sized version of the paper's pretrain -> fine-tune protocol, ~7 min on a shared 2-core machine):
embedded synthetic DNA (`datamodules.genomics`): a 300 kb uniform-random genome with TATAAA / CCAAT / GGGCGG
planted once per ~48 bp for MLM pretraining, and the motif-pair task (label = TATAAA and CCAAT both present; 0-3
motifs at random offsets, so a fixed grid splits motifs at varying phases) for fine-tuning. Both stages start
from the paper's quick configs through `experiments.kit.from_config`: ``configs/ldarnet/pretrain_quick.yaml``
(tiny LDARNet: d 32/64, encoder m1t1 (local window 64), backbone M2 (SwiGLU 128), decoder m1, Mamba-2 d_state 16,
headdim 32, N = 4, ratio weight 0.03; MLM with RC augmentation, AdamW 3e-3) and ``configs/ldarnet/quick.yaml``
(the same network, mean pooling -> linear, AdamW 1e-3). The experiment overrides only what it varies: the
boundaries (the arm), the seed, the data sizes (genome 300 kb, 2000/500 motif-task sequences, batch 32, evaluation
batch 128) and ``init_from`` (the classifier is loaded from the pretrained weights in memory, matched by name and
shape, instead of from a checkpoint file). Per seed and arm: MLM pretraining (120 steps, seq 128), then full
fine-tuning from those weights (120 steps), test MCC/accuracy of the final weights.
Arms: ``learned`` (bidirectional router) and ``fixed`` (boundaries every 4 bases: the same compressed length as
the learned router's target, same network otherwise).

Measured per run: test MCC and accuracy, MLM accuracy on held-out windows after pretraining, realised compression
F = mean(b) on the test sequences (target 1/N = 0.25), and boundary enrichment at motif edges: P(boundary | within
2 bp of a motif's start or end) / P(boundary | elsewhere), position 0 excluded (fixed grid: ~1 by construction);
both measured with the router after MLM pretraining and after fine-tuning. Note that for 5-6 bp motifs the +-2 bp
edge windows cover almost the whole motif, so this is close to a "boundaries in motifs" enrichment; the PNG's
profile (boundary rate by offset from motif starts) shows where exactly the boundaries sit.

Speed part (the ``speed`` key of the JSON; ``--speed-only`` runs just this and writes it in the kit's schema to
``<out>/ldarnet_speed.json``, ``--no-speed`` leaves it out): the
pure-PyTorch chunked SSD scan vs the straightforward sequential scan on the same inputs (outputs compared),
forward and forward+backward, and the tokens/s of a forward+backward of the paper's 2.01M "micro" LDARNet
(m3t1/[M6]/m3, d 64/128, d_state 128, chunk 256; SwiGLU 384, which gives the paper's 2.01M). Minimum over repeats
(the machine is shared).

Outputs: markdown tables on stdout and the kit's schema in ``<out>/ldarnet.json`` (``{"paper", "seeds", "wall_s",
"config", "arms": {arm: {metric: {"mean", "std"}}}, "per_seed": [{"seed", "runs": {arm: every measured value,
profiles included}}], "title", "speed"}``) and ``<out>/ldarnet.png``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from datamodules.genomics import motif_edge_mask, motif_hits
from experiments.kit import (experiment_parser, from_config, markdown_table, progress, quiet_single_thread,
                             quiet_trainer, summarise, write_result)
from lightning_modules.shared.base import load_matching_weights
from lightning_modules.ldarnet.bimamba2 import ssd_chunked, ssd_sequential
from lightning_modules.ldarnet.ldarnet import LDARNetPretraining

PAPER = "ldarnet"
TITLE = ("LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling "
         "(arXiv 2606.04552)")
PRETRAIN_CONFIG = "configs/ldarnet/pretrain_quick.yaml"
FINETUNE_CONFIG = "configs/ldarnet/quick.yaml"
ARMS = ("learned", "fixed")
MICRO = dict(arch_layout=["m3t1", ["M6"], "m3"], d_model=[64, 128], d_intermediate=[0, 384], d_state=128,
             headdim=64, ssd_chunk_size=256, attn_heads=2, attn_window=1023, rotary_dim=32)
PROFILE_OFFSETS = list(range(-6, 13))  # boundary rate relative to a motif start
METRICS = ("mcc", "accuracy", "mlm_accuracy", "pretrain_compression", "mlm_compression", "mlm_enrichment",
           "mlm_edge_rate", "mlm_background_rate", "compression", "enrichment", "edge_rate", "background_rate",
           "pretrain_ratio_loss")
SIZES = dict(pretrain_steps=120, finetune_steps=120, train_size=2000, test_size=500, seq_len=128, batch_size=32,
             genome_length=300_000)
SMOKE_SIZES = dict(pretrain_steps=3, finetune_steps=3, train_size=64, test_size=32, seq_len=128, batch_size=16,
                   genome_length=20_000)


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
            train_size: int = 2000, test_size: int = 500, seq_len: int = 128, batch_size: int = 32,
            genome_length: int = 300_000) -> dict:
    """MLM pretraining then fine-tuning of one arm for one seed; returns its metrics."""
    start = time.time()
    arm = (f"--model.init_args.boundaries={boundaries}", f"--data.init_args.batch_size={batch_size}",
           "--data.init_args.eval_batch_size=128", f"--data.init_args.seed={seed}")
    pretrain_data = (f"--data.init_args.seq_len={seq_len}", f"--data.init_args.genome_length={genome_length}")
    pre, pre_data = from_config(PRETRAIN_CONFIG, f"--seed_everything={seed}", *arm, *pretrain_data)
    trainer = quiet_trainer(max_steps=pretrain_steps, deterministic=True, limit_val_batches=4,
                            val_check_interval=pretrain_steps, check_val_every_n_epoch=None)
    trainer.fit(pre, datamodule=pre_data)
    mlm = trainer.callback_metrics
    mlm_acc, ratio = float(mlm["val/mlm_accuracy"]), float(mlm["val/ratio_loss"])
    pre_compression = float(mlm["val/compression"])
    # no re-seeding: the classifier's initialisation continues the seeded stream after pretraining
    clf, data = from_config(FINETUNE_CONFIG, "--seed_everything=false", "--model.init_args.init_from=null", *arm,
                            f"--data.init_args.synthetic_train={train_size}",
                            f"--data.init_args.synthetic_test={test_size}",
                            f"--data.init_args.synthetic_length={seq_len}")
    data.setup("fit")
    after_mlm = {f"mlm_{k}": v for k, v in boundary_stats(pre.net, data.test_tokens).items()}
    load_matching_weights(clf, pre.state_dict(), source="pretraining")
    trainer = quiet_trainer(max_steps=finetune_steps, deterministic=True, limit_val_batches=0)
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


def speed(repeats: int = 3, length: int = 1024, micro_length: int = 1024) -> dict:
    torch.manual_seed(0)
    batch, heads, headdim, d_state = 2, 2, 64, 128  # the micro config's Mamba-2 at d 64
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
    tokens = torch.randint(0, 4, (4, micro_length))
    valid = torch.ones_like(tokens, dtype=torch.bool)

    def micro_step():
        logits, aux = model(tokens, valid)
        (logits.float().logsumexp(-1).mean() + aux["ratio_loss"]).backward()

    micro_step()
    step = _best_time(micro_step, repeats)
    out["micro_ldarnet"] = {"params": params, "batch": 4, "length": micro_length, "forward_backward_s": step,
                            "tokens_per_s": 4 * micro_length / step}
    return out


# ============================================================================================ report
def speed_markdown(result: dict) -> str:
    lines = ["## Speed (shared 2-core machine, min over repeats, 1 thread)", "",
             "| scan | forward s | fwd+bwd s | fwd+bwd tokens/s | max rel err vs fp64 sequential |",
             "|---|---|---|---|---|"]
    for name in ("sequential", "chunked_64", "chunked_256"):
        r = result[name]
        lines.append(f"| {name} | {r['forward_s']:.3f} | {r['forward_backward_s']:.3f} | "
                     f"{r['forward_backward_tokens_per_s']:.0f} | {r['max_rel_err_vs_fp64_sequential']:.1e} |")
    m = result["micro_ldarnet"]
    lines += ["", f"micro LDARNet ({m['params'] / 1e6:.2f}M params), batch {m['batch']} x {m['length']}, fwd+bwd: "
              f"{m['forward_backward_s']:.2f} s = {m['tokens_per_s']:.0f} tokens/s"]
    return "\n".join(lines)


def plot(runs: list[dict], arms: dict, path: Path) -> None:
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


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--pretrain-steps", type=int, default=SIZES["pretrain_steps"])
    parser.add_argument("--finetune-steps", type=int, default=SIZES["finetune_steps"])
    parser.add_argument("--train-size", type=int, default=SIZES["train_size"])
    parser.add_argument("--test-size", type=int, default=SIZES["test_size"])
    parser.add_argument("--speed-only", action="store_true",
                        help="only the scan / micro-model timing (writes <out>/ldarnet_speed.json)")
    parser.add_argument("--no-speed", action="store_true", help="leave out the timing part")
    args = parser.parse_args(argv)
    quiet_single_thread()
    start = time.time()
    speed_sizes = dict(repeats=1, length=64, micro_length=64) if args.smoke else {}
    if args.speed_only:  # <out>/ldarnet_speed.json: one arm per scan / model, its timings as metrics
        speed_result = speed(**speed_sizes)
        print(speed_markdown(speed_result))
        timed = {name: {metric: value for metric, value in block.items() if isinstance(value, (int, float))}
                 for name, block in speed_result.items() if name != "shape"}
        return write_result("ldarnet_speed", seeds=1, wall_s=time.time() - start,
                            config={"shape": speed_result["shape"], "smoke": args.smoke, **speed_sizes},
                            arms=summarise([timed]), per_seed=[speed_result], out=args.out, name="ldarnet_speed")
    sizes = dict(SMOKE_SIZES) if args.smoke else dict(SIZES, pretrain_steps=args.pretrain_steps,
                                                      finetune_steps=args.finetune_steps,
                                                      train_size=args.train_size, test_size=args.test_size)
    per_seed = []
    bar = progress(None, desc="ldarnet seeds x arms", total=args.seeds * len(ARMS))
    for seed in range(args.seeds):
        runs = {}
        for arm in ARMS:
            r = runs[arm] = run_arm(arm, seed, **sizes)
            bar.update(1)
            bar.write(f"seed {seed} {arm:7s}: MCC {r['mcc']:.3f} acc {r['accuracy']:.3f} MLM acc "
                      f"{r['mlm_accuracy']:.3f} F {r['mlm_compression']:.3f} -> {r['compression']:.3f} "
                      f"enrichment {r['mlm_enrichment']:.2f} -> {r['enrichment']:.2f} ({r['wall_s']:.0f} s)")
        per_seed.append({"seed": seed, "runs": runs})
    bar.close()
    arms = summarise([{arm: {k: r[k] for k in METRICS} for arm, r in s["runs"].items()} for s in per_seed])
    speed_result = None if args.no_speed else speed(**speed_sizes)
    wall = time.time() - start
    config = {"pretrain_config": PRETRAIN_CONFIG, "finetune_config": FINETUNE_CONFIG,
              "varied": "boundaries (the arm), seed, data sizes, init_from (in-memory pretrained weights)",
              **sizes, "eval_batch_size": 128, "profile_offsets": PROFILE_OFFSETS, "smoke": args.smoke}
    result = write_result(PAPER, seeds=args.seeds, wall_s=wall, config=config, arms=arms, per_seed=per_seed,
                          out=args.out, title=TITLE, speed=speed_result)
    out = Path(args.out)
    plot([r for s in per_seed for r in s["runs"].values()], arms, out / f"{PAPER}.png")
    if speed_result:
        print(speed_markdown(speed_result) + "\n")
    print(f"## LDARNet: learned vs fixed boundaries ({args.seeds} seeds, {sizes['pretrain_steps']} MLM + "
          f"{sizes['finetune_steps']} fine-tuning steps, wall {wall:.0f} s)\n")
    print(markdown_table(arms, ("mcc", "accuracy", "mlm_accuracy", "mlm_compression", "mlm_enrichment",
                                "compression", "enrichment", "pretrain_ratio_loss")))
    print(f"\nresults in {out / (PAPER + '.json')} and {out / (PAPER + '.png')}")
    return result


if __name__ == "__main__":
    main()
