"""Audio language models that answer spoken multiple-choice questions, with PCLM (prompt-conditioned layer mixing)
as a switch, and the content-only encoder pre-training that makes a small encoder behave like a real one.

Paper: "Do Audio LLMs Listen or Read? Analyzing and Mitigating Paralinguistic Failures with VoxParadox"
(Pang, Chaubey & Soleymani, ICML 2026, arXiv 2605.27772). No official code was released (the project page,
voxparadox.github.io, says "coming soon"), so everything below is written from the paper's text; details the text
does not fix are marked RECONSTRUCTION and are configurable. One file: the encoders, the PCLM mixer and the three
training stages (SFT, PCLM, DPO) share one forward, which reads best in one place.

Method (from the paper's text). Audio LLMs answer questions about *how* something is said (pitch, speed, gender,
...) from *what* is said: on VoxParadox, where the transcript asserts a wrong answer, they agree with the
transcript (ALA, adversarial-label agreement) far more often than with the acoustics (Acc_GT). Probes show that
intermediate encoder layers carry the paralinguistic information that the last layer, the one fed to the LLM,
has lost. PCLM keeps a set of encoder layers L (Qwen2-Audio / AF-Whisper: {5, 15, 25, 30} and the final 32nd),
gives each its own projector P^(l) *initialised by cloning the trained final-layer projector*, and mixes the
projected sequences with weights that depend on the prompt only:
``alpha = softmax(MLP(e_prompt)) in R^|L|``, one weight per layer per example shared over time,
``Z = sum_l alpha_l P^(l)(H^(l))``, which replaces the audio tokens given to the LLM. Training: SFT stage 1
trains projectors + mixer (encoder and LLM frozen, lr 5e-5), stage 2 also unfreezes the LLM; then DPO
(`lightning_modules.pclm.audio_dpo.AudioDPO`).

This module:

* `AudioLanguageModel`: encoder exposing every layer's hidden states -> projector(s) -> language model over
  [prompt tokens, audio tokens]; the option scores are the LM's next-token logits at the last real position,
  restricted to the option tokens (log-softmax over the options; each option is one token: its text in the
  embedded word vocabulary, or its letter ``A``/``B``/... when the datamodule renders lettered questions with a
  transformers tokenizer, ``tokenizer_path``). Padding frames are masked before pooling and mixing, and padded
  audio tokens are masked out of the LM's attention. ``pclm: true`` switches PCLM on over ``pclm_layers``;
  ``train_parts`` chooses what trains (``[projector, language_model]`` for last-layer SFT, ``[projector, mixer]``
  for PCLM stage 1, ``[projector, mixer, language_model]`` for stage 2). With ``init_from`` a last-layer SFT
  checkpoint, every per-layer projector the checkpoint lacks is cloned from the loaded final projector
  (``clone_projectors``).
* `SpeechContentPretraining`: the encoder alone, trained to classify the *sentence* of each clip (random pitch,
  speed, voice and volume per clip): a stand-in for the ASR-style pre-training of Whisper, which makes the deep
  layers of a small encoder paralinguistically invariant as in real audio LLMs (checked with
  `callbacks.layer_probing.LayerProbing` before the PCLM claim is measured).
* Encoders: `SpeechEncoder` (a Whisper-style log-mel -> 2 convolutions (the second with stride 2) -> pre-LN
  transformer; hidden states indexed like transformers' ``output_hidden_states``: 0 = the convolution output,
  l = after layer l, the last with the final LayerNorm) and `HFWhisperEncoder` (a transformers Whisper-family
  encoder from a local folder, e.g. the audio tower of Qwen2-Audio, or from a config). Language models:
  `TinyAudioLM` (a pre-LN causal transformer built from `lightning_modules.shared.tiny_gpt.Block`) and `HFLanguageModel`
  (a local transformers causal LM fed ``inputs_embeds``).
* Metrics: `OptionAgreement` (torchmetrics): Acc_GT = mean 1[prediction = true label], ALA = mean 1[prediction =
  the label the transcript asserts], per task and overall (paper Sec. 3); `MixingWeights`: mean alpha per task.
  On the VoxParadox release ALA comes from each row's ``adversarial_labels`` (batch ``adv_options``): a question
  may list several (the project page shows two for a vocal-range question), and a prediction equal to any of them
  counts as following the transcript (our choice for such questions); release predictions add the row's ``id``,
  the chosen option's text (``chosen_text``) and the ``adversarial_labels`` texts.
* Predictions (``train.py predict``, one row per question): the task, the chosen option (its index among the
  question's options) and its probability, the acoustic answer ``label`` and the transcript's ``adv_label``,
  ``correct`` / ``follows_transcript`` (the paper's failure), every option's probability and, with PCLM, the
  layer weights alpha; the pre-training stage writes each clip's sentence probabilities and its true sentence.

RECONSTRUCTIONS and deviations:

* The prompt embedding of the mixer is the masked mean of the language model's own (detached) token embeddings of
  the prompt; the paper encodes the prompt with a frozen BERT-small. The mixer MLP is Linear-GELU-Linear
  (``mixer_hidden``); its depth is not given in the text. The last Linear starts at zero (uniform alpha at start).
* Options are scored by one logit per option token (the option text's word token, or with a transformers tokenizer
  the option letter, the paper's MCQ format); the paper parses the generated answer with a regex.
* The projector is a 2-layer MLP after a stride-2 average pooling of the encoder states (the pooling of
  Qwen2-Audio, the MLP of Audio Flamingo 3); any projector clones the same way.
* The LM reads [prompt tokens, audio tokens] and answers at the last audio token, for every backbone; Qwen2-Audio's
  own chat format puts the audio inside the user turn before the question, so the real model sees a layout it
  was not trained on until SFT adapts it (a choice of this collection, kept so that the embedded experiment's
  numbers stay as measured).
* `HFWhisperEncoder` / `HFLanguageModel` with the datamodule's ``tokenizer_path`` run ``configs/pclm/paper.yaml``
  (Qwen2-Audio-7B from local folders); the whole chain is tested end to end with a tiny Qwen2 LM, a tiny Whisper
  encoder and a tiny BPE tokenizer (tests/test_pclm.py). The 7B configs themselves were not run here (no weights).
  Token ids at or beyond the LM's embedding rows (a tokenizer that is not the LM's) are one `UserInputError`.

Length: one paper's model read top to bottom (feature extraction, the two encoder and LM backends, the PCLM
switch and its metrics); DPO lives in `audio_dpo.py`, the data in `datamodules/paralinguistic_speech.py`.
"""
from __future__ import annotations

import copy
import logging
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import Metric

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import SpokenQuestionData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.tiny_gpt import Block, fully_shard_model, picklable_hyperparameters, sharding_mesh

log = logging.getLogger(__name__)
PARTS = ("encoder", "projector", "mixer", "language_model")


# ============================================================================================ front end
def mel_filter_bank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Slaney-style triangular mel filters [n_fft // 2 + 1, n_mels] (HTK mel scale, area-normalised)."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10 ** (np.asarray(m) / 2595.0) - 1.0)

    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2))
    lower = (freqs[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])[None]
    upper = (edges[None, 2:] - freqs[:, None]) / (edges[2:] - edges[1:-1])[None]
    bank = np.maximum(0.0, np.minimum(lower, upper))
    return (bank * (2.0 / (edges[2:] - edges[:-2]))[None]).astype(np.float32)


class LogMel(nn.Module):
    """Waveform [B, T] (16 kHz) -> log10-mel features [B, frames, n_mels] and frame counts (no learnable weights;
    no per-utterance normalisation, so loudness stays visible). Frames are the windows that lie inside the clip
    (no centre padding), features of padding frames are 0, so a clip's features do not depend on its batch."""

    def __init__(self, sample_rate: int = 16_000, n_fft: int = 400, hop_length: int = 160, n_mels: int = 80) -> None:
        super().__init__()
        self.sample_rate, self.n_fft, self.hop_length, self.n_mels = sample_rate, n_fft, hop_length, n_mels
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.register_buffer("filters", torch.from_numpy(mel_filter_bank(sample_rate, n_fft, n_mels)),
                             persistent=False)

    def forward(self, waveform: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        real = torch.arange(waveform.shape[1], device=waveform.device)[None] < lengths.to(waveform.device)[:, None]
        waveform = waveform * real                                      # padding never leaks into real frames
        if waveform.shape[1] < self.n_fft:
            waveform = F.pad(waveform, (0, self.n_fft - waveform.shape[1]))
        spec = torch.stft(waveform, self.n_fft, self.hop_length, window=self.window, return_complex=True,
                          center=False).abs().pow(2)                    # [B, F, frames]: windows inside the clip
        mel = torch.einsum("bft,fm->btm", spec, self.filters)
        frames = ((lengths.to(waveform.device) - self.n_fft).clamp(min=0) // self.hop_length + 1)
        real_frames = torch.arange(mel.shape[1], device=mel.device)[None] < frames[:, None]
        return (torch.log10(mel.clamp(min=1e-8)) + 4.0) / 4.0 * real_frames[..., None], frames


def _sinusoids(length: int, width: int) -> torch.Tensor:
    scale = math.log(10_000) / (width // 2 - 1)
    inv = torch.exp(-scale * torch.arange(width // 2))
    angles = torch.arange(length)[:, None] * inv[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class SpeechEncoder(nn.Module):
    """A small Whisper-style encoder: log-mel -> conv(3) GELU -> conv(3, stride 2) GELU -> sinusoidal positions ->
    ``num_layers`` transformer layers (pre-LN as Whisper; ``norm_first: false`` = post-LN as wav2vec 2.0 / HuBERT
    base) -> final LayerNorm.

    ``forward(waveform, lengths) -> (hidden_states, mask)``: ``num_layers + 1`` states [B, T', width] (index 0 the
    convolution output, index l after layer l; the last one after the final LayerNorm, as transformers' Whisper)
    and the mask of real (non-padding) positions [B, T'].
    """

    def __init__(self, num_layers: int = 6, width: int = 64, num_heads: int = 4, n_mels: int = 80,
                 hop_length: int = 160, max_positions: int = 1500, dropout: float = 0.0,
                 sample_rate: int = 16_000, norm_first: bool = True) -> None:
        super().__init__()
        check_range("SpeechEncoder.num_layers", num_layers, low=1)
        if width % num_heads or width % 2:
            raise UserInputError(f"SpeechEncoder: width={width} must be even and divisible by num_heads={num_heads}.")
        self.num_layers, self.width, self.max_positions = num_layers, width, max_positions
        self.sample_rate = sample_rate
        self.front_end = LogMel(sample_rate=sample_rate, hop_length=hop_length, n_mels=n_mels)
        self.conv1 = nn.Conv1d(n_mels, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.register_buffer("positions", _sinusoids(max_positions, width), persistent=False)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, num_heads, 4 * width, dropout, activation="gelu", batch_first=True,
                                       norm_first=norm_first) for _ in range(num_layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, waveform: torch.Tensor, lengths: torch.Tensor):
        features, frames = self.front_end(waveform, lengths)
        real_frames = torch.arange(features.shape[1], device=features.device)[None] < frames[:, None]
        x = F.gelu(self.conv1(features.transpose(1, 2))) * real_frames[:, None]   # padding stays exactly zero
        x = F.gelu(self.conv2(x)).transpose(1, 2)                        # [B, T', width]
        if x.shape[1] > self.max_positions:
            raise UserInputError(f"SpeechEncoder: a clip gives {x.shape[1]} positions but max_positions="
                                 f"{self.max_positions}; shorten the audio or raise max_positions.")
        mask = torch.arange(x.shape[1], device=x.device)[None] < ((frames + 1) // 2).to(x.device)[:, None]
        x = x + self.positions[:x.shape[1]]
        states = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x, src_key_padding_mask=~mask)
            states.append(self.norm(x) if i == len(self.layers) - 1 else x)
        return states, mask


class HFWhisperEncoder(nn.Module):
    """A transformers Whisper-family audio encoder (WhisperEncoder, Qwen2AudioEncoder) with all hidden states.

    Args:
        path: local folder of a ``save_pretrained`` model: an encoder, or a full audio LLM (Qwen2-Audio, Audio
            Flamingo 3) whose ``audio_tower`` is taken. Nothing is downloaded.
        config: instead of ``path``, a WhisperConfig mapping (a randomly initialised encoder; tests, CPU work).
        n_mels / hop_length: the log-mel front end (Whisper-large-v3 and Qwen2-Audio: 128 / 160). Features are
            zero-padded to the encoder's fixed 3,000 frames (30 s), and the padding positions are masked.

    Every hidden state has the encoder's 1,500 positions (the model's ``pool_stride`` pools them): Qwen2-Audio's
    encoder average-pools its final output by 2 before its final norm, so its final state here is the final norm
    of the last layer's 1,500 positions (otherwise the final and intermediate layers would not align for PCLM and
    the final layer would be pooled twice).
    """

    def __init__(self, path: str | None = None, config: dict | None = None, n_mels: int = 128,
                 hop_length: int = 160, sample_rate: int = 16_000) -> None:
        super().__init__()
        if (path is None) == (config is None):
            raise UserInputError("HFWhisperEncoder needs exactly one of `path` (a local folder) and `config`.")
        from transformers import AutoModel, WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        if config is not None:
            self.model = WhisperEncoder(WhisperConfig(num_mel_bins=n_mels, **config))
        else:
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise UserInputError(f"HFWhisperEncoder: '{path}' is not a local model folder with a config.json.")
            loaded = AutoModel.from_pretrained(path, local_files_only=True)
            self.model = getattr(loaded, "audio_tower", None) or getattr(loaded, "encoder", None) or loaded
        cfg = self.model.config
        self.num_layers = cfg.encoder_layers
        self.width = cfg.d_model
        self.sample_rate = sample_rate
        self.frames = 2 * cfg.max_source_positions
        self.front_end = LogMel(sample_rate=sample_rate, hop_length=hop_length, n_mels=n_mels)

    def forward(self, waveform: torch.Tensor, lengths: torch.Tensor):
        features, frames = self.front_end(waveform, lengths)
        if features.shape[1] > self.frames:
            raise UserInputError(f"HFWhisperEncoder: a clip has {features.shape[1]} frames; the encoder takes at "
                                 f"most {self.frames} frames (30 s for Whisper). Cut the audio.")
        features = F.pad(features, (0, 0, 0, self.frames - features.shape[1])).transpose(1, 2)
        last = {}
        pools_itself = hasattr(self.model, "avg_pooler")   # Qwen2-Audio's encoder: pool by 2, then ln_post
        if pools_itself:
            hook = self.model.layers[-1].register_forward_hook(
                lambda module, args, output: last.update(state=output[0] if isinstance(output, tuple) else output))
        try:
            out = self.model(features, output_hidden_states=True)
        finally:
            if pools_itself:
                hook.remove()
        states = list(out.hidden_states)
        if pools_itself:
            # its final hidden state is pooled (750 positions) while the other layers have 1,500: take the final
            # layer normalised at 1,500 positions, so every layer has the same positions and `pool_stride` (2 for
            # Qwen2-Audio) pools all layers alike (Qwen2-Audio: avg-pool then norm; here norm then the pool)
            states[-1] = self.model.layer_norm(last["state"])
        length = states[-1].shape[1]
        mask = torch.arange(length, device=features.device)[None] < ((frames + 1) // 2).to(features.device)[:, None]
        return states, mask


# ============================================================================================ language models
class TinyAudioLM(nn.Module):
    """A small pre-LN causal transformer over input embeddings (blocks of `lightning_modules.shared.tiny_gpt`).

    ``embed(ids) -> [B, L, width]``; ``forward(embeddings, mask) -> hidden [B, L, width]`` (causal, padded keys
    masked, learned positions counted over real tokens); ``logits(hidden) -> [..., vocab_size]``.
    """

    def __init__(self, vocab_size: int = 64, num_layers: int = 2, width: int = 64, num_heads: int = 4,
                 context_length: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        check_range("TinyAudioLM.vocab_size", vocab_size, low=1)
        if width % num_heads:
            raise UserInputError(f"TinyAudioLM: width={width} must be divisible by num_heads={num_heads}.")
        self.vocab_size, self.width, self.context_length = vocab_size, width, context_length
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(context_length, width)
        self.blocks = nn.ModuleList(Block(width, num_heads, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids)

    def forward(self, embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        length = embeddings.shape[1]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        if int(positions.max()) >= self.context_length:
            raise UserInputError(f"TinyAudioLM: {int(positions.max()) + 1} tokens exceed context_length="
                                 f"{self.context_length}; raise it or use shorter clips.")
        at = torch.arange(length, device=mask.device)
        allowed = ((at[None, :] <= at[:, None])[None] & mask[:, None, :]) | (at[None, None, :] == at[None, :, None])
        x = embeddings + self.positions(positions)
        for block in self.blocks:
            x, _ = block(x, allowed, None)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)


class HFLanguageModel(nn.Module):
    """A transformers causal LM from a local folder (or a config mapping with ``model_type``), fed embeddings."""

    def __init__(self, path: str | None = None, config: dict | None = None, dtype: str = "float32") -> None:
        super().__init__()
        if (path is None) == (config is None):
            raise UserInputError("HFLanguageModel needs exactly one of `path` (a local folder) and `config`.")
        from transformers import AutoConfig, AutoModelForCausalLM

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype not in dtypes:
            raise UserInputError(f"HFLanguageModel: dtype={dtype!r}; choose one of {sorted(dtypes)}.")
        if config is not None:
            settings = dict(config)
            if "model_type" not in settings:
                raise UserInputError(f"HFLanguageModel config={settings!r} lacks `model_type`.")
            self.model = AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))
        else:
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise UserInputError(f"HFLanguageModel: '{path}' is not a local model folder with a config.json.")
            self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtypes[dtype])
        self.width = self.model.get_input_embeddings().weight.shape[1]
        # token ids must index both the input embeddings and the output head (rows can exceed len(tokenizer))
        self.vocab_size = min(self.model.get_input_embeddings().weight.shape[0],
                              self.model.get_output_embeddings().weight.shape[0])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def forward(self, embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Final (normed) hidden states from the decoder alone: the causal LM's own forward would also compute
        logits at every position ([B, T, vocab], 0.53 GB per 850-token sequence at Qwen2's 156,032 tokens in
        float32), where the option scores need them at one position (`logits`)."""
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return self.model.base_model(inputs_embeds=embeddings, attention_mask=mask.long(),
                                     position_ids=positions).last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)


# ============================================================================================ metrics
class OptionAgreement(Metric):
    """Mean 1[prediction == target] per task and overall; targets < 0 (no such label) are not counted. A 2-D
    boolean target [B, K] is a set of options per example: a hit is 1[target[b, prediction[b]]], and examples with
    an empty set are not counted (ALA with several adversarial labels).

    With the true labels this is Acc_GT, with the labels the transcript asserts it is ALA (paper Sec. 3).
    ``compute()`` returns ``{"all": value, "<task>": value, ...}`` (tasks that had no example are left out).
    """

    full_state_update = False

    def __init__(self, task_names: list[str]) -> None:
        super().__init__()
        self.task_names = list(task_names)
        self.add_state("correct", torch.zeros(len(task_names), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(len(task_names), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, prediction: torch.Tensor, target: torch.Tensor, task: torch.Tensor) -> None:
        if target.dim() == 2:                           # a set of options per example
            keep = target.any(-1) & (task >= 0)
            hits = target.gather(1, prediction.clamp(min=0)[:, None]).squeeze(1) & keep
        else:
            keep = (target >= 0) & (task >= 0)
            hits = (prediction == target) & keep
        self.correct += torch.zeros_like(self.correct).index_add_(0, task[keep], hits[keep].long())
        self.total += torch.bincount(task[keep], minlength=len(self.task_names))

    def compute(self) -> dict[str, torch.Tensor]:
        out = {"all": self.correct.sum().float() / self.total.sum().clamp(min=1)}
        for i, name in enumerate(self.task_names):
            if self.total[i] > 0:
                out[name] = self.correct[i].float() / self.total[i]
        return out


class MixingWeights(Metric):
    """Mean PCLM mixing weight per (task, layer); ``compute()`` -> [num_tasks, num_layers] (NaN for absent tasks)."""

    full_state_update = False

    def __init__(self, num_tasks: int, num_layers: int) -> None:
        super().__init__()
        self.add_state("sums", torch.zeros(num_tasks, num_layers), dist_reduce_fx="sum")
        self.add_state("counts", torch.zeros(num_tasks), dist_reduce_fx="sum")

    def update(self, alpha: torch.Tensor, task: torch.Tensor) -> None:
        keep = task >= 0
        self.sums.index_add_(0, task[keep], alpha[keep].float())
        self.counts.index_add_(0, task[keep], torch.ones_like(task[keep], dtype=torch.float))

    def compute(self) -> torch.Tensor:
        return self.sums / self.counts[:, None]


# ============================================================================================ modules
def _vocabulary_message(size: int, language_model: nn.Module, seen: bool = False) -> str:
    what = (f"a batch holds token id {size - 1}" if seen else f"the data's tokens have ids up to {size - 1} "
            f"(vocab_size {size})")
    if isinstance(language_model, TinyAudioLM):
        fix = f"set --model.init_args.language_model.init_args.vocab_size={size} (or more)"
    else:
        fix = ("the tokenizer does not match the language model: point the datamodule's tokenizer_path at the "
               "language model's own tokenizer (for the paper configs the Qwen2-Audio-7B-Instruct folder)")
    return (f"{what} but the language model has {language_model.vocab_size} embedding rows (ids 0.."
            f"{language_model.vocab_size - 1}); {fix}.")


def masked_pool(states: torch.Tensor, mask: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Average pooling over time with the given stride that ignores padding positions: [B, T, D] -> [B, T/s, D]."""
    if stride == 1:
        return states * mask[..., None], mask
    batch, length, width = states.shape
    pad = (-length) % stride
    states = F.pad(states * mask[..., None], (0, 0, 0, pad))
    weights = F.pad(mask.float(), (0, pad))
    summed = states.view(batch, -1, stride, width).sum(2)
    counts = weights.view(batch, -1, stride).sum(2)
    return summed / counts.clamp(min=1)[..., None], counts > 0


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real positions: [B, T, D], [B, T] -> [B, D]."""
    weights = mask.float()[..., None]
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1)


class SpeechContentPretraining(PaperModule):
    """Content-only pre-training of the encoder: classify each clip's sentence from the masked mean of the last
    hidden state (pitch, speed, voice and volume vary at random, so the objective rewards invariance to them).

    Args:
        encoder: a `SpeechEncoder` (or any module with the same ``forward``).
        num_content_classes: number of sentences (checked against the data).
    """

    def __init__(self, encoder: nn.Module, num_content_classes: int = 50,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        self.encoder = encoder
        self.num_content_classes = num_content_classes
        self.head = nn.Linear(encoder.width, num_content_classes)

    def setup(self, stage: str) -> None:
        self.check_data_matches(SpokenQuestionData, {"num_content_classes": self.num_content_classes},
                                "SpeechContentPretraining: the model has {model} content classes but the data has "
                                "{data}; set --model.init_args.num_content_classes={data}.")
        super().setup(stage)

    def layer_states(self, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        return self.encoder(batch["waveform"], batch["wave_lengths"])

    def forward(self, batch: dict) -> torch.Tensor:
        states, mask = self.layer_states(batch)
        return self.head(masked_mean(states[-1], mask))

    def _step(self, batch: dict, split: str) -> torch.Tensor:
        logits = self(batch)
        keep = batch["content"] >= 0
        if not bool(keep.any()):
            raise UserInputError("SpeechContentPretraining needs the sentence id of each clip (`content`), which "
                                 "only the embedded espeak-ng data has.")
        loss = F.cross_entropy(logits[keep], batch["content"][keep])
        accuracy = (logits[keep].argmax(-1) == batch["content"][keep]).float().mean()
        self.log(f"{split}/loss", loss, prog_bar=split == "train", batch_size=int(keep.sum()),
                 sync_dist=split != "train")
        self.log(f"{split}/content_acc", accuracy, prog_bar=split != "train", batch_size=int(keep.sum()),
                 sync_dist=split != "train")
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return {"content_probs": self(batch).softmax(-1)}

    def prediction_fields(self, outputs, batch) -> dict:
        """Per clip: its true sentence id (``content``, -1 unknown) and the sentence probabilities (the table adds
        ``content_predicted_class``)."""
        return {"content": batch["content"], **outputs}


class AudioLanguageModel(PaperModule):
    """Encoder -> projector(s) -> language model over [prompt, audio] scoring the options; PCLM as a switch.

    Args:
        encoder: audio encoder returning (all hidden states, mask) (`SpeechEncoder`, `HFWhisperEncoder`).
        language_model: `TinyAudioLM` or `HFLanguageModel`.
        pclm: prompt-conditioned layer mixing over ``pclm_layers``; False = the final layer only.
        pclm_layers: hidden-state indices to mix (0 = convolution output, L = final layer); the final layer is
            added when missing. Qwen2-Audio / AF3 (32 layers): [5, 15, 25, 30, 32].
        projector_hidden: hidden width of the 2-layer MLP projector.
        pool_stride: average pooling of the encoder states before the projector (Qwen2-Audio: 2).
        mixer_hidden: hidden width of the mixer MLP (prompt embedding -> |L| logits).
        clone_projectors: after ``init_from``, clone the loaded final projector into each per-layer projector
            the checkpoint does not have (PCLM's initialisation); at construction they are clones already.
        train_parts: subset of encoder, projector (all projectors), mixer, language_model that trains; the rest is
            frozen (``requires_grad=False``, eval mode for the encoder).
        task_names: metric names per task id (the data's ``task_names`` win when attached).
    """

    def __init__(self, encoder: nn.Module, language_model: nn.Module, pclm: bool = False,
                 pclm_layers: list[int] | None = None, projector_hidden: int = 128, pool_stride: int = 2,
                 mixer_hidden: int = 64, clone_projectors: bool = True,
                 train_parts: list[str] | None = None, task_names: list[str] | None = None,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        self.encoder, self.language_model = encoder, language_model
        depth = int(encoder.num_layers)
        final = depth
        layers = list(pclm_layers) if (pclm and pclm_layers) else [final]
        bad = [i for i in layers if not isinstance(i, int) or i < 0 or i > depth]
        if bad:
            raise UserInputError(f"pclm_layers={list(pclm_layers or [])}: layer index {bad[0]} is beyond the encoder's "
                                 f"depth ({depth} layers: valid hidden-state indices are 0..{depth}, {depth} = final).")
        if final not in layers:
            layers.append(final)
        if len(set(layers)) != len(layers):
            raise UserInputError(f"pclm_layers={layers} repeats a layer.")
        self.layers, self.final_layer, self.pclm = layers, final, pclm
        check_range("pool_stride", pool_stride, low=1)
        self.pool_stride = pool_stride
        self.projector = nn.Sequential(nn.Linear(encoder.width, projector_hidden), nn.GELU(),
                                       nn.Linear(projector_hidden, language_model.width))
        self.layer_projectors = nn.ModuleDict(
            {str(i): copy.deepcopy(self.projector) for i in layers if i != final} if pclm else {})
        self.mixer = None
        if pclm:
            self.mixer = nn.Sequential(nn.Linear(language_model.width, mixer_hidden), nn.GELU(),
                                       nn.Linear(mixer_hidden, len(layers)))
            nn.init.zeros_(self.mixer[-1].weight)
            nn.init.zeros_(self.mixer[-1].bias)
        parts = list(train_parts) if train_parts is not None else ["projector", "language_model"]
        unknown = [p for p in parts if p not in PARTS] + (["mixer"] if "mixer" in parts and not pclm else [])
        if unknown or not parts:
            raise UserInputError(f"train_parts={parts}: choose a non-empty subset of {list(PARTS)} ('mixer' only with "
                                 "pclm: true).")
        self.train_parts = parts
        self.clone_projectors = clone_projectors
        self.task_names = list(task_names) if task_names else ["pitch", "speed", "gender", "volume"]
        self._apply_freezing()
        self._build_metrics()

    # ----------------------------------------------------------------------------- set-up
    def _groups(self) -> dict[str, list[nn.Module]]:
        return {"encoder": [self.encoder], "projector": [self.projector, self.layer_projectors],
                "mixer": [self.mixer] if self.mixer is not None else [], "language_model": [self.language_model]}

    def _apply_freezing(self) -> None:
        for name, modules in self._groups().items():
            for module in modules:
                module.requires_grad_(name in self.train_parts)

    def _build_metrics(self) -> None:
        names = self.task_names
        self.acc_gt = nn.ModuleDict({s: OptionAgreement(names) for s in ("val", "test")})
        self.ala = nn.ModuleDict({s: OptionAgreement(names) for s in ("val", "test")})
        self.alpha_by_task = MixingWeights(len(names), len(self.layers))

    def setup(self, stage: str) -> None:
        names = self.data(SpokenQuestionData).task_names
        if names is not None and list(names) != self.task_names:
            self.task_names = list(names)
            self._build_metrics()
        vocab = self.data(SpokenQuestionData).vocab_size
        if vocab is not None and vocab > self.language_model.vocab_size:
            raise UserInputError(_vocabulary_message(vocab, self.language_model))
        rate = self.data(SpokenQuestionData).sample_rate
        if rate is not None and rate != self.encoder.sample_rate:
            raise UserInputError(f"the data is sampled at {rate} Hz but the encoder expects "
                                 f"{self.encoder.sample_rate} Hz.")
        super().setup(stage)

    def load_initial_weights(self):
        report = super().load_initial_weights()
        if self.pclm and self.clone_projectors:
            loaded = set(report["loaded"])
            cloned = []
            for layer, projector in self.layer_projectors.items():
                if not any(k.startswith(f"layer_projectors.{layer}.") for k in loaded):
                    projector.load_state_dict(self.projector.state_dict())
                    cloned.append(layer)
            log.warning("PCLM: per-layer projectors %s cloned from the loaded final-layer projector", cloned)
            report["cloned_projectors"] = cloned
        return report

    def configure_model(self) -> None:
        """FSDP2 under Lightning's ``ModelParallelStrategy`` (configs/trainer/fsdp.yaml): every transformer block,
        then the root, of the language model (its ``embed`` and ``logits`` registered as forward methods) and of
        the encoder; the projectors and the mixer as units of their own. A part left unsharded under this strategy
        would not have its gradients averaged over the ranks. Nothing happens under any other strategy."""
        mesh = sharding_mesh(self._trainer, type(self).__name__, generates=False)
        if mesh is None:
            return
        for language_model in self.sharded_language_models():
            fully_shard_model(language_model, mesh, forward_methods=("embed", "logits"))
        fully_shard_model(self.encoder, mesh)
        for part in (self.projector, *self.layer_projectors.values(), self.mixer):
            if part is not None:
                fully_shard_model(part, mesh)

    def sharded_language_models(self) -> list[nn.Module]:
        """The language models `configure_model` shards (DPO adds its frozen reference)."""
        return [self.language_model]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        picklable_hyperparameters(checkpoint)

    def train(self, mode: bool = True):
        """Frozen encoder always in eval mode (no dropout), whatever Lightning switches."""
        super().train(mode)
        if "encoder" not in self.train_parts:
            self.encoder.eval()
        return self

    # ----------------------------------------------------------------------------- forward
    def layer_states(self, batch: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        with torch.set_grad_enabled(torch.is_grad_enabled() and "encoder" in self.train_parts):
            return self.encoder(batch["waveform"], batch["wave_lengths"])

    def mixing_weights(self, prompt: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """alpha = softmax(MLP(e_prompt)) [B, |L|], e_prompt = masked mean of the prompt's token embeddings."""
        embedding = masked_mean(self.language_model.embed(prompt).detach(), prompt_mask)
        return self.mixer(embedding).softmax(-1)

    def audio_tokens(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        states, mask = self.layer_states(batch)
        projected = []
        for layer in self.layers:
            pooled, pooled_mask = masked_pool(states[layer], mask, self.pool_stride)
            projector = self.projector if layer == self.final_layer else self.layer_projectors[str(layer)]
            projected.append(projector(pooled))
        alpha = None
        if self.pclm:
            alpha = self.mixing_weights(batch["prompt"], batch["prompt_mask"])
            tokens = torch.einsum("bl,lbtd->btd", alpha, torch.stack(projected))
        else:
            tokens = projected[0]
        return tokens * pooled_mask[..., None], pooled_mask, alpha

    def option_logprobs(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(option | prompt, audio) over each question's options [B, K] (-inf at padded options), alpha."""
        options = batch["options"]
        valid = options >= 0
        if not bool(valid.any(-1).all()):
            raise UserInputError("a question has no options: every prompt needs at least one option to score.")
        top = max(int(batch["prompt"].max()), int(options.max()))
        if top >= self.language_model.vocab_size:      # an embedding lookup would fail (a device assert on GPU)
            raise UserInputError(_vocabulary_message(top + 1, self.language_model, seen=True))
        tokens, audio_mask, alpha = self.audio_tokens(batch)
        prompt = self.language_model.embed(batch["prompt"])
        hidden = self.language_model(torch.cat([prompt, tokens], 1), torch.cat([batch["prompt_mask"], audio_mask], 1))
        last = batch["prompt"].shape[1] + audio_mask.long().sum(1) - 1      # prompts are left-padded
        final = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        logits = self.language_model.logits(final).gather(1, options.clamp(min=0))
        return logits.masked_fill(~valid, float("-inf")).log_softmax(-1), alpha

    def forward(self, batch: dict) -> torch.Tensor:
        return self.option_logprobs(batch)[0]

    # ----------------------------------------------------------------------------- steps
    def training_step(self, batch, batch_idx):
        logprobs, _ = self.option_logprobs(batch)
        loss = F.nll_loss(logprobs, batch["label"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["label"]))
        return loss

    def _evaluate(self, batch: dict, split: str) -> None:
        logprobs, alpha = self.option_logprobs(batch)
        prediction = logprobs.argmax(-1)
        self.log(f"{split}/loss", F.nll_loss(logprobs, batch["label"]), batch_size=len(prediction), sync_dist=True)
        self.acc_gt[split].update(prediction, batch["label"], batch["task"])
        self.ala[split].update(prediction, batch.get("adv_options", batch["adv_label"]), batch["task"])
        if alpha is not None and split == "test":
            self.alpha_by_task.update(alpha, batch["task"])

    def _log_epoch(self, split: str) -> None:
        for name, metric in (("acc_gt", self.acc_gt[split]), ("ala", self.ala[split])):
            if int(metric.total.sum()) == 0:
                metric.reset()
                continue
            values = metric.compute()
            self.log(f"{split}/{name}", values["all"], prog_bar=split == "val")
            for task, value in values.items():
                if task != "all":
                    self.log(f"{split}/{name}/{task}", value)
            metric.reset()
        if split == "test" and self.pclm and float(self.alpha_by_task.counts.sum()) > 0:
            table = self.alpha_by_task.compute()
            for t, task in enumerate(self.task_names):
                if self.alpha_by_task.counts[t] > 0:
                    for j, layer in enumerate(self.layers):
                        self.log(f"test/alpha/{task}/layer{layer}", table[t, j])
            self.alpha_by_task.reset()

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        logprobs, alpha = self.option_logprobs(batch)
        out = {"option_probs": logprobs.exp(), "prediction": logprobs.argmax(-1)}
        if alpha is not None:
            out["alpha"] = alpha
        return out

    def prediction_fields(self, outputs, batch) -> dict:
        """Per question: task name, chosen option (index among its options) and its probability, the acoustic
        answer (``label``) and the transcript's (``adv_label``, -1 unknown), ``correct`` and
        ``follows_transcript``, then every option's probability and (PCLM) the layer weights ``alpha``."""
        probs, chosen = outputs["option_probs"], outputs["prediction"]
        label, adv = batch["label"].to(chosen.device), batch["adv_label"].to(chosen.device)
        names = self.task_names
        fields = {"task": [names[t] if 0 <= t < len(names) else "unknown" for t in batch["task"].tolist()],
                  "chosen": chosen, "chosen_prob": probs.gather(1, chosen[:, None]).squeeze(1),
                  "label": label, "adv_label": adv, "correct": (chosen == label).long(),
                  "follows_transcript": ((chosen == adv) & (adv >= 0)).long(), "option_probs": probs}
        if "adv_options" in batch:        # every adversarial label (the VoxParadox release may list several)
            fields["follows_transcript"] = batch["adv_options"].to(chosen.device).gather(
                1, chosen[:, None]).squeeze(1).long()
        if "id" in batch:                 # the release: its question id, the chosen and the adversarial texts
            texts = batch["option_texts"]
            fields["id"] = list(batch["id"])
            fields["chosen_text"] = [texts[i][c] for i, c in enumerate(chosen.tolist())]
            fields["adversarial_labels"] = [[texts[i][k] for k in row.nonzero().flatten().tolist()]
                                            for i, row in enumerate(batch["adv_options"])]
        if "alpha" in outputs:
            fields["alpha"] = outputs["alpha"]
        return fields
