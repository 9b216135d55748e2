"""CauSciBench agents as a LightningModule: choose a method and variables for a causal query, estimate, score.

Paper: "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research?" (Acharya, Zhang, Kim,
..., Schoelkopf, Jin; ICML 2026, PMLR v306; no arXiv id; data and code github.com/causalNLP/CauSciBench, agent and
synthetic generators github.com/causalNLP/causal-agent). The benchmark gives an agent a question about a
scientific data file; the agent must pick an identification strategy (RCT difference in means, backdoor
adjustment, IV, RDD, DiD, front-door, ...), the variables, and report an effect. Its finding: models are worse on
real than on synthetic tasks, and method selection is the bottleneck (models default to simpler methods).

`CausalInferenceAgent` answers each test query (a dict of `datamodules.causal_queries`) in its test step with one
of these agents (``agent``):

* ``oracle``: the reference method and variables (validates the data and the estimators: near-zero error on
  synthetic queries);
* ``rule-based``: the design variables the query names decide (running variable -> rdd, instrument -> iv,
  mediator -> frontdoor, time and group -> did), else a randomisation cue in the text (random..., lottery,
  coin flip, controlled trial) -> ols, else propensity-score matching. It reads the query's role fields (the benchmark's
  ``running_var``, ``instrument_var``, ... columns), so it knows the design variables: an upper reference for a
  selector that reads text only;
* ``forced-ols``: OLS of the outcome on the treatment with every other numeric column of the data file as a control
  (the default the paper reports models falling back to; it keeps a multi-arm query's arm and, being the naive
  baseline, ignores the design variables, the interaction included);
* ``learned``: a small MLP over `datamodules.causal_queries.query_features` (hashed question and description
  words, column-name words, data structure; never the roles), trained in ``fit`` with cross-entropy on synthetic
  queries; its method runs with the query's variables;
* ``llm``: a causal LM from a local folder (`lightning_modules.shared.tiny_gpt.HFCausalLM`, tokenizer in the same
  folder), prompted with the description, the columns and the question, greedy decoding; the first method label or
  synonym in its reply is the method, variables as for ``learned``. A reply without a label is a failure.

Scoring (per query, averaged; torchmetrics means, so they accumulate across batches and processes):
``method_acc`` = chosen method == reference label (closed set of
`lightning_modules.causcibench.causal_estimators.METHODS`); relative error ``|est - ref| / |ref|``, with the guard: when
``|ref| < near_zero`` the absolute error is used; ``mre`` caps each error at ``error_cap`` (default 1, i.e. 100 %) and
counts a failure (a method whose variables the query lacks, an estimator error, an unparsable LLM reply) as error 1;
``mre_uncapped`` the same without cap; ``failure_rate``. The paper reports MRE and method-selection accuracy; its
handling of failures and caps is not stated, so these are our documented choices (configurable).

Predictions (``train.py predict``): every test query answered as in ``test``, one JSONL row each: query name,
design, chosen and reference method, effect estimate (null on failure) and reference effect, relative errors
(capped and uncapped), the failure message and, for the learned selector, its method probabilities.

Deviations: the paper's agents choose the variables themselves; here every agent but forced OLS uses the query's
variables, and an agent whose method is the query's reference method also runs it as the query's ``spec`` fixes
(e.g. the benchmark's RDD window and polynomial order), so what is compared is the method choice (the paper's
bottleneck). No standard errors are scored.
"""
from __future__ import annotations

import math
import re
import warnings

import torch
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.causcibench.causal_estimators import (METHODS, SYNONYMS, EstimationError, Roles, estimate,
                                                 normalise_method)
from lightning_modules.shared.errors import UserInputError, check_range

AGENTS = ("oracle", "rule-based", "forced-ols", "learned", "llm")
RANDOM_CUE = re.compile(r"\b(random\w*|lottery|coin flip|controlled trial)\b", re.IGNORECASE)
METHOD_HELP = {"ols": "randomized experiment: difference in means or OLS with controls",
               "regression_adjustment": "observational data, adjust for covariates by regression",
               "matching": "observational data, propensity score matching on covariates",
               "ipw": "observational data, inverse probability weighting",
               "did": "difference in differences: treated and control groups before and after",
               "iv": "instrumental variable (two-stage least squares)",
               "rdd": "regression discontinuity: treatment assigned by a cutoff of a running variable",
               "frontdoor": "front-door adjustment through a mediator",
               "glm": "generalised linear model (logit/probit) for a binary outcome"}


def rule_based_method(query: dict) -> str:
    """The rule-based selector (see the module docstring)."""
    roles = query["roles"]
    if roles.get("running"):
        return "rdd"
    if roles.get("instrument"):
        return "iv"
    if roles.get("mediator"):
        return "frontdoor"
    if roles.get("time") and roles.get("group"):
        return "did"
    if RANDOM_CUE.search(f"{query['query']} {query['description']}"):
        return "ols"
    return "matching"


def parse_method(reply: str) -> str | None:
    """The first method label or synonym in an LLM reply (longest match at the earliest position), else None."""
    text = re.sub(r"[\s_\-]+", " ", reply.lower())
    best = None
    for synonym in sorted(SYNONYMS, key=len, reverse=True):
        match = re.search(rf"\b{re.escape(synonym)}\b", text)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), SYNONYMS[synonym])
    return None if best is None else best[1]


def relative_error(estimate_value: float | None, reference: float, near_zero: float = 1e-8,
                   cap: float | None = 1.0) -> float:
    """``|est - ref| / |ref|`` (absolute error when ``|ref| < near_zero``), capped at ``cap``; None -> 1."""
    if estimate_value is None or not math.isfinite(estimate_value):
        return 1.0
    error = abs(estimate_value - reference) / (abs(reference) if abs(reference) >= near_zero else 1.0)
    return min(error, cap) if cap is not None else error


class CausalInferenceAgent(PaperModule):
    """Answer causal queries with one of `AGENTS`; ``fit`` trains the learned method selector.

    Args:
        agent: ``oracle``, ``rule-based``, ``forced-ols``, ``learned`` or ``llm`` (only ``learned`` trains).
        input_dim: size of the query features (``text_buckets + column_buckets + 8`` of the datamodule).
        hidden_dim / dropout: the selector MLP.
        error_cap: cap of each query's relative error in ``mre`` (None: no cap).
        near_zero: below this |reference| the absolute error is scored instead of the relative one.
        rdd_bandwidth: triangular-kernel bandwidth of the RDD estimator (None: the query's own specification,
            else every row with uniform weights); it overrides the bandwidth and kernel a query fixes.
        llm_path: local folder of the LLM agent (weights and tokenizer, ``save_pretrained``).
        llm_dtype: its dtype (see `HFCausalLM`); max_new_tokens: the reply length.
    """

    def __init__(self, agent: str = "learned", input_dim: int = 584, hidden_dim: int = 64, dropout: float = 0.1,
                 error_cap: float | None = 1.0, near_zero: float = 1e-8, rdd_bandwidth: float | None = None,
                 llm_path: str | None = None, llm_dtype: str = "float32", max_new_tokens: int = 12,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        if agent not in AGENTS:
            raise UserInputError(f"agent={agent!r}; choose one of {list(AGENTS)}.")
        if agent == "llm" and not llm_path:
            raise UserInputError("agent=llm needs llm_path, a local folder with the model and its tokenizer.")
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        check_range("near_zero", near_zero, 0.0)
        if error_cap is not None:
            check_range("error_cap", error_cap, 0.0, low_inclusive=False)
        if rdd_bandwidth is not None:
            check_range("rdd_bandwidth", rdd_bandwidth, 0.0, low_inclusive=False)
        for name, value in (("input_dim", input_dim), ("hidden_dim", hidden_dim), ("max_new_tokens", max_new_tokens)):
            if int(value) < 1:
                raise UserInputError(f"{name}={value} must be at least 1.")
        self.save_hyperparameters()
        self.selector = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Dropout(dropout),
                                      nn.Linear(hidden_dim, len(METHODS)))
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(len(METHODS), average="micro")
        self.test_means = nn.ModuleDict({k: torchmetrics.MeanMetric() for k in
                                         ("method_acc", "mre", "mre_uncapped", "failure_rate")})
        self.records: list[dict] = []  # per answered query, in this process (the experiment reads them)
        self._llm = None

    # ----------------------------------------------------------------------------- the learned selector
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] != self.hparams.input_dim:
            raise UserInputError(f"query features have {features.shape[-1]} entries but input_dim="
                                 f"{self.hparams.input_dim}; set input_dim to text_buckets + column_buckets + 8 of "
                                 "the datamodule.")
        return self.selector(features)

    def on_fit_start(self) -> None:
        if self.hparams.agent != "learned":
            raise UserInputError(f"agent={self.hparams.agent!r} has nothing to train; run `test` (only the "
                                 "learned selector is fitted).")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        loss = nn.functional.cross_entropy(self(features), labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(labels))
        return loss

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.log("val/loss", nn.functional.cross_entropy(logits, labels), sync_dist=True, batch_size=len(labels))
        self.val_acc(logits, labels)
        self.log("val/method_acc", self.val_acc, batch_size=len(labels))

    def on_predict_start(self) -> None:
        self.records = []

    def predict_step(self, batch, batch_idx):
        """Selector batches ``(features, labels)``: the method probabilities. Query batches (the predict loader):
        each query answered as in `test_step` (its record, failure message included, appended to ``records``):
        chosen method index (-1: none), ``failed``, estimate (0 where failed), reference, capped and uncapped
        relative error and, for the learned selector, the method probabilities."""
        if isinstance(batch, (list, tuple)) and isinstance(batch[0], torch.Tensor):
            return {"method_probs": self(batch[0].to(self.device)).softmax(-1)}
        records = [self.answer(query) for query in batch]
        self.records.extend(records)
        out = {"method": torch.tensor([METHODS.index(r["method"]) if r["method"] in METHODS else -1 for r in records]),
               "failed": torch.tensor([r["estimate"] is None for r in records]),
               "estimate": torch.tensor([0.0 if r["estimate"] is None else r["estimate"] for r in records],
                                        dtype=torch.float64),
               "reference": torch.tensor([r["reference"] for r in records], dtype=torch.float64),
               "error": torch.tensor([r["error"] for r in records], dtype=torch.float64),
               "error_uncapped": torch.tensor([r["error_uncapped"] for r in records], dtype=torch.float64)}
        if self.hparams.agent == "learned":
            out["method_probs"] = self(torch.stack([q["features"] for q in batch]).to(self.device)).softmax(-1)
        return out

    def prediction_fields(self, outputs, batch) -> dict:
        """One row per query: name, design, method and reference method, estimate (None on failure), reference,
        errors, failure message ("" when none) and the learned selector's method probabilities."""
        if "method" not in outputs:
            return dict(outputs)
        records = self.records[-len(batch):]
        if [r["name"] for r in records] != [q["name"] for q in batch]:
            raise RuntimeError("prediction_fields must follow the predict_step of the same batch.")
        fields = {"query": [q["name"] for q in batch], "design": [q["design"] for q in batch],
                  "method": [r["method"] or "" for r in records],
                  "reference_method": [r["reference_method"] for r in records],
                  "estimate": [r["estimate"] for r in records], "reference": outputs["reference"],
                  "error": outputs["error"], "error_uncapped": outputs["error_uncapped"],
                  "failure": [r["failure"] or "" for r in records]}
        if "method_probs" in outputs:
            fields["method_probs"] = outputs["method_probs"]
        return fields

    # ----------------------------------------------------------------------------- answering queries
    def choose(self, query: dict) -> tuple[str | None, Roles]:
        """(method or None when the agent gave no usable answer, variables) for one query."""
        given = {k: v for k, v in query["roles"].items()}
        roles = Roles(**given)
        agent = self.hparams.agent
        if agent == "oracle":
            return query["method"], roles
        if agent == "rule-based":
            return rule_based_method(query), roles
        if agent == "forced-ols":  # design columns built from the query's formula terms are not the file's columns
            named = {roles.treatment, roles.outcome, *query.get("derived_columns", ())}
            numeric = query["data"].select_dtypes("number").columns
            return "ols", Roles(treatment=roles.treatment, outcome=roles.outcome, treatment_arm=roles.treatment_arm,
                                controls=[c for c in numeric if c not in named])
        if agent == "learned":
            with torch.no_grad():
                logits = self(query["features"].to(self.device)[None])
            return METHODS[int(logits.argmax(-1))], roles
        return self.ask_llm(query), roles

    def answer(self, query: dict) -> dict:
        """Choose, estimate and score one query; returns its record."""
        method, roles = self.choose(query)
        value, failure = None, None
        if method is None:
            failure = "no method in the reply"
        else:
            try:
                with warnings.catch_warnings():
                    if self.hparams.agent == "forced-ols":
                        # forced OLS controls for every numeric column by design, so collinear designs (and no
                        # residual degrees of freedom) are expected: statsmodels notes the rank deficiency and
                        # divides by zero in the robust standard error, once per query, and only the point estimate
                        # is scored. The other agents' regressions keep these warnings.
                        from statsmodels.tools.sm_exceptions import SingularMatrixWarning
                        warnings.filterwarnings("ignore", category=SingularMatrixWarning)
                        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"statsmodels\.")
                    spec = query.get("spec") if method == query["method"] else None  # written for that method
                    value = estimate(method, query["data"], roles, rdd_bandwidth=self.hparams.rdd_bandwidth,
                                     spec=spec).effect
            except EstimationError as err:
                failure = str(err)
        reference = float(query["effect"])
        return {"name": query["name"], "design": query["design"], "reference_method": query["method"],
                "method": method, "estimate": value, "reference": reference, "failure": failure,
                "method_correct": float(method == query["method"]),
                "error": relative_error(value, reference, self.hparams.near_zero, self.hparams.error_cap),
                "error_uncapped": relative_error(value, reference, self.hparams.near_zero, None)}

    def on_test_start(self) -> None:
        self.records = []

    def test_step(self, batch, batch_idx):
        for query in batch:
            record = self.answer(query)
            self.records.append(record)
            for key, value in (("method_acc", record["method_correct"]), ("mre", record["error"]),
                               ("mre_uncapped", record["error_uncapped"]),
                               ("failure_rate", float(record["failure"] is not None))):
                self.test_means[key].update(torch.tensor(value, dtype=torch.float32, device=self.device))
        for key, metric in self.test_means.items():
            self.log(f"test/{key}", metric, batch_size=len(batch))

    # ----------------------------------------------------------------------------- the LLM agent
    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.hparams.agent == "llm" and stage in ("test", "predict") and self._llm is None:
            self._llm = self.load_llm()

    def load_llm(self):
        from transformers import AutoTokenizer

        from lightning_modules.shared.tiny_gpt import HFCausalLM

        model = HFCausalLM(path=self.hparams.llm_path, dtype=self.hparams.llm_dtype).eval().requires_grad_(False)
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.hparams.llm_path, local_files_only=True)
        except (OSError, ValueError) as err:
            raise UserInputError(f"no tokenizer in {self.hparams.llm_path}: {err}; save it there with "
                                 "tokenizer.save_pretrained(path).") from None
        return model, tokenizer

    @staticmethod
    def prompt(query: dict) -> str:
        methods = "\n".join(f"- {m}: {text}" for m, text in METHOD_HELP.items())
        columns = ", ".join(map(str, query["columns"][:60]))
        return ("You are an expert in causal inference. Choose the estimation method for the question.\n"
                f"Methods:\n{methods}\nDataset: {query['description']}\nColumns: {columns}\n"
                f"Question: {query['query']}\nReply with the method name only.\nMethod:")

    @torch.no_grad()
    def ask_llm(self, query: dict) -> str | None:
        if self._llm is None:
            self._llm = self.load_llm()
        model, tokenizer = self._llm
        model.to(self.device)
        ids = tokenizer(self.prompt(query), return_tensors="pt")["input_ids"].to(self.device)
        limit = model.context_length
        if limit is not None:
            ids = ids[:, -(int(limit) - self.hparams.max_new_tokens):]
        prompt_length = ids.shape[1]
        for _ in range(self.hparams.max_new_tokens):  # greedy decoding
            logits, _ = model(ids)
            next_id = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
            if tokenizer.eos_token_id is not None and int(next_id) == tokenizer.eos_token_id:
                break
        reply = tokenizer.decode(ids[0, prompt_length:], skip_special_tokens=True)
        return parse_method(reply)


__all__ = ["AGENTS", "CausalInferenceAgent", "normalise_method", "parse_method", "relative_error",
           "rule_based_method"]
