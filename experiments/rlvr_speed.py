"""Throughput of the RLVR core: KV-cache sampler vs transformers' ``generate``, and GRPO steps/s.

    python -m experiments.rlvr_speed            # ~2-4 min on 2 cores, one thread
    python -m experiments.rlvr_speed --device cuda --batch 1024 --new-tokens 256   # on a GPU

Generation: a randomly initialised transformers GPT-2 built in code (d 256, 4 layers, 4 heads, vocab 512: ~3.5M
parameters, nothing downloaded), the same batch of prompts (``--prompts`` x ``--samples`` rollouts, prompt length
16, left-padded), the same number of new tokens (EOS disabled, so every row generates all of them), temperature 1.0
sampling. Arms: our sampler (`lightning_modules.rlvr.rollouts.sample_completions`, one prefill per prompt + KV cache)
on that GPT-2 through `HFCausalLM`; transformers ``generate(do_sample=True)`` on the same model (rollouts expanded
before the call, as TRL does); our sampler on a `TinyGPT` of the same width/depth; and our sampler without the
cache (recomputing the sequence each step). Timings are the minimum over ``--repeats`` runs after one warm-up.

GRPO: optimiser steps/s of ``configs/grpo/quick.yaml`` (8 prompts x 4 rollouts, TinyGPT 0.35M) and of the
step the rollout-allocation experiments use (32 prompts x 8 rollouts, as ``experiments.knapsack_rl``), from a
randomly initialised policy (init_from=null; validation off), built through `experiments.kit.from_config`.

``--seeds`` = independent measurement rounds (each the minimum over ``--repeats``). Writes ``<out>/rlvr_speed.json``
in the kit's schema: arms = what is timed, metrics = throughputs (tokens/s or steps/s) and seconds.

Memory (``--memory``, Linux): peak resident memory of GRPO's log-prob + entropy computation, forward and backward,
for one micro-batch of a large-vocabulary tiny model (TinyGPT, vocabulary ``--vocab`` 151,936 as Qwen2.5, d 64,
1 layer, ``--micro`` 2 rows x ``--tokens`` 512 tokens, temperature 1.0), before (the direct fp32 ``log_softmax``
and ``exp`` over the whole vocabulary, kept here as `full_vocabulary_logprobs`) and after
(`lightning_modules.rlvr.token_logprobs.completion_logprobs`: gather minus logsumexp, entropy in chunks, chunks
recomputed in backward). Each arm runs in a fresh process; the figure is the peak RSS during the step minus the RSS
before it (``ru_maxrss`` vs ``/proc/self/status``), with the entropy bonus off (GRPO's default: entropy without
gradient) and on (DARS' ``entropy_coef``). Writes ``<out>/rlvr_memory.json``.

    python -m experiments.rlvr_speed --memory
"""
from __future__ import annotations

import os
import tempfile
import time

import torch
from lightning.pytorch import Callback

from experiments.kit import experiment_parser, from_config, progress, quiet_trainer, summarise, write_result
from lightning_modules.rlvr.token_logprobs import completion_logprobs
from lightning_modules.rlvr.rollouts import TransformersGenerate, sample_completions
from lightning_modules.shared.tiny_gpt import HFCausalLM, TinyGPT

GRPO_ARMS = {"grpo quick.yaml (8 prompts x 4 rollouts)": [],
             "grpo 32 prompts x 8 rollouts": ["--data.init_args.batch_size=32",
                                              "--model.init_args.rollouts_per_prompt=8"]}


class NoEOS:
    """Special ids for timing: pad 0 and no EOS, so every rollout generates exactly max_new_tokens tokens."""
    pad_id, eos_id, bos_id, vocab_size = 0, None, None, 512


def build_gpt2(folder: str, vocab: int, width: int, layers: int, heads: int, positions: int) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def best_time(fn, repeats: int, device: str) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def generation_speed(args) -> dict:
    device = args.device
    folder = build_gpt2(tempfile.mkdtemp(), 512, args.width, args.layers, args.heads, 16 + args.new_tokens + 8)
    policy = HFCausalLM(folder, attn_implementation="sdpa").to(device).eval()
    torch.manual_seed(0)
    tiny = TinyGPT(vocab_size=512, n_layer=args.layers, d_model=args.width, n_head=args.heads,
                   context_length=16 + args.new_tokens + 8).to(device).eval()
    gen = torch.Generator(device=device)
    prompts = torch.randint(3, 512, (args.prompts, 16), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    lengths = torch.randint(8, 17, (args.prompts,), generator=torch.Generator().manual_seed(1)).to(device)
    mask &= torch.arange(16, device=device)[None, :] >= (16 - lengths)[:, None]  # left padding
    prompts = prompts.masked_fill(~mask, 0)
    counts = torch.full((args.prompts,), args.samples, dtype=torch.long)
    rollouts, tokens = args.prompts * args.samples, args.prompts * args.samples * args.new_tokens

    def ours(model, cache=True):
        def run():
            out = sample_completions(model, prompts, mask, counts, args.new_tokens, 1.0, NoEOS, gen.manual_seed(0),
                                     use_cache=cache)
            assert out[0].shape == (rollouts, args.new_tokens)
        return run

    def transformers_generate():
        engine = TransformersGenerate()
        out = engine.generate(policy, prompts, mask, counts, args.new_tokens, 1.0, NoEOS)
        assert out[0].shape == (rollouts, args.new_tokens), out[0].shape

    params = sum(p.numel() for p in policy.parameters())
    arms = {"ours_kv_cache_gpt2": ours(policy), "transformers_generate_gpt2": transformers_generate,
            "ours_kv_cache_tinygpt": ours(tiny)}
    if not args.skip_no_cache:
        arms["ours_no_cache_gpt2"] = ours(policy, cache=False)
    result = {"model": f"GPT-2 random init, d {args.width}, {args.layers} layers, {args.heads} heads, vocab 512, "
                       f"{params / 1e6:.2f}M params", "device": device, "prompts": args.prompts,
              "samples_per_prompt": args.samples, "rollouts": rollouts, "new_tokens": args.new_tokens,
              "prompt_length": 16, "temperature": 1.0, "repeats": args.repeats, "arms": {}}
    with torch.no_grad():
        for name, fn in arms.items():
            seconds = best_time(fn, args.repeats, device)
            result["arms"][name] = {"seconds": seconds, "tokens_per_s": tokens / seconds}
            print(f"{name:30s} {seconds:8.3f} s  {tokens / seconds:12.0f} tokens/s", flush=True)
    base = result["arms"]["transformers_generate_gpt2"]["tokens_per_s"]
    result["speedup_vs_generate"] = result["arms"]["ours_kv_cache_gpt2"]["tokens_per_s"] / base
    return result


class StepClock(Callback):
    """Wall time from the start of the 3rd training batch (after warm-up) to the end of training."""

    def __init__(self) -> None:
        self.start, self.batches = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches += 1
        if self.batches == 3:
            self.start, self.steps_at_start = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start
        self.steps = trainer.global_step - self.steps_at_start


def grpo_speed(extra: list[str], steps: int, device: str) -> dict:
    model, data = from_config("configs/grpo/quick.yaml", "--model.init_args.init_from=null", *extra)
    clock = StepClock()
    quiet_trainer([clock], max_steps=steps, limit_val_batches=0, deterministic=True, log_every_n_steps=1,
                  accelerator="gpu" if device == "cuda" else "cpu").fit(model, datamodule=data)
    return {"steps": clock.steps, "seconds": clock.seconds, "steps_per_s": clock.steps / clock.seconds,
            "rollouts_per_step": model.hparams.rollouts_per_prompt * data.hparams.batch_size, "args": extra}


# ------------------------------------------------------------------------------------------------ memory
def full_vocabulary_logprobs(policy, sequences, mask, prompt_length, temperature, with_entropy=False,
                             entropy_grad=False):
    """The former `completion_logprobs`: fp32 logits / T, their full log_softmax and exp (the "before" arm)."""
    logits = policy(sequences, attention_mask=mask)[0][:, prompt_length - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, sequences[:, prompt_length:, None]).squeeze(-1)
    if not with_entropy:
        return token_logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def _rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB (Linux)."""
    import resource

    with open("/proc/self/status") as status:
        current = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return current / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_worker(implementation: str, entropy_grad: bool, vocab: int, tokens: int, micro: int, width: int) -> dict:
    """One forward + backward of the log-probs (and entropy) in THIS process; returns the peak RSS increase."""
    import gc

    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = TinyGPT(vocab_size=vocab, n_layer=1, d_model=width, n_head=2, context_length=tokens)
    sequences = torch.randint(3, vocab, (micro, tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(sequences, dtype=torch.bool)
    fn = full_vocabulary_logprobs if implementation == "before" else completion_logprobs

    def step(length):
        logp, entropy = fn(policy, sequences[:, :length], mask[:, :length], 16, 1.0, True, entropy_grad)
        loss = logp.sum() + (0.001 * entropy.sum() if entropy_grad else 0.0)
        loss.backward()
        policy.zero_grad(set_to_none=False)  # gradients stay allocated, as between optimiser steps
        return float(loss)

    step(32)  # warm-up: kernels, allocator, gradient buffers
    gc.collect()
    before, peak_before = _rss_mib()
    step(tokens)
    after, peak = _rss_mib()
    return {"peak_increase_mib": peak - before, "rss_before_mib": before, "peak_before_step_mib": peak_before,
            "peak_mib": peak, "step_raised_the_peak": peak > peak_before}


def memory_benchmark(args) -> dict:
    import json
    import subprocess
    import sys

    rows = {}
    for entropy_grad, setting in ((False, "entropy bonus off"), (True, "entropy bonus on")):
        for implementation in ("before", "after"):
            code = ("import json, sys; from experiments.rlvr_speed import memory_worker; "
                    f"print('RESULT', json.dumps(memory_worker({implementation!r}, {entropy_grad}, {args.vocab}, "
                    f"{args.tokens}, {args.micro}, {args.memory_width})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
            row = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))[7:])
            if not row["step_raised_the_peak"] and not args.smoke:  # smoke sizes are too small to matter
                raise RuntimeError(f"{implementation}, {setting}: the step did not raise the process's peak RSS, so "
                                   "its memory cannot be read from ru_maxrss; raise --tokens or --vocab.")
            rows[f"{implementation}, {setting}"] = row
            print(f"{implementation:6s} {setting:18s} peak +{row['peak_increase_mib']:8.1f} MiB", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--skip-no-cache", action="store_true")
    parser.add_argument("--memory", action="store_true", help="measure the log-prob memory instead (see above)")
    parser.add_argument("--vocab", type=int, default=151_936, help="--memory: vocabulary size")
    parser.add_argument("--tokens", type=int, default=512, help="--memory: sequence length")
    parser.add_argument("--micro", type=int, default=2, help="--memory: rows per micro-batch")
    parser.add_argument("--memory-width", type=int, default=64, help="--memory: model width")
    args = parser.parse_args(argv)
    if args.memory:
        return memory_main(args)
    if args.smoke:
        args.prompts, args.samples, args.new_tokens, args.width, args.layers, args.heads = 2, 2, 4, 32, 1, 2
        args.repeats, args.grpo_steps = 1, 4
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start = time.perf_counter()
    per_seed, details = [], []
    for _ in progress(range(args.seeds), "measurement rounds"):
        generation = generation_speed(args)
        row = {arm: {"tokens_per_s": v["tokens_per_s"], "seconds": v["seconds"]}
               for arm, v in generation["arms"].items()}
        grpo = {}
        for arm, extra in GRPO_ARMS.items():
            grpo[arm] = grpo_speed(extra, args.grpo_steps, args.device)
            row[arm] = {"steps_per_s": grpo[arm]["steps_per_s"], "seconds": grpo[arm]["seconds"]}
            print(f"{arm}: {grpo[arm]['steps_per_s']:.2f} steps/s", flush=True)
        per_seed.append(row)
        details.append({"generation": generation, "grpo": grpo})
    arms = summarise(per_seed)
    speedup = [r["ours_kv_cache_gpt2"]["tokens_per_s"] / r["transformers_generate_gpt2"]["tokens_per_s"]
               for r in per_seed]
    result = write_result("rlvr_speed", seeds=args.seeds, wall_s=time.perf_counter() - start,
                          config={k: v for k, v in vars(args).items() if k != "out"}, arms=arms, per_seed=per_seed,
                          out=args.out, note="measured on a shared machine (other jobs running); minimum over repeats",
                          torch_threads=torch.get_num_threads(), speedup_vs_generate=sum(speedup) / len(speedup),
                          details=details)
    for arm, metrics in arms.items():
        print(f"{arm:45s} " + ", ".join(f"{m} {c['mean']:.3g}" for m, c in metrics.items()))
    return result


def memory_main(args) -> dict:
    if args.smoke:
        args.vocab, args.tokens, args.micro, args.memory_width = 20_000, 128, 2, 16
    for name in ("vocab", "tokens", "micro", "memory_width"):
        if getattr(args, name) < (17 if name == "tokens" else 1):
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} is too small: use a positive value "
                             "(--tokens must exceed the 16 prompt tokens).")
    start = time.perf_counter()
    per_seed = [{arm: {"peak_increase_mib": row["peak_increase_mib"]} for arm, row in memory_benchmark(args).items()}
                for _ in progress(range(args.seeds), "measurement rounds")]
    fp32_tensor_mib = args.micro * (args.tokens - 16) * args.vocab * 4 / 2**20
    result = write_result("rlvr_memory", seeds=args.seeds, wall_s=time.perf_counter() - start,
                          config={k: v for k, v in vars(args).items() if k != "out"}, arms=summarise(per_seed),
                          per_seed=per_seed, out=args.out, one_fp32_completion_logits_mib=fp32_tensor_mib,
                          note="peak RSS increase over one forward+backward of the log-probs and entropy, fresh "
                               "process per arm, CPU, one thread")
    for arm, metrics in result["arms"].items():
        print(f"{arm:30s} peak +{metrics['peak_increase_mib']['mean']:.0f} MiB")
    return result


if __name__ == "__main__":
    main()
