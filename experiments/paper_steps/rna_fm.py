"""RNA-FM's three paper configs (RNA-FM, HE2RNA, tRNAsformer) on the RNA-FM/SEQUOIA release layout of TCGA-BRCA.

The official pipeline (github.com/YXSong000/RNA-FM, ``pre_processing/generate_ref_file.py``,
``compute_features_hdf5.py``, ``kmean_features.py``) writes ``reference.csv`` (``wsi_file_name`` = the slide's
``.svs`` path, ``patient_id`` = its first 12 characters, then ``rna_<GENE>`` raw FPKM-UQ columns over the 20,820
genes of ``examples/gene_list.csv``), one ``features/<slide>/<slide>.h5`` per slide holding ``uni_features``
[tiles, 1024] (UNI ViT-L/16) and ``cluster_features`` [100, 1024] (k-means cluster means, float32), and the GO
molecular-function pathway JSON ``{name: [gene index, ...]}`` (``examples/all_gene_indices_molecular_function.json``:
382 keys including ``UNCLASSIFIED`` and ``UNMAPPED``, 234,949 memberships).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

NUM_GENES, NUM_CLUSTERS, FEATURE_DIM = 20820, 100, 1024  # SEQUOIA/RNA-FM gene list, k-means k, UNI feature width
SLIDES = 48  # one per patient: 33 train / 5 val / 10 test patients at the configs' 0.1 / 0.2 fractions
TILES = 128  # uni_features rows per slide (the release keeps up to 4000; only cluster_features is read)
# Gene counts of the 382 entries of the released GO-MF pathway JSON, in file order (the last but one pair are
# UNCLASSIFIED 1340 and UNMAPPED 2305, at positions given in SPECIAL).
PATHWAY_SIZES = (
    47, 743, 2771, 6427, 887, 1159, 2731, 943, 588, 33, 57, 1353, 15312, 16674, 34, 493, 1669, 511, 1431, 2710, 556,
    57, 147, 50, 56, 58, 115, 294, 919, 855, 2858, 168, 584, 81, 40, 45, 75, 1429, 777, 45, 199, 40, 192, 464, 654,
    793, 41, 40, 730, 849, 1280, 513, 699, 805, 38, 2171, 4655, 38, 275, 35, 61, 43, 66, 106, 107, 7272, 40, 37, 2692,
    41, 182, 1759, 87, 887, 64, 1740, 1916, 44, 114, 62, 554, 45, 255, 395, 657, 1082, 44, 50, 71, 850, 57, 173, 38,
    930, 1032, 46, 67, 50, 73, 87, 135, 42, 46, 91, 275, 296, 214, 49, 214, 138, 203, 561, 79, 141, 63, 247, 44, 149,
    179, 336, 697, 102, 187, 349, 394, 200, 100, 423, 467, 94, 100, 2952, 5163, 5259, 7097, 86, 87, 123, 81, 163, 360,
    209, 224, 378, 562, 79, 187, 105, 74, 73, 2103, 2544, 2747, 2917, 2770, 71, 169, 74, 181, 67, 58, 64, 124, 64, 62,
    458, 801, 84, 57, 54, 49, 199, 106, 290, 56, 840, 55, 112, 3101, 411, 51, 45, 147, 248, 1645, 107, 52, 101, 2889,
    198, 154, 403, 429, 39, 44, 296, 921, 48, 50, 59, 78, 84, 88, 149, 458, 985, 1062, 1064, 93, 148, 155, 498, 80,
    1210, 81, 76, 320, 71, 68, 117, 123, 75, 71, 74, 133, 107, 160, 70, 61, 61, 96, 64, 86, 66, 91, 135, 154, 83, 147,
    182, 248, 112, 456, 83, 412, 731, 2209, 125, 102, 103, 1943, 2379, 1992, 2432, 2448, 2825, 72, 73, 291, 175, 76,
    161, 105, 109, 110, 778, 217, 77, 125, 95, 141, 120, 141, 159, 81, 114, 105, 280, 586, 543, 92, 905, 89, 91, 141,
    235, 138, 89, 126, 104, 527, 103, 116, 111, 346, 97, 379, 90, 129, 223, 343, 102, 157, 502, 109, 156, 166, 105,
    108, 163, 488, 154, 131, 2650, 184, 912, 2677, 1289, 168, 228, 478, 569, 611, 629, 501, 146, 167, 181, 161, 262,
    171, 362, 187, 257, 194, 307, 329, 355, 369, 811, 1272, 1296, 1633, 1634, 1721, 1841, 1876, 1505, 51, 102, 29, 74,
    140, 152, 20, 22, 1340, 16, 9, 15, 8, 10, 393, 7, 49, 74, 37, 6, 71, 3, 37, 106, 113, 18, 6, 12, 2, 2, 3, 25, 26,
    2305)
SPECIAL = {356: "UNCLASSIFIED", 381: "UNMAPPED"}
FORMAT = ("RNA-FM/SEQUOIA TCGA-BRCA layout: reference.csv (wsi_file_name = .svs path, patient_id, 20,820 rna_<GENE> "
          "raw FPKM-UQ columns; placeholder gene symbols), features/<slide>/<slide>.h5 (uni_features [128, 1024], "
          "cluster_features [100, 1024] float32), GO-MF pathways.json (382 keys with the released gene counts, "
          "UNCLASSIFIED/UNMAPPED; random members); 48 slides")


def write_tcga_brca(root: Path, slides: int = SLIDES, seed: int = 0) -> Path:
    """The release files for ``slides`` slides (one per patient) under ``root``; returns ``root``."""
    import h5py

    assert len(PATHWAY_SIZES) == 382 and PATHWAY_SIZES[356] == 1340 and PATHWAY_SIZES[381] == 2305
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    genes = [f"GENE{g:05d}" for g in range(NUM_GENES)]
    with open(root / "reference.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["wsi_file_name", "patient_id", *(f"rna_{g}" for g in genes)])
        for s in range(slides):
            patient = f"TCGA-A{s // 100}-{s:04d}"
            stem = f"{patient}-01Z-00-DX1.{rng.integers(16 ** 8):08X}-5E2F-4B0A-9C1D-{rng.integers(16 ** 12):012X}"
            # FPKM-UQ: non-negative, heavy-tailed, many exact zeros
            fpkm = np.where(rng.random(NUM_GENES) < 0.2, 0.0, rng.lognormal(1.5, 2.0, NUM_GENES))
            writer.writerow([f"/data/TCGA_slides/TCGA_BRCA/{rng.integers(16 ** 8):08x}/{stem}.svs", patient,
                             *(f"{v:.4f}" for v in fpkm)])
            folder = root / "features" / stem
            folder.mkdir(parents=True, exist_ok=True)
            with h5py.File(folder / f"{stem}.h5", "w") as h5:
                tiles = rng.standard_normal((TILES, FEATURE_DIM), dtype=np.float32)
                h5.create_dataset("uni_features", data=tiles)
                h5.create_dataset("cluster_features", data=np.stack([tiles[i::NUM_CLUSTERS].mean(0)
                                                                      for i in range(NUM_CLUSTERS)]))
            (folder / "complete_tile.txt").write_text(f"Total n patch = {TILES}")
    pathways = {SPECIAL.get(i, f"GO molecular function {i}"): rng.choice(NUM_GENES, size, replace=False).tolist()
                for i, size in enumerate(PATHWAY_SIZES)}
    (root / "pathways.json").write_text(json.dumps(pathways))
    return root


def tcga_brca(folder: Path) -> list[str]:
    root = folder / "dataset" / "TCGA-BRCA"
    if not (root / "pathways.json").is_file():  # the three configs share one folder and one copy of the files
        write_tcga_brca(root)
    return [f"--data.init_args.data_dir={root}", "--data.init_args.num_workers=0"]


SMALL = ("--data.init_args.batch_size=8", "--data.init_args.eval_batch_size=8")
CASES = {
    "configs/rna_fm/paper.yaml": Case(tcga_brca, release_format=FORMAT, test_args=SMALL),
    "configs/rna_fm/he2rna_paper.yaml": Case(tcga_brca, release_format=FORMAT, test_args=SMALL),
    "configs/rna_fm/trnasformer_paper.yaml": Case(tcga_brca, release_format=FORMAT, test_args=SMALL),
}
