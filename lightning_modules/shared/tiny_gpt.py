"""Policies for the RLVR modules: a small GPT for CPU work and a wrapper around any local transformers causal LM.

Both follow one calling convention, so rollouts, GRPO and SFT never look at which one they hold::

    logits, cache = policy(input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False)

* ``input_ids`` [B, L] (prompts LEFT-padded), ``attention_mask`` [B, L_past + L] (True = real token; covers the
  cached tokens too, as in transformers), ``position_ids`` [B, L] (default: ``cumsum(mask) - 1`` of the full
  mask, so left padding does not shift positions), ``past_key_values`` the cache returned by the previous call.
* ``logits`` [B, L, V]; ``cache`` is None unless ``use_cache``.
* ``policy.select_cache(cache, index)`` gathers cache rows (index may repeat rows): the sampler prefills each
  prompt once and then expands the cache to the prompt's rollouts.

`TinyGPT` is a pre-LayerNorm decoder (learned positions, GELU MLP, no biases in attention) with a KV cache that
grows by concatenation. Its defaults are this collection's CPU size for the reversed-addition task
(n_layer 3, d_model 96, 4 heads, context 24: about 0.35M parameters).

`HFCausalLM` loads ``AutoModelForCausalLM`` from a local folder only (``local_files_only=True``: nothing is ever
downloaded); the tokenizer is read from the same folder by the datamodule (``tokenizer_path``). With ``config``
instead of ``path`` it builds a randomly initialised model of a transformers architecture (training from scratch;
no file is read; configs/grpo/hf_quick.yaml). Dropout is disabled by default (TRL's ``disable_dropout``): with
dropout active the PPO ratio of an on-policy update is not 1.

Sharded training (`sharding_mesh`, `fully_shard_model`): under Lightning's ``ModelParallelStrategy``
(configs/trainer/fsdp.yaml, fsdp_cpu.yaml) the modules apply FSDP2 (``torch.distributed.fsdp.fully_shard``) in
``configure_model``: every transformer block is its own unit (this file's `Block`, ``nn.TransformerEncoderLayer``
and the classes a transformers model lists in ``_no_split_modules``), then the model itself (for `HFCausalLM` the
wrapped transformers model, so that its own ``generate`` also goes through the root unit). Frozen copies
(reference policies) are sharded the same way. Every sharded forward all-gathers parameters over the ranks, so
all ranks must run the same number of forward passes (see `lightning_modules.rlvr.rollouts` for generation).
"""
from __future__ import annotations

import inspect
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.shared.errors import UserInputError, check_range


def default_position_ids(attention_mask: torch.Tensor, new_length: int) -> torch.Tensor:
    """Positions of the last `new_length` tokens: (number of real tokens before each one), pads at 0."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)[:, -new_length:]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None],
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width)), (k, v)


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x, allowed, past):
        attended, present = self.attn(self.ln1(x), allowed, past)
        x = x + attended
        return x + self.mlp(self.ln2(x)), present


class TinyGPT(nn.Module):
    """A small decoder-only transformer with a KV cache (see the module docstring for the calling convention).

    Args:
        vocab_size: number of token ids (must cover the datamodule's tokenizer; checked by GRPO/SFT).
        n_layer, d_model, n_head: depth, width and heads (d_model divisible by n_head).
        context_length: learned positions; prompt + completion must fit.
        dropout: attention/MLP dropout (0 for RL: the on-policy ratio must be exactly 1).
    """

    def __init__(self, vocab_size: int = 15, n_layer: int = 3, d_model: int = 96, n_head: int = 4,
                 context_length: int = 24, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("n_layer", n_layer), ("d_model", d_model),
                            ("n_head", n_head), ("context_length", context_length)):
            check_range(f"TinyGPT.{name}", value, low=1)
        check_range("TinyGPT.dropout", dropout, 0.0, 1.0, high_inclusive=False)
        if d_model % n_head:
            raise UserInputError(f"TinyGPT: d_model={d_model} must be divisible by n_head={n_head}.")
        self.vocab_size, self.context_length = vocab_size, context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: list | None = None,
                use_cache: bool = False):
        batch, length = input_ids.shape
        past_length = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if attention_mask is None:
            attention_mask = torch.ones(batch, past_length + length, dtype=torch.bool, device=input_ids.device)
        attention_mask = attention_mask.bool()
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, length)
        if int(position_ids.max()) >= self.context_length:
            raise UserInputError(f"TinyGPT: a sequence reaches position {int(position_ids.max())} but "
                                 f"context_length={self.context_length}. Raise context_length or shorten "
                                 "prompts / max_new_tokens.")
        total = past_length + length
        query_at = torch.arange(past_length, total, device=input_ids.device)
        key_at = torch.arange(total, device=input_ids.device)
        causal = key_at[None, :] <= query_at[:, None]  # [L, total]
        # A query may always see itself: fully padded (left-pad) rows then stay finite instead of NaN.
        allowed = (causal[None] & attention_mask[:, None, :]) | (key_at[None, None, :] == query_at[None, :, None])
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids)
        presents = []
        for i, block in enumerate(self.blocks):
            x, present = block(x, allowed, None if past_key_values is None else past_key_values[i])
            presents.append(present)
        logits = self.head(self.ln_f(x))
        return logits, (presents if use_cache else None)

    @staticmethod
    def select_cache(cache: list, index: torch.Tensor) -> list:
        """Rows `index` of every layer's (k, v) (repeats allowed): one prefill per prompt, many rollouts."""
        return [(k.index_select(0, index), v.index_select(0, index)) for k, v in cache]


def check_policy_vocabulary(policy: nn.Module, tokenizer_vocab_size: int) -> None:
    """Refuse a policy whose output vocabulary does not fit the data's tokenizer, before anything is sampled.

    Every policy must cover the tokenizer's ids. A `TinyGPT` is trained from scratch on this tokenizer, so it must
    match it exactly: a larger head samples ids the tokenizer cannot decode (the run would crash later while
    decoding validation samples). Pretrained transformers models often pad their embedding table beyond the
    tokenizer's size, so larger is allowed for them.
    """
    vocab = getattr(policy, "vocab_size", None)
    if vocab is None:
        return
    if tokenizer_vocab_size > vocab:
        raise UserInputError(f"the tokenizer has {tokenizer_vocab_size} ids but the policy's vocab_size is {vocab}; "
                             f"set --model.init_args.policy.init_args.vocab_size={tokenizer_vocab_size}.")
    if isinstance(policy, TinyGPT) and vocab != tokenizer_vocab_size:
        raise UserInputError(f"the policy's vocab_size is {vocab} but the data's tokenizer has only "
                             f"{tokenizer_vocab_size} ids, so the policy would sample ids the tokenizer cannot decode; "
                             f"set --model.init_args.policy.init_args.vocab_size={tokenizer_vocab_size}.")


class HFCausalLM(nn.Module):
    """Any transformers causal LM from a local folder (weights and config; the tokenizer sits in the same folder).

    Args:
        path: local folder written by ``save_pretrained`` (nothing is downloaded).
        config: instead of ``path``, a transformers config as a mapping with ``model_type`` (e.g. ``{model_type:
            gpt2, vocab_size: 15, n_embd: 32, n_layer: 2, n_head: 2, n_positions: 32}``): a randomly initialised
            model of that architecture (seeded by the global RNG). Exactly one of ``path`` and ``config``.
        dtype: ``float32`` (default), ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's dtype; with
            ``config``, the config's own ``dtype`` or float32).
        disable_dropout: set every dropout probability to 0 (on-policy PPO ratio exactly 1).
        gradient_checkpointing: trade compute for memory at scale.
        attn_implementation: e.g. ``sdpa`` or ``flash_attention_2`` (None: transformers' default).
        trust_remote_code: only for folders you trust.
    """

    def __init__(self, path: str | None = None, dtype: str = "float32", disable_dropout: bool = True,
                 gradient_checkpointing: bool = False, attn_implementation: str | None = None,
                 trust_remote_code: bool = False, config: dict | None = None) -> None:
        super().__init__()
        if (path is None) == (config is None):
            raise UserInputError("HFCausalLM needs exactly one of `path` (a local save_pretrained folder) and "
                                 f"`config` (a transformers config with model_type); got path={path!r}, "
                                 f"config={config!r}.")
        if config is not None:
            if "model_type" not in config:
                raise UserInputError(f"HFCausalLM config={dict(config)!r} lacks `model_type` (e.g. gpt2, llama).")
        elif not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
            raise UserInputError(f"HFCausalLM: '{path}' is not a local model folder with a config.json. Save a "
                                 "model there with model.save_pretrained(path) (nothing is downloaded).")
        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
        if dtype not in dtypes:
            raise UserInputError(f"HFCausalLM: dtype={dtype!r}; choose one of {sorted(dtypes)}.")
        from transformers import AutoConfig, AutoModelForCausalLM

        kwargs = {"dtype": dtypes[dtype], "trust_remote_code": trust_remote_code}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        if config is not None:
            settings = dict(config)
            if dtype == "auto":
                kwargs.pop("dtype")
            try:
                architecture = AutoConfig.for_model(settings.pop("model_type"), **settings)
                self.model = AutoModelForCausalLM.from_config(architecture, **kwargs)
            except (TypeError, ValueError) as err:
                raise UserInputError(f"HFCausalLM: could not build a causal LM from config={dict(config)!r}: "
                                     f"{err}") from None
        else:
            try:
                self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
            except (OSError, ValueError) as err:
                raise UserInputError(f"HFCausalLM: could not load a causal LM from '{path}': {err}") from None
        if disable_dropout:
            for module in self.model.modules():
                if isinstance(module, nn.Dropout):
                    module.p = 0.0
            for key in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
                if hasattr(self.model.config, key):
                    setattr(self.model.config, key, 0.0)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # transformers >= 5.2x renamed the forward argument `past_key_values` to `cache`
        self._cache_argument = "cache" if "cache" in inspect.signature(self.model.forward).parameters \
            else "past_key_values"
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.context_length = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", None)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        if attention_mask is not None and position_ids is None:
            position_ids = default_position_ids(attention_mask, input_ids.shape[1])
        cache = {self._cache_argument: past_key_values} if past_key_values is not None else {}
        out = self.model(input_ids=input_ids, attention_mask=None if attention_mask is None else attention_mask.long(),
                         position_ids=position_ids, use_cache=use_cache, **cache)
        if not use_cache:
            return out.logits, None
        return out.logits, getattr(out, "cache", None) or getattr(out, "past_key_values", None)

    @staticmethod
    def select_cache(cache, index: torch.Tensor):
        """Rows `index` of a transformers cache (``reorder_cache`` gathers along the batch, repeats allowed)."""
        cache.reorder_cache(index)
        return cache


# --------------------------------------------------------------------------------------------- sharding (FSDP2)
SHARDED_STRATEGY_HINT = ("shard with ModelParallelStrategy and FSDP2 instead: --trainer configs/trainer/fsdp.yaml "
                         "(GPUs) or configs/trainer/fsdp_cpu.yaml (2 CPU processes)")


def sharding_mesh(trainer, owner: str, generates: bool = True):
    """The data-parallel device mesh to shard over when ``trainer`` runs Lightning's ``ModelParallelStrategy``, else
    None (no trainer, one process, DDP). Refuses, with one line naming the fix, what these modules do not support:
    tensor parallelism (``tensor_parallel_size`` > 1: only FSDP2 is applied) and, for modules that generate, FSDP1
    (``FSDPStrategy``) and DeepSpeed.
    """
    if trainer is None:
        return None
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = trainer.strategy
    name = type(strategy).__name__
    if not isinstance(strategy, ModelParallelStrategy):
        if generates and ("FSDP" in name or "DeepSpeed" in name):
            raise UserInputError(f"{owner} does not support the strategy {name} (its generation would run a different "
                                 f"number of sharded forward passes on each rank); {SHARDED_STRATEGY_HINT}.")
        return None
    mesh = strategy.device_mesh
    if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
        raise UserInputError(f"{owner} applies FSDP2 only (no tensor-parallel plan): set ModelParallelStrategy's "
                             f"tensor_parallel_size=1 and data_parallel_size to the number of devices (got "
                             f"tensor_parallel_size={mesh['tensor_parallel'].size()}).")
    return mesh["data_parallel"]


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) manages ``module`` or one of its submodules."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def fully_shard_model(model: nn.Module, mesh, forward_methods: tuple[str, ...] = ()) -> nn.Module:
    """FSDP2 over ``mesh``: every transformer block of ``model`` becomes its own unit (bottom-up), then the root.

    Blocks are this file's `Block` (TinyGPT, TinyAudioLM), ``nn.TransformerEncoderLayer`` and every class a
    transformers model names in ``_no_split_modules`` (GPT2Block, LlamaDecoderLayer, WhisperEncoderLayer, ...). The
    root is ``model`` itself, or for `HFCausalLM` the wrapped transformers model (its ``generate`` calls that model,
    not the wrapper). ``forward_methods`` names root methods other than ``forward`` that use the root's parameters
    (e.g. ``embed`` and ``logits`` of the audio language models), registered with ``register_fsdp_forward_method``.
    Idempotent: an already sharded model is returned unchanged (``configure_model`` runs once per Trainer call).
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    if is_sharded(model):
        return model
    root = model.model if isinstance(model, HFCausalLM) else model
    block_names = set()
    for module in root.modules():
        block_names.update(getattr(module, "_no_split_modules", None) or ())
    for module in reversed(list(root.modules())):  # children before their parents
        if module is not root and (isinstance(module, (Block, nn.TransformerEncoderLayer))
                                   or type(module).__name__ in block_names):
            fully_shard(module, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for name in forward_methods:
        register_fsdp_forward_method(root, name)
    return model


def picklable_hyperparameters(checkpoint: dict) -> None:
    """Replace, in ``checkpoint["hyper_parameters"]``, every injected module that FSDP2 has sharded (its classes are
    created at run time and cannot be pickled into the checkpoint's metadata) by a line naming its class. Runs
    started from the command line store the modules' class_path/init_args there instead and are unaffected."""
    hyper = checkpoint.get("hyper_parameters")
    if not isinstance(hyper, dict):
        return
    for key, value in list(hyper.items()):
        if isinstance(value, nn.Module) and is_sharded(value):
            name = type(value).__name__.removeprefix("FSDP")
            hyper[key] = (f"{name} (sharded with FSDP2 when saved and not stored: pass the same module again to "
                          "rebuild this model)")
