"""TREW's three paper configs on CIFAR-10's python release (32 x 32 RGB, ten classes): the original classifier,
the retrained-without-the-class reference and the TREW unlearning run that starts from the original."""
from __future__ import annotations

from pathlib import Path

from experiments.paper_steps import Case
from experiments.paper_steps._release import cifar10_python

FORMAT = "cifar-10-batches-py: data_batch_1..5, test_batch, batches.meta (python pickles, byte keys)"


def cifar10(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={cifar10_python(folder / 'data')}", "--data.init_args.num_workers=0"]


CASES = {
    "configs/trew/classifier_paper.yaml": Case(cifar10, release_format=FORMAT,
                                               test_args=("--data.init_args.batch_size=16",)),
    "configs/trew/retrain_paper.yaml": Case(cifar10, release_format=FORMAT,
                                            test_args=("--data.init_args.batch_size=16",)),
    "configs/trew/paper.yaml": Case(cifar10, release_format=FORMAT, after=("configs/trew/classifier_paper.yaml",),
                                    test_args=("--data.init_args.batch_size=16",)),
}
