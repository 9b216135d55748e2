"""TIVDiff's paper configs (identity encoder, then VIP + generator from its checkpoint) on CelebA as the release is
distributed: ``Img/img_align_celeba/*.jpg`` (178 x 218 aligned RGB JPEGs), ``Anno/identity_CelebA.txt``,
``Anno/list_landmarks_align_celeba.txt`` and ``Eval/list_eval_partition.txt``."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

FORMAT = ("CelebA release: Img/img_align_celeba/000001.jpg.. (178 x 218 RGB JPEG), Anno/identity_CelebA.txt, "
          "Anno/list_landmarks_align_celeba.txt (count + header lines, 5 points), Eval/list_eval_partition.txt "
          "(identity-disjoint 0/1/2)")
LANDMARK_HEADER = ("lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y rightmouth_x "
                   "rightmouth_y")
ALIGNED_LANDMARKS = np.array([69, 109, 106, 113, 77, 142, 73, 152, 108, 154])  # 000001.jpg's row of the release


def celeba_release(root: Path, partitions: tuple[tuple[int, int], ...] = ((30, 10), (2, 2), (8, 4)),
                   seed: int = 0) -> Path:
    """CelebA laid out as its release (Liu et al. 2015) ships it, for ``partitions`` = (identities, images each) of
    partition 0 (train), 1 (validation) and 2 (test): images numbered ``000001.jpg``.. in that order, 178 wide and
    218 high (the aligned-and-cropped set), identity ids drawn from 1..10177; ``identity_CelebA.txt`` lines
    ``<file> <id>``; ``list_landmarks_align_celeba.txt`` a count line, the header line, then ``<file>`` and ten
    right-aligned integers (the aligned set's 5 points, jittered around the release's first row);
    ``list_eval_partition.txt`` lines ``<file> <0|1|2>``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = Path(root) / "Img" / "img_align_celeba"
    images.mkdir(parents=True, exist_ok=True)
    (Path(root) / "Anno").mkdir(exist_ok=True)
    (Path(root) / "Eval").mkdir(exist_ok=True)
    total = sum(n * k for n, k in partitions)
    identities = rng.choice(np.arange(1, 10178), sum(n for n, _ in partitions), replace=False)
    ids, marks, parts = [], [str(total), LANDMARK_HEADER], []
    yy, xx = np.mgrid[0:218, 0:178]
    number, person = 0, 0
    for partition, (people, per_person) in enumerate(partitions):
        for _ in range(people):
            tone = rng.uniform(90, 200, 3)
            for _ in range(per_person):
                number += 1
                name = f"{number:06d}.jpg"
                face = np.exp(-(((xx - 89) / 55.0) ** 2 + ((yy - 120) / 70.0) ** 2))[..., None] * tone
                pixels = np.clip(face + 30 + rng.normal(0, 12, (218, 178, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(images / name, quality=95)
                ids.append(f"{name} {identities[person]}")
                row = ALIGNED_LANDMARKS + rng.integers(-3, 4, 10)
                marks.append(f"{name}" + "".join(f"{v:>5d}" for v in row))
                parts.append(f"{name} {partition}")
            person += 1
    for path, lines in ((Path(root) / "Anno" / "identity_CelebA.txt", ids),
                        (Path(root) / "Anno" / "list_landmarks_align_celeba.txt", marks),
                        (Path(root) / "Eval" / "list_eval_partition.txt", parts)):
        path.write_text("\n".join(lines) + "\n")
    return Path(root)


def celeba(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={celeba_release(folder / 'dataset' / 'celeba')}",
            "--data.init_args.num_workers=0"]


# predict generates each face with 50 DDIM steps and inverts it with 50 more (~5 s a face on one core)
PREDICT_ARGS = ("--data.init_args.eval_batch_size=4",)
TEST_ARGS = ("--data.init_args.eval_batch_size=4", "--model.init_args.num_inference_steps=5")
CASES = {
    "configs/tivdiff/encoder_paper.yaml": Case(
        celeba, release_format=FORMAT, args=PREDICT_ARGS,
        note=("evaluation (validation and predict) batch 4 instead of 512: predict generates and inverts each face "
              "with 50 + 50 DDIM steps, ~5 s a face on one core (20-22 s for the batch of 4)"),
        test_args=("--data.init_args.batch_size=16", *TEST_ARGS)),
    "configs/tivdiff/paper.yaml": Case(
        celeba, release_format=FORMAT, args=PREDICT_ARGS, after=("configs/tivdiff/encoder_paper.yaml",),
        note=("evaluation (validation and predict) batch 4 instead of 128: predict generates and inverts each face "
              "with 50 + 50 DDIM steps, ~5 s a face on one core (20-22 s for the batch of 4)"),
        test_args=("--data.init_args.batch_size=4", *TEST_ARGS)),
}
