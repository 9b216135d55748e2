"""DNA data for LDARNet (arXiv 2606.04552): MLM pretraining windows and sequence-classification tasks.

Token ids (byte-level vocabulary of the official code): A=0, C=1, G=2, T=3, N=4 (every other IUPAC letter too),
[MASK]=5, [PAD]=6. Lower case (soft-masked repeats) is upper-cased. Batches are right-padded dicts
``{"tokens": long (B, L), "mask": bool (B, L), "label": long (B,), "index": long (B,)}`` (no label for
pretraining; ``index`` = each sequence's position in its split, which seeds its evaluation masks).

One file (past 600 lines): the four sources below tokenise, window and split the same way and feed the same
batch layout; split apart, each would repeat that contract.

Sources (nothing is downloaded; real data comes from a local ``data_dir``):

* ``synthetic`` (embedded default): uniform random DNA with planted motifs TATAAA, CCAAT, GGGCGG
  (`synthetic_motif_task`). Accidental background occurrences of the motifs are mutated away before planting, so
  the motifs occur only where planted (up to rare overlaps created by planting; labels always come from a scan of
  the final sequence). Classification label = 1 iff both TATAAA and CCAAT occur (a motif *pair*; half of the
  sequences are generated positive; negatives carry one of the two or none, plus GGGCGG as a decoy, 0-3 motifs at
  random offsets). Pretraining uses `synthetic_genome`: one long genome with motifs planted at ``motif_rate`` per
  base, tiled into windows.
* ``fasta`` (pretraining): ``<data_dir>/<fasta_name>`` (plain or .gz FASTA, e.g. hg38 ``ldar_data.fa``) and an
  optional BED of windows ``chrom start end split`` (``<data_dir>/<bed_name>``, HyenaDNA/Caduceus
  ``human-sequences.bed`` style, split in train/valid/test). Windows are tiled into pieces of ``seq_len``. Without a
  BED every record is tiled and pieces are split at random (seeded) into train/val/test.
* ``nucleotide_transformer`` (classification): a local copy of HF
  ``InstaDeepAI/nucleotide_transformer_downstream_tasks`` (or its ``_revised`` version). ``data_dir`` may be
  (1) the snapshot root, one folder per task, with ``task`` naming the folder (optional when there is only one; an
  unknown name is an error listing the tasks found):
  ``<root>/<task>/{train,test}.parquet`` (columns ``sequence``, ``name``, ``label``, and ``task`` in later
  revisions), the Hub's parquet conversion ``<root>/<task>/{train,test}/*.parquet``, or the original FASTA files
  ``<root>/<task>/{train,test}.fna`` whose headers are ``>name|label`` (the label is the integer after the last
  ``|``, as in the dataset's loading script); (2) one task folder holding those files; (3) a flat multi-task table
  ``<data_dir>/{train,test}.csv`` / ``.parquet`` (or ``{split}-*.parquet``, ``data/{split}-*.parquet``) with a
  ``task`` column whose rows are filtered by ``task``. Where a folder holds both parquet and FASTA (as the released
  snapshot does), the parquet is read, or the FASTA when pyarrow is unusable.
* ``genomic_benchmarks`` (classification): ``<data_dir>/{train,test}/<class_name>/<id>.txt`` (one sequence per
  file, the on-disk layout of the genomic-benchmarks package); class ids follow the sorted class names. The
  package's cache root (``~/.genomic_benchmarks``, one ``<dataset_name>/`` folder per downloaded dataset) is
  accepted too: ``task`` names the dataset, optional when the root holds exactly one.

Validation data is a seeded hold-out (``val_fraction``) of the training split; sequences longer than
``max_length`` keep their first ``max_length`` bases (the tokenizer truncation of the authors' eval script).

Length: the datamodules and the readers of the released formats they accept (FASTA, NT downstream snapshot,
Genomic Benchmarks, parquet) stay in one file so each accepted layout is documented beside its reader.
"""
from __future__ import annotations

import csv
import glob
import gzip
import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

PAD_ID, N_ID = 6, 4
MOTIFS = ("TATAAA", "CCAAT", "GGGCGG")
PAIR = (0, 1)  # label = both MOTIFS[0] and MOTIFS[1] present
_IUPAC_OTHER = "NRYSWKMBDHV"
_LOOKUP = np.full(256, 255, dtype=np.uint8)
for _i, _b in enumerate("ACGT"):
    _LOOKUP[ord(_b)] = _LOOKUP[ord(_b.lower())] = _i
for _b in _IUPAC_OTHER:
    _LOOKUP[ord(_b)] = _LOOKUP[ord(_b.lower())] = N_ID


def encode(sequence: str, where: str = "sequence") -> np.ndarray:
    """DNA string -> uint8 token ids; any character outside ACGT + IUPAC letters is an error naming `where`."""
    raw = np.frombuffer(sequence.strip().encode("latin-1", errors="replace"), dtype=np.uint8)
    ids = _LOOKUP[raw]
    if (ids == 255).any():
        bad = sequence.strip()[int(np.argmax(ids == 255))]
        raise UserInputError(f"{where}: invalid DNA character {bad!r}; expected A/C/G/T/N (or IUPAC letters).")
    if len(ids) == 0:
        raise UserInputError(f"{where}: empty sequence.")
    return ids


def _motif_ids(motif: str) -> np.ndarray:
    return encode(motif)


def motif_hits(tokens: np.ndarray, motif: str) -> np.ndarray:
    """(n, L) uint8 tokens -> (n, L - k + 1) bool: the motif starts at j."""
    ids = _motif_ids(motif)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, len(ids), axis=1)
    return (windows == ids).all(-1)


def motif_edge_mask(tokens: np.ndarray, radius: int = 2) -> np.ndarray:
    """(n, L) bool: within `radius` bases of a motif start or of the base after its end (a motif's edges)."""
    n, length = tokens.shape
    edges = np.zeros((n, length + 1), dtype=bool)
    for motif in MOTIFS:
        hits = motif_hits(tokens, motif)
        rows, starts = np.nonzero(hits)
        edges[rows, starts] = True
        edges[rows, starts + len(motif)] = True
    edges = edges[:, :length]
    out = edges.copy()
    for shift in range(1, radius + 1):
        out[:, shift:] |= edges[:, :-shift]
        out[:, :-shift] |= edges[:, shift:]
    return out


def _remove_accidental_motifs(tokens: np.ndarray, rng: np.random.Generator) -> None:
    """Mutate background bases until no motif occurs (in place)."""
    for _ in range(100):
        found = False
        for motif in MOTIFS:
            rows, starts = np.nonzero(motif_hits(tokens, motif))
            if len(rows):
                found = True
                cols = starts + len(motif) // 2
                tokens[rows, cols] = (tokens[rows, cols] + rng.integers(1, 4, len(rows))) % 4
        if not found:
            return


def synthetic_motif_task(n: int, length: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (n, length) uint8, labels (n,) int64): label 1 iff TATAAA and CCAAT both occur."""
    if length < 3 * max(len(m) for m in MOTIFS) + 3:
        raise UserInputError(f"synthetic sequence length {length} is too short for 3 motifs; use >= 24.")
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, (n, length), dtype=np.uint8)
    _remove_accidental_motifs(tokens, rng)
    positive = rng.random(n) < 0.5
    for i in range(n):
        if positive[i]:
            chosen = [0, 1] + ([2] if rng.random() < 0.5 else [])
        else:
            chosen = [int(k) for k in rng.choice([0, 1], size=rng.integers(0, 2), replace=False)]
            chosen += [2] if rng.random() < 0.5 else []
        # non-overlapping offsets: split the sequence into len(chosen) slots and place one motif in each
        order = rng.permutation(chosen)
        slot = length // max(len(order), 1)
        for s, k in enumerate(order):
            motif = _motif_ids(MOTIFS[k])
            start = s * slot + int(rng.integers(0, slot - len(motif) + 1))
            tokens[i, start:start + len(motif)] = motif
    labels = (motif_hits(tokens, MOTIFS[PAIR[0]]).any(1) & motif_hits(tokens, MOTIFS[PAIR[1]]).any(1))
    return tokens, labels.astype(np.int64)


def synthetic_genome(length: int, motif_rate: float = 1 / 48, seed: int = 0) -> np.ndarray:
    """One long uniform-random genome (uint8) with motifs planted at about `motif_rate` per base."""
    rng = np.random.default_rng(seed)
    genome = rng.integers(0, 4, (1, length), dtype=np.uint8)
    _remove_accidental_motifs(genome, rng)
    genome = genome[0]
    step = max(int(round(1 / motif_rate)), 8)
    for block in range(0, length - step, step):  # one motif in each block of `step` bases, random offset
        motif = _motif_ids(MOTIFS[int(rng.integers(0, len(MOTIFS)))])
        start = block + int(rng.integers(0, step - len(motif)))
        genome[start:start + len(motif)] = motif
    return genome


# ============================================================================================ file readers
def read_fasta(path: str) -> dict[str, np.ndarray]:
    """{record name: uint8 tokens} of a (optionally gzipped) FASTA file."""
    if not os.path.isfile(path):
        raise UserInputError(f"FASTA file '{path}' not found: put the genome there (e.g. hg38 as ldar_data.fa) or "
                             "set data.init_args.fasta_name.")
    records: dict[str, str] = {}
    for number, header, sequence in _fasta_records(path):
        name = header.split()[0] if header.split() else ""
        if not name or name in records:
            raise UserInputError(f"{path}:{number}: header '>{header}' has an empty or duplicate record name.")
        records[name] = sequence
    if not records:
        raise UserInputError(f"{path}: no FASTA record ('>name' line) found.")
    return {k: encode(v, f"{path} record '{k}'") for k, v in records.items()}


SPLIT_NAMES = {"train": "train", "valid": "val", "val": "val", "validation": "val", "test": "test"}


def read_bed_windows(path: str, genome: dict[str, np.ndarray]) -> list[tuple[str, int, int, str]]:
    """BED lines ``chrom start end split`` (0-based, end exclusive) checked against the genome."""
    if not os.path.isfile(path):
        raise UserInputError(f"BED file '{path}' not found (expected 'chrom start end split' lines).")
    windows = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip() or line.startswith(("#", "track", "browser")):
                continue
            fields = line.split()
            if len(fields) < 4:
                raise UserInputError(f"{path}:{number}: expected 4 columns 'chrom start end split', got {fields}.")
            chrom, start, end, split = fields[:4]
            try:
                start, end = int(start), int(end)
            except ValueError:
                raise UserInputError(f"{path}:{number}: start/end must be integers, got {fields[1:3]}.") from None
            if split.lower() not in SPLIT_NAMES:
                raise UserInputError(f"{path}:{number}: split '{split}' must be train, valid or test.")
            if chrom not in genome:
                raise UserInputError(f"{path}:{number}: chromosome '{chrom}' is not in the FASTA file "
                                     f"(records: {sorted(genome)[:5]}...).")
            if not 0 <= start < end <= len(genome[chrom]):
                raise UserInputError(f"{path}:{number}: window [{start}, {end}) is outside '{chrom}' "
                                     f"(length {len(genome[chrom])}).")
            windows.append((chrom, start, end, SPLIT_NAMES[split.lower()]))
    if not windows:
        raise UserInputError(f"{path}: no BED window found.")
    return windows


def tile(sequence: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """Non-overlapping pieces of `seq_len` (the last one may be shorter)."""
    return [sequence[i:i + seq_len] for i in range(0, len(sequence), seq_len)]


def _pyarrow_error() -> str | None:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError as err:
        return str(err)
    return None


def _read_table(path: str) -> dict[str, list]:
    if path.endswith(".parquet"):
        problem = _pyarrow_error()
        if problem is not None:
            raise UserInputError(f"reading '{path}' needs a working pyarrow ({problem}); install it, or read the "
                                 "task's .fna files instead (put them next to it or in place of the parquet).")
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pydict()
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise UserInputError(f"{path}: empty table (expected a header 'sequence,label,task' and rows).")
    return {key: [row[key] for row in rows] for key in rows[0]}


def _fasta_records(path: str):
    """(line number of the header, header text without '>', sequence) for each record of a (gzipped) FASTA file."""
    opener = gzip.open if path.endswith(".gz") else open
    header, number, chunks = None, 0, []
    with opener(path, "rt") as handle:
        for line_number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith(">"):
                if header is not None:
                    yield number, header, "".join(chunks)
                header, number, chunks = line[1:].strip(), line_number, []
            elif header is None:
                raise UserInputError(f"{path}:{line_number}: sequence before the first '>' header; is this a "
                                     "FASTA file?")
            else:
                chunks.append(line)
    if header is not None:
        yield number, header, "".join(chunks)


def read_labelled_fasta(path: str) -> dict[str, list]:
    """NT downstream-task FASTA (``>name|label`` headers) -> a table ``{"sequence", "name", "label"}``.

    As the dataset's loading script: the record name is the header's first word and the label the integer after
    its last ``|``."""
    table: dict[str, list] = {"sequence": [], "name": [], "label": []}
    for number, header, sequence in _fasta_records(path):
        name = header.split()[0] if header.split() else ""
        label = name.rsplit("|", 1)[-1] if "|" in name else None
        try:
            label = int(label)
        except (TypeError, ValueError):
            raise UserInputError(f"{path}:{number}: header '>{header}' does not end in '|<integer label>' (the NT "
                                 "downstream-task FASTA header is '>name|label').") from None
        if not sequence:
            raise UserInputError(f"{path}:{number}: record '{name}' has no sequence.")
        table["sequence"].append(sequence)
        table["name"].append(name)
        table["label"].append(label)
    if not table["sequence"]:
        raise UserInputError(f"{path}: no FASTA record ('>name|label' line) found.")
    return table


_NT_TABLES = ("{split}.parquet", "{split}/*.parquet", "{split}-*.parquet", "data/{split}-*.parquet", "{split}.csv")
_NT_FASTA = ("{split}.fna", "{split}.fna.gz", "{split}.fasta", "{split}.fa")
NT_LAYOUTS = ("<data_dir>/<task>/{train,test}.parquet or .fna (the snapshot root, with data.init_args.task), "
              "<data_dir>/<task>/{train,test}/*.parquet, <data_dir>/{train,test}.parquet/.fna/.csv (one task "
              "folder), or data/{train,test}-*.parquet (with a 'task' column)")


def _nt_files(folder: str, split: str) -> list[str]:
    """The files of one split in one folder ([] if none): parquet/CSV tables first, the FASTA files when there is
    no table, or when pyarrow is unusable and a FASTA copy exists."""
    def first(patterns):
        for pattern in patterns:
            found = sorted(glob.glob(os.path.join(folder, pattern.format(split=split))))
            if found:
                return found
        return []

    tables, fasta = first(_NT_TABLES), first(_NT_FASTA)
    if tables and fasta and tables[0].endswith(".parquet") and _pyarrow_error() is not None:
        return fasta
    return tables or fasta


def nucleotide_transformer_tasks(data_dir: str) -> list[str]:
    """Task folders of a snapshot root: sub-folders holding a train split."""
    if not os.path.isdir(data_dir):
        return []
    return sorted(d for d in os.listdir(data_dir)
                  if os.path.isdir(os.path.join(data_dir, d)) and _nt_files(os.path.join(data_dir, d), "train"))


def resolve_nucleotide_transformer(data_dir: str, task: str | None) -> tuple[str, bool]:
    """(folder holding the split files, whether rows are filtered on a ``task`` column) for `data_dir`."""
    if not os.path.isdir(data_dir):
        raise UserInputError(f"NT data_dir '{data_dir}' not found; expected {NT_LAYOUTS}.")
    if _nt_files(data_dir, "train"):
        return data_dir, True
    tasks = nucleotide_transformer_tasks(data_dir)
    if not tasks:
        raise UserInputError(f"no 'train' split under '{data_dir}': expected {NT_LAYOUTS}.")
    if task is None and len(tasks) == 1:
        task = tasks[0]
    if task is None:
        raise UserInputError(f"'{data_dir}' holds {len(tasks)} NT tasks: set data.init_args.task to one of {tasks}.")
    if task not in tasks:
        raise UserInputError(f"task '{task}' is not under '{data_dir}'; tasks found: {tasks}.")
    return os.path.join(data_dir, task), False


def read_nucleotide_transformer(data_dir: str, split: str, task: str | None) -> tuple[list[np.ndarray], np.ndarray]:
    """Sequences and labels of one NT downstream task in any layout of the module docstring."""
    folder, filter_rows = resolve_nucleotide_transformer(data_dir, task)
    files = _nt_files(folder, split)
    if not files:
        raise UserInputError(f"no '{split}' split under '{folder}': expected {split}.parquet, {split}.fna, "
                             f"{split}.csv, {split}/*.parquet or data/{split}-*.parquet next to the train split.")
    sequences, labels, tasks_seen = [], [], set()
    for path in files:
        table = read_labelled_fasta(path) if not path.endswith((".parquet", ".csv")) else _read_table(path)
        missing = {"sequence", "label"} - set(table)
        if missing:
            raise UserInputError(f"{path}: missing column(s) {sorted(missing)}; expected sequence, label "
                                 "(and name or task).")
        rows = range(len(table["sequence"]))
        if filter_rows and "task" in table:
            names = set(table["task"])
            tasks_seen |= names
            if task is None and len(names) > 1:
                raise UserInputError(f"{path} holds several tasks {sorted(names)[:20]}: set data.init_args.task.")
            if task is not None:
                rows = [i for i in rows if table["task"][i] == task]
        row_offset = 2 if path.endswith(".csv") else 0  # CSV: the file line; parquet: the 0-based row
        for i in rows:
            where = f"{path} row {i + row_offset}" if path.endswith((".csv", ".parquet")) else \
                f"{path} record {i + 1}"
            try:
                labels.append(int(table["label"][i]))
            except (TypeError, ValueError):
                raise UserInputError(f"{where}: label {table['label'][i]!r} is not an integer.") from None
            sequences.append(encode(str(table["sequence"][i]), where))
    if not sequences:
        raise UserInputError(f"task '{task}' has no rows in the {split} split of '{folder}'; tasks there: "
                             f"{sorted(tasks_seen)}.")
    return sequences, np.asarray(labels, dtype=np.int64)


def resolve_genomic_benchmarks(data_dir: str, dataset: str | None = None) -> str:
    """The dataset folder (holding ``train/`` and ``test/``) of `data_dir`: itself, or ``<data_dir>/<dataset>`` when
    `data_dir` is a genomic-benchmarks cache root (``~/.genomic_benchmarks``)."""
    if not os.path.isdir(data_dir):
        raise UserInputError(f"'{data_dir}' not found: the Genomic Benchmarks layout is <data_dir>/{{train,test}}/"
                             "<class_name>/<id>.txt, or the package cache <data_dir>/<dataset_name>/{train,test}/...")
    if os.path.isdir(os.path.join(data_dir, "train")):
        return data_dir
    found = sorted(d for d in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, d, "train")))
    if not found:
        raise UserInputError(f"'{data_dir}' has neither train/ nor <dataset_name>/train/ folders: the Genomic "
                             "Benchmarks layout is <data_dir>/{train,test}/<class_name>/<id>.txt (or the package "
                             "cache root holding <dataset_name>/ folders).")
    if dataset is None and len(found) == 1:
        return os.path.join(data_dir, found[0])
    if dataset is None:
        raise UserInputError(f"'{data_dir}' holds {len(found)} Genomic Benchmarks datasets: set data.init_args.task "
                             f"to one of {found}.")
    if dataset not in found:
        raise UserInputError(f"dataset '{dataset}' is not under '{data_dir}'; datasets found: {found}.")
    return os.path.join(data_dir, dataset)


def read_genomic_benchmarks(data_dir: str, split: str, classes: list[str] | None = None,
                            dataset: str | None = None) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """``<data_dir>/<split>/<class>/<id>.txt`` (or ``<data_dir>/<dataset>/<split>/...`` of a cache root):
    sequences, labels (sorted class order) and the class names."""
    root = os.path.join(resolve_genomic_benchmarks(data_dir, dataset), split)
    if not os.path.isdir(root):
        raise UserInputError(f"'{root}' not found: the Genomic Benchmarks layout is <data_dir>/{{train,test}}/"
                             "<class_name>/<id>.txt.")
    found = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if len(found) < 2:
        raise UserInputError(f"'{root}' has {len(found)} class folder(s); a classification task needs >= 2.")
    if classes is not None and found != classes:
        raise UserInputError(f"'{root}' has classes {found} but the train split has {classes}.")
    sequences, labels = [], []
    for label, name in enumerate(found):
        files = sorted(glob.glob(os.path.join(root, name, "*.txt")))
        if not files:
            raise UserInputError(f"class folder '{os.path.join(root, name)}' holds no .txt sequence file.")
        for path in files:
            with open(path) as handle:
                sequences.append(encode("".join(handle.read().split()), path))
            labels.append(label)
    return sequences, np.asarray(labels, dtype=np.int64), found


# ============================================================================================ datasets
class SequenceDataset(Dataset):
    """Variable-length token arrays (+ optional labels); each item carries its ``index`` in the split (the global
    index that seeds a sequence's evaluation masks and drops the sampler's padding copies)."""

    def __init__(self, sequences: list[np.ndarray], labels: np.ndarray | None = None) -> None:
        self.sequences, self.labels = sequences, labels

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int):
        item = {"tokens": torch.from_numpy(np.asarray(self.sequences[index], dtype=np.int64)), "index": int(index)}
        if self.labels is not None:
            item["label"] = int(self.labels[index])
        return item


class PadCollate:
    """Right-pads token sequences with [PAD] and builds the validity mask (picklable)."""

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(item["tokens"]) for item in items)
        tokens = torch.full((len(items), length), PAD_ID, dtype=torch.long)
        for row, item in enumerate(items):
            tokens[row, :len(item["tokens"])] = item["tokens"]
        batch = {"tokens": tokens, "mask": tokens != PAD_ID}
        if "label" in items[0]:
            batch["label"] = torch.tensor([item["label"] for item in items], dtype=torch.long)
        if "index" in items[0]:
            batch["index"] = torch.tensor([item["index"] for item in items], dtype=torch.long)
        return batch


def _holdout(n: int, fraction: float, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(mix_seed(seed, stream)).permutation(n)
    n_val = max(1, int(round(fraction * n))) if fraction > 0 else 0
    return np.sort(order[n_val:]), np.sort(order[:n_val])


class _DNADataModule(LightningDataModule):
    def __init__(self, batch_size: int, eval_batch_size: int, seed: int, num_workers: int) -> None:
        super().__init__()
        check_range("batch_size", batch_size, 1)
        check_range("eval_batch_size", eval_batch_size, 1)
        check_range("num_workers", num_workers, 0)
        self.batch_size, self.eval_batch_size, self.seed, self.num_workers = batch_size, eval_batch_size, seed, \
            num_workers
        self.train_set = self.val_set = self.test_set = None

    def train_dataloader(self) -> DataLoader:
        sampler = training_sampler(len(self.train_set), self.seed, self.trainer)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, collate_fn=PadCollate(),
                          num_workers=self.num_workers)

    def _eval_loader(self, dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=self.eval_batch_size, sampler=evaluation_sampler(dataset, self.trainer),
                          collate_fn=PadCollate(), num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)


class DNAPretrainDataModule(_DNADataModule):
    """MLM pretraining windows: an embedded synthetic genome, or a local FASTA (+ BED windows).

    Args:
        source: 'synthetic' or 'fasta'. data_dir: folder of the FASTA/BED files. fasta_name / bed_name: file names
        (bed_name None: tile every record and split the pieces at random). seq_len: window length.
        genome_length, motif_rate: size and motif density of the synthetic genome.
        val_fraction, test_fraction: random split of the pieces when there is no BED.
    """

    def __init__(self, source: Literal["synthetic", "fasta"] = "synthetic", data_dir: str | None = None,
                 fasta_name: str = "ldar_data.fa", bed_name: str | None = None, seq_len: int = 256,
                 genome_length: int = 400_000, motif_rate: float = 1 / 48, val_fraction: float = 0.05,
                 test_fraction: float = 0.05, batch_size: int = 32, eval_batch_size: int = 64, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__(batch_size, eval_batch_size, seed, num_workers)
        if source not in ("synthetic", "fasta"):
            raise UserInputError(f"source={source!r}: use 'synthetic' or 'fasta'.")
        if source == "fasta" and not data_dir:
            raise UserInputError("source='fasta' needs data.init_args.data_dir (the folder of the FASTA file).")
        check_range("seq_len", seq_len, 8)
        check_range("genome_length", genome_length, 16 * seq_len)
        check_range("motif_rate", motif_rate, 0, 1 / 8)
        check_range("val_fraction", val_fraction, 0, 0.5)
        check_range("test_fraction", test_fraction, 0, 0.5)
        self.source, self.data_dir, self.fasta_name, self.bed_name = source, data_dir, fasta_name, bed_name
        self.seq_len, self.genome_length, self.motif_rate = seq_len, genome_length, motif_rate
        self.val_fraction, self.test_fraction = val_fraction, test_fraction

    def _pieces(self) -> dict[str, list[np.ndarray]]:
        if self.source == "synthetic":
            genome = {"synthetic": synthetic_genome(self.genome_length, self.motif_rate, mix_seed(self.seed, 11))}
            windows = None
        else:
            genome = read_fasta(os.path.join(self.data_dir, self.fasta_name))
            windows = (read_bed_windows(os.path.join(self.data_dir, self.bed_name), genome)
                       if self.bed_name else None)
        splits: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
        if windows is not None:
            for chrom, start, end, split in windows:
                splits[split] += tile(genome[chrom][start:end], self.seq_len)
        else:
            pieces = [p for seq in genome.values() for p in tile(seq, self.seq_len)]
            order = np.random.default_rng(mix_seed(self.seed, 12)).permutation(len(pieces))
            n_val, n_test = int(round(self.val_fraction * len(pieces))), int(round(self.test_fraction * len(pieces)))
            splits["val"] = [pieces[i] for i in order[:n_val]]
            splits["test"] = [pieces[i] for i in order[n_val:n_val + n_test]]
            splits["train"] = [pieces[i] for i in order[n_val + n_test:]]
        for name, pieces in splits.items():
            if not pieces and (name == "train" or self.val_fraction > 0 or windows is not None):
                raise UserInputError(f"the {name} split of the pretraining data is empty: add '{name}' BED windows "
                                     "or raise the split fraction.")
        return splits

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = self._pieces()
        self.train_set, self.val_set = SequenceDataset(splits["train"]), SequenceDataset(splits["val"])
        self.test_set = SequenceDataset(splits["test"] or splits["val"])


class DNAClassificationDataModule(_DNADataModule):
    """Sequence classification: the embedded motif task, NT downstream tasks or Genomic Benchmarks.

    Args:
        source: 'synthetic', 'nucleotide_transformer' or 'genomic_benchmarks'. data_dir: local copy of the data.
        task: which task of a multi-task copy: the NT task folder of a snapshot root (or the value of a flat
        table's `task` column), or the Genomic Benchmarks dataset folder of a cache root; optional when there is
        only one. max_length: longer sequences keep their first bases. val_fraction: seeded hold-out of the
        training split. synthetic_train / synthetic_test / synthetic_length: sizes of the embedded task.
    """

    def __init__(self, source: Literal["synthetic", "nucleotide_transformer", "genomic_benchmarks"] = "synthetic",
                 data_dir: str | None = None, task: str | None = None, max_length: int = 1280,
                 val_fraction: float = 0.1, synthetic_train: int = 4000, synthetic_test: int = 1000,
                 synthetic_length: int = 256, batch_size: int = 32, eval_batch_size: int = 64, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__(batch_size, eval_batch_size, seed, num_workers)
        if source not in ("synthetic", "nucleotide_transformer", "genomic_benchmarks"):
            raise UserInputError(f"source={source!r}: use 'synthetic', 'nucleotide_transformer' or "
                                 "'genomic_benchmarks'.")
        if source != "synthetic" and not data_dir:
            raise UserInputError(f"source='{source}' needs data.init_args.data_dir (a local copy of the data).")
        check_range("max_length", max_length, 1)
        check_range("val_fraction", val_fraction, 0, 0.5, low_inclusive=False)
        check_range("synthetic_train", synthetic_train, 10)
        check_range("synthetic_test", synthetic_test, 1)
        self.source, self.data_dir, self.task, self.max_length = source, data_dir, task, max_length
        self.val_fraction, self.synthetic_train, self.synthetic_test = val_fraction, synthetic_train, synthetic_test
        self.synthetic_length = synthetic_length
        self.num_classes: int | None = None
        self.class_names: list[str] | None = None
        self.test_tokens: np.ndarray | None = None  # synthetic only: (n, L) for the boundary analysis

    def _load(self) -> tuple[list, np.ndarray, list, np.ndarray]:
        if self.source == "synthetic":
            train, train_y = synthetic_motif_task(self.synthetic_train, self.synthetic_length, mix_seed(self.seed, 21))
            test, test_y = synthetic_motif_task(self.synthetic_test, self.synthetic_length, mix_seed(self.seed, 22))
            self.test_tokens = test
            return list(train), train_y, list(test), test_y
        if self.source == "nucleotide_transformer":
            train, train_y = read_nucleotide_transformer(self.data_dir, "train", self.task)
            test, test_y = read_nucleotide_transformer(self.data_dir, "test", self.task)
            return train, train_y, test, test_y
        train, train_y, classes = read_genomic_benchmarks(self.data_dir, "train", dataset=self.task)
        test, test_y, _ = read_genomic_benchmarks(self.data_dir, "test", classes, dataset=self.task)
        self.class_names = classes
        return train, train_y, test, test_y

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, train_y, test, test_y = self._load()
        if train_y.min() < 0:
            raise UserInputError(f"labels must be >= 0 (class ids); found {int(train_y.min())}.")
        self.num_classes = max(int(train_y.max()) + 1, 2)
        if test_y.min() < 0 or test_y.max() >= self.num_classes:
            raise UserInputError(f"test labels span [{int(test_y.min())}, {int(test_y.max())}] but the train split "
                                 f"has classes 0..{self.num_classes - 1}.")
        train = [s[: self.max_length] for s in train]
        test = [s[: self.max_length] for s in test]
        fit_idx, val_idx = _holdout(len(train), self.val_fraction, self.seed, 23)
        self.train_set = SequenceDataset([train[i] for i in fit_idx], train_y[fit_idx])
        self.val_set = SequenceDataset([train[i] for i in val_idx], train_y[val_idx])
        self.test_set = SequenceDataset(test, test_y)
