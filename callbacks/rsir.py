"""RSIR: recursive self-improvement of a sequential recommender with fidelity control.

"Can Recommender Systems Teach Themselves? A Recursive Self-Improving Framework with Fidelity Control"
(Zhang et al., arXiv 2602.15659, ICML 2026).

**Method.** Round k: (1) train a model theta_k to early-stopped convergence on D_k; (2) with theta_k, generate
synthetic sequences from every current training sequence (original users and earlier synthetic ones); (3) keep
only steps that pass the fidelity check; (4) D_{k+1} = D_k + the new sequences (plain concatenation, weight 1);
then train a FRESH model on D_{k+1}. Generation, as in the official ``generate_and_save_sequences_parallel``:

    O = the items of the training history (s[:-1] of the most recent max_len + 1 items: the last training
        item is not in O); m trajectories per sequence, each g = [O[0]];
    for step 1 .. max_len - 1:
        R = O - g; stop if R is empty
        scores = theta(g) at the last position, over ALL items (pad and generated items included, unmasked)
        stop unless some r in R has rank(r) = 1 + #{j: score_j > score_r} <= tau      (fidelity, before choosing)
        pool = O with probability p (exploitation), else all items 1..N; g items set to -inf (no repeats)
        g.append(argmax over the pool); stop if the pool's best is -inf
    keep g if len(g) >= min_len; dedupe all kept g (first occurrence order) -> new pseudo-users.

Batched: all trajectories of a batch step together; min over R of rank = 1 + #{scores > max_{r in R} score_r}.
With p in {0, 1} the m trajectories are identical and collapse to one in the dedupe; tau = inf disables the
fidelity check (the "no fidelity control" ablation, whose data grows geometrically).

**How to drive it.** (a) One config, one round: ``python train.py fit --config configs/rsir/quick.yaml`` trains
theta_0 (EarlyStopping + ModelCheckpoint), and this callback, at ``on_fit_end``, reloads the best checkpoint,
generates, and writes ALL synthetic sequences so far (earlier + new) to ``output_path`` (text, one sequence per
line). Round k is the same config with ``--data.init_args.synthetic_from=<round k-1 output_path>``: a fresh
model on D_k (the commands are in the header of configs/rsir/quick.yaml). (b) `run_rsir_rounds`, an
in-process driver. ``configs/rsir/experiment.yaml`` runs each round as an arm of its own: its prepare hook
generates with `generate_into` and passes the file as ``synthetic_from``, as in (a). ``generator_ckpt``
makes a different (e.g. weaker) model's checkpoint the generator (weak-to-strong).

Deviation: the official code also passes a ``max_len`` argument that it ignores (its loop bound is the
model's max_seq_len); here the bound is the data window ``max_len``. Defaults tau=20, p=0.5, m=5, min_len=3 are
the official fallback values (the released YAML's k=2e7 disables the check and is not used).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from datamodules.sequences import write_sequence_file
from lightning_modules.shared.data_contract import SelfImprovingSequenceData
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)


def generation_sources(sequences: list[Tensor], max_len: int) -> list[Tensor]:
    """O of each training sequence: its history s[:-1] within the most recent max_len + 1 items."""
    return [s[-(max_len + 1):][:-1] for s in sequences]


@torch.no_grad()
def generate_sequences(score_next: Callable[[Tensor], Tensor], sequences: list[Tensor], m: int = 5,
                       tau: float = 20, p: float = 0.5, min_len: int = 3, max_len: int = 20,
                       generator: torch.Generator | None = None, batch_size: int = 1024,
                       num_items: int | None = None) -> list[Tensor]:
    """Batched greedy generation with the fidelity check (module docstring). Returns unique sequences.

    ``score_next(window (T, max_len) left-padded) -> (T, N+1)`` scores after the last position.
    """
    check_range("m", m, 1)
    check_range("tau", tau, 1)
    check_range("p", p, 0.0, 1.0)
    check_range("min_len", min_len, 1)
    sources = [o for o in generation_sources(sequences, max_len) if len(o)]
    found: dict[tuple[int, ...], None] = {}
    for start in range(0, len(sources), max(1, batch_size // m)):
        chunk = [o for o in sources[start:start + max(1, batch_size // m)] for _ in range(m)]
        for g in _generate_batch(score_next, chunk, tau, p, max_len, generator, num_items):
            if len(g) >= min_len:
                found.setdefault(tuple(g), None)
    return [torch.tensor(g, dtype=torch.long) for g in found]


def _generate_batch(score_next, sources: list[Tensor], tau, p, max_len, generator, num_items):
    t = len(sources)
    if num_items is None:
        num_items = score_next(torch.zeros(1, max_len, dtype=torch.long)).shape[1] - 1
    n_cols = num_items + 1
    in_o = torch.zeros(t, n_cols, dtype=torch.bool)
    rows = torch.cat([torch.full((len(o),), i) for i, o in enumerate(sources)])
    in_o[rows, torch.cat(sources)] = True
    gen = torch.zeros(t, max_len, dtype=torch.long)
    gen[:, 0] = torch.stack([o[0] for o in sources])
    used = torch.zeros(t, n_cols, dtype=torch.bool)
    used[torch.arange(t), gen[:, 0]] = True
    length = torch.ones(t, dtype=torch.long)
    alive = torch.ones(t, dtype=torch.bool)
    for step in range(1, max_len):
        remaining = in_o & ~used
        alive &= remaining.any(1)
        if not alive.any():
            break
        idx = alive.nonzero().squeeze(1)
        window = torch.zeros(len(idx), max_len, dtype=torch.long)
        window[:, max_len - step:] = gen[idx, :step]
        scores = score_next(window).float().cpu()                                  # (A, N+1), unmasked
        best_remaining = scores.masked_fill(~remaining[idx], float("-inf")).max(1).values
        rank = 1 + (scores > best_remaining.unsqueeze(1)).sum(1)
        passed = rank <= tau if math.isfinite(tau) else torch.ones(len(idx), dtype=torch.bool)
        local = torch.rand(len(idx), generator=generator) < p
        pool = torch.where(local.unsqueeze(1), in_o[idx], torch.ones_like(in_o[idx]))
        pool[:, 0] = False
        choice_scores = scores.masked_fill(used[idx] | ~pool, float("-inf"))
        best, choice = choice_scores.max(1)
        ok = passed & torch.isfinite(best)
        alive[idx[~ok]] = False
        grow = idx[ok]
        gen[grow, step] = choice[ok]
        used[grow, choice[ok]] = True
        length[grow] += 1
    return [gen[i, :length[i]].tolist() for i in range(t)]


def _datamodule_of(trainer: Trainer):
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or not isinstance(datamodule, SelfImprovingSequenceData):
        raise UserInputError("RSIRSelfImprovement needs a datamodule with training_sequences / "
                             "add_training_sequences (datamodules.sequences.SequentialRecDataModule).")
    return datamodule


def load_generator(path: str, trusted: bool = False) -> LightningModule:
    """A SequentialRecommender checkpoint as the generator (e.g. a weaker model: weak-to-strong)."""
    from lightning_modules.shared.base import read_checkpoint
    from lightning_modules.rsir.sequential_rec import SequentialRecommender

    read_checkpoint(path, trusted=trusted, what="generator checkpoint")  # clear errors first
    return SequentialRecommender.load_from_checkpoint(path, map_location="cpu", weights_only=not trusted)


class RSIRSelfImprovement(Callback):
    """At the end of fit: generate with the best model (or ``generator_ckpt``), append to the data, save.

    Args:
        m / tau / p / min_len: generation (module docstring); ``tau: .inf`` disables fidelity control.
        output_path: text file receiving every synthetic sequence so far (earlier rounds + this one); feed it to
            the next round with ``--data.init_args.synthetic_from``. None = do not write.
        generator_ckpt: checkpoint of another SequentialRecommender to generate with (weak-to-strong).
        use_best: reload the ModelCheckpoint's best weights before generating (the early-stopped model).
        max_new_sequences: cap on one round's accepted sequences (a seeded subsample beyond it, logged).
        seed: seed of the exploitation coin flips.
    """

    def __init__(self, m: int = 5, tau: float = 20.0, p: float = 0.5, min_len: int = 3,
                 output_path: str | None = None, generator_ckpt: str | None = None, use_best: bool = True,
                 max_new_sequences: int = 100_000, seed: int = 0) -> None:
        check_range("m", m, 1)
        check_range("tau", tau, 1)
        check_range("p", p, 0.0, 1.0)
        check_range("min_len", min_len, 1)
        check_range("max_new_sequences", max_new_sequences, 1)
        self.m, self.tau, self.p, self.min_len = m, tau, p, min_len
        self.output_path, self.generator_ckpt, self.use_best = output_path, generator_ckpt, use_best
        self.max_new_sequences, self.seed = max_new_sequences, seed
        self.last_round: dict | None = None

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        datamodule = _datamodule_of(trainer)
        if trainer.sanity_checking or getattr(trainer, "fast_dev_run", False):
            return
        model = pl_module
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        if self.generator_ckpt:
            model = load_generator(self.generator_ckpt)
        elif self.use_best and best:
            model = load_generator(best)
        stats = generate_into(model, datamodule, self.m, self.tau, self.p, self.min_len, self.seed,
                              self.max_new_sequences)
        self.last_round = stats
        if trainer.is_global_zero and self.output_path:
            write_sequence_file(self.output_path, datamodule.synthetic_sequences)
            log.warning("RSIR: wrote %d synthetic sequences to %s; next round: --data.init_args.synthetic_from=%s",
                        len(datamodule.synthetic_sequences), self.output_path, self.output_path)
        for logger in trainer.loggers:
            logger.log_metrics({f"rsir/{k}": float(v) for k, v in stats.items()}, step=trainer.global_step)


def generate_into(model, datamodule, m: int, tau: float, p: float, min_len: int, seed: int = 0,
                  max_new_sequences: int = 100_000) -> dict:
    """Generate from the datamodule's current training sequences with `model` and append the result."""
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device

    def score(window: Tensor) -> Tensor:
        return model.score_next(window.to(device)).cpu()

    new = generate_sequences(score, datamodule.training_sequences, m, tau, p, min_len, datamodule.max_len, gen,
                             num_items=datamodule.num_items)
    seconds = time.perf_counter() - start
    generated = len(new)
    if len(new) > max_new_sequences:
        keep = torch.randperm(len(new), generator=gen)[:max_new_sequences].sort().values
        log.warning("RSIR: %d sequences accepted, capped to max_new_sequences=%d (seeded subsample)", len(new),
                    max_new_sequences)
        new = [new[i] for i in keep]
    before = len(datamodule.training_sequences)
    datamodule.add_training_sequences(new)
    model.train(was_training)
    stats = {"sources": before, "generated": generated, "added": len(new),
             "mean_length": float(sum(len(s) for s in new) / max(1, len(new))),
             "total_sequences": len(datamodule.training_sequences), "seconds": seconds,
             "source_sequences_per_s": before / max(seconds, 1e-9),
             "trajectories_per_s": before * m / max(seconds, 1e-9)}
    log.warning("RSIR round: %d source sequences -> %d unique generated (mean length %.2f), %d training "
                "sequences now (%.1f s)", before, generated, stats["mean_length"], stats["total_sequences"], seconds)
    return stats


def run_rsir_rounds(make_model: Callable[[], LightningModule], make_trainer: Callable[[int], Trainer],
                    datamodule, rounds: int = 2, m: int = 5, tau: float = 20.0, p: float = 0.5, min_len: int = 3,
                    seed: int = 0, generator: LightningModule | None = None,
                    after_round: Callable[[int, LightningModule, Trainer], None] | None = None) -> list[dict]:
    """Train theta_0 on the datamodule, then for k = 1..rounds: generate with theta_{k-1} (or a fixed
    ``generator`` for round 1), append, and train a FRESH ``make_model()`` on D_k. ``make_trainer(k)`` must
    restore the early-stopped best weights into the model at the end of fit (e.g. a best-weights callback).
    Returns one stats dict per round (round 0 has no generation stats)."""
    history = []
    model = None
    for k in range(rounds + 1):
        stats: dict = {"round": k}
        if k > 0:
            source = generator if (generator is not None and k == 1) else model
            stats.update(generate_into(source, datamodule, m, tau, p, min_len, seed + k))
        model, trainer = make_model(), make_trainer(k)
        trainer.fit(model, datamodule=datamodule)
        stats["global_step"] = trainer.global_step
        if after_round is not None:
            after_round(k, model, trainer)
        history.append(stats)
    return history
