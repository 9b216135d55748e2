"""DPO on top of a PCLM audio language model (VoxParadox, Pang, Chaubey & Soleymani, arXiv 2605.27772).

After PCLM's two SFT stages the paper runs Direct Preference Optimisation (Rafailov et al., 2023) with the
encoder, projectors and mixer frozen and only the LLM updated; policy and frozen reference both start from the
stage-2 checkpoint (here: ``init_from``), beta = 0.1, lr 5e-7 (Qwen2-Audio / AF3), and pairs built from the
paralinguistic training questions (not VoxParadox): the chosen answer is the acoustically correct option, the
rejected one a random wrong option. Loss, per question x with chosen y+ and rejected y-:

    L = -log sigmoid(beta * [(log pi(y+|x) - log ref(y+|x)) - (log pi(y-|x) - log ref(y-|x))])

where log pi(y|x) is the option's log-probability under the same prompt and audio (log-softmax over the
question's options, `AudioLanguageModel.option_logprobs`).

``negatives: adversarial`` is an extra variant, not in the paper, with harder negatives: the rejected option is
the one the transcript asserts (``adv_label``) when it differs from the truth, else a random wrong option;
``train/adversarial_negative_share`` logs how often it applied. The data must contain questions whose transcript
contradicts the acoustics for this to differ from ``random`` (``incongruent_fraction`` of the datamodule;
configs/pclm/dpo_quick.yaml).

Why the loss is written here and not taken from TRL: TRL's DPO loss lives inside ``DPOTrainer`` (a
transformers ``Trainer`` over tokenised chosen/rejected *sequences* with its own data collator and reference
handling), not as a standalone function of four log-probabilities, and ``trl`` would add accelerate/datasets
pins to the base install for three lines of arithmetic. `dpo_loss` is pinned against a hand-computed value in
tests/test_pclm.py.

The reference is a frozen copy of the language model only (``reference_language_model``): the encoder,
projectors and mixer are frozen in DPO, so the reference's audio tokens are the policy's. It is copied from the
policy after ``init_from`` is loaded unless the checkpoint already had one (continuing a DPO run).

Fully sharded training (FSDP2 through Lightning's ``ModelParallelStrategy``, configs/trainer/fsdp.yaml; fsdp_cpu.yaml
for 2 CPU processes): `AudioLanguageModel.configure_model` shards every stage, and DPO adds its frozen reference,
sharded like the policy's language model. The random wrong option of ``negatives: random`` is drawn from each rank's own
generator, so a sharded run rejects other (equally random) options than one process does; with two options per
question, or ``negatives: adversarial`` on incongruent questions, the pairs and the update are the same.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.pclm.audio_language_model import AudioLanguageModel
from lightning_modules.shared.errors import UserInputError, check_range


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, reference_chosen: torch.Tensor,
             reference_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean sigmoid DPO loss and the per-example implicit reward margin beta * (Δchosen - Δrejected)."""
    margin = beta * ((policy_chosen - reference_chosen) - (policy_rejected - reference_rejected))
    return -F.logsigmoid(margin).mean(), margin


def pick_negatives(label: torch.Tensor, adv_label: torch.Tensor, valid: torch.Tensor, mode: str,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejected option per question: a uniformly random wrong valid option, or (``adversarial``) the transcript's
    option where it is a wrong one. Returns (indices [B], whether the adversarial option was used [B])."""
    wrong = valid.clone()
    wrong[torch.arange(len(label)), label] = False
    if not bool(wrong.any(-1).all()):
        raise UserInputError("DPO needs at least one wrong option per question to reject; a question has only its "
                             "correct option.")
    scores = torch.rand(wrong.shape, generator=generator, device="cpu").to(wrong.device)
    random_pick = scores.masked_fill(~wrong, -1.0).argmax(-1)
    use_adv = torch.zeros_like(label, dtype=torch.bool)
    if mode == "adversarial":
        use_adv = (adv_label >= 0) & (adv_label != label)
    return torch.where(use_adv, adv_label.clamp(min=0), random_pick), use_adv


class AudioDPO(AudioLanguageModel):
    """DPO of the language model of an `AudioLanguageModel` (PCLM or not) against a frozen reference copy.

    Args (beyond `AudioLanguageModel`'s):
        beta: DPO temperature (paper: 0.1).
        negatives: ``random`` (paper: a random wrong option) or ``adversarial`` (the transcript-asserted option).
        sft_weight: optional weight of the NLL of the chosen option added to the loss (0 = plain DPO, the paper).
    """

    def __init__(self, encoder: nn.Module, language_model: nn.Module, pclm: bool = True,
                 pclm_layers: list[int] | None = None, projector_hidden: int = 128, pool_stride: int = 2,
                 mixer_hidden: int = 64, clone_projectors: bool = True, train_parts: list[str] | None = None,
                 task_names: list[str] | None = None, beta: float = 0.1, negatives: str = "random",
                 sft_weight: float = 0.0, optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False) -> None:
        super().__init__(encoder, language_model, pclm, pclm_layers, projector_hidden, pool_stride, mixer_hidden,
                         clone_projectors, train_parts if train_parts is not None else ["language_model"],
                         task_names, optimizer, lr_scheduler, init_from, init_from_trusted)
        check_range("beta", beta, low=0.0, low_inclusive=False)
        check_range("sft_weight", sft_weight, low=0.0)
        if negatives not in ("random", "adversarial"):
            raise UserInputError(f"negatives={negatives!r}: choose 'random' (the paper) or 'adversarial'.")
        self.beta, self.negatives, self.sft_weight = beta, negatives, sft_weight
        self.reference_language_model = copy.deepcopy(self.language_model).requires_grad_(False)

    def load_initial_weights(self):
        report = super().load_initial_weights()
        if not any(k.startswith("reference_language_model.") for k in report["loaded"]):
            self.reference_language_model.load_state_dict(self.language_model.state_dict())
        return report

    def train(self, mode: bool = True):
        super().train(mode)
        self.reference_language_model.eval()
        return self

    def sharded_language_models(self) -> list[nn.Module]:
        """Under FSDP2 the frozen reference is sharded like the policy (`AudioLanguageModel.configure_model`)."""
        return [self.language_model, self.reference_language_model]

    def reference_logprobs(self, batch: dict) -> torch.Tensor:
        """Option log-probabilities of the frozen reference under the same prompt and audio."""
        policy_lm = self.language_model
        try:
            self.language_model = self.reference_language_model
            with torch.no_grad():
                return self.option_logprobs(batch)[0]
        finally:
            self.language_model = policy_lm

    def training_step(self, batch, batch_idx):
        logprobs, _ = self.option_logprobs(batch)
        reference = self.reference_logprobs(batch)
        label = batch["label"]
        rejected, used_adv = pick_negatives(label, batch["adv_label"], batch["options"] >= 0, self.negatives)
        rows = torch.arange(len(label), device=label.device)
        loss, margin = dpo_loss(logprobs[rows, label], logprobs[rows, rejected], reference[rows, label],
                                reference[rows, rejected], self.beta)
        if self.sft_weight:
            loss = loss + self.sft_weight * F.nll_loss(logprobs, label)
        size = len(label)
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        self.log("train/reward_margin", margin.mean(), batch_size=size)
        self.log("train/reward_accuracy", (margin > 0).float().mean(), batch_size=size)
        self.log("train/adversarial_negative_share", used_adv.float().mean(), batch_size=size)
        return loss
