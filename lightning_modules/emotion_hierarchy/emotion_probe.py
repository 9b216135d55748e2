"""Emotion hierarchies read out of a causal language model's next-token distribution.

Paper: "Emergence of Hierarchical Emotion Organization in Large Language Models" (Bo Zhao, Maya Okawa, Eric J.
Bigelow, Rose Yu, Tomer Ullman, Ekdeep Singh Lubana, Hidenori Tanaka; ICML 2026; arXiv 2507.10599). Official
code: github.com/phys-ai/Emotion-Hierarchy-LLMs (``emotion_tree_construction.py``, ``emotion_tree_get_logits.py``).

Method. Each scenario is followed by a probe prompt ("... The emotion in this sentence is", optionally voiced by
a persona); the model's softmax over the next token is read at the last position. Tree (as the official code
builds it): take the top-100 tokens; keep those whose decoded, stripped string is an emotion word (single-token
words only); renormalise their probabilities to sum to 1 (p). For every pair (A, B) of emotion words *within the
top-20 tokens*, add p_A p_B to the symmetric co-occurrence C[A, B] and C[B, A] (no diagonal). Over all scenarios,
with f_A = sum_B C[A, B] and P(B | A) = C[A, B] / f_A, B is a parent of A iff P(B | A) > t and P(A | B) < P(B | A)
(t = 0.3). The result is a DAG (several parents are possible; the second condition orders every edge by f, so
there are no cycles). Tree metrics: number of edges, total path length (sum over ordered node pairs of the
directed shortest-path length, networkx's ``all_pairs_shortest_path_length``), average depth (mean length of all
root-to-leaf paths), and group purity (the fraction of edges whose two words share a Shaver basic category; the
paper compares with the Shaver wheel by colour only, this number is this collection's summary of that figure).
Recognition (the paper's persona experiments): the prediction is the most probable emotion word among the top-100
tokens; accuracy at the fine level (the exact word) and at the basic level (its Shaver category), with the
fine and basic confusion matrices. ``confusion_pair: [fear, anger]`` also reports the rate at which scenarios of
the first basic category are recognised as the second (``planted_confusion``) and the mean renormalised
probability they put on it (``planted_confusion_mass``).

Implementation. The co-occurrence and the confusion counts are torchmetrics states summed over batches and
processes, so DDP evaluation equals one process. The module holds any causal LM at ``self.policy`` with the
collection's calling convention (`TinyGPT`, or `HFCausalLM` from a local folder), so an LM trained by
`lightning_modules.rlvr.sft.SupervisedWarmup` loads with ``init_from`` (weights matched by name and shape, for
test and predict too). The emotion words, their categories and the tokenizer come from the datamodule
(`EmotionWordData`); a word counts when ``encode(word)`` or ``encode(" " + word)`` is one token (both map to the
word, as decoding and stripping does in the official code; their probabilities are summed). The tree drawn with a
layered layout (depth = longest path from a root; colour = Shaver category) is saved as ``emotion_tree.png``
in the run folder and logged as a W&B image when a WandbLogger is attached; ``emotion_probe.json`` beside it
holds the edges and confusion matrices.

Deviations. ``tree_vocabulary: subordinate`` reproduces the official construction over the 129 subordinate words;
``all`` (default) also admits the 6 basic words, which the planted corpus needs (its parents are the basic words).
The paper's matrix notation (C = Y^T Y over all words) differs from the code (top-20 pairs, no diagonal); the code
is followed. Drawing uses matplotlib instead of graphviz ``dot``.
"""
from __future__ import annotations

import json
import logging
import os
from collections import deque
from typing import Any

import torch
from torch import nn
from torchmetrics import Metric

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import EmotionWordData
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------- tree math
def word_token_map(tokenizer, words: list[str], vocab: int) -> torch.Tensor:
    """[vocab] token id -> index of the emotion word it spells (-1: none); a word counts when ``encode(word)`` or
    ``encode(" " + word)`` is a single token (both map to the word, as decoding and stripping does)."""
    word_of_token = torch.full((vocab,), -1, dtype=torch.long)
    for i, word in enumerate(words):
        for variant in (word, " " + word):
            ids = tokenizer.encode(variant)
            if len(ids) == 1 and 0 <= ids[0] < vocab:
                word_of_token[ids[0]] = i
    return word_of_token


def emotion_distribution(probs: torch.Tensor, word_of_token: torch.Tensor, num_words: int, top_k: int = 100,
                         pair_k: int = 20, allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of next-token ``probs`` [B, V]: the renormalised emotion-word distribution [B, K] over the words
    among the ``top_k`` tokens (restricted to ``allowed`` words when given), and the mask [B, K] of words among
    the ``pair_k`` most probable tokens. ``word_of_token`` [V] maps token ids to word indices (-1: not a word)."""
    k = min(top_k, probs.shape[-1])
    top_p, top_i = probs.topk(k, dim=-1)
    words = word_of_token[top_i]                                           # [B, k]
    keep = words >= 0
    if allowed is not None:
        keep &= allowed[words.clamp(min=0)]
    index = words.clamp(min=0)
    mass = torch.zeros(probs.shape[0], num_words, dtype=probs.dtype, device=probs.device)
    mass.scatter_add_(1, index, torch.where(keep, top_p, torch.zeros_like(top_p)))
    total = mass.sum(-1, keepdim=True)
    dist = torch.where(total > 0, mass / total.clamp(min=torch.finfo(probs.dtype).tiny), mass)
    rank = torch.arange(k, device=probs.device).expand_as(words)
    hits = torch.zeros(probs.shape[0], num_words, dtype=torch.long, device=probs.device)
    in_pairs = hits.scatter_add_(1, index, (keep & (rank < pair_k)).long()) > 0
    return dist, in_pairs


def cooccurrence(dist: torch.Tensor, in_pairs: torch.Tensor) -> torch.Tensor:
    """Sum over rows of p_A p_B for every pair of distinct words both in the top-20: [K, K], zero diagonal."""
    z = dist * in_pairs.to(dist.dtype)
    c = z.T @ z
    return c - torch.diag(torch.diagonal(c))


def parent_edges(c: torch.Tensor, threshold: float = 0.3) -> list[tuple[int, int]]:
    """``(parent, child)`` pairs of the official rule: B parents A iff P(B|A) > t and P(A|B) < P(B|A)."""
    freq = c.sum(1)
    cond = c / freq.clamp(min=1e-300)[:, None]         # cond[A, B] = P(B | A)
    cond = torch.where(freq[:, None] > 0, cond, torch.zeros_like(cond))
    is_edge = (cond > threshold) & (cond.T < cond)      # [A, B]: P(B|A) > t and P(A|B) < P(B|A)
    return [(int(b), int(a)) for a, b in torch.nonzero(is_edge).tolist()]


def tree_metrics(edges: list[tuple[int, int]]) -> dict[str, float]:
    """Edges, total path length (sum of directed shortest-path lengths over reachable ordered pairs of the nodes
    that have an edge) and average depth (mean length of all root-to-leaf paths) of a DAG."""
    children: dict[int, list[int]] = {}
    has_parent = set()
    nodes = set()
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
        has_parent.add(child)
        nodes.update((parent, child))
    total = 0
    for source in nodes:  # BFS from every node
        seen, queue = {source: 0}, deque([source])
        while queue:
            node = queue.popleft()
            for nxt in children.get(node, ()):
                if nxt not in seen:
                    seen[nxt] = seen[node] + 1
                    queue.append(nxt)
        total += sum(seen.values())
    paths: dict[int, tuple[int, int]] = {}   # node -> (number of paths to a leaf, sum of their lengths)

    def count(node: int) -> tuple[int, int]:
        if node not in paths:
            below = [count(c) for c in children.get(node, ())]
            paths[node] = (1, 0) if not below else (sum(n for n, _ in below), sum(s + n for n, s in below))
        return paths[node]

    roots = [n for n in nodes if n not in has_parent]
    counted = [count(r) for r in roots]
    number = sum(n for n, _ in counted)
    return {"edges": float(len(edges)), "total_path_length": float(total),
            "avg_depth": float(sum(s for _, s in counted) / number) if number else 0.0}


def group_purity(edges: list[tuple[int, int]], category: list[int]) -> float:
    """Fraction of edges whose two words share a basic category (0 for an empty tree)."""
    if not edges:
        return 0.0
    return sum(category[p] == category[c] for p, c in edges) / len(edges)


def edge_recovery(edges: list[tuple[int, int]], reference: list[tuple[int, int]]) -> dict[str, float]:
    """Precision and recall of the recovered (parent, child) edges against a planted hierarchy."""
    found, truth = set(edges), set(map(tuple, reference))
    hit = len(found & truth)
    return {"edge_precision": hit / len(found) if found else 0.0, "edge_recall": hit / len(truth) if truth else 0.0}


class EmotionTreeMetric(Metric):
    """Accumulates the co-occurrence matrix (summed over batches and processes); ``compute`` returns it."""

    full_state_update = False

    def __init__(self, num_words: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("cooc", torch.zeros(num_words, num_words, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sentences", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("contributing", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, dist: torch.Tensor, in_pairs: torch.Tensor) -> None:
        self.cooc += cooccurrence(dist.double(), in_pairs)
        self.sentences += dist.shape[0]
        self.contributing += int(((dist > 0) & in_pairs).sum(-1).ge(2).sum())

    def compute(self) -> torch.Tensor:
        return self.cooc


class RecognitionMetric(Metric):
    """Confusion counts [K, K + 1] (true word x predicted word, last column: no emotion word in the top-100) and
    the renormalised probability mass per (true word, predicted word) [K, K]."""

    full_state_update = False

    def __init__(self, num_words: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("counts", torch.zeros(num_words, num_words + 1, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("mass", torch.zeros(num_words, num_words, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, dist: torch.Tensor, labels: torch.Tensor) -> None:
        labelled = labels >= 0
        if not labelled.any():
            return
        dist, labels = dist[labelled], labels[labelled]
        none = dist.sum(-1) <= 0
        pred = torch.where(none, torch.full_like(labels, dist.shape[1]), dist.argmax(-1))
        flat = labels * (dist.shape[1] + 1) + pred
        self.counts += torch.bincount(flat, minlength=self.counts.numel()).view_as(self.counts)
        self.mass.index_add_(0, labels, dist.double())

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.counts, self.mass


def recognition_summary(counts: torch.Tensor, mass: torch.Tensor, category: list[int], num_categories: int,
                        pair: tuple[int, int] | None = None) -> dict[str, Any]:
    """Fine and basic accuracy, the basic confusion matrix, and the planted-confusion rate/mass of ``pair``."""
    counts = counts.double()
    total = counts.sum()
    cat = torch.tensor(list(category) + [num_categories], dtype=torch.long)  # "none" -> its own column
    rows = torch.zeros(num_categories, counts.shape[1], dtype=torch.float64).index_add_(0, cat[:-1], counts)
    basic = torch.zeros(num_categories, num_categories + 1, dtype=torch.float64).index_add_(1, cat, rows)
    out: dict[str, Any] = {
        "labelled": float(total),
        "acc_fine": float(torch.diagonal(counts[:, :-1]).sum() / total) if total > 0 else 0.0,
        "acc_basic": float(torch.diagonal(basic[:, :-1]).sum() / total) if total > 0 else 0.0,
        "confusion_basic": basic,
    }
    if pair is not None:
        src, dst = pair
        row = basic[src]
        out["planted_confusion"] = float(row[dst] / row.sum()) if row.sum() > 0 else 0.0
        words_src = [i for i, c in enumerate(category) if c == src]
        words_dst = torch.tensor([i for i, c in enumerate(category) if c == dst], dtype=torch.long)
        n_src = counts[words_src].sum()
        out["planted_confusion_mass"] = float(mass[words_src][:, words_dst].sum() / n_src) if n_src > 0 else 0.0
    return out


# --------------------------------------------------------------------------------------------- drawing
def draw_tree(edges: list[tuple[int, int]], words: list[str], category: list[int], category_names: list[str],
              path: str, title: str = "") -> str:
    """Layered drawing of the DAG (depth = longest path from a root), nodes coloured by basic category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = sorted({n for e in edges for n in e})
    parents: dict[int, list[int]] = {n: [] for n in nodes}
    for p, c in edges:
        parents[c].append(p)
    depth: dict[int, int] = {}

    def level(n: int) -> int:
        if n not in depth:
            depth[n] = 0 if not parents[n] else 1 + max(level(p) for p in parents[n])
        return depth[n]

    layers: dict[int, list[int]] = {}
    for n in sorted(nodes, key=lambda n: (category[n], n)):
        layers.setdefault(level(n), []).append(n)
    position = {n: ((i + 1) / (len(layer) + 1), -d) for d, layer in layers.items() for i, n in enumerate(layer)}
    width = max([len(layer) for layer in layers.values()] + [4])
    fig, ax = plt.subplots(figsize=(min(2 + 0.9 * width, 40), 2 + 1.4 * max(len(layers), 1)))
    colours = plt.get_cmap("tab10")
    for p, c in edges:
        (x0, y0), (x1, y1) = position[p], position[c]
        ax.annotate("", xy=(x1, y1 + 0.08), xytext=(x0, y0 - 0.08),
                    arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8})
    for n, (x, y) in position.items():
        ax.text(x, y, words[n], ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "fc": colours(category[n] % 10), "alpha": 0.55})
    handles = [plt.Line2D([], [], marker="o", ls="", color=colours(i % 10), label=name)
               for i, name in enumerate(category_names)]
    ax.legend(handles=handles, loc="upper right", fontsize=7, frameon=False)
    ax.set_xlim(0, 1)
    ax.set_ylim(-max(len(layers), 1) + 0.5, 0.5)
    ax.set_axis_off()
    ax.set_title(title or f"emotion tree: {len(edges)} edges", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------- module
class EmotionProbe(PaperModule):
    """Probe a causal LM's emotion hierarchy and emotion recognition (``train.py test`` / ``predict``).

    Args:
        policy: the causal LM (`TinyGPT` or `HFCausalLM`; kept at ``self.policy``, as `SupervisedWarmup` keeps it).
        threshold: t of the parent rule.
        top_k, pair_k: tokens read (100) and tokens whose emotion words form pairs (20).
        tree_vocabulary: ``all`` words or only the ``subordinate`` ones (the official construction).
        confusion_pair: ``[source, target]`` basic categories whose confusion rate is reported (None: none).
        plot_dir: folder of ``emotion_tree.png`` / ``emotion_probe.json`` (default: the trainer's log dir).
        init_from: checkpoint whose matching weights are loaded before testing/predicting (e.g. an LM trained by
            `SupervisedWarmup`).
    """

    def __init__(self, policy: nn.Module, threshold: float = 0.3, top_k: int = 100, pair_k: int = 20,
                 tree_vocabulary: str = "all", confusion_pair: list[str] | None = None,
                 plot_dir: str | None = None, init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(init_from=init_from, init_from_trusted=init_from_trusted)
        self.save_hyperparameters()
        check_range("threshold", threshold, 0.0, 1.0)
        check_range("top_k", top_k, low=1)
        check_range("pair_k", pair_k, 1, top_k)
        if tree_vocabulary not in ("all", "subordinate"):
            raise UserInputError(f"tree_vocabulary={tree_vocabulary!r}: choose 'all' or 'subordinate'.")
        if confusion_pair is not None and len(confusion_pair) != 2:
            raise UserInputError(f"confusion_pair={confusion_pair!r}: give two basic categories, e.g. [fear, anger].")
        self.policy = policy
        self.tree_metric: EmotionTreeMetric | None = None
        self.recognition: RecognitionMetric | None = None
        self.results: dict[str, Any] = {}

    # ------------------------------------------------------------------ set-up
    def setup(self, stage: str) -> None:
        super().setup(stage)  # init_from, in test and predict as in every stage
        data = self.attached_data(EmotionWordData)
        if data is None:
            raise UserInputError("EmotionProbe needs an emotion datamodule (EmotionCorpusDataModule): it supplies "
                                 "the tokenizer and the emotion words.")
        self.bind_words(data.tokenizer, data.emotion_words, data.emotion_categories, data.emotion_is_basic,
                        data.category_names, data.reference_edges)

    def bind_words(self, tokenizer, words: list[str], categories: list[int], is_basic: list[bool],
                   category_names: list[str], reference_edges: list | None = None) -> None:
        """Map the emotion words to single token ids of ``tokenizer`` and build the metrics."""
        vocab = getattr(self.policy, "vocab_size", None) or tokenizer.vocab_size
        word_of_token = word_token_map(tokenizer, words, vocab)
        single = set(word_of_token[word_of_token >= 0].tolist())
        if not single:
            raise UserInputError("EmotionProbe: no emotion word is a single token of this tokenizer, so the probe "
                                 "would read nothing; use a model whose tokenizer has whole-word tokens.")
        if len(single) < len(words):
            log.warning("EmotionProbe: %d of %d emotion words are not single tokens and are never counted: %s",
                        len(words) - len(single), len(words),
                        ", ".join(w for i, w in enumerate(words) if i not in single)[:300])
        names = list(category_names)
        pair = None
        if self.hparams.confusion_pair is not None:
            unknown = [c for c in self.hparams.confusion_pair if c not in names]
            if unknown:
                raise UserInputError(f"confusion_pair names {unknown}, not basic categories of the data ({names}).")
            pair = (names.index(self.hparams.confusion_pair[0]), names.index(self.hparams.confusion_pair[1]))
        self.register_buffer("word_of_token", word_of_token.to(self.device), persistent=False)
        allowed = torch.tensor([not b for b in is_basic]) if self.hparams.tree_vocabulary == "subordinate" else \
            torch.ones(len(words), dtype=torch.bool)
        self.register_buffer("tree_words", allowed.to(self.device), persistent=False)
        self.words, self.categories, self.category_names = list(words), list(categories), names
        self.single_token_words = len(single)
        self.reference_edges = reference_edges
        self.pair = pair
        self.tree_metric = EmotionTreeMetric(len(words)).to(self.device)
        self.recognition = RecognitionMetric(len(words)).to(self.device)

    # ------------------------------------------------------------------ probing
    def forward(self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Next-token probabilities [B, V] after each (left-padded) prompt."""
        logits = self.policy(prompt_tokens, attention_mask=prompt_mask)[0][:, -1]
        return logits.float().softmax(-1)

    def _distributions(self, batch):
        if self.tree_metric is None:
            raise UserInputError("EmotionProbe has no emotion words bound: run it through the Trainer with an "
                                 "EmotionCorpusDataModule (or call bind_words first).")
        probs = self(batch["prompt_tokens"], batch["prompt_mask"])
        h = self.hparams
        recog, _ = emotion_distribution(probs, self.word_of_token, len(self.words), h.top_k, h.pair_k)
        tree, pairs = emotion_distribution(probs, self.word_of_token, len(self.words), h.top_k, h.pair_k,
                                           self.tree_words)
        return recog, tree, pairs

    def test_step(self, batch, batch_idx):
        recog, tree, pairs = self._distributions(batch)
        self.tree_metric.update(tree, pairs)
        self.recognition.update(recog, batch["labels"])

    def on_test_epoch_start(self) -> None:
        if self.tree_metric is not None:
            self.tree_metric.reset()
            self.recognition.reset()

    def on_test_epoch_end(self) -> None:
        c = self.tree_metric.compute().cpu()
        self.sentences = int(self.tree_metric.sentences)  # this process's count (the matrix is the global one)
        counts, mass = (t.detach().cpu() for t in self.recognition.compute())
        edges = parent_edges(c, self.hparams.threshold)
        metrics = tree_metrics(edges)
        metrics["group_purity"] = group_purity(edges, self.categories)
        if self.reference_edges is not None:
            metrics.update(edge_recovery(edges, self.reference_edges))
        summary = recognition_summary(counts, mass, self.categories, len(self.category_names), self.pair)
        metrics["acc_fine"], metrics["acc_basic"] = summary["acc_fine"], summary["acc_basic"]
        if self.pair is not None:
            metrics["planted_confusion"] = summary["planted_confusion"]
            metrics["planted_confusion_mass"] = summary["planted_confusion_mass"]
        metrics["single_token_words"] = float(self.single_token_words)
        for name, value in metrics.items():
            self.log(f"test/{name}", value)  # already reduced over processes by the metric states
        self.results = {"metrics": metrics, "edges": [[self.words[p], self.words[q]] for p, q in edges],
                        "confusion_fine": counts.tolist(), "confusion_basic": summary["confusion_basic"].tolist(),
                        "words": self.words, "categories": self.category_names,
                        "sentences": self.sentences, "labelled": summary["labelled"]}
        if self.trainer.is_global_zero:
            self._save_outputs(edges)

    def _save_outputs(self, edges) -> None:
        folder = self.hparams.plot_dir or self.trainer.log_dir or self.trainer.default_root_dir
        png = draw_tree(edges, self.words, self.categories, self.category_names,
                        os.path.join(folder, "emotion_tree.png"),
                        title=f"emotion tree (t={self.hparams.threshold}): {len(edges)} edges")
        with open(os.path.join(folder, "emotion_probe.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        self.results["tree_png"] = png
        for logger in self.loggers:
            if hasattr(logger, "log_image"):  # WandbLogger
                logger.log_image("test/emotion_tree", [png])

    def predict_step(self, batch, batch_idx=0):
        recog, _, _ = self._distributions(batch)
        return recog

    def prediction_fields(self, outputs, batch) -> dict:
        """Per scenario: the predicted emotion word (or empty), the label, and the renormalised word probabilities."""
        none = outputs.sum(-1) <= 0
        pred = outputs.argmax(-1)
        return {"prompt_id": batch["prompt_ids"],
                "predicted": ["" if n else self.words[int(p)] for n, p in zip(none.tolist(), pred.tolist())],
                "label": ["" if int(y) < 0 else self.words[int(y)] for y in batch["labels"].tolist()],
                "emotion_probs": outputs}

    def training_step(self, batch, batch_idx):
        raise UserInputError("EmotionProbe only probes (`train.py test` / `predict`); train the language model with "
                             "SupervisedWarmup (configs/emotion_hierarchy/lm_*_quick.yaml) and pass its checkpoint "
                             "as --model.init_args.init_from.")

    def configure_optimizers(self):
        return None
