"""Reproduce LDARNet's learned-vs-fixed boundary claim at small scale: ``python -m experiments ldarnet``.

Paper: "LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling"
(arXiv 2606.04552). Claim: learned (dynamic) chunking beats a FLOPs-matched fixed grid of boundaries after MLM
pretraining (up to +14 MCC points on histone tasks); the router's compression approaches 1/N.

Setup (a CPU-sized version of the paper's pretrain -> fine-tune protocol): embedded synthetic DNA
(`datamodules.genomics`): a 300 kb uniform-random genome with TATAAA / CCAAT / GGGCGG planted once per ~48 bp for
MLM pretraining, and the motif-pair task (label = TATAAA and CCAAT both present; 0-3 motifs at random offsets, so a
fixed grid splits motifs at varying phases) for fine-tuning. The protocol is ``configs/ldarnet/experiment.yaml``,
run by `experiments.runner`. Per seed S (the model seed and the data seed) and arm, the runner builds and fits
``configs/ldarnet/pretrain_quick.yaml`` as ``python train.py fit`` builds it (tiny LDARNet: d 32/64, encoder m1t1
(local window 64), backbone M2 (SwiGLU 128), decoder m1, Mamba-2 d_state 16, headdim 32, N = 4, ratio weight 0.03;
MLM with RC augmentation, AdamW 3e-3; 120 steps, seq 128, batch 32, one validation of 4 batches at the end).
`evaluate` then builds ``configs/ldarnet/quick.yaml`` (``settings.finetune``: the same network, mean pooling ->
linear, AdamW 1e-3; 2000 / 500 motif-task sequences, 120 steps, no validation) with the arm's boundaries, the
pretraining run's batch sizes (evaluation batch 128), sequence length and data seed, **without re-seeding** (the
classifier's initialisation continues the seeded stream after pretraining), loads the pretrained weights in memory
(matched by name and shape, ``init_from: null``), fine-tunes and tests the final weights (test MCC / accuracy).
Arms: ``learned`` (bidirectional router) and ``fixed`` (boundaries every 4 bases: the same compressed length as the
learned router's target, same network otherwise).

Measured per run: test MCC and accuracy, MLM accuracy on held-out windows after pretraining, realised compression
F = mean(b) on the test sequences (target 1/N = 0.25), and boundary enrichment at motif edges: P(boundary | within
2 bp of a motif's start or end) / P(boundary | elsewhere), position 0 excluded (fixed grid: ~1 by construction);
both measured with the router after MLM pretraining and after fine-tuning. Note that for 5-6 bp motifs the +-2 bp
edge windows cover almost the whole motif, so this is close to a "boundaries in motifs" enrichment; the PNG's
profile (boundary rate by offset from motif starts) shows where exactly the boundaries sit.

`report` writes ``per_seed`` as ``[{"seed", "runs": {arm: every measured value, profiles included}}]`` (the
runner's paired block ``learned - fixed`` reads it), adds ``title`` and the ``speed`` block (``settings.speed``;
null leaves it out): the pure-PyTorch chunked SSD scan vs the straightforward sequential scan on the same inputs
(outputs compared), forward and forward+backward, and the tokens/s of a forward+backward of the paper's 2.01M
"micro" LDARNet (m3t1/[M6]/m3, d 64/128, d_state 128, chunk 256; SwiGLU 384, which gives the paper's 2.01M).
Minimum over repeats (the machine is shared). `speed_result` writes the speed part alone in the kit's schema
(``<out>/ldarnet_speed.json``). `plot`: ``<out>/ldarnet.png``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from datamodules.genomics import motif_edge_mask, motif_hits
from experiments import kit
from experiments.kit import summarise, write_result
from lightning_modules.ldarnet.bimamba2 import ssd_chunked, ssd_sequential
from lightning_modules.ldarnet.ldarnet import LDARNetPretraining
from lightning_modules.shared.base import load_matching_weights

PAPER = "ldarnet"
TITLE = ("LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling "
         "(arXiv 2606.04552)")
FINETUNE_CONFIG = "configs/ldarnet/quick.yaml"
MICRO = dict(arch_layout=["m3t1", ["M6"], "m3"], d_model=[64, 128], d_intermediate=[0, 384], d_state=128,
             headdim=64, ssd_chunk_size=256, attn_heads=2, attn_window=1023, rotary_dim=32)
PROFILE_OFFSETS = list(range(-6, 13))  # boundary rate relative to a motif start
METRICS = ("mcc", "accuracy", "mlm_accuracy", "pretrain_compression", "mlm_compression", "mlm_enrichment",
           "mlm_edge_rate", "mlm_background_rate", "compression", "enrichment", "edge_rate", "background_rate",
           "pretrain_ratio_loss")


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


def finetune_cli(run):
    """The fine-tuning stage of ``run`` (a fitted pretraining run): ``settings.finetune``'s config and overrides plus
    the arm's boundaries, the run's batch sizes, sequence length and data seed and its output folder, built as
    ``python train.py fit`` builds it but with ``--seed_everything=false``: no re-seeding, so the classifier's
    initialisation continues the stream the run's seed started."""
    import train
    from experiments.runner import QUIET, ExperimentError, flag

    stage = run.settings.get("finetune") or {}
    unknown = sorted(set(stage) - {"config", "overrides"})
    if unknown:
        raise ExperimentError(f"settings.finetune: unknown key(s) {unknown}; allowed: config, overrides")
    if not (kit.REPO_ROOT / stage.get("config", FINETUNE_CONFIG)).is_file():
        raise ExperimentError(f"settings.finetune.config: no config file {stage['config']} (paths are relative to "
                              "the repository root)")
    data = run.datamodule
    overrides = {**(stage.get("overrides") or {}), "model.init_args.boundaries": run.model.hparams.boundaries,
                 "data.init_args.batch_size": data.batch_size, "data.init_args.eval_batch_size": data.eval_batch_size,
                 "data.init_args.seed": run.seed, "data.init_args.synthetic_length": data.seq_len}
    args = ["--config", str(kit.REPO_ROOT / stage.get("config", FINETUNE_CONFIG)),
            *(flag(k, v) for k, v in overrides.items()), *QUIET, "--seed_everything=false",
            f"--trainer.default_root_dir={run.root / 'finetune'}"]
    return train.main(args, run=False)


def evaluate(run) -> dict[str, float]:
    """After MLM pretraining (the run's fit): the last validation's MLM accuracy, ratio loss and compression, the
    router's boundary statistics on the fine-tuning test sequences, then fine-tuning (`finetune_cli`) from the
    pretrained weights and the test of its final weights; returns `METRICS`, keeps the whole record (profiles
    included) in ``run.extra``."""
    start = time.time()
    mlm = run.trainer.callback_metrics
    mlm_acc, ratio = float(mlm["val/mlm_accuracy"]), float(mlm["val/ratio_loss"])
    pre_compression = float(mlm["val/compression"])
    cli = finetune_cli(run)
    clf, data = cli.model, cli.datamodule
    data.setup("fit")
    after_mlm = {f"mlm_{k}": v for k, v in boundary_stats(run.model.net, data.test_tokens).items()}
    load_matching_weights(clf, run.model.state_dict(), source="pretraining")
    cli.trainer.fit(clf, datamodule=data)
    test = cli.trainer.test(clf, datamodule=data, ckpt_path=None, verbose=False)[0]
    stats = boundary_stats(clf.net, data.test_tokens)
    record = {"arm": run.arm.name, "seed": run.seed, "mcc": float(test["test/mcc"]),
              "accuracy": float(test["test/acc"]), "mlm_accuracy": mlm_acc, "pretrain_ratio_loss": ratio,
              "pretrain_compression": pre_compression, **after_mlm, **stats,
              "finetune_wall_s": time.time() - start}
    run.extra.update(record=record, speed=run.settings.get("speed"))  # `report` reads both
    return {k: record[k] for k in METRICS}


def train_run(boundaries: str, seed: int, overrides: dict | None = None, finetune: dict | None = None) -> dict:
    """One run of the experiment's protocol outside the whole experiment (tests, a single comparison): the arm
    ``boundaries`` on ``seed`` with experiment.yaml's overrides, then ``overrides`` (dotted keys of the pretraining
    run) and ``finetune`` (dotted keys added to ``settings.finetune.overrides``), built, fitted and evaluated as the
    runner does, in a temporary folder; returns the run's record (`evaluate`)."""
    import tempfile

    from experiments import runner

    spec = runner.load_spec(PAPER)
    stage = dict(spec.settings["finetune"])
    stage["overrides"] = {**stage.get("overrides", {}), **(finetune or {})}
    spec.settings = {**spec.settings, "finetune": stage}
    arm = runner.Arm(boundaries, list(spec.arms[0].configs),
                     {"model.init_args.boundaries": boundaries, **(overrides or {})})
    kit.quiet_single_thread()
    with tempfile.TemporaryDirectory(prefix="ldarnet_run_") as root:
        run = runner.Run(spec, arm, None, seed, Path(root), Path(root))
        runner.execute(run, evaluate)
        return run.extra["record"]


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


def speed_result(out=kit.RESULTS, smoke: bool = False) -> dict:
    """The speed part alone, written in the kit's schema to ``<out>/ldarnet_speed.json`` (one arm per scan / model,
    its timings as metrics); ``smoke``: tiny sizes, one repeat."""
    start = time.time()
    sizes = dict(repeats=1, length=64, micro_length=64) if smoke else {}
    result = speed(**sizes)
    print(speed_markdown(result))
    timed = {name: {metric: value for metric, value in block.items() if isinstance(value, (int, float))}
             for name, block in result.items() if name != "shape"}
    return write_result("ldarnet_speed", seeds=1, wall_s=time.time() - start,
                        config={"shape": result["shape"], "smoke": smoke, **sizes}, arms=summarise([timed]),
                        per_seed=[result], out=out, name="ldarnet_speed")


def speed_arguments(value: dict) -> dict:
    """``settings.speed`` ({repeats, length, micro_length}) as `speed`'s arguments."""
    unknown = sorted(set(value) - {"repeats", "length", "micro_length"})
    if unknown:
        from experiments.runner import ExperimentError

        raise ExperimentError(f"settings.speed: unknown key(s) {unknown}; allowed: length, micro_length, repeats")
    return dict(value)


def report(result: dict, records: list[dict]) -> dict:
    """``per_seed`` as ``[{"seed", "runs": {arm: record}}]`` (every measured value, profiles included), ``title`` and
    the ``speed`` block (``settings.speed``, null: left out; printed). The runner prints the arms' table."""
    per_seed = [{"seed": seed, "runs": {arm: extra["record"] for arm, extra in kept.get("", {}).items()}}
                for seed, kept in enumerate(records)]
    sizes = next(extra["speed"] for kept in records for extra in kept.get("", {}).values())
    speed_block = speed(**speed_arguments(sizes)) if sizes is not None else None
    if speed_block:
        print(speed_markdown(speed_block) + "\n")
    return {"per_seed": per_seed, "title": TITLE, "speed": speed_block}


def plot_runs(runs: list[dict], arms: dict, path: Path) -> None:
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


def plot(result: dict, path) -> None:
    """Test MCC and boundary enrichment per arm (every run a dot) and the boundary profile around motif starts."""
    plot_runs([r for s in result["per_seed"] for r in s["runs"].values()], result["arms"], Path(path))


if __name__ == "__main__":  # the older spelling: python -m experiments.ldarnet [--smoke] [--seeds N] [--out DIR]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["ldarnet", *sys.argv[1:]]))
