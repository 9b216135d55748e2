"""Evaluation randomness that does not depend on the number of processes.

Validation, test and prediction of the sampling modules (RNA-FM, the diffusion samplers, GRPO's pass@k) draw
each example's noise from a generator of its own, seeded by the run's seed, a stream number and the example's
*global* index in its dataset (`ExampleGenerators`). Neither the batch an example lands in nor the data-parallel
rank that evaluates it changes a single draw, so a 2-process run samples exactly what one process samples.

Metrics that pool examples are computed once, at the end of the epoch, from every rank's per-example outputs
(`gather_examples`): all ranks' rows are gathered, ordered by global index, and the copies that Lightning's
``DistributedSampler`` adds to even out the shards (validation and test pad the last ranks with the first
examples) are dropped, so the number of examples (and every count, sum and correlation over them) equals one
process's.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser (Steele et al. 2014): a bijective 64-bit mix of a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def example_seed(seed: int, index: int, stream: int = 0) -> int:
    """The 63-bit seed of example ``index`` in random stream ``stream`` of a run seeded with ``seed``."""
    return _splitmix64(_splitmix64(_splitmix64(int(seed) & _MASK64) ^ (int(stream) & _MASK64))
                       ^ (int(index) & _MASK64)) >> 1


class ExampleGenerators:
    """One CPU ``torch.Generator`` per example of a batch, seeded by (seed, stream, global index).

    Pass it where the evaluation code takes a generator: `draw_normal`, `draw_uniform` and `draw_integers` then
    draw row b of every tensor (shape[0] = batch size) from example b's generator, in the order the code asks, so
    an example's draws are the same whatever else shares its batch. Draws are made on the CPU and moved to the
    requested device (the same numbers on CPU and GPU).
    """

    def __init__(self, seed: int, indices: Tensor | Sequence[int], stream: int = 0) -> None:
        self.indices = [int(i) for i in (indices.tolist() if isinstance(indices, Tensor) else indices)]
        self.generators = [torch.Generator().manual_seed(example_seed(seed, i, stream)) for i in self.indices]

    def __len__(self) -> int:
        return len(self.generators)

    def _rows(self, shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(int(s) for s in shape)
        if not shape or shape[0] != len(self.generators):
            raise ValueError(f"per-example draws need shape[0] = batch size {len(self.generators)}, got {shape}.")
        return shape[1:]

    def randn(self, shape: Sequence[int], dtype: torch.dtype | None = None, device=None) -> Tensor:
        row = self._rows(shape)
        dtype = dtype or torch.get_default_dtype()
        out = torch.stack([torch.randn(row, generator=g, dtype=dtype) for g in self.generators]) if self.generators \
            else torch.empty(tuple(shape), dtype=dtype)
        return out.to(device) if device is not None else out

    def rand(self, shape: Sequence[int], dtype: torch.dtype | None = None, device=None) -> Tensor:
        row = self._rows(shape)
        dtype = dtype or torch.get_default_dtype()
        out = torch.stack([torch.rand(row, generator=g, dtype=dtype) for g in self.generators]) if self.generators \
            else torch.empty(tuple(shape), dtype=dtype)
        return out.to(device) if device is not None else out

    def randint(self, low: int, high: int, shape: Sequence[int], device=None) -> Tensor:
        row = self._rows(shape)
        out = torch.stack([torch.randint(low, high, row, generator=g) for g in self.generators]) \
            if self.generators else torch.empty(tuple(shape), dtype=torch.long)
        return out.to(device) if device is not None else out


def draw_normal(shape: Sequence[int], generator: torch.Generator | ExampleGenerators | None, device=None,
                dtype: torch.dtype | None = None) -> Tensor:
    """Standard normal noise of ``shape`` on ``device``: per example for `ExampleGenerators`, else from
    ``generator`` (drawn on the generator's device) or the global RNG (drawn on ``device``)."""
    if isinstance(generator, ExampleGenerators):
        return generator.randn(shape, dtype, device)
    where = device if generator is None else generator.device
    return torch.randn(tuple(shape), generator=generator, device=where, dtype=dtype).to(device)


def draw_uniform(shape: Sequence[int], generator: torch.Generator | ExampleGenerators | None, device=None,
                 dtype: torch.dtype | None = None) -> Tensor:
    """U[0, 1) draws of ``shape`` (same dispatch as `draw_normal`)."""
    if isinstance(generator, ExampleGenerators):
        return generator.rand(shape, dtype, device)
    where = device if generator is None else generator.device
    return torch.rand(tuple(shape), generator=generator, device=where, dtype=dtype).to(device)


def draw_integers(low: int, high: int, shape: Sequence[int], generator: torch.Generator | ExampleGenerators | None,
                  device=None) -> Tensor:
    """Integers uniform in [low, high) of ``shape`` (same dispatch as `draw_normal`)."""
    if isinstance(generator, ExampleGenerators):
        return generator.randint(low, high, shape, device)
    where = device if generator is None else generator.device
    return torch.randint(low, high, tuple(shape), generator=generator, device=where).to(device)


# ============================================================================================ exact gathering
def _all_gather_rows(x: Tensor) -> Tensor:
    """Every rank's rows of ``x`` concatenated in rank order (ranks may hold different numbers of rows)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    count = torch.tensor([x.shape[0]], dtype=torch.long, device=x.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    padded = x.new_zeros((max(counts), *x.shape[1:]))
    padded[:x.shape[0]] = x
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, counts)])


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1


def gather_examples(index: Tensor, *values: Tensor) -> tuple[Tensor, ...]:
    """(index, *values) of every rank's examples, one row per distinct global index, in increasing index order.

    ``index`` [N] and each value [N, ...] hold one row per example this rank evaluated. With one process the rows
    are only ordered; under data parallelism they are all-gathered first and the sampler's padding copies (same
    index, same values) are dropped, so pooled metrics see each example exactly once.
    """
    index = index.reshape(-1).long()
    if distributed():
        index = _all_gather_rows(index)
        values = tuple(_all_gather_rows(v) for v in values)
    order = torch.argsort(index, stable=True)
    index = index[order]
    keep = torch.ones_like(index, dtype=torch.bool)
    keep[1:] = index[1:] != index[:-1]
    rows = order[keep]
    return (index[keep], *(v[rows] for v in values))


def gather_objects(index: Sequence[int], records: Sequence) -> tuple[list[int], list]:
    """`gather_examples` for Python objects: every rank's (index, record) pairs, one per index, ordered by index."""
    pairs = list(zip((int(i) for i in index), records))
    if distributed():
        import torch.distributed as dist

        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, pairs)
        pairs = [pair for part in parts for pair in part]
    unique: dict[int, object] = {}
    for i, record in sorted(pairs, key=lambda pair: pair[0]):
        unique.setdefault(i, record)
    return list(unique), list(unique.values())


class ExactMeans:
    """Weighted means of per-batch values over an evaluation epoch, reduced exactly across ranks.

    ``add(name, value, weight)`` accumulates value x weight and weight in float64; ``compute()`` sums both over all
    ranks (the union of every rank's names) and returns the means. Lightning's ``sync_dist`` mean averages its
    integer example count over gloo ranks with a truncating division, which is off whenever the total is odd.
    """

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}

    def add(self, name: str, value: Tensor | float, weight: float) -> None:
        total = self.sums.setdefault(name, [0.0, 0.0])
        total[0] += float(value) * float(weight)
        total[1] += float(weight)

    def compute(self, device=None) -> dict[str, float]:
        names = sorted(self.sums)
        if distributed():
            import torch.distributed as dist

            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, names)
            names = sorted(set().union(*parts))
        totals = torch.tensor([self.sums.get(n, [0.0, 0.0]) for n in names], dtype=torch.float64,
                              device=device).reshape(-1, 2)
        if distributed():
            torch.distributed.all_reduce(totals)
        self.sums = {}
        return {n: float(s / w) for n, (s, w) in zip(names, totals.tolist()) if w > 0}
