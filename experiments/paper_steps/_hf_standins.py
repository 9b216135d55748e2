"""Local stand-ins of released transformers folders for the paper-step cases of PCLM, HiDe, the emotion probe and
CauSciBench: random weights of a published architecture (``experiments/architectures/<name>/config.json``) at
fewer layers, and a tokenizer with the family's vocabulary size and special-token ids.

Nothing is downloaded, so the real tokenizers (Llama-3's tiktoken BPE, Qwen2's BPE) are not here. The stand-in is
a byte-level BPE of the same kind (the family's pre-tokenisation regex, byte-level alphabet) trained on the texts of
the case, padded with never-produced filler entries to the family's number of regular tokens (Llama-3: 128,000;
Qwen2: 151,643), so that every special token sits at its released id (``<|begin_of_text|>`` = 128000,
``<|im_end|>`` = 151645, ``<|image_pad|>`` = 151655, ...) and ``len(tokenizer)`` is the released one. Its merges
are not the released ones, so texts split into other (more) tokens than with the real tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# pre-tokenisation regexes of the released tokenizer.json files
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                   + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])          # ids 128000 .. 128255
QWEN2_AUDIO_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>",
                        "<|audio_eos|>"]                                                   # ids 151643 .. 151648
QWEN25_VL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                      "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                      "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]  # 151643 .. 151656
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['content'] is string %}"
          "{{ message['content'] }}{% else %}{% for part in message['content'] %}"
          "{% if part['type'] == 'image' or 'image' in part %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
          "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
          "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
               "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


def architecture(name: str) -> dict:
    """The published config.json of ``experiments/architectures/<name>`` without the "_" notes."""
    values = json.loads((ROOT / "experiments" / "architectures" / name / "config.json").read_text())
    return {k: v for k, v in values.items() if not k.startswith("_")}


def byte_level_tokenizer(folder: Path, texts: list[str], regular: int, specials: list[str], split: str,
                         bos: str | None, eos: str, pad: str | None, chat_template: str | None,
                         add_bos: bool = False, whole_words: list[str] = (), merges: int = 4000) -> Path:
    """A byte-level BPE trained on ``texts`` (and each of ``whole_words`` with and without a leading space, so that
    they are single tokens), padded to ``regular`` entries, then ``specials`` at ids ``regular, regular + 1, ...``;
    saved with ``save_pretrained`` into ``folder``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    corpus = list(texts) + [f"{w} {w}" for w in whole_words for _ in range(50)]
    trainer = trainers.BpeTrainer(vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(corpus, trainer)
    state = json.loads(core.to_str())
    vocab = state["model"]["vocab"]
    for i in range(len(vocab), regular):                  # entries no merge produces: the ids of the real vocabulary
        vocab[f"<|standin_unused_{i}|>"] = i
    core = Tokenizer.from_str(json.dumps(state))
    core.add_special_tokens(specials)
    if add_bos and bos is not None:
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, regular + specials.index(bos))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=eos, pad_token=pad,
                                        additional_special_tokens=[s for s in specials if s not in (bos, eos, pad)])
    if chat_template:
        tokenizer.chat_template = chat_template
    assert tokenizer.convert_tokens_to_ids(specials[0]) == regular, "special ids shifted"
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    return folder


def llama3_tokenizer(folder: Path, texts: list[str], instruct: bool, whole_words: list[str] = ()) -> Path:
    """Llama-3.1's vocabulary size (128,256) and special ids; bos ``<|begin_of_text|>`` prepended as released;
    eos ``<|end_of_text|>`` (base) or ``<|eot_id|>`` (Instruct, with the Llama-3 chat template)."""
    return byte_level_tokenizer(folder, texts, 128000, LLAMA3_SPECIALS, LLAMA3_SPLIT, bos="<|begin_of_text|>",
                                eos="<|eot_id|>" if instruct else "<|end_of_text|>", pad=None,
                                chat_template=LLAMA3_CHAT if instruct else None, add_bos=True,
                                whole_words=whole_words)


def qwen2_tokenizer(folder: Path, texts: list[str], specials: list[str], whole_words: list[str] = ()) -> Path:
    """Qwen2's regular vocabulary (151,643) with the given special tokens from id 151643, ChatML chat template,
    eos ``<|im_end|>`` and pad ``<|endoftext|>`` (the Instruct models' settings)."""
    return byte_level_tokenizer(folder, texts, 151643, specials, QWEN2_SPLIT, bos=None, eos="<|im_end|>",
                                pad="<|endoftext|>", chat_template=CHATML, whole_words=whole_words)


def save_random(model: torch.nn.Module, folder: Path) -> Path:
    """``save_pretrained`` of a randomly initialised model (safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    return folder


def random_causal_lm(folder: Path, name: str, layers: int, dtype: torch.dtype = torch.bfloat16,
                     **overrides) -> Path:
    """A causal LM of the published architecture ``name`` with ``layers`` decoder layers, random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {**architecture(name), "num_hidden_layers": layers, **overrides}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    return save_random(AutoModelForCausalLM.from_config(config, dtype=dtype), folder)


def done(folder: Path) -> bool:
    """Whether a stand-in folder was written completely by an earlier stage (the marker is written last)."""
    return (folder / ".standin_complete").is_file()


def mark_done(folder: Path) -> None:
    (folder / ".standin_complete").write_text("written by experiments/paper_steps\n")

# the shared tail of the notes of the Llama-3.1 cases
LAYERS_NOTE_TAIL = (" (hidden 4096, 32 heads, 8 KV heads, FFN 14336, vocabulary 128,256 unchanged), random bfloat16 "
                    "weights; tokenizer: a byte-level BPE stand-in with Llama-3's vocabulary size and special-token "
                    "ids (the released merges are not here, so texts split into more tokens)")
