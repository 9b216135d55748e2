"""Throughput of the RSIR pieces on the embedded data: Lightning vs the same work in a plain PyTorch loop.

    python -m experiments.rsir_speed                  # ~1 min on 2 cores, one thread
    python -m experiments.rsir_speed --paper-scale    # d 64, 2 blocks, max_len 50, batch 256 (paper.yaml's sizes)

Measures (SASRec and data of configs/rsir/quick.yaml through `experiments.kit.from_config`: 1 block, 1 head,
d 32, max_len 20, dropout 0.2, full softmax, batch 64; 1500 users, 400 items, set-like regime): training
samples/s (optimizer steps x batch size, timed from the first to the last batch), full-ranking evaluation users/s
(all 400 items scored, history masked, NDCG/Recall accumulated), and RSIR generation source sequences/s (m = 5
trajectories each, tau = 20, p = 0.5). Writes ``<out>/rsir_speed[_paper_scale].json`` in the kit's schema: arms =
what is timed (training / evaluation, Lightning / plain loop; generation), metrics = throughputs; ``--seeds`` =
independent measurement rounds. With the quick sizes a training step takes a few milliseconds, so Lightning's
fixed per-step cost (hooks, logging) is visible; ``--paper-scale`` measures the same at the paper's model and
batch sizes.
"""
from __future__ import annotations

import time

import torch
from lightning.pytorch import Callback

from callbacks.rsir import generate_sequences
from experiments.kit import experiment_parser, from_config, progress, quiet_trainer, summarise, write_result
from lightning_modules.shared.ranking_metrics import LeaveOneOutMetrics, leave_one_out_ranks
from lightning_modules.rsir.sequential_rec import full_softmax_loss

CONFIG = "configs/rsir/quick.yaml"
STEPS, EVAL_REPEATS = 400, 20


class Clock(Callback):
    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == 0 and not hasattr(self, "start"):
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start


QUICK = {"hidden_dim": 32, "num_blocks": 1, "max_len": 20, "batch_size": 64}
PAPER_SCALE = {"hidden_dim": 64, "num_blocks": 2, "max_len": 50, "batch_size": 256}


def build(sizes: dict, users: int):
    """(model, data) of the config at these sizes (seed 0)."""
    return from_config(CONFIG, "--seed_everything=0", f"--model.init_args.hidden_dim={sizes['hidden_dim']}",
                       f"--model.init_args.num_blocks={sizes['num_blocks']}",
                       f"--model.init_args.max_len={sizes['max_len']}", f"--data.init_args.max_len={sizes['max_len']}",
                       f"--data.init_args.batch_size={sizes['batch_size']}",
                       f"--data.init_args.synthetic_users={users}")


def measure(sizes: dict, steps: int, eval_repeats: int, users: int) -> dict:
    batch = sizes["batch_size"]
    lit, data = build(sizes, users)
    out = {}
    bar = progress(None, "training, evaluation, generation (Lightning and plain)", total=5)
    # ---- training
    clock = Clock()
    quiet_trainer([clock], max_steps=steps, max_epochs=-1, limit_val_batches=0).fit(lit, datamodule=data)
    out["train_samples_per_s_lightning"] = steps * batch / clock.seconds
    bar.update()
    plain, _ = build(sizes, users)
    opt = torch.optim.Adam(plain.parameters(), lr=3e-3)
    plain.train()
    done, start, epoch = 0, time.perf_counter(), 0
    while done < steps:
        loader = data.train_dataloader()
        loader.sampler.set_epoch(epoch)
        for inputs, target in loader:
            loss = full_softmax_loss(plain(inputs) @ plain.item_embedding.T, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    out["train_samples_per_s_plain"] = steps * batch / (time.perf_counter() - start)
    bar.update()
    # ---- full-ranking evaluation
    evaluated = len(data.valid_target) * eval_repeats
    t = quiet_trainer()
    start = time.perf_counter()
    for _ in range(eval_repeats):
        t.validate(lit, datamodule=data, verbose=False)
    out["eval_users_per_s_lightning"] = evaluated / (time.perf_counter() - start)
    bar.update()
    lit.eval()
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(eval_repeats):
            metrics = LeaveOneOutMetrics((5, 10, 20))
            for history, target, *_ in data.val_dataloader():
                metrics.update(leave_one_out_ranks(lit.masked_scores(history), target))
            metrics.compute()
    out["eval_users_per_s_plain"] = evaluated / (time.perf_counter() - start)
    bar.update()
    # ---- generation
    start = time.perf_counter()
    new = generate_sequences(lit.score_next, data.training_sequences, m=5, tau=20, p=0.5, min_len=3,
                             max_len=sizes["max_len"], generator=torch.Generator().manual_seed(0),
                             num_items=lit.hparams.num_items)
    seconds = time.perf_counter() - start
    out["generation_source_sequences_per_s"] = len(data.training_sequences) / seconds
    out["generation_trajectories_per_s"] = 5 * len(data.training_sequences) / seconds
    out["generated_unique"] = len(new)
    bar.update()
    bar.close()
    out["train_ratio_lightning_over_plain"] = out["train_samples_per_s_lightning"] / out["train_samples_per_s_plain"]
    out["eval_ratio_lightning_over_plain"] = out["eval_users_per_s_lightning"] / out["eval_users_per_s_plain"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=1)
    parser.add_argument("--paper-scale", action="store_true", help="paper.yaml's model and batch sizes")
    args = parser.parse_args(argv)
    sizes = PAPER_SCALE if args.paper_scale else QUICK
    steps, eval_repeats, users = (8, 1, 100) if args.smoke else (STEPS, EVAL_REPEATS, 1500)
    torch.set_num_threads(1)
    start = time.perf_counter()
    per_seed, raw = [], []
    for _ in progress(range(args.seeds), "measurement rounds"):
        out = measure(sizes, steps, eval_repeats, users)
        raw.append(out)
        per_seed.append({
            "training (Lightning)": {"samples_per_s": out["train_samples_per_s_lightning"]},
            "training (plain PyTorch)": {"samples_per_s": out["train_samples_per_s_plain"]},
            "full-ranking evaluation (Lightning)": {"users_per_s": out["eval_users_per_s_lightning"]},
            "full-ranking evaluation (plain PyTorch)": {"users_per_s": out["eval_users_per_s_plain"]},
            "RSIR generation": {"source_sequences_per_s": out["generation_source_sequences_per_s"],
                                "trajectories_per_s": out["generation_trajectories_per_s"],
                                "generated_unique": float(out["generated_unique"])},
        })
    arms = summarise(per_seed)
    name = "rsir_speed" + ("_paper_scale" if args.paper_scale else "")
    result = write_result(name, seeds=args.seeds, wall_s=time.perf_counter() - start,
                          config={"config_file": CONFIG, "sizes": sizes, "train_steps": steps,
                                  "eval_repeats": eval_repeats, "users": users, "smoke": args.smoke},
                          arms=arms, per_seed=per_seed, out=args.out, measurements=raw)
    mean = {k: sum(r[k] for r in raw) / len(raw) for k in raw[0]}
    print("| measure | Lightning | plain PyTorch | ratio |\n|---|---|---|---|")
    print(f"| SASRec training samples/s | {mean['train_samples_per_s_lightning']:.0f} | "
          f"{mean['train_samples_per_s_plain']:.0f} | {mean['train_ratio_lightning_over_plain']:.2f} |")
    print(f"| full-ranking evaluation users/s | {mean['eval_users_per_s_lightning']:.0f} | "
          f"{mean['eval_users_per_s_plain']:.0f} | {mean['eval_ratio_lightning_over_plain']:.2f} |")
    print(f"\nRSIR generation: {mean['generation_source_sequences_per_s']:.0f} source sequences/s "
          f"({mean['generation_trajectories_per_s']:.0f} trajectories/s, {mean['generated_unique']:.0f} unique kept)")
    return result


if __name__ == "__main__":
    main()
