"""Samplers shared by every datamodule: resume-exact training shuffles and DDP-exact evaluation shards."""
from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import Dataset, Sampler

SHUFFLE_STREAM = 2  # seed stream of the training shuffle (other streams: each datamodule's own draws)


def mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (seed, stream[, epoch]): distinct tuples, distinct streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0]) >> 1


class EpochShuffleSampler(Sampler[int]):
    """A random permutation of ``range(num_samples)`` that is a pure function of (seed, epoch).

    Lightning calls ``set_epoch`` at the start of every training epoch (also after resuming from a
    checkpoint), so epoch e always visits the same order, interrupted or not. Picklable (ddp_spawn).
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples, self.seed, self.epoch = num_samples, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        gen = torch.Generator().manual_seed(mix_seed(self.seed, SHUFFLE_STREAM, self.epoch))
        return iter(torch.randperm(self.num_samples, generator=gen).tolist())


class LoaderGeneratorReplaySampler(EpochShuffleSampler):
    """Epoch e visits the order that ``DataLoader(shuffle=True, generator=Generator().manual_seed(seed),
    batch_size=batch_size)`` gave epoch e of an uninterrupted Lightning run of full epochs, recomputed from
    (seed, epoch) alone.

    The RLVR, multi-answer and slide-expression datamodules shuffled with such a per-loader generator, so a run
    resumed from a checkpoint replayed epoch 0's order. This sampler keeps their measured orders (and numbers)
    while making the order a pure function of (seed, epoch) like ``EpochShuffleSampler``: it replays the draws
    that torch's DataLoader iterator (one int64 for the workers' base seed) and ``RandomSampler`` (one
    permutation) made in earlier epochs, plus the one ``RandomSampler`` makes for its empty remainder when it is
    read past its last index. Lightning reads exactly ``len(loader)`` batches of a sized loader, so that happens
    only when the last batch is partial (``num_samples % batch_size != 0`` without ``drop_last``); a loop that
    reads the loader to its end (``list(loader)``) always makes it, which is why ``batch_size`` is needed.
    Give the DataLoader its own seeded generator too, so that its base-seed draw stays off the global RNG, as before.
    """

    def __init__(self, num_samples: int, seed: int, batch_size: int, drop_last: bool = False) -> None:
        super().__init__(num_samples, seed)
        self.batch_size, self.drop_last = int(batch_size), bool(drop_last)

    def __iter__(self):
        reads_past_end = self.num_samples % self.batch_size != 0 and not self.drop_last
        gen = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epoch):
            torch.empty((), dtype=torch.int64).random_(generator=gen)
            torch.randperm(self.num_samples, generator=gen)
            if reads_past_end:
                torch.randperm(self.num_samples, generator=gen)
        torch.empty((), dtype=torch.int64).random_(generator=gen)
        return iter(torch.randperm(self.num_samples, generator=gen).tolist())


class ReplacementSampler(EpochShuffleSampler):
    """Indices drawn uniformly WITH replacement, one ``torch.randint(num_samples, (batch_size,), generator=gen)``
    per batch from one generator seeded with ``seed`` that runs on across epochs: the batches of the plain loop
    ``gen = Generator().manual_seed(seed); for step: rows = torch.randint(n, (B,), generator=gen)``, step for step.

    An epoch is ``num_samples // batch_size`` full batches (the sampler's length is a multiple of ``batch_size``,
    so no batch is partial); epoch e first replays the draws of epochs 0 .. e-1, so the order is a pure function
    of (seed, epoch) and a resumed run continues the same stream.
    """

    def __init__(self, num_samples: int, seed: int, batch_size: int) -> None:
        super().__init__(num_samples, seed)
        self.batch_size = int(batch_size)
        if not 1 <= self.batch_size <= self.num_samples:
            raise ValueError(f"ReplacementSampler: batch_size {batch_size} must be between 1 and the {num_samples} "
                             "examples")

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed)
        batches = self.num_samples // self.batch_size
        for _ in range(self.epoch * batches):  # the draws of the earlier epochs
            torch.randint(self.num_samples, (self.batch_size,), generator=gen)
        for _ in range(batches):
            yield from torch.randint(self.num_samples, (self.batch_size,), generator=gen).tolist()


def training_sampler(num_samples: int, seed: int, trainer, sampler_class=EpochShuffleSampler, **kwargs) -> Sampler:
    """The epoch-seeded training sampler (``sampler_class(num_samples, seed, **kwargs)``), already set to the
    trainer's current epoch (if any)."""
    sampler = sampler_class(num_samples, seed, **kwargs)
    if trainer is not None:
        sampler.set_epoch(trainer.current_epoch)
    return sampler


def evaluation_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """Under DDP, shard evaluation data without DistributedSampler's padding duplicates, so that summed
    torchmetrics equal the single-process value (each example is seen exactly once); None otherwise."""
    if trainer is None or trainer.world_size == 1:
        return None
    return UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank,
                                        shuffle=False)
