"""LDARNet's two paper configs: MLM pretraining on hg38 (FASTA + HyenaDNA/Enformer ``human-sequences.bed``) and
fine-tuning from that checkpoint on a Nucleotide Transformer downstream task (H3) of the HF snapshot
``InstaDeepAI/nucleotide_transformer_downstream_tasks``.

hg38 as UCSC ships it: ``>chr1`` records, 50 bases per line, soft-masked repeats in lower case, N runs (chr1 starts
with 10,000 N). The BED holds tab-separated ``chrom start end split`` windows of 131,072 bp (the Enformer/Basenji
``sequences.bed`` that HyenaDNA calls ``human-sequences.bed``), each tiled into 32 pieces of the config's 4,096.
The NT snapshot holds one folder per task with ``{train,test}.parquet`` (columns ``sequence``, ``name``, ``label``)
next to the original ``{train,test}.fna`` (headers ``>name|label``); H3 sequences are 500 bp, two classes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

WINDOW = 131_072  # Enformer/Basenji/HyenaDNA BED window
LEADING_N = 10_000  # hg38 chr1 begins with 10 kb of N
H3_LENGTH = 500  # NT downstream H3: 500 bp, labels 0/1


def _dna(rng: np.random.Generator, n: int) -> str:
    """Random bases with soft-masked (lower-case) runs, as in the UCSC assembly."""
    bases = np.frombuffer(b"ACGT", dtype=np.uint8)[rng.integers(0, 4, n)]
    masked = np.zeros(n, dtype=bool)
    for start in rng.integers(0, max(n - 300, 1), n // 2000):
        masked[start:start + int(rng.integers(50, 300))] = True
    return np.where(masked, bases + 32, bases).astype(np.uint8).tobytes().decode()  # upper -> lower case


def write_hg38(root: Path, seed: int = 0) -> Path:
    """``ldar_data.fa`` (chr1 with one train, one valid and one test window after the leading N run) and
    ``human-sequences.bed`` under ``root``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    chrom = "N" * LEADING_N + _dna(rng, 3 * WINDOW + 5_000)
    with open(root / "ldar_data.fa", "w") as f:
        f.write(">chr1\n")
        f.writelines(chrom[i:i + 50] + "\n" for i in range(0, len(chrom), 50))
    starts = [LEADING_N + k * WINDOW for k in range(3)]
    (root / "human-sequences.bed").write_text("".join(f"chr1\t{s}\t{s + WINDOW}\t{split}\n"
                                                      for s, split in zip(starts, ("train", "valid", "test"))))
    return root


def write_nt_h3(root: Path, train: int = 64, test: int = 16, seed: int = 0) -> Path:
    """``H3/{train,test}.parquet`` and ``H3/{train,test}.fna`` of the NT downstream snapshot under ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    folder = root / "H3"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        sequences = [_dna(rng, H3_LENGTH).upper() for _ in range(n)]
        labels = [i % 2 for i in range(n)]
        starts = rng.integers(0, 200_000_000, n)
        names = [f"chr{1 + i % 22}:{s}-{s + H3_LENGTH}|{y}" for i, (s, y) in enumerate(zip(starts, labels))]
        pq.write_table(pa.table({"sequence": sequences, "name": names, "label": pa.array(labels, pa.int32())}),
                       folder / f"{split}.parquet")
        (folder / f"{split}.fna").write_text("".join(f">{name}\n{seq}\n" for name, seq in zip(names, sequences)))
    return root


def hg38(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={write_hg38(folder / 'data' / 'hg38')}", "--data.init_args.num_workers=0"]


def nt_downstream(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={write_nt_h3(folder / 'data' / 'nt_downstream')}",
            "--data.init_args.num_workers=0"]


PRETRAIN_FORMAT = ("hg38 ldar_data.fa (UCSC FASTA, >chr1, 50 bases/line, soft-masked, leading N run) + "
                   "human-sequences.bed (tab-separated chrom/start/end/split, 131,072-bp train/valid/test windows)")
NT_FORMAT = ("NT downstream snapshot H3/{train,test}.parquet (sequence, name 'chrN:s-e|label', int32 label) + "
             "{train,test}.fna ('>name|label'), 500-bp sequences, 64 train / 16 test")
CASES = {
    "configs/ldarnet/pretrain_paper.yaml": Case(
        hg38, release_format=PRETRAIN_FORMAT,
        args=("--data.init_args.batch_size=1", "--data.init_args.eval_batch_size=1",
              "--trainer.accumulate_grad_batches=1"),
        note="batch 1 window of 4,096 bp per optimizer step (published: 32 x 16 accumulation x 3 GPUs = 1,536)",
        test_args=("--data.init_args.seq_len=1024",)),
    "configs/ldarnet/paper.yaml": Case(
        nt_downstream, release_format=NT_FORMAT, after=("configs/ldarnet/pretrain_paper.yaml",),
        args=("--data.init_args.batch_size=4", "--data.init_args.eval_batch_size=4"),
        note="batch 4 (published: effective batch 64)",
        test_args=("--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2")),
}
