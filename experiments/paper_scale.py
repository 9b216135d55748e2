"""Paper-scale check of every paper config: build each model at its published size and estimate its memory.

    python -m experiments.paper_scale                       # every configs/*/*paper*.yaml
    python -m experiments.paper_scale --config configs/grpo/paper.yaml --out results
    python -m experiments.paper_scale --gpu --steps 5       # also time N synthetic bf16 steps on the GPU

For every paper config the module and the datamodule are built the way the CLI builds them (`train.main` parses
the YAML; `parser.instantiate_classes` builds each part), with one substitution: a weight folder that is not on
this machine (``models/Qwen2.5-Math-7B``) is replaced by the architecture's published config.json shipped in
``experiments/architectures/<name>/`` (random weights, nothing downloaded). Models whose parameters would not fit in
CPU memory are built on the meta device. A datamodule whose data is absent is recorded as not built (its error).
The memory estimate (docs/paper_scale.md) is weights + gradients + optimizer states (+ an EMA copy) + activations
at the config's batch and sequence length; writes ``results/paper_scale.json`` and ``results/paper_scale.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from lightning_modules.shared.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURES = ROOT / "experiments" / "architectures"
GIB = 1024 ** 3
META_THRESHOLD = 2e9  # bytes of weights above which a model is built on the meta device (CPU memory is 24 GiB)
DEFAULT_DEVICE_GIB = 80.0
# Published parameter counts of models that are not in experiments/architectures (paper or official code).
PAPER_PARAMS = {"configs/ldarnet/pretrain_paper.yaml": (110_690_000, "LDARNet-110M: 110.69M (official code)")}
# Data-dependent sizes at the published datasets, for models that read them from the data (absent here).
DATA_SIZES = {
    "configs/rsir/paper.yaml": ({"num_items": 12101}, "Amazon Beauty 5-core: 12,101 items (SASRec paper, Table 2)"),
    "configs/nt_ssm/paper.yaml": ({"num_users": 6039, "num_items": 3583},
                                  "MovieLens-1M as the NT-SSM release splits it: 6,039 users, 3,583 items in training, "
                                  "the shapes of its released embedding tables"),
}
# Checkpoints that share a published architecture (the instruction-tuned model of the same base).
ALIASES = {"Llama-3.1-8B-Instruct": "Llama-3.1-8B"}
WEIGHT_FILE_KEYS = ("backbone_weights", "encoder_weights", "denoiser_path")
INFERENCE_ONLY = {"CausalInferenceAgent", "EmotionProbe", "HiDe"}
LAZY_BACKBONES = {"HiDe": ("backbone", "model_path", "vision_language"),
                  "CausalInferenceAgent": (None, "llm_path", "causal_lm")}


# ============================================================================================ architectures
def architecture(name: str) -> dict:
    """The published config.json of ``experiments/architectures/<name>`` (keys starting with "_" are notes)."""
    path = ARCHITECTURES / ALIASES.get(name, name) / "config.json"
    if not path.is_file():
        raise UserInputError(f"no architecture file {path}: add the model's published config.json there.")
    return json.loads(path.read_text(encoding="utf-8"))


def settings(config: dict) -> dict:
    return {key: value for key, value in config.items() if not key.startswith("_")}


def build_hf(config: dict, kind: str) -> nn.Module:
    """A randomly initialised transformers model of a published architecture (call under a device context)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    values = settings(config)
    model_type = values.pop("model_type")
    if kind == "vision_language":
        return AutoModelForImageTextToText.from_config(AutoConfig.for_model(model_type, **values))
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values))


# ============================================================================================ building
def _namespaces(node, trail=()):
    """Every (trail, Namespace with class_path) inside a parsed config."""
    from jsonargparse import Namespace

    if isinstance(node, Namespace):
        if "class_path" in node:
            yield trail, node
        for key, value in vars(node).items():
            yield from _namespaces(value, (*trail, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _namespaces(item, (*trail, str(i)))


def substitute_weights(config) -> list[str]:
    """Replace local weight folders/files that are absent here by published architectures or random weights."""
    notes = []
    for trail, node in list(_namespaces(config.model, ("model",))):
        args = node.get("init_args")
        if args is None:
            continue
        name = node.class_path.rsplit(".", 1)[-1]
        path = args.get("path")
        if name in ("HFCausalLM", "HFLanguageModel", "HFWhisperEncoder") and path and not os.path.isdir(path):
            parts = Path(path).parts
            folder = parts[parts.index("language_model") - 1] if "language_model" in parts else Path(path).name
            published = architecture(folder)
            if name == "HFWhisperEncoder":
                audio = settings(published["audio_config"])
                values = {k: audio[k] for k in ("d_model", "encoder_layers", "encoder_attention_heads",
                                                "encoder_ffn_dim", "max_source_positions")}
            elif "text_config" in published:
                values = dict(published["text_config"])
            else:
                values = settings(published)
            args.path, args.config = None, values
            notes.append(f"{'.'.join(trail)}: random weights of experiments/architectures/{folder}")
        for key in WEIGHT_FILE_KEYS:
            if args.get(key) and not os.path.exists(args[key]):
                args[key] = None
                notes.append(f"{'.'.join(trail)}.{key}: absent, random weights")
    return notes


def parse(path: str, extra: list[str] = ()):
    """The config as the CLI parses it (`train.main(..., run=False)` with instantiation deferred) and its parser."""
    import train

    class ParseOnly(train.CollectionCLI):
        def instantiate_classes(self) -> None:  # parts are built one at a time below
            pass

    cli = train.main(["--config", path, *extra], run=False, cli_class=ParseOnly)
    return cli.parser, cli.config


def _instantiate(parser, config, part: str):
    """Instantiate one part (model or data) of the parsed config the way LightningCLI does."""
    config = config.clone()
    config["data" if part == "model" else "model"] = None
    config.trainer.callbacks = None
    return getattr(parser.instantiate_classes(config), part)


def _weight_bytes_guess(config, path: str) -> float:
    """Bytes of weights if built in its dtype, from the architectures it names (to choose meta vs cpu)."""
    total = 0.0
    for _, node in _namespaces(config.model, ("model",)):
        values = (node.get("init_args") or {})
        published = values.get("config") if isinstance(values.get("config"), dict) else None
        if published and "hidden_size" in published:
            h, layers = published["hidden_size"], published.get("num_hidden_layers", 1)
            total += 4 * (12 * h * h * layers + 2 * h * published.get("vocab_size", 0))
    return total


def build(path: str) -> dict:
    """Build the module and the datamodule of one config; returns the built objects and what was substituted."""
    parser, config = parse(path)
    notes = substitute_weights(config)
    name = config.model.class_path.rsplit(".", 1)[-1]
    if path in DATA_SIZES:
        sizes, source = DATA_SIZES[path]
        for key, value in sizes.items():
            config.model.init_args[key] = value
        notes.append(f"data sizes of the published dataset ({source})")
    on_meta = _weight_bytes_guess(config, path) > META_THRESHOLD or name in LAZY_BACKBONES
    with torch.device("meta" if on_meta else "cpu"):
        model = _instantiate(parser, config, "model")
        extra = None
        if name in LAZY_BACKBONES:  # loaded lazily at test time: build the named architecture beside the module
            attr, key, kind = LAZY_BACKBONES[name]
            holder = config.model.init_args[attr].init_args if attr else config.model.init_args
            extra = build_hf(architecture(Path(holder[key]).name), kind)
            notes.append(f"{key}: loaded at test time; counted from experiments/architectures/{Path(holder[key]).name}")
    try:
        datamodule = _instantiate(parser, config, "data")
        data_note = f"datamodule {type(datamodule).__name__} built"
    except (UserInputError, ValueError, OSError) as err:
        from icml26.parse_errors import find_user_error

        datamodule = None
        data_note = f"datamodule not built ({str(find_user_error(err) or err).splitlines()[0][:160]})"
    if getattr(model, "structure", "") is None and hasattr(model, "structure_from"):
        data_note = _build_from_release_files(path, model)
    return {"config": config, "model": model, "extra": extra, "datamodule": datamodule, "on_meta": on_meta,
            "notes": notes, "data_note": data_note, "name": name}


def _build_from_release_files(path: str, model: nn.Module) -> str:
    """A module that takes its sizes from the data (RNA-FM's genes, clusters and pathway tokens) is built from the
    release-format files of its `experiments.paper_steps` case, which have the published shapes."""
    from experiments.paper_steps import cases

    case = cases().get(path)
    if case is None:
        return "datamodule not built (the model takes its sizes from data and no release-format case writes any)"
    with tempfile.TemporaryDirectory(prefix="paper_scale_data_") as folder:
        flags = case.write(Path(folder))
        parser, config = parse(path, flags)
        datamodule = _instantiate(parser, config, "data")
        datamodule.setup("fit")
        model._build(model.structure_from(datamodule))
    return "model sized by its datamodule on release-format files at the published shapes (experiments.paper_steps)"


# ============================================================================================ memory estimate
def optimizer_states(optimizer_config) -> tuple[int, str]:
    """Number of per-parameter state tensors the configured optimizer keeps, and its name."""
    if optimizer_config is None:
        return 0, "none"
    name = optimizer_config.class_path.rsplit(".", 1)[-1]
    args = optimizer_config.get("init_args") or {}
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        return 2, name
    if name == "SGD":
        return (1 if (args.get("momentum") or 0) > 0 else 0), name
    if name in ("RMSprop", "Adagrad"):
        return 1, name
    raise UserInputError(f"paper_scale: no state count for optimizer {name}; add it to optimizer_states().")


def state_bytes(params: list[tuple[int, int, bool]], states: int, ema: bool, shards: int = 1) -> dict[str, float]:
    """Weights, gradients, optimizer states and EMA bytes per device from (numel, element size, trainable) rows.

    Gradients and optimizer states have the parameter's dtype (torch keeps Adam's moments in the parameter's
    dtype); an EMA copy holds the trainable parameters once more; ``shards`` divides everything (FSDP)."""
    weights = sum(n * size for n, size, _ in params)
    trainable = sum(n * size for n, size, train in params if train)
    return {"weights": weights / shards, "gradients": trainable / shards, "optimizer": states * trainable / shards,
            "ema": (trainable if ema else 0) / shards}


def decoder_activation_bytes(cfg, tokens: int, act_bytes: int, checkpointing: bool, logit_bytes: float,
                             logit_positions: int | None = None) -> float:
    """Saved activations of one micro-batch through a decoder LM (SwiGLU, SDPA: no sequence-squared term).

    Per token and layer: 6h (norm inputs/outputs, q, attention output, residual) + 2 kv (k, v) + 4 I (gate, up,
    act(gate), product) elements; with checkpointing only each layer's input (h) plus one layer's working set are
    kept. Logits: ``logit_bytes`` per vocabulary entry at ``logit_positions`` (default every token; GRPO's chunked
    log-probs: the logits and their gradient, 2 x the activation width; the audio LLM reads one position per
    question: float32 logits there)."""
    h, layers, inter, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * (
        getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads)
    per_layer = (6 * h + 2 * kv + 4 * inter) * act_bytes
    body = (layers * h * act_bytes + per_layer) if checkpointing else layers * per_layer
    return tokens * body + (tokens if logit_positions is None else logit_positions) * vocab * logit_bytes


def probe_activation_bytes(model: nn.Module, example: torch.Tensor, autocast: bool) -> float:
    """Bytes of the tensors autograd saves for backward in one forward pass (parameters excluded), counted on
    the meta device, each storage once."""
    parameters = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage._cdata not in parameters:
            seen[storage._cdata] = max(seen.get(storage._cdata, 0), storage.nbytes())
        return t

    meta_model = model.to("meta") if next(model.parameters()).device.type != "meta" else model
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        meta_model(example.to("meta"))
    return float(sum(seen.values()))


def _precision(config) -> str:
    return str(config.trainer.get("precision") or "32-true")


def _act_bytes(precision: str) -> int:
    return 2 if precision.startswith(("bf16", "16")) else 8 if precision.startswith("64") else 4


def _hf_model(model: nn.Module):
    for attr in ("policy", "language_model"):
        inner = getattr(getattr(model, attr, None), "model", None)
        if inner is not None and hasattr(inner, "config"):
            return inner
    return None


def _shards(strategy, devices) -> int:
    """Over how many devices weights, gradients and optimizer states are sharded: FSDP's device count, or the
    ``data_parallel_size`` of a ModelParallelStrategy (FSDP2); 1 for DDP and single-device runs."""
    if strategy is not None and hasattr(strategy, "get") and str(strategy.get("class_path", "")).endswith(
            "ModelParallelStrategy"):
        size = (strategy.get("init_args") or {}).get("data_parallel_size", "auto")
        size = devices if size == "auto" else size
        return int(size) if str(size).isdigit() else 1
    return int(devices) if "fsdp" in str(strategy or "") and str(devices).isdigit() else 1


def estimate(built: dict) -> dict:
    """Memory per device in bytes with its terms, and the notes that explain it."""
    config, model, name = built["config"], built["model"], built["name"]
    precision = _precision(config)
    trainer = config.trainer
    devices = trainer.get("devices")
    shards = _shards(trainer.get("strategy"), devices)
    inference = name in INFERENCE_ONLY
    states, optimizer = (0, "none") if inference else optimizer_states(config.model.init_args.get("optimizer"))
    callbacks = config.trainer.get("callbacks") or []
    ema = any(str(c.get("class_path", "")).endswith("EMAWeights") for c in callbacks) and not inference
    rows = [(p.numel(), p.element_size(), p.requires_grad and not inference) for p in model.parameters()]
    if built["extra"] is not None:
        rows += [(p.numel(), p.element_size() if p.dtype != torch.float32 else 2, False)
                 for p in built["extra"].parameters()]  # inference backbones load in bfloat16 (the config's dtype)
    terms = state_bytes(rows, states, ema, shards)
    notes = [f"{precision}, {optimizer}" + (", EMA copy" if ema else "") + (f", FSDP/{shards}" if shards > 1 else "")]
    act = _act_bytes(precision)
    data = config.data.init_args
    hf = _hf_model(model)
    terms["activations"] = 0.0
    if inference:
        notes.append("inference only (test): weights in bfloat16, no gradients or optimizer; KV cache not counted")
    elif hf is not None:
        args = config.model.init_args
        checkpointing = bool(getattr(hf, "is_gradient_checkpointing", False))
        if hasattr(args, "max_new_tokens") and hasattr(data, "max_prompt_tokens"):
            seq, micro = int(data.max_prompt_tokens) + int(args.max_new_tokens), int(args.micro_batch_size)
            notes.append(f"activations: micro-batch {micro} x {seq} tokens (prompt + response)")
        else:  # audio LLM: 1500 encoder frames pooled by pool_stride, plus ~256 question tokens (an assumption)
            seq, micro = 1500 // int(args.get("pool_stride") or 1) + 256, int(data.batch_size)
            notes.append(f"activations: batch {micro} x ~{seq} tokens (audio tokens + 256 question tokens, assumed)")
        if "DPO" in name:  # one policy pass scores every option; the reference's pass saves nothing (no_grad)
            notes.append("DPO: chosen and rejected options scored in one policy pass")
        if hasattr(args, "max_new_tokens"):
            logit_bytes, positions = 2 * act, None
        else:
            logit_bytes, positions = 4, micro
        terms["activations"] = decoder_activation_bytes(hf.config, micro * seq, act, checkpointing, logit_bytes,
                                                        positions)
        notes.append("gradient checkpointing" if checkpointing else "no gradient checkpointing")
        if hasattr(args, "max_new_tokens"):
            notes.append("rollout KV cache not counted")
    elif getattr(model, "example_input_array", None) is not None:
        batch = int(data.batch_size)
        example = model.example_input_array
        example = example[:1].expand(batch, *example.shape[1:])
        terms["activations"] = probe_activation_bytes(model, example, precision.endswith("mixed"))
        notes.append(f"activations: saved tensors of one forward at batch {batch}")
    else:
        notes.append("activations not estimated (no input model for this module)")
    return {"terms": terms, "total": sum(terms.values()), "notes": notes,
            "strategy": f"FSDP/{shards}" if shards > 1 else "one device per replica (DDP)"}


def measured_activations(memory: dict, release: dict | None) -> None:
    """Where the estimate has no activation model, take the activations the release-format run measured (the
    bytes autograd saved in one training step, `experiments.paper_steps.StepTimer`) when that run was the
    published configuration (its batch included)."""
    missing = "activations not estimated (no input model for this module)"
    if (missing not in memory["notes"] or not release or release.get("note")
            or release.get("activation_bytes") is None):
        return
    memory["terms"]["activations"] = float(release["activation_bytes"])
    memory["total"] = sum(memory["terms"].values())
    memory["notes"][memory["notes"].index(missing)] = (
        f"activations: saved tensors measured in one training step on release-format files at batch "
        f"{release.get('batch_size')}")


def device_memory(config) -> tuple[float, str]:
    accelerator = str(config.trainer.get("accelerator") or "auto")
    if accelerator == "cpu":
        return 24.0, "CPU config: this machine's 24 GiB"
    return DEFAULT_DEVICE_GIB, "device: 80 GiB (A100/H100 80GB) assumed, the config names no GPU model"


# ============================================================================================ measured steps
def step_inputs(model: nn.Module, batch: int, seq: int | None, device: str):
    """A synthetic training batch and a loss function for the proxy step (image classifier or decoder LM)."""
    hf = _hf_model(model)
    if hf is not None:
        vocab = hf.config.vocab_size
        ids = torch.randint(0, vocab, (batch, seq), device=device)

        def loss_fn():
            logits = hf(input_ids=ids).logits
            return -logits.float().log_softmax(-1).gather(-1, ids[..., None]).mean()
        return loss_fn, batch * seq, "tokens"
    example = getattr(model, "example_input_array", None)
    if example is None:
        raise UserInputError(f"paper_scale: no synthetic step for {type(model).__name__} (only image "
                             "classifiers and decoder LMs have one).")
    x = torch.randn(batch, *example.shape[1:], device=device, dtype=next(model.parameters()).dtype)
    target = torch.randint(0, 2, (batch,), device=device)

    def loss_fn():
        return nn.functional.cross_entropy(model(x), target)
    return loss_fn, batch, "samples"


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> int:
    """Current RSS after resetting the peak (Linux: ``clear_refs`` 5 resets VmHWM), so that the imports' transient
    peak does not hide the steps' own; without /proc, the process's max RSS so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_bytes("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_rss() -> int:
    return _status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_steps(path: str, steps: int, device: str = "cpu", tiny: bool = False, bf16: bool = False) -> dict:
    """N optimizer steps of a synthetic batch at the config's batch (``tiny``: batch 2, 32 tokens); returns the
    throughput and the peak memory (``torch.cuda.max_memory_allocated`` on CUDA, max RSS growth on CPU)."""
    import train  # noqa: F401 - imports first, so that the RSS baseline holds only the libraries

    rss0 = _reset_peak_rss()
    built = build(path)
    if built["on_meta"] and device == "cpu" and not tiny:
        raise UserInputError(f"{path}: too large for CPU steps; run with --gpu on a GPU.")
    model = built["model"]
    if built["on_meta"]:
        model = model.to_empty(device=device)
    model.to(device)
    if bf16:
        model.to(torch.bfloat16)
    model.train()
    args = built["config"].model.init_args
    data = built["config"].data.init_args
    batch = 2 if tiny else int(getattr(args, "micro_batch_size", None) or data.batch_size)
    seq = 32 if tiny else (int(data.max_prompt_tokens) + int(args.max_new_tokens)
                           if hasattr(args, "max_new_tokens") else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6) if optimizer_states(args.optimizer)[0] == 2 else \
        torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    loss_fn, units, unit = step_inputs(model, batch, seq, device)
    start = None
    for step in range(steps):
        if step == 1:
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        loss_fn().backward()
        optimizer.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _peak_rss() - rss0
    step_s = (time.perf_counter() - start) / (steps - 1) if steps > 1 else None
    return {"steps": steps, "step_s": step_s, "per_s": units / step_s if step_s else None, "unit": unit,
            "peak_gib": peak / GIB, "batch": batch}


def measure_in_subprocess(path: str, steps: int, device: str, tiny: bool, bf16: bool) -> dict:
    """`run_steps` in a fresh process, so that its max RSS belongs to this config alone."""
    code = ("import json, sys; from experiments.paper_scale import run_steps; "
            f"print('RESULT ' + json.dumps(run_steps({path!r}, {steps}, {device!r}, {tiny}, {bf16})))")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"steps of {path} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ============================================================================================ report
def check_config(path: str, cpu_steps: int = 0, gpu: bool = False, steps: int = 0, device: str = "cuda",
                 tiny: bool = False, release: dict | None = None) -> dict:
    """The JSON entry of one config; ``release`` is its figures from `experiments.paper_steps` (real steps on
    release-format files), the source of ``cpu_steps`` and ``step_s``."""
    built = build(path)
    model = built["model"]
    params = sum(p.numel() for p in model.parameters())
    if built["extra"] is not None:
        params += sum(p.numel() for p in built["extra"].parameters())
    paper = None
    for _, node in _namespaces(built["config"].model, ("model",)):
        args = node.get("init_args") or {}
        for key in ("path", "model_path", "llm_path"):
            name = Path(str(args.get(key) or "")).name
            folder = ARCHITECTURES / ALIASES.get(name, name) / "config.json"
            if args.get(key) and folder.is_file():
                paper = architecture(folder.parent.name).get("_paper_params")
        if isinstance(args.get("config"), dict) and paper is None:
            for candidate in ARCHITECTURES.glob("*/config.json"):
                published = architecture(candidate.parent.name)
                inner = settings(published.get("text_config", published))
                if all(args.config.get(k) == v for k, v in inner.items() if k in ("hidden_size", "vocab_size")):
                    paper = published.get("_paper_params")
    if path in PAPER_PARAMS:
        paper = PAPER_PARAMS[path][0]
    memory = estimate(built)
    measured_activations(memory, release)
    device_gib, device_note = device_memory(built["config"])
    total_gib = memory["total"] / GIB
    terms = ", ".join(f"{k} {v / GIB:.2f}" for k, v in memory["terms"].items() if v)
    notes = [*built["notes"], *memory["notes"], f"GiB: {terms}", built["data_note"], device_note]
    steppable = _hf_model(model) is not None or getattr(model, "example_input_array", None) is not None
    entry = {"params": int(params), "paper_params": paper, "built_on": "meta" if built["on_meta"] else "cpu",
             "train_memory_gib_per_device": round(total_gib, 3), "device_memory_gib": device_gib,
             "fits": total_gib <= device_gib, "strategy": memory["strategy"], "cpu_steps": 0, "step_s": None,
             "note": ""}
    if release and release.get("not_run"):
        entry["release_run"] = release
        notes.append(f"train.py steps on {release['release_format']}: {release['not_run']}")
    elif release:
        entry.update(cpu_steps=release["cpu_steps"], step_s=release["step_s"], release_run=release)
        what = (f"train.py: {release['cpu_steps']} optimizer steps (a resume from step {release['resumed_from']}) "
                if release["cpu_steps"] else "train.py: test ")
        notes.append(what + f"and predict on {release['release_format']}"
                     + (f" ({release['note']})" if release["note"] else " at the published configuration"))
    built_name = built["name"]
    del built, model
    if cpu_steps and steppable and entry["built_on"] == "cpu" and total_gib < 6:
        try:
            measured = measure_in_subprocess(path, cpu_steps, "cpu", False, False)
            ratio = measured["peak_gib"] / total_gib
            notes.append(f"CPU check: measured peak RSS growth {measured['peak_gib']:.3f} GiB over {cpu_steps} "
                         f"synthetic steps = {ratio:.2f} x the estimate")
        except UserInputError as err:
            notes.append(f"CPU check skipped ({err})")
    if gpu and entry["fits"] and not steppable:
        notes.append(f"{device} steps skipped (no synthetic step for {built_name})")
    elif gpu and entry["fits"]:
        try:
            measured = measure_in_subprocess(path, steps, device, tiny, True)
            if device != "cpu":
                entry.update(gpu_steps=steps, gpu_step_s=measured["step_s"], gpu_per_s=measured["per_s"],
                             gpu_unit=measured["unit"], gpu_peak_gib=round(measured["peak_gib"], 3))
            notes.append(f"{device} bf16{' tiny' if tiny else ''}: {measured['per_s']:.1f} {measured['unit']}/s, "
                         f"peak {measured['peak_gib']:.2f} GiB")
        except (UserInputError, RuntimeError) as err:
            notes.append(f"{device} steps skipped ({str(err)[:160]})")
    entry["note"] = "; ".join(notes)
    return entry


def release_runs(configs: list[str], steps: int) -> dict[str, dict]:
    """`experiments.paper_steps` for the configs: one fresh process per config (its memory is its own: a chain of
    7-8B-wide configs in one process held over 20 GiB), prerequisites first in their paper's folder."""
    from experiments.paper_steps import cases, in_order

    registry = cases()
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="paper_steps_") as folder:
        ordered = in_order(configs)
        for index, path in enumerate(ordered):
            paper_folder = Path(folder) / Path(path).parent.name
            if index and Path(ordered[index - 1]).parent != Path(path).parent:  # a paper's GBs of checkpoints go
                shutil.rmtree(Path(folder) / Path(ordered[index - 1]).parent.name, ignore_errors=True)
            out = Path(folder) / "figures.json"
            command = [sys.executable, "-m", "experiments.paper_steps", "--steps", str(steps), "--json", str(out),
                       "--folder", str(paper_folder.parent), f"--config={path}", "--prerequisites-done"]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode or not out.is_file():  # recorded, and the other configs still run
                killed = " (killed: out of memory?)" if done.returncode == -9 else ""
                figures[path] = {"release_format": registry[path].release_format, "note": registry[path].note,
                                 "cpu_steps": 0, "step_s": None,
                                 "not_run": f"failed{killed}: {' | '.join(done.stderr.strip().splitlines()[-2:])}"}
                continue
            figures.update(json.loads(out.read_text()))
            out.unlink()
    return {path: figures[path] for path in configs}


def markdown(results: dict) -> str:
    lines = ["| config | params | paper params | built on | train GiB / device | device GiB | fits | CPU steps | "
             "step s |", "|---|---:|---:|---|---:|---:|---|---:|---:|"]
    for path, e in results["configs"].items():
        paper = f"{e['paper_params'] / 1e9:.2f}B" if e["paper_params"] else "-"
        step = f"{e['step_s']:.3f}" if e["step_s"] else "-"
        lines.append(f"| {path} | {e['params'] / 1e6:,.2f}M | {paper} | {e['built_on']} | "
                     f"{e['train_memory_gib_per_device']:.2f} | {e['device_memory_gib']:.0f} | "
                     f"{'yes' if e['fits'] else 'NO'} | {e['cpu_steps']} | {step} |")
    lines += ["", "Notes per config:", ""]
    lines += [f"- `{path}`: {e['note']}" for path, e in results["configs"].items()]
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- paper_scale table: python -m experiments.paper_scale --readme -->"
README_END = "<!-- end of paper_scale table -->"


def readme_table(results: dict) -> str:
    """The README's "Scaling up" table, one row per paper, from ``paper_scale.json``."""
    papers: dict[str, list[tuple[str, dict]]] = {}
    for path, entry in results["configs"].items():
        papers.setdefault(Path(path).parent.name, []).append((path, entry))
    lines = [README_BEGIN, "| paper | configs | largest model | GiB per device (strategy) | fits | "
             "train.py on release-format files |", "|---|---:|---:|---|---|---|"]
    for paper, entries in sorted(papers.items()):
        largest = max(entries, key=lambda item: item[1]["params"])[1]
        heaviest = max(entries, key=lambda item: item[1]["train_memory_gib_per_device"])[1]
        stepped = [e for _, e in entries if e["cpu_steps"] >= 2 and e.get("release_run")]
        tested = [e for _, e in entries if (e.get("release_run") or {}).get("test_s") is not None]
        not_run = [e for _, e in entries if (e.get("release_run") or {}).get("not_run")]
        reduced = sum(1 for e in stepped if e["release_run"].get("note"))
        parts = []
        if stepped:  # step times stay in paper_scale.md: the README states no duration of its own
            parts.append(f"{len(stepped)} fit + resume + predict" + (f" ({reduced} reduced, see notes)" if reduced
                                                                      else ""))
        if tested:
            parts.append(f"{len(tested)} test + predict")
        if not_run:
            parts.append(f"{len(not_run)} not run (memory)")
        missing = len(entries) - len(stepped) - len(tested) - len(not_run)
        if missing:
            parts.append(f"{missing} not run")
        strategy = heaviest.get("strategy", "?").replace("one device per replica (DDP)", "DDP")
        lines.append(f"| {paper} | {len(entries)} | {_count(largest['params'])} | "
                     f"{heaviest['train_memory_gib_per_device']:.1f} ({strategy}) | "
                     f"{'yes' if all(e['fits'] for _, e in entries) else 'NO'} | {'; '.join(parts)} |")
    return "\n".join(lines + [README_END])


def _count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params:,}"


def write_readme(results: dict, readme: Path = ROOT / "README.md") -> None:
    """Replace the table between `README_BEGIN` and `README_END` in the README with `readme_table`."""
    text = readme.read_text(encoding="utf-8")
    if README_BEGIN not in text or README_END not in text:
        raise UserInputError(f"{readme} has no paper_scale table markers ({README_BEGIN} ... {README_END}); add "
                             "them where the table belongs.")
    before, rest = text.split(README_BEGIN, 1)
    after = rest.split(README_END, 1)[1]
    readme.write_text(before + readme_table(results) + after, encoding="utf-8")


def _previous(out: Path) -> dict:
    """The configs of an earlier ``<out>/paper_scale.json`` ({} when there is none)."""
    if not (out / "paper_scale.json").is_file():
        return {}
    try:
        return dict(json.loads((out / "paper_scale.json").read_text())["configs"])
    except (ValueError, KeyError, TypeError):
        raise UserInputError(f"{out / 'paper_scale.json'} is not a paper_scale result; remove it or choose another "
                             "--out.") from None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append",
                        help="a paper config (repeatable; default: all of them); updates its entry in <out>'s JSON")
    parser.add_argument("--out", default="results", help="folder for paper_scale.json and paper_scale.md")
    parser.add_argument("--cpu-steps", type=int, default=3,
                        help="synthetic steps on CPU to check the estimate where it is small (0: none)")
    parser.add_argument("--gpu", action="store_true", help="run --steps synthetic bf16 steps of configs that fit")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="device of --gpu (cpu: test the path without a GPU)")
    parser.add_argument("--tiny", action="store_true", help="with --gpu: batch 2 and 32 tokens (a path test)")
    parser.add_argument("--release-steps", type=int, default=2,
                        help="real train.py steps on release-format files before a resume (experiments.paper_steps; "
                             "0: keep the figures already in the JSON)")
    parser.add_argument("--readme", action="store_true",
                        help="only rewrite README.md's Scaling up table from <out>/paper_scale.json (no run)")
    args = parser.parse_args(argv)
    if args.readme:
        results = {"configs": _previous(Path(args.out))}
        if not results["configs"]:
            parser.error(f"--readme: no {Path(args.out) / 'paper_scale.json'}; run the check first.")
        write_readme(results)
        return results
    if args.gpu and args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--gpu needs a CUDA device; use --device cpu --tiny to test the path on CPU.")
    if args.steps < 2 and args.gpu:
        parser.error(f"--steps {args.steps}: need at least 2 (the first step is warm-up, not timed).")
    configs = args.config or sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/*/*paper*.yaml"))
    for path in configs:
        if not (ROOT / path).is_file() and not Path(path).is_file():
            parser.error(f"--config {path}: no such file.")
    out = Path(args.out)
    results = {"configs": {}}
    if args.config:  # configs re-checked: the others' entries stay
        results["configs"].update(_previous(out))
    from tqdm import tqdm

    if args.release_steps:
        release = release_runs(configs, args.release_steps)
    else:  # the figures of the last run stay
        release = {path: entry.get("release_run") for path, entry in _previous(out).items()}
    for path in tqdm(configs, desc="paper configs"):
        results["configs"][path] = check_config(path, args.cpu_steps, args.gpu, args.steps, args.device, args.tiny,
                                                release.get(path))
    results["configs"] = dict(sorted(results["configs"].items()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "paper_scale.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    table = markdown(results)
    (out / "paper_scale.md").write_text(table, encoding="utf-8")
    print(table)
    return results


if __name__ == "__main__":
    main()
