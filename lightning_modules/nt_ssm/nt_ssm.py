"""NT-SSM: neighbor-type-aware sampled softmax for graph collaborative filtering, on a LightGCN or SimGCL backbone.

Paper: "Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy",
Geon Lee, Sunwoo Kim, Kyungho Kim, Kijung Shin, ICML 2026 (arXiv 2605.24015). Official code:
github.com/geon0325/NT-SSM (SELFRec-based). The paper's equations were not readable; everything below follows
the official code (``LightGCN_NT.py``, ``LightGCN.py``, SELFRec's evaluation), as read for this collection.

Method
------
Unrolling a LightGCN score shows that s(u, i) is a sum of learnable weights over pairs (a, b) of multi-hop
neighbours of u and of i. The in-batch sampled softmax (SSM) pushes all these pair weights of a negative
alike. NT-SSM splits every propagated embedding into its **even** part (sum of the even layers, layer 0
included, divided by L + 1) and its **odd** part (sum of the odd layers, divided by L + 1); even + odd is the
usual LightGCN mean over layers. A user's even part lives on user-type nodes (the user, its 2-hop users) and
its odd part on item-type nodes; for an item it is the reverse. The four pair types are

    UU = <u_even, i_odd>    II = <u_odd, i_even>    UI = <u_even, i_even>    IU = <u_odd, i_odd>

The loss is a bidirectional in-batch softmax on cosine logits in which the *negatives'* components are
scaled per neighbour type; positives are never scaled. For anchors X and candidates Y (the batch's positives
of the other side; B x B, positives on the diagonal)::

    den[b, j] = ||X_e[b] + X_o[b]|| ||Y_e[j] + Y_o[j]|| + 1e-8
    C_uu = X_e Y_o^T / den   C_ii = X_o Y_e^T / den   C_ui = X_e Y_e^T / den   C_iu = X_o Y_o^T / den
    logit[b, j] = C_uu + C_ii + C_ui + C_iu                          (j == b: the plain cosine)
                = a_u (C_uu + C_iu) + a_i (C_ii + C_ui)                (j != b)
    L_dir = mean_b [ logsumexp_j(logit[b, :] / tau) - logit[b, b] / tau ]
    loss  = ( L_dir(X=user, Y=item; a_u=alpha_iu, a_i=alpha_ii)
            + L_dir(X=item, Y=user; a_u=alpha_uu, a_i=alpha_ui) ) / 2

``a_u`` multiplies every component that uses the candidate's odd part, ``a_i`` its even part, so the scaled
logit is ``(X_e + X_o) . (a_u Y_o + a_i Y_e) / den`` (one matrix product; `nt_ssm_direction` computes it so,
and the tests pin it against the four explicit components).

**The alpha names are the official code's CLI names and do NOT map one-to-one to pair types.** Each alpha
scales two pair types of the negatives, in one direction only:

=============  ==========================  ===========================================  ====================
alpha          direction (anchor -> neg.)  scales the negative's ...                    pair types scaled
=============  ==========================  ===========================================  ====================
``alpha_iu``   user -> negative item       odd part (the item's user-type neighbours)    UU and IU
``alpha_ii``   user -> negative item       even part (the item and its 2-hop items)      II and UI
``alpha_uu``   item -> negative user       odd part (the user's item-type neighbours)    II and IU
``alpha_ui``   item -> negative user       even part (the user and its 2-hop users)      UU and UI
=============  ==========================  ===========================================  ====================

With all alphas 1 NT-SSM is exactly the **bidirectional** SSM (tested), not the official repository's
baseline, which is **one-directional** SSM (user -> the batch's positive items only). Both are offered.

Losses (``loss``): ``ssm`` (one-directional, the official baseline), ``bidirectional_ssm``, ``nt_ssm`` and
``bpr`` (LightGCN's BPR with one sampled negative item per pair, dot-product scores of the layer means).
In-batch negatives are not de-duplicated (a repeated item or a consumed item counts as a negative), as in
the official code. Every loss adds the official code's small L2 term on the **ego** (layer-0) embeddings of
the batch's users, positive items and sampled negative items:
``reg * (||E_u[b]||_F / B + ||E_i[pos]||_F / B + ||E_i[neg]||_F / B) / B`` (norms not squared and divided by
the batch size twice, so it is tiny; SELFRec's ``l2_reg_loss(...) / batch_size``). The sampled negatives of
the SSM losses serve only this term, as in the official code.

SimGCL backbone (``backbone="simgcl"``)
--------------------------------------
SimGCL (Yu et al., "Are Graph Augmentations Necessary? Simple Graph Contrastive Learning for Recommendation",
SIGIR 2022, arXiv 2112.08679) is LightGCN plus a contrastive loss between two views made by adding random noise
to the embeddings at every propagation layer instead of perturbing the graph. Reconstructed from the
official NT-SSM code (``SimGCL.py``, ``SimGCL_NT.py``, SELFRec's ``InfoNCE``):

* Propagation: E^(l) = A E^(l-1), and in a *perturbed* view ``E^(l) <- E^(l) + eps * sign(E^(l)) *
  normalize(U(0, 1) noise)`` (row-normalised uniform noise carrying the sign of the embedding, so every nonzero
  row moves by exactly ``noise_eps`` in L2 norm; the noisy layer feeds the next one). Noise comes from torch's
  global RNG (``torch.rand_like``), so ``seed_everything`` makes runs reproducible.
* Layer combination (SimGCL/SELFRec): the final embedding averages layers 1..L, **no layer 0**. The NT split
  (``SimGCL_NT``): even = (layers 2, 4, ...) / L, odd = (layers 1, 3, ...) / L; even + odd = that average.
* Loss = rec + ``cl_weight`` * CL + L2. rec (``ssm`` / ``bidirectional_ssm`` / ``nt_ssm`` / ``bpr``) is computed on
  the **clean, noise-free** propagation, as in the official code. CL = InfoNCE(view1[u], view2[u]) +
  InfoNCE(view1[i], view2[i]) over the batch's **unique** users u and unique positive items i (``torch.unique``,
  as the official code), between two independently perturbed propagations (even + odd), L2-normalised,
  temperature ``cl_tau``: InfoNCE(a, b) = mean_r [logsumexp_j(cos(a_r, b_j)/tau) - cos(a_r, b_r)/tau].
  Official defaults: ``cl_weight`` (``lmbda``) 0.5, ``noise_eps`` 0.1, ``cl_tau`` 0.2 (hard-coded there).
* L2 term (official SimGCL code, differs from LightGCN's): on the **propagated** (clean even + odd) embeddings of
  the batch's users and positive items, ``reg * (||U_b||_F / B + ||I_pos||_F / B)`` (not divided by B again, no
  negatives).
* Evaluation uses the noise-free propagation. With ``noise_eps=0`` and ``cl_weight=0`` the model is LightGCN
  without layer 0 in the combination (tested).
* Not reproduced: the official ``SimGCL_NT`` "bpr" loss is bidirectional (a sampled negative user too); here
  ``loss="bpr"`` is the one-directional BPR for both backbones. The other hyper-parameters (``noise_eps``,
  ``cl_weight``, ``cl_tau``) are ignored by ``backbone="lightgcn"``.

Evaluation protocol (SELFRec's, as in the official code)
--------------------------------------------------------
Full ranking over all items with the scores ``(u_even + u_odd) . (i_even + i_odd)``. Validation masks the
user's train items; **test masks only the train items, so validation items compete** (the official code;
``mask_valid_at_test=True`` masks them too). Recall@K = |hits| / |held-out items|, NDCG@K with IDCG over
min(|held-out|, K), K in ``ks`` (default 10, 20, 40), averaged over users with at least one held-out item
(`TopKMetrics`). Logged as ``val/recall@20``, ``val/ndcg@20``, ``test/...``. The official protocol stops
early on ``val/ndcg@20`` (patience 10) and reports test at the best validation epoch
(``configs/nt_ssm/paper.yaml``).

Deviations and reconstructions
------------------------------
* Data-dependent sizes: ``num_users``/``num_items`` default to the datamodule's (`GraphRecDataModule`), read
  in ``setup``; they are then written into the hyper-parameters, so a checkpoint rebuilds the model alone.
* The train graph (its (2, E) edge list) is saved in every checkpoint (entry ``train_graph_edges``, outside
  the ``state_dict`` because its shape depends on the data), so a checkpoint scores users without the data
  (the official code saves only the ego tables, which then need the graph again). ``init_from`` copies only
  the embeddings; the graph then comes from the new data.
* Negative items (for the L2 term and BPR) are drawn uniformly among the user's non-train items by the
  datamodule, as a pure function of (seed, epoch, edge) (SELFRec uses Python's ``random``).
* Mixed precision (``precision="bf16-mixed"``): the sparse graph propagation and the full-ranking scores run in
  fp32 inside autocast (`without_autocast`); the losses run under autocast. fp32 runs are unchanged.
* The NCL backbone of the paper is not implemented (NCL's NT variant is not in the release either).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import InteractionGraphData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.ranking_metrics import TopKMetrics, mask_known_items

log = logging.getLogger(__name__)

GraphLoss = Literal["ssm", "bidirectional_ssm", "nt_ssm", "bpr"]
Backbone = Literal["lightgcn", "simgcl"]
ALPHA_NAMES = ("alpha_uu", "alpha_ii", "alpha_ui", "alpha_iu")
CHECKPOINT_EDGES_KEY = "train_graph_edges"  # top-level checkpoint entry holding the (2, E) train edges


# ============================================================================================ graph
def normalized_adjacency(users: Tensor, items: Tensor, num_users: int, num_items: int) -> Tensor:
    """D^-1/2 A D^-1/2 of the bipartite user-item graph as a sparse COO tensor (U+I, U+I), no self-loops.

    Nodes 0..U-1 are users and U..U+I-1 items; ``users``/``items`` are the (de-duplicated) train edges.
    Isolated nodes get a zero row.
    """
    n = num_users + num_items
    rows = torch.cat([users, items + num_users])
    cols = torch.cat([items + num_users, users])
    degree = torch.zeros(n, dtype=torch.float32, device=users.device).index_add_(
        0, rows, torch.ones_like(rows, dtype=torch.float32))
    inv_sqrt = degree.clamp_min(1.0).rsqrt() * (degree > 0)
    values = inv_sqrt[rows] * inv_sqrt[cols]
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, n), check_invariants=False).coalesce()


def without_autocast(tensor: Tensor):
    """Context that turns autocast off on ``tensor``'s device type; the graph propagation and the ranking scores
    run inside it, in fp32 on ``.float()`` inputs.

    Under ``precision="bf16-mixed"`` (or "16-mixed") autocast hands the sparse products low-precision operands
    next to the fp32 adjacency and their backward fails (``expected scalar type Float but found BFloat16``);
    bf16 ranking scores (8-bit mantissa) would tie among thousands of items and change top-K metrics. The
    losses after the propagation still run under autocast. Without autocast this changes nothing
    (bit-identical results).
    """
    return torch.autocast(device_type=tensor.device.type, enabled=False)


class LightGCN(nn.Module):
    """LightGCN ego embeddings and propagation returning the even/odd layer decomposition.

    ``forward(adjacency)`` returns ``(even, odd)``, each (U+I, d): even = (sum of layers 0, 2, 4, ...) / (L+1),
    odd = (sum of layers 1, 3, ...) / (L+1), with layer l+1 = adjacency @ layer l. Xavier-uniform ego
    embeddings (SELFRec's initialisation).
    """

    def __init__(self, num_users: int, num_items: int, embedding_dim: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        self.num_users, self.num_items, self.num_layers = num_users, num_items, num_layers
        self.user_embedding = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_users, embedding_dim)))
        self.item_embedding = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_items, embedding_dim)))

    def forward(self, adjacency: Tensor) -> tuple[Tensor, Tensor]:
        with without_autocast(adjacency):
            layer = self.ego_embeddings()
            adjacency = adjacency.float()
            even, odd = layer, torch.zeros_like(layer)
            for depth in range(1, self.num_layers + 1):
                layer = torch.sparse.mm(adjacency, layer)
                if depth % 2:
                    odd = odd + layer
                else:
                    even = even + layer
            scale = 1.0 / (self.num_layers + 1)
            return even * scale, odd * scale

    def ego_embeddings(self) -> Tensor:
        """Layer 0 (U+I, d) in fp32 (the propagation's precision, see `without_autocast`)."""
        return torch.cat([self.user_embedding, self.item_embedding]).float()

    def split(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """(user rows, item rows) of a (U+I, d) node tensor."""
        return nodes[:self.num_users], nodes[self.num_users:]


def simgcl_noise(layer: Tensor, eps: float) -> Tensor:
    """SimGCL's perturbation of a layer: eps * sign(E) * row-normalised U(0, 1) noise (torch's global RNG).

    Every row with no zero entry gets a perturbation of L2 norm exactly ``eps`` that points into the embedding's
    orthant (entries that are 0 get no noise, as ``sign(0) = 0``)."""
    return eps * torch.sign(layer) * F.normalize(torch.rand_like(layer), dim=-1)


class SimGCL(LightGCN):
    """SimGCL propagation with the NT even/odd split of the official ``SimGCL_NT``: layer 0 is dropped,
    even = (layers 2, 4, ...) / L, odd = (layers 1, 3, ...) / L (even + odd = mean of layers 1..L).

    ``forward(adjacency, perturbed=True)`` adds `simgcl_noise` to every propagated layer (before it feeds the
    next one); ``perturbed=False`` (or ``noise_eps=0``) is the clean propagation. Same parameters (names and
    shapes) as `LightGCN`, so checkpoints and ``init_from`` move between the two backbones.
    """

    def __init__(self, num_users: int, num_items: int, embedding_dim: int = 64, num_layers: int = 2,
                 noise_eps: float = 0.1) -> None:
        if num_layers < 1:
            raise UserInputError(f"num_layers={num_layers} is out of range for SimGCL: it needs at least 1 layer "
                                 "(layer 0 is not part of its combination).")
        super().__init__(num_users, num_items, embedding_dim, num_layers)
        self.noise_eps = noise_eps

    def forward(self, adjacency: Tensor, perturbed: bool = False) -> tuple[Tensor, Tensor]:
        with without_autocast(adjacency):
            layer = self.ego_embeddings()
            adjacency = adjacency.float()
            even = odd = torch.zeros_like(layer)
            for depth in range(1, self.num_layers + 1):
                layer = torch.sparse.mm(adjacency, layer)
                if perturbed and self.noise_eps > 0:
                    layer = layer + simgcl_noise(layer, self.noise_eps)
                if depth % 2:
                    odd = odd + layer
                else:
                    even = even + layer
            scale = 1.0 / self.num_layers
            return even * scale, odd * scale


# ============================================================================================ losses
def ssm_direction(anchors: Tensor, candidates: Tensor, tau: float) -> Tensor:
    """One-directional in-batch sampled softmax on cosine logits (positives on the diagonal, kept in the
    denominator): mean_b [ logsumexp_j cos(a_b, c_j)/tau - cos(a_b, c_b)/tau ]."""
    logits = F.normalize(anchors, dim=1) @ F.normalize(candidates, dim=1).T / tau
    return (torch.logsumexp(logits, 1) - logits.diagonal()).mean()


def nt_ssm_direction(anchor_even: Tensor, anchor_odd: Tensor, cand_even: Tensor, cand_odd: Tensor,
                     a_odd: float, a_even: float, tau: float) -> Tensor:
    """L_dir of the module docstring: negatives' components on the candidate's odd part scaled by ``a_odd``
    (the code's a_u: C_uu + C_iu), on its even part by ``a_even`` (a_i: C_ii + C_ui); the positive unscaled."""
    anchor = anchor_even + anchor_odd
    cand = cand_even + cand_odd
    den = anchor.norm(dim=1, keepdim=True) * cand.norm(dim=1).unsqueeze(0) + 1e-8
    positive = (anchor * cand).sum(1) / den.diagonal()
    negative = anchor @ (a_odd * cand_odd + a_even * cand_even).T / den
    logits = negative.clone()
    logits.diagonal().copy_(positive)  # (autograd-safe: writes into a fresh tensor)
    logits = logits / tau
    return (torch.logsumexp(logits, 1) - logits.diagonal()).mean()


def nt_ssm_loss(user_even: Tensor, user_odd: Tensor, item_even: Tensor, item_odd: Tensor, tau: float,
                alpha_uu: float = 1.0, alpha_ii: float = 1.0, alpha_ui: float = 1.0, alpha_iu: float = 1.0) -> Tensor:
    """NT-SSM for a batch of (user, positive item) rows; the alpha mapping is the table of the module docstring."""
    user_to_item = nt_ssm_direction(user_even, user_odd, item_even, item_odd, alpha_iu, alpha_ii, tau)
    item_to_user = nt_ssm_direction(item_even, item_odd, user_even, user_odd, alpha_uu, alpha_ui, tau)
    return (user_to_item + item_to_user) / 2


def bpr_loss(users: Tensor, positives: Tensor, negatives: Tensor) -> Tensor:
    """-mean log sigmoid(u.i+ - u.i-) (LightGCN's BPR)."""
    return -F.logsigmoid((users * positives).sum(1) - (users * negatives).sum(1)).mean()


def info_nce(view1: Tensor, view2: Tensor, tau: float) -> Tensor:
    """SELFRec's InfoNCE (SimGCL's CL loss): rows L2-normalised, positives on the diagonal (kept in the
    denominator): mean_r [ logsumexp_j cos(v1_r, v2_j)/tau - cos(v1_r, v2_r)/tau ]."""
    logits = F.normalize(view1, dim=1) @ F.normalize(view2, dim=1).T / tau
    return (torch.logsumexp(logits, 1) - logits.diagonal()).mean()


def simgcl_l2(reg: float, *rows: Tensor) -> Tensor:
    """The official SimGCL code's L2 term (SELFRec's ``l2_reg_loss``): reg * sum_t ||E_t||_F / rows_t."""
    return reg * sum(r.norm(p=2) / len(r) for r in rows)


def official_l2(reg: float, *ego_rows: Tensor) -> Tensor:
    """The official (SELFRec) L2 term: reg * sum_t ||E_t||_F / rows_t, divided once more by the batch size."""
    batch = len(ego_rows[0])
    return reg * sum(rows.norm(p=2) / len(rows) for rows in ego_rows) / batch


# ============================================================================================ module
class GraphCollaborativeFiltering(PaperModule):
    """LightGCN or SimGCL trained with SSM, bidirectional SSM, NT-SSM or BPR; full-ranking evaluation (module
    docstring).

    Args:
        loss: "ssm" (one-directional, official baseline), "bidirectional_ssm", "nt_ssm" or "bpr".
        tau: softmax temperature of the SSM losses, > 0 (official default 0.2).
        alpha_uu, alpha_ii, alpha_ui, alpha_iu: NT-SSM scales of the negatives' components, official names;
            see the module docstring for which pair types each one scales (not the pair type of its name).
            Only used by ``loss="nt_ssm"``; all 1 is bidirectional SSM. >= 0.
        embedding_dim: d (official 64). num_layers: L (official 2), >= 0.
        reg: weight of the official L2 term (official 1e-4), >= 0.
        backbone: "lightgcn" (layers 0..L) or "simgcl" (layers 1..L, noisy views and a contrastive loss).
        cl_weight: SimGCL's lambda, weight of the InfoNCE between two noisy views (official 0.5), >= 0.
        noise_eps: SimGCL's eps, L2 norm of the per-layer noise of a view (official 0.1), >= 0.
        cl_tau: temperature of SimGCL's InfoNCE (official 0.2), > 0. The three SimGCL arguments are ignored by
            ``backbone="lightgcn"``.
        ks: ranking cutoffs (official 10, 20, 40).
        mask_valid_at_test: also mask validation items at test (default False, the official protocol).
        num_users, num_items: None = taken from the datamodule in ``setup``; a given value must match it.
    """

    def __init__(self, loss: GraphLoss = "nt_ssm", tau: float = 0.2,
                 alpha_uu: float = 1.0, alpha_ii: float = 1.0, alpha_ui: float = 1.0, alpha_iu: float = 1.0,
                 embedding_dim: int = 64, num_layers: int = 2, reg: float = 1e-4,
                 backbone: Backbone = "lightgcn", cl_weight: float = 0.5, noise_eps: float = 0.1,
                 cl_tau: float = 0.2,
                 ks: Sequence[int] = (10, 20, 40), mask_valid_at_test: bool = False,
                 num_users: int | None = None, num_items: int | None = None,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        if loss not in GraphLoss.__args__:
            raise UserInputError(f"loss={loss!r} is unknown: choose one of {', '.join(GraphLoss.__args__)}.")
        check_range("tau", tau, 0.0, low_inclusive=False)
        if backbone not in Backbone.__args__:
            raise UserInputError(f"backbone={backbone!r} is unknown: choose one of {', '.join(Backbone.__args__)}.")
        check_range("cl_weight", cl_weight, 0.0)
        check_range("noise_eps", noise_eps, 0.0)
        check_range("cl_tau", cl_tau, 0.0, low_inclusive=False)
        if backbone == "simgcl":
            check_range("num_layers", num_layers, 1)
        for name, value in zip(ALPHA_NAMES, (alpha_uu, alpha_ii, alpha_ui, alpha_iu)):
            check_range(name, value, 0.0)
        check_range("embedding_dim", embedding_dim, 1)
        check_range("num_layers", num_layers, 0)
        check_range("reg", reg, 0.0)
        for name, value in (("num_users", num_users), ("num_items", num_items)):
            if value is not None:
                check_range(name, value, 1)
        self.save_hyperparameters()
        self.ks = tuple(int(k) for k in ks)
        self.val_metrics = TopKMetrics(self.ks)
        self.test_metrics = TopKMetrics(self.ks)
        self.encoder: LightGCN | None = None
        if num_users is not None and num_items is not None:
            self._build(num_users, num_items)
        # the train graph (2, E). Not in the state_dict (its shape is data-dependent, and `--ckpt_path` checks
        # state_dict shapes against the configured model); saved in the checkpoint by on_save_checkpoint
        self.register_buffer("train_edges", torch.zeros(2, 0, dtype=torch.long), persistent=False)
        self._adjacency: Tensor | None = None
        self._adjacency_key: tuple | None = None
        self._eval_cache: tuple[Tensor, Tensor] | None = None

    def _build(self, num_users: int, num_items: int) -> None:
        hp = self.hparams
        if hp.get("backbone", "lightgcn") == "simgcl":
            self.encoder = SimGCL(num_users, num_items, hp.embedding_dim, hp.num_layers, hp.noise_eps)
        else:
            self.encoder = LightGCN(num_users, num_items, hp.embedding_dim, hp.num_layers)
        self.hparams["num_users"], self.hparams["num_items"] = num_users, num_items

    # ----------------------------------------------------------------------------------------- data
    def setup(self, stage: str) -> None:
        datamodule = self.attached_data(InteractionGraphData)
        if datamodule is not None:
            num_users, num_items = datamodule.num_users, datamodule.num_items
            if self.encoder is None:
                self._build(num_users, num_items)
            elif (self.encoder.num_users, self.encoder.num_items) != (num_users, num_items):
                raise UserInputError(
                    f"the model has {self.encoder.num_users} users x {self.encoder.num_items} items but the data "
                    f"has {num_users} x {num_items}: leave model.init_args.num_users/num_items null (taken from "
                    "the data) or use the data the checkpoint was trained on.")
            super().setup(stage)  # init_from (after the embeddings exist)
            self.set_train_graph(datamodule.train_edge_index())
        elif self.encoder is None:
            raise UserInputError("GraphCollaborativeFiltering needs a GraphRecDataModule (it provides the users, "
                                 "items and the train graph), or num_users/num_items and a checkpoint.")
        else:
            super().setup(stage)

    def set_train_graph(self, edges: Tensor) -> None:
        """Use ``edges`` (2, E) = (user ids, item ids) of the train split as the propagation graph."""
        edges = edges.to(device=self.train_edges.device, dtype=torch.long)
        if edges.numel() and (edges[0].max() >= self.encoder.num_users or edges[1].max() >= self.encoder.num_items):
            raise UserInputError("train graph ids exceed the model's num_users/num_items.")
        self.train_edges = edges
        self._adjacency = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[CHECKPOINT_EDGES_KEY] = self.train_edges.detach().cpu().clone()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the train graph (``load_from_checkpoint`` calls this before ``load_state_dict``)."""
        super().on_load_checkpoint(checkpoint)
        if CHECKPOINT_EDGES_KEY in checkpoint:
            self.train_edges = checkpoint[CHECKPOINT_EDGES_KEY].to(self.train_edges.device, torch.long)
            self._adjacency = None

    def adjacency(self) -> Tensor:
        """The normalised adjacency of the train graph on the model's device (built once, cached)."""
        key = (self.train_edges.device, self.train_edges.shape, self.train_edges.data_ptr())
        if self._adjacency is None or self._adjacency_key != key:
            if self.train_edges.shape[1] == 0:
                raise UserInputError("the model has no train graph: fit or load it with a GraphRecDataModule.")
            self._adjacency = normalized_adjacency(self.train_edges[0], self.train_edges[1],
                                                   self.encoder.num_users, self.encoder.num_items)
            self._adjacency_key = key
        return self._adjacency

    # ----------------------------------------------------------------------------------------- model
    def propagate(self, perturbed: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(user_even, user_odd, item_even, item_odd) of every node; ``perturbed`` = a noisy SimGCL view."""
        if perturbed:
            even, odd = self.encoder(self.adjacency(), perturbed=True)
        else:
            even, odd = self.encoder(self.adjacency())
        user_even, item_even = self.encoder.split(even)
        user_odd, item_odd = self.encoder.split(odd)
        return user_even, user_odd, item_even, item_odd

    def forward(self, users: Tensor) -> Tensor:
        """Scores (B, N) of every item for ``users`` (no masking)."""
        user_final, item_final = self._final_embeddings()
        with without_autocast(item_final):  # fp32 scores: bf16 would tie items and change the ranking
            return user_final[users].float() @ item_final.float().T

    def _final_embeddings(self) -> tuple[Tensor, Tensor]:
        if self._eval_cache is not None:
            return self._eval_cache
        user_even, user_odd, item_even, item_odd = self.propagate()
        return user_even + user_odd, item_even + item_odd

    def contrastive_loss(self, users: Tensor, items: Tensor) -> Tensor:
        """SimGCL's CL term (unweighted): InfoNCE between two noisy views on the batch's unique users plus on its
        unique positive items."""
        users, items = torch.unique(users), torch.unique(items)
        view1 = self.propagate(perturbed=True)
        view2 = self.propagate(perturbed=True)
        (u1, i1), (u2, i2) = [(ue + uo, ie + io) for ue, uo, ie, io in (view1, view2)]
        tau = self.hparams.cl_tau
        return info_nce(u1[users], u2[users], tau) + info_nce(i1[items], i2[items], tau)

    def compute_loss(self, batch: dict[str, Tensor]) -> Tensor:
        return sum(self.loss_terms(batch).values())

    def loss_terms(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """{"rec", "reg"[, "cl"]}: the recommendation loss (on the clean propagation), the L2 term and, for
        SimGCL with ``cl_weight > 0``, the weighted contrastive term; `compute_loss` is their sum."""
        users, items, negatives = batch["users"], batch["items"], batch["negatives"]
        user_even, user_odd, item_even, item_odd = self.propagate()
        ue, uo, ie, io = user_even[users], user_odd[users], item_even[items], item_odd[items]
        hp = self.hparams
        if hp.loss == "ssm":
            rec = ssm_direction(ue + uo, ie + io, hp.tau)
        elif hp.loss == "bidirectional_ssm":
            rec = (ssm_direction(ue + uo, ie + io, hp.tau) + ssm_direction(ie + io, ue + uo, hp.tau)) / 2
        elif hp.loss == "nt_ssm":
            rec = nt_ssm_loss(ue, uo, ie, io, hp.tau, hp.alpha_uu, hp.alpha_ii, hp.alpha_ui, hp.alpha_iu)
        else:
            rec = bpr_loss(ue + uo, ie + io, item_even[negatives] + item_odd[negatives])
        if hp.get("backbone", "lightgcn") != "simgcl":
            reg = official_l2(hp.reg, self.encoder.user_embedding[users], self.encoder.item_embedding[items],
                              self.encoder.item_embedding[negatives])
            return {"rec": rec, "reg": reg}
        terms = {"rec": rec, "reg": simgcl_l2(hp.reg, ue + uo, ie + io)}
        if hp.cl_weight > 0:
            terms["cl"] = hp.cl_weight * self.contrastive_loss(users, items)
        return terms

    def training_step(self, batch, batch_idx):
        terms = self.loss_terms(batch)
        loss = sum(terms.values())
        batch_size = len(batch["users"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        if "cl" in terms:
            self.log("train/cl_loss", terms["cl"], batch_size=batch_size)
        return loss

    # ----------------------------------------------------------------------------------------- evaluation
    def masked_scores(self, batch: dict[str, Tensor], mask_valid: bool) -> Tensor:
        scores = self(batch["users"])
        mask_known_items(scores, batch["train_items"], padding_value=-1)
        if mask_valid and "valid_items" in batch:
            mask_known_items(scores, batch["valid_items"], padding_value=-1)
        return scores

    def _evaluate(self, batch, metrics: TopKMetrics, mask_valid: bool) -> None:
        scores = self.masked_scores(batch, mask_valid)
        targets = torch.zeros_like(scores, dtype=torch.bool)
        held_out = batch["target_items"]
        rows = torch.arange(len(held_out), device=held_out.device).view(-1, 1).expand_as(held_out)
        present = held_out >= 0
        targets[rows[present], held_out[present]] = True
        metrics.update(scores, targets)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, self.val_metrics, mask_valid=False)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, self.test_metrics, mask_valid=self.hparams.mask_valid_at_test)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """Top-max(ks) item ids (B, K) of the batch's users, train items masked (and validation items with
        ``mask_valid_at_test``)."""
        scores = self.masked_scores(batch, mask_valid=self.hparams.mask_valid_at_test)
        return scores.topk(min(max(self.ks), scores.shape[1]), dim=1).indices

    def prediction_fields(self, outputs, batch) -> dict:
        """The user id and its recommended item ids, best first (one CSV row per user)."""
        return {"user": batch["users"], "top_items": outputs}

    def _cache_embeddings(self) -> None:
        with torch.no_grad():
            self._eval_cache = None
            self._eval_cache = self._final_embeddings()

    def _clear_cache(self) -> None:
        self._eval_cache = None

    def on_validation_epoch_start(self) -> None:
        self._cache_embeddings()

    on_test_epoch_start = on_predict_epoch_start = on_validation_epoch_start

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def on_predict_epoch_end(self) -> None:
        self._clear_cache()

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._clear_cache()

    def _log_metrics(self, stage: str, metrics: TopKMetrics) -> None:
        self._clear_cache()
        values = metrics.compute()  # already reduced over processes (sum states)
        for name, value in values.items():
            self.log(f"{stage}/{name}", value, prog_bar=name == "ndcg@20")
        metrics.reset()
