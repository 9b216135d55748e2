"""Throughput of the RSIR pieces on the embedded data: Lightning vs the same work in a plain PyTorch loop.

    python -m experiments.rsir_speed                  # ~1 min on 2 cores, one thread
    python -m experiments.rsir_speed --paper-scale    # d 64, 2 blocks, max_len 50, batch 256 (paper.yaml's sizes)

Measures (SASRec of configs/rsir/quick.yaml: 1 block, d 32, max_len 20, full softmax, batch 64; 1500 users,
400 items): training samples/s (optimizer steps x batch size, timed from the first to the last batch), full-
ranking evaluation users/s (all 400 items scored, history masked, NDCG/Recall accumulated), and RSIR generation
source sequences/s (m = 5 trajectories each, tau = 20, p = 0.5). Writes results/rsir_speed[_paper_scale].json.
With the quick sizes a training step takes a few milliseconds, so Lightning's fixed per-step cost (hooks,
logging) is visible; ``--paper-scale`` measures the same at the paper's model and batch sizes.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from callbacks.rsir import generate_sequences
from datamodules.sequences import SequentialRecDataModule
from lightning_modules.ranking_metrics import LeaveOneOutMetrics, leave_one_out_ranks
from lightning_modules.sequential_rec import SequentialRecommender, full_softmax_loss

STEPS, EVAL_REPEATS = 400, 20


class Clock(Callback):
    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == 0 and not hasattr(self, "start"):
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start


QUICK = {"hidden_dim": 32, "num_blocks": 1, "max_len": 20, "batch_size": 64}
PAPER_SCALE = {"hidden_dim": 64, "num_blocks": 2, "max_len": 50, "batch_size": 256}


def model(sizes: dict) -> SequentialRecommender:
    seed_everything(0, verbose=False)
    return SequentialRecommender(num_items=400, hidden_dim=sizes["hidden_dim"], num_blocks=sizes["num_blocks"],
                                 max_len=sizes["max_len"], optimizer=functools.partial(torch.optim.Adam, lr=3e-3))


def trainer(**kw) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, **kw)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper-scale", action="store_true", help="paper.yaml's model and batch sizes")
    args = parser.parse_args(argv)
    sizes = PAPER_SCALE if args.paper_scale else QUICK
    batch = sizes["batch_size"]
    torch.set_num_threads(1)
    data = SequentialRecDataModule(synthetic_users=1500, max_len=sizes["max_len"], batch_size=batch, seed=0)
    out = {"sizes": sizes}
    # ---- training
    clock = Clock()
    lit = model(sizes)
    trainer(max_steps=STEPS, max_epochs=-1, limit_val_batches=0, callbacks=[clock]).fit(lit, datamodule=data)
    out["train_samples_per_s_lightning"] = STEPS * batch / clock.seconds
    plain = model(sizes)
    opt = torch.optim.Adam(plain.parameters(), lr=3e-3)
    plain.train()
    steps, start, epoch = 0, time.perf_counter(), 0
    while steps < STEPS:
        loader = data.train_dataloader()
        loader.sampler.set_epoch(epoch)
        for inputs, target in loader:
            loss = full_softmax_loss(plain(inputs) @ plain.item_embedding.T, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if steps == STEPS:
                break
        epoch += 1
    out["train_samples_per_s_plain"] = STEPS * batch / (time.perf_counter() - start)
    # ---- full-ranking evaluation
    users = len(data.valid_target) * EVAL_REPEATS
    t = trainer()
    start = time.perf_counter()
    for _ in range(EVAL_REPEATS):
        t.validate(lit, datamodule=data, verbose=False)
    out["eval_users_per_s_lightning"] = users / (time.perf_counter() - start)
    lit.eval()
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(EVAL_REPEATS):
            metrics = LeaveOneOutMetrics((5, 10, 20))
            for history, target in data.val_dataloader():
                metrics.update(leave_one_out_ranks(lit.masked_scores(history), target))
            metrics.compute()
    out["eval_users_per_s_plain"] = users / (time.perf_counter() - start)
    # ---- generation
    start = time.perf_counter()
    new = generate_sequences(lit.score_next, data.training_sequences, m=5, tau=20, p=0.5, min_len=3,
                             max_len=sizes["max_len"],
                             generator=torch.Generator().manual_seed(0), num_items=400)
    seconds = time.perf_counter() - start
    out["generation_source_sequences_per_s"] = len(data.training_sequences) / seconds
    out["generation_trajectories_per_s"] = 5 * len(data.training_sequences) / seconds
    out["generated_unique"] = len(new)
    out["train_ratio_lightning_over_plain"] = out["train_samples_per_s_lightning"] / out["train_samples_per_s_plain"]
    out["eval_ratio_lightning_over_plain"] = out["eval_users_per_s_lightning"] / out["eval_users_per_s_plain"]
    os.makedirs("results", exist_ok=True)
    with open("results/rsir_speed" + ("_paper_scale" if args.paper_scale else "") + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print("| measure | Lightning | plain PyTorch | ratio |\n|---|---|---|---|")
    print(f"| SASRec training samples/s | {out['train_samples_per_s_lightning']:.0f} | "
          f"{out['train_samples_per_s_plain']:.0f} | {out['train_ratio_lightning_over_plain']:.2f} |")
    print(f"| full-ranking evaluation users/s | {out['eval_users_per_s_lightning']:.0f} | "
          f"{out['eval_users_per_s_plain']:.0f} | {out['eval_ratio_lightning_over_plain']:.2f} |")
    print(f"\nRSIR generation: {out['generation_source_sequences_per_s']:.0f} source sequences/s "
          f"({out['generation_trajectories_per_s']:.0f} trajectories/s, {len(new)} unique kept)")


if __name__ == "__main__":
    main()
