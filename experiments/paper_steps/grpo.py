"""GRPO's paper config (Qwen2.5-Math-1.5B on DAPO-Math-17K in verl parquet, validation on AIME 2024), plus the
Qwen model folder and verl-parquet writers that the DARS, Knapsack-RL and Multi-RLCR cases share.

No Qwen weights or tokenizer files are on this machine and nothing is downloaded, so each case writes a model
folder the way ``save_pretrained`` lays it out (``config.json`` = the published architecture of
``experiments/architectures/<name>`` at the case's number of layers, random bfloat16 ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``) and points the config's model path at it. The tokenizer is a stand-in:
a byte-level BPE with Qwen2's pre-tokenizer regex and NFC normaliser, merges trained on Python's bundled
documentation, padded with never-produced filler tokens so that the released special tokens keep their released
ids (``<|endoftext|>`` = 151643, ``<|im_start|>`` = 151644, ``<|im_end|>`` = 151645, ...), the released
``len(tokenizer)`` (151665 for Qwen2.5, 151669 for Qwen3), eos/pad tokens and chat template (Qwen2.5-Math's
default system prompt "Please reason step by step, and put your final answer within \\boxed{}."). Prompt token
counts therefore differ from the released tokenizer's (its 151k merges are not here).
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from experiments.paper_steps import ROOT, Case

QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                 "<|file_sep|>"]
QWEN3_SPECIAL = QWEN2_SPECIAL + ["<tool_response>", "</tool_response>", "<think>", "</think>"]
FIRST_SPECIAL = 151643  # id of <|endoftext|> in every Qwen2/2.5/3 tokenizer
# Qwen2's pre-tokenizer split (tokenizer.json of the Qwen2/2.5/3 releases)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")
# chat templates of the releases, reduced to what these prompts use (no tool calls)
QWEN25_MATH_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nPlease reason step by step, and put your final answer "
    "within \\\\boxed{}.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == "
    "'system' and loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined "
    "and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
MERGES_VOCAB = 16384  # byte-level tokens + trained merges of the stand-in (the rest are fillers)


def architecture(name: str, layers: int | None = None) -> dict:
    """The published config.json of ``experiments/architectures/<name>`` (notes dropped), optionally with fewer
    layers (every width, head count and the vocabulary unchanged)."""
    config = {k: v for k, v in json.loads((ROOT / "experiments" / "architectures" / name / "config.json")
                                          .read_text(encoding="utf-8")).items() if not k.startswith("_")}
    if layers is not None:
        config["num_hidden_layers"] = layers
    return config


def _corpus():
    import pydoc_data.topics

    yield from pydoc_data.topics.topics.values()


def qwen_model_folder(folder: Path, name: str, layers: int) -> Path:
    """``folder/<name>`` as ``save_pretrained`` writes it: random bfloat16 weights of the published architecture at
    ``layers`` layers (``config.json``, ``model.safetensors``) and the stand-in tokenizer (module docstring)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    target = Path(folder) / name
    if (target / "tokenizer.json").is_file() and (target / "config.json").is_file():
        return target
    qwen3 = name.startswith("Qwen3")
    special = QWEN3_SPECIAL if qwen3 else QWEN2_SPECIAL
    split = pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    core.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    core.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=MERGES_VOCAB, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    state = json.loads(core.to_str())
    vocab = state["model"]["vocab"]
    for i in range(len(vocab), FIRST_SPECIAL):  # fillers: never produced by a merge, keep the released ids
        vocab[f"<|filler_{i}|>"] = i
    state["model"]["vocab"] = vocab
    # as in the releases' tokenizer_config.json, <tool_call> and every later added token (<|fim_*|>, <think>, ...)
    # is not "special": decoding with skip_special_tokens keeps it (Multi-RLCR's format reward reads <think>)
    state["added_tokens"] = [{"id": FIRST_SPECIAL + i, "content": token, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": i < special.index("<tool_call>")}
                             for i, token in enumerate(special)]
    full = Tokenizer.from_str(json.dumps(state))
    eos = "<|im_end|>" if qwen3 else "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=full, eos_token=eos, pad_token="<|endoftext|>",
                                        bos_token=None, unk_token=None, model_max_length=131072)
    tokenizer.chat_template = QWEN3_TEMPLATE if qwen3 else QWEN25_MATH_TEMPLATE
    if len(tokenizer) != FIRST_SPECIAL + len(special):
        raise RuntimeError(f"stand-in tokenizer has {len(tokenizer)} ids, not {FIRST_SPECIAL + len(special)}")
    tokenizer.save_pretrained(target)
    config = architecture(name, layers)
    config.pop("architectures", None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config),
                                                 dtype=torch.bfloat16)
    model.save_pretrained(target)
    return target


# ------------------------------------------------------------------------------------------- verl parquet
DAPO_INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be of the "
                    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}"
                    "\n\nRemember to put your answer on its own line after \"Answer:\".")
PROBLEMS = [  # (problem, integer answer): competition-style problems in the releases' style
    ("Find the number of positive integers $n \\le 1000$ such that $15n$ is a perfect square.", "8"),
    ("Let $x$ and $y$ be real numbers with $x + y = 10$ and $xy = 21$. Find $x^3 + y^3$.", "370"),
    ("How many ordered pairs $(a, b)$ of positive integers satisfy $a + b = 30$ and $\\gcd(a, b) = 3$?", "4"),
    ("Find the remainder when $2^{100}$ is divided by $7$.", "2"),
    ("A triangle has side lengths $13$, $14$ and $15$. Find its area.", "84"),
    ("Find the sum of all positive divisors of $360$.", "1170"),
    ("In how many ways can $5$ distinct books be arranged on a shelf if two particular books must be adjacent?",
     "48"),
    ("Find the smallest positive integer $n$ such that $n!$ ends in exactly $6$ zeros.", "25"),
]


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def dapo_rows(count: int, seed: int = 0) -> list[dict]:
    """DAPO-Math-17k rows (BytedTsinghua-SIA/DAPO-Math-17k ``data/dapo-math-17k.parquet``): ``data_source``
    "math_dapo", ``prompt`` one user message with the "Answer:" instruction, ``ability`` "MATH", ``reward_model``
    ``{ground_truth, style: rule-lighteval/MATH_v2}``, ``extra_info`` ``{index: a UUID string}``."""
    return [{"data_source": "math_dapo",
             "prompt": [{"content": DAPO_INSTRUCTION.format(problem=PROBLEMS[i % len(PROBLEMS)][0]), "role": "user"}],
             "ability": "MATH",
             "reward_model": {"ground_truth": PROBLEMS[i % len(PROBLEMS)][1], "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": str(uuid.uuid5(uuid.NAMESPACE_URL, f"dapo-math/{seed}/{i}"))}}
            for i in range(count)]


def dapo_parquets(folder: Path, train: int = 8, val: int = 8) -> Path:
    """``dapo-math-17k.parquet`` (train) and ``aime-2024.parquet`` (BytedTsinghua-SIA/AIME-2024, the same verl
    columns and "Answer:" prompt, data_source "math_dapo") under ``folder``."""
    write_parquet(dapo_rows(train, seed=0), folder / "dapo-math-17k.parquet")
    write_parquet(dapo_rows(val, seed=1), folder / "aime-2024.parquet")
    return folder


DAPO_FORMAT = ("verl parquet as BytedTsinghua-SIA/DAPO-Math-17k ships it (dapo-math-17k.parquet: data_source, prompt "
               "[user message with the 'Answer:' instruction], ability, reward_model {ground_truth, style}, "
               "extra_info {index: UUID string}) and aime-2024.parquet in the same columns; model folder "
               "(save_pretrained: config.json, model.safetensors, tokenizer.json, tokenizer_config.json)")


GRPO_LAYERS = 2


def grpo_files(folder: Path) -> list[str]:
    model = qwen_model_folder(folder / "models", "Qwen2.5-Math-1.5B", GRPO_LAYERS)
    data = dapo_parquets(folder / "data" / "dapo_math")
    return [f"--data.init_args.data_dir={data}", f"--data.init_args.tokenizer_path={model}",
            f"--model.init_args.policy.init_args.path={model}", "--data.init_args.num_workers=0"]


CASES = {
    "configs/grpo/paper.yaml": Case(
        grpo_files, release_format=DAPO_FORMAT,
        args=("--trainer.val_check_interval=2",
              "--data.init_args.batch_size=2",
              "--data.init_args.eval_batch_size=2", "--model.init_args.rollouts_per_prompt=4",
              "--model.init_args.max_new_tokens=16", "--model.init_args.ppo_mini_batches=1",
              "--model.init_args.micro_batch_size=8", "--model.init_args.eval_samples=2",
              "--model.init_args.eval_k=[1,2]"),
        note=(f"Qwen2.5-Math-1.5B architecture with {GRPO_LAYERS} of 28 layers (widths, heads, KV heads, vocabulary "
              "unchanged), random weights, stand-in byte-level BPE tokenizer with the released special-token ids and "
              "chat template; 2 prompts x 4 rollouts of 16 new tokens (published 256 x 8 of up to 4096); one PPO "
              "mini-batch per rollout batch (published 8) so that max_steps counts one optimiser step per batch; "
              "validation 2 samples (published 16) after step 2 (published every 400 rollout batches; the 8-row file "
              "has 4 batches)"),
        test_args=("--data.init_args.batch_size=1", "--data.init_args.eval_batch_size=1",
                   "--model.init_args.rollouts_per_prompt=2", "--model.init_args.max_new_tokens=8",
                   "--model.init_args.eval_samples=1", "--model.init_args.eval_k=[1]")),
}
