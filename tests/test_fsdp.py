"""Fully sharded training (FSDP2 through Lightning's ModelParallelStrategy) of GRPO, SFT and DPO on 2 CPU processes.

The slow test starts two ranks the way ``torchrun`` does (``RANK``, ``WORLD_SIZE``, ...; gloo, a short collective
timeout and a wall-clock limit, so a desynchronised step fails instead of hanging). Each rank trains on its half of
every global batch; the test then trains one process on the whole batches and compares the loss trajectory and the
updated weights. What "equal" needs: the same global batch (per-process batches are halves, given explicitly, no
sampler), the same sampling (GRPO with ``rollout_seeding: example``, rollouts keyed by prompt id and rollout index,
not by rank), loss denominators over all ranks (GRPO's token counts, SFT's target tokens) and float tolerance for
the different reduction order. GRPO also resumes from its sharded (distributed-checkpoint folder) checkpoint.

The fast tests check the synchronised generation loop with a fake policy and a mocked all-reduce: a rank that
finishes early keeps calling the policy (on padding) until the simulated other rank is done, and returns what the
unsynchronised loop returns.

    python tests/test_fsdp.py worker OUT_DIR     # what each rank runs (env set by the test)
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningDataModule, Trainer
from torch.utils.data import DataLoader

from datamodules.verifiable_tasks import CharTokenizer, collate_prompts, collate_sft
from lightning_modules.rlvr import rollouts
from lightning_modules.rlvr.rollouts import rollout_keys, sample_completions

TOKENIZER = CharTokenizer()
TIMEOUT_S = 300
HF_CONFIG = {"model_type": "gpt2", "vocab_size": TOKENIZER.vocab_size, "n_positions": 32, "n_embd": 32,
             "n_layer": 2, "n_head": 2, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


# --------------------------------------------------------------------------------------------- fast: synced loop
class CountingPolicy(torch.nn.Module):
    """A fake policy: the next-token logits favour EOS for row r from step ``stop[r]`` on; counts its calls."""

    def __init__(self, stop_after: dict[int, int]) -> None:
        super().__init__()
        self.stop_after, self.calls = stop_after, 0

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        self.calls += 1
        step = 0 if past_key_values is None else past_key_values + 1
        rows = input_ids.shape[0]
        logits = torch.zeros(rows, input_ids.shape[1], TOKENIZER.vocab_size)
        logits[:, -1, 5] = 10.0  # a digit
        for r in range(rows):
            if step >= self.stop_after.get(r, 99):
                logits[r, -1, TOKENIZER.eos_id] = 20.0
        return logits, (step if use_cache else None)


def _prompts(n: int) -> dict:
    return collate_prompts([{"prompt_id": i, "prompt": "12+34=", "answers": ["0"]} for i in range(n)], TOKENIZER)


def test_synced_generation_keeps_calling_the_policy_until_every_rank_is_done(monkeypatch):
    """This rank's rollouts end after 2 tokens; the simulated other rank generates 6. The loop calls the policy
    once per step until the other rank is done, and returns exactly the unsynchronised result."""
    other_rank_active_until = 5  # steps 0..4 still active elsewhere: forward calls after steps 0..4
    seen = []

    def fake_all_reduce(flag, op=None, group=None):
        seen.append(float(flag))
        if len(seen) <= other_rank_active_until:
            flag.fill_(1.0)

    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    batch = _prompts(2)
    counts = torch.tensor([2, 1])
    plain_policy, synced_policy = CountingPolicy({0: 1, 1: 1, 2: 1}), CountingPolicy({0: 1, 1: 1, 2: 1})
    plain = sample_completions(plain_policy, batch["prompt_tokens"], batch["prompt_mask"], counts, 8, 0.0, TOKENIZER)
    synced = sample_completions(synced_policy, batch["prompt_tokens"], batch["prompt_mask"], counts, 8, 0.0,
                                TOKENIZER, synced=True)
    assert plain[0].shape == (3, 2) and bool((plain[0][:, 1] == TOKENIZER.eos_id).all())
    for a, b in zip(plain, synced):
        assert torch.equal(a, b)
    assert plain_policy.calls == 2  # prefill + one step
    assert synced_policy.calls == 1 + other_rank_active_until  # prefill + one call per step while any rank is active
    assert seen[:2] == [1.0, 0.0] and all(v == 0.0 for v in seen[1:])  # this rank reports done from step 1 on


def test_synced_generation_with_no_local_rollouts_runs_the_same_forward_passes(monkeypatch):
    """A rank with zero rollouts (an allocator gave its prompts none) still prefills and steps on a dummy row while
    the other rank is active, and returns empty tensors."""
    calls = []

    def fake_all_reduce(flag, op=None, group=None):
        calls.append(float(flag))
        if len(calls) <= 3:
            flag.fill_(1.0)

    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    batch = _prompts(2)
    policy = CountingPolicy({})
    tokens, mask, group = sample_completions(policy, batch["prompt_tokens"], batch["prompt_mask"], torch.tensor([0, 0]),
                                             8, 1.0, TOKENIZER, synced=True)
    assert tokens.shape == (0, 0) and mask.shape == (0, 0) and group.numel() == 0
    assert policy.calls == 1 + 3 and calls[0] == 0.0


def test_synced_generation_stops_at_max_new_tokens_without_an_extra_all_reduce(monkeypatch):
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda flag, op=None, group=None: flag.fill_(1.0))
    batch = _prompts(1)
    policy = CountingPolicy({})
    tokens, _, _ = sample_completions(policy, batch["prompt_tokens"], batch["prompt_mask"], torch.tensor([2]), 4, 0.0,
                                      TOKENIZER, synced=True)
    assert tokens.shape == (2, 4) and policy.calls == 4  # prefill + 3 steps, the 4th token needs no forward


def test_keyed_sampling_does_not_depend_on_the_batch_split():
    """Rollouts keyed by (seed, prompt id, rollout index) are the same whether prompts are sampled together or
    apart (what makes a data-parallel run sample what one process samples), and differ between keys."""
    torch.manual_seed(0)
    from lightning_modules.shared.tiny_gpt import TinyGPT

    policy = TinyGPT(vocab_size=TOKENIZER.vocab_size, n_layer=1, d_model=16, n_head=2, context_length=24).eval()
    batch = _prompts(4)
    counts = torch.tensor([3, 2, 1, 2])
    together = sample_completions(policy, batch["prompt_tokens"], batch["prompt_mask"], counts, 6, 1.0, TOKENIZER,
                                  row_seeds=rollout_keys(7, batch["prompt_ids"], counts))
    halves = []
    for rows in (slice(0, 2), slice(2, 4)):
        part = {k: v[rows] for k, v in batch.items() if torch.is_tensor(v)}
        halves.append(sample_completions(policy, part["prompt_tokens"], part["prompt_mask"], counts[rows], 6, 1.0,
                                         TOKENIZER, row_seeds=rollout_keys(7, part["prompt_ids"], counts[rows]))[0])
    width = together[0].shape[1]
    joined = torch.cat([torch.nn.functional.pad(h, (0, width - h.shape[1]), value=TOKENIZER.pad_id) for h in halves])
    assert torch.equal(joined, together[0])
    keys = rollout_keys(7, batch["prompt_ids"], counts)
    assert keys.unique().numel() == keys.numel()
    assert not torch.equal(rollout_keys(8, batch["prompt_ids"], counts), keys)
    # the uniforms are uniform enough: mean and spread of 20k draws
    u = rollouts.keyed_uniforms(torch.arange(20_000), 3)
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - 12 ** -0.5) < 0.01


# --------------------------------------------------------------------------------------------- slow: 2 processes
class LengthReward:
    """Completion length / 8 (a graded reward: every group of rollouts has variance, so the update is not zero)."""

    def evaluate(self, completions, answers):
        rewards = torch.tensor([len(c) / 8 for c in completions])
        return rewards, rewards > 0.5, {}


# two global batches (one per epoch) of 4 prompts: rank r gets rows [2r, 2r + 2)
GRPO_PROMPTS = [[11, 12, 13, 14], [15, 16, 17, 18]]
SFT_ROWS = [[("12+34=", "64"), ("55+11=", "66"), ("99+99=", "891"), ("10+20=", "03")],
            [("1+1=", "2"), ("7+8=", "51"), ("123+456=", "975"), ("5+50=", "55")]]


def _dpo_examples():
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        out.append({"waveform": torch.randn(4000, generator=g) * 0.1, "prompt": torch.randint(4, 30, (5,), generator=g),
                    "options": torch.tensor([30 + i % 3, 40 + i % 5]), "label": i % 2, "adv_label": -1, "task": 0,
                    "attributes": torch.full((4,), -1), "content": -1})
    return [out[:4], out[4:]]


class FixedBatches(LightningDataModule):
    """Global batch ``current_epoch`` of ``kind``: all of it (``rank`` None, one process) or the rank's half."""

    def __init__(self, kind: str, rank: int | None) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank

    def train_dataloader(self):
        from datamodules.paralinguistic_speech import collate_spoken_questions

        epoch = self.trainer.current_epoch if self.kind not in ("dpo", "alm") else 0
        rows = slice(None) if self.rank is None else slice(2 * self.rank, 2 * self.rank + 2)
        if self.kind == "grpo":
            batches = [collate_prompts([{"prompt_id": p, "prompt": f"{p}+{p}=", "answers": ["0"]}
                                        for p in GRPO_PROMPTS[epoch][rows]], TOKENIZER)]
        elif self.kind == "sft":
            batches = [collate_sft([{"prompt": p, "target": t} for p, t in SFT_ROWS[epoch][rows]], TOKENIZER)]
        else:
            batches = [collate_spoken_questions(b[rows]) for b in _dpo_examples()]
        return DataLoader(batches, batch_size=None, collate_fn=lambda b: b)


def build(kind: str):
    torch.manual_seed(0)
    if kind == "grpo":
        from lightning_modules.rlvr.grpo import GRPO
        from lightning_modules.rlvr.rollout_allocation import DARSAllocator
        from lightning_modules.shared.tiny_gpt import HFCausalLM

        model = GRPO(HFCausalLM(config=HF_CONFIG), reward=LengthReward(),
                     rollout_allocator=DARSAllocator("hardness_weighted", max_rollouts=6), rollouts_per_prompt=3,
                     max_new_tokens=6, scale_by_group_std=False, kl_coef=0.05, ppo_epochs=2, micro_batch_size=2,
                     max_grad_norm=1.0, rollout_seed=0, rollout_seeding="example",
                     optimizer=functools.partial(torch.optim.Adam, lr=0.01))
        model.set_tokenizer(TOKENIZER)
    elif kind == "sft":
        from lightning_modules.rlvr.sft import SupervisedWarmup
        from lightning_modules.shared.tiny_gpt import TinyGPT

        model = SupervisedWarmup(TinyGPT(vocab_size=TOKENIZER.vocab_size, n_layer=2, d_model=32, n_head=2,
                                         context_length=24), optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    elif kind == "alm":  # PCLM stage 2: projectors, mixer and language model train, encoder frozen
        from lightning_modules.pclm.audio_language_model import AudioLanguageModel, SpeechEncoder, TinyAudioLM

        model = AudioLanguageModel(SpeechEncoder(num_layers=2, width=32, num_heads=2, n_mels=40, hop_length=320),
                                   TinyAudioLM(vocab_size=64, num_layers=2, width=32, num_heads=2, context_length=64),
                                   pclm=True, pclm_layers=[1, 2], projector_hidden=32, mixer_hidden=16,
                                   train_parts=["projector", "mixer", "language_model"],
                                   optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    else:
        from lightning_modules.pclm.audio_dpo import AudioDPO
        from lightning_modules.pclm.audio_language_model import SpeechEncoder, TinyAudioLM

        model = AudioDPO(SpeechEncoder(num_layers=2, width=32, num_heads=2, n_mels=40, hop_length=320),
                         TinyAudioLM(vocab_size=64, num_layers=2, width=32, num_heads=2, context_length=64),
                         pclm=True, pclm_layers=[1, 2], projector_hidden=32, mixer_hidden=16,
                         train_parts=["projector", "language_model"], beta=0.5,
                         optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    return model


class LossRecorder(Callback):
    """train/loss after every training batch, one value per rank (all-gathered when distributed)."""

    def __init__(self) -> None:
        self.losses: list[list[float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        value = trainer.callback_metrics["train/loss"].detach().reshape(1).float()
        if trainer.world_size > 1:
            gathered = [torch.zeros_like(value) for _ in range(trainer.world_size)]
            torch.distributed.all_gather(gathered, value)
            value = torch.cat(gathered)
        self.losses.append(value.tolist())


def fit(kind: str, rank: int | None, epochs: int, ckpt_path=None, save_to=None):
    from lightning.pytorch.strategies import ModelParallelStrategy

    model, recorder = build(kind), LossRecorder()
    sharded = rank is not None
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo",
                                     timeout=timedelta(seconds=90)) if sharded else "auto"
    trainer = Trainer(accelerator="cpu", devices=2 if sharded else 1, strategy=strategy, max_epochs=epochs,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                      use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1, callbacks=[recorder])
    trainer.fit(model, datamodule=FixedBatches(kind, rank), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    weights = {}
    for name, value in model.state_dict().items():
        weights[name] = (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
    from torch.distributed.fsdp import FSDPModule

    return {"losses": recorder.losses, "weights": weights, "steps": trainer.global_step,
            "fsdp_units": sum(isinstance(m, FSDPModule) for m in model.modules())}


EPOCHS = {"grpo": 2, "sft": 2, "dpo": 2, "alm": 2}


def worker(out: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    results = {kind: fit(kind, rank, epochs) for kind, epochs in EPOCHS.items()}
    folder = Path(out) / "grpo_epoch1.ckpt"
    fit("grpo", rank, 1, save_to=folder)
    results["grpo_resumed"] = fit("grpo", rank, 2, ckpt_path=folder)
    results["checkpoint_is_folder"] = folder.is_dir()
    torch.save(results, Path(out) / f"rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_process_fully_sharded_training_equals_one_process_and_resumes(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "NODE_RANK": "0", "OMP_NUM_THREADS": "1",
           # the test's own checkpoint holds the Python objects passed to the modules (reward, allocator, optimizer
           # factory) in its hyper-parameters, which weights-only loading refuses: trusted here
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    ranks = [subprocess.Popen([sys.executable, __file__, "worker", str(tmp_path)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for process in ranks:
            process.kill()
        pytest.fail(f"2-process sharded training did not finish within {TIMEOUT_S} s: the ranks are out of step")
    assert all(p.returncode == 0 for p in ranks), "a rank failed:\n" + "\n".join(o[-4000:] for o in outputs)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert got[0]["checkpoint_is_folder"], "ModelParallelStrategy should save a distributed checkpoint folder"

    for kind, epochs in EPOCHS.items():
        reference = fit(kind, None, epochs)
        initial = build(kind).state_dict()
        moved = [k for k, v in reference["weights"].items() if v.is_floating_point() and not torch.equal(v, initial[k])]
        assert moved, f"{kind}: one process did not change any weight (the comparison would be empty)"
        for rank in range(2):
            sharded = got[rank][kind]
            assert sharded["fsdp_units"] >= 3 and reference["fsdp_units"] == 0, (kind, sharded["fsdp_units"])
            assert sharded["steps"] == reference["steps"], (kind, sharded["steps"], reference["steps"])
            different = [k for k, v in reference["weights"].items() if not _close(sharded["weights"][k], v)]
            assert not different, f"{kind}, rank {rank}: weights differ from one process: {different[:4]}"
        # GRPO logs each rank's share of the loss (sum over ranks); SFT the global loss; DPO and PCLM each half's mean
        mean = lambda v: sum(v) / len(v)  # noqa: E731
        combine = {"grpo": sum, "sft": lambda v: v[0], "dpo": mean, "alm": mean}[kind]
        sharded_losses = torch.tensor([combine(step) for step in got[0][kind]["losses"]])
        one_losses = torch.tensor([step[0] for step in reference["losses"]])
        assert len(one_losses) == epochs * (2 if kind in ("dpo", "alm") else 1)
        assert bool((one_losses != 0).all()) and _close(sharded_losses, one_losses), (kind, sharded_losses, one_losses)
        assert kind != "sft" or got[0][kind]["losses"] == got[1][kind]["losses"]
    for rank in range(2):  # resuming from the sharded checkpoint continues the run exactly
        straight, resumed = got[rank]["grpo"], got[rank]["grpo_resumed"]
        assert resumed["steps"] == straight["steps"] and resumed["losses"] == straight["losses"][1:]
        assert all(torch.allclose(resumed["weights"][k], v, rtol=1e-5, atol=1e-6)
                   for k, v in straight["weights"].items())


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2])
