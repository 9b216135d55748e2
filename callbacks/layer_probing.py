"""Per-layer linear probes of a frozen audio encoder: the diagnostic of VoxParadox (Pang, Chaubey & Soleymani,
arXiv 2605.27772, Sec. 4) that shows intermediate encoder layers carry paralinguistic information (pitch, speed,
gender, ...) that the last layer has lost.

At the end of ``fit`` (and, with ``on_test: true``, of ``test``) the callback runs the module's
``layer_states(batch) -> (hidden states per layer, mask)`` under ``no_grad`` over up to ``max_examples`` training
and validation clips, mean-pools each layer over real (non-padding) positions, and for every attribute fits a
multinomial logistic regression (scikit-learn, standardised features, ``C``) on the training clips and scores it
on the validation clips. Attributes are the columns of the batch's ``attributes`` [B, A] (names ``attributes``;
-1 = unknown, skipped) and, with ``content: true``, the sentence id ``content``.

Deviation: the paper probes with 3-layer ReLU MLPs on every 2nd layer of a 32-layer encoder; a linear probe on
every layer of a small encoder is what the small scale affords (a linear probe is the stricter test of what a
linear projector can read).

Output: ``results`` ({attribute: [accuracy per layer]}), logged as ``probe/<attribute>/layer<l>`` to the
trainer's loggers, and written as ``layer_probes.json`` and ``layer_probes.png`` into ``out_dir`` (default: the
trainer's log dir, else ``default_root_dir``).
"""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_modules.shared.errors import UserInputError

PROBE_MAX_ITER = 500  # lbfgs iterations per probe
# scikit-learn's note when a label has more distinct values than half the clips (the sentence-id probe on few clips)
EXPECTED_SKLEARN_NOTE = r"The number of unique classes is greater than 50% of the number of samples"


class LayerProbing(Callback):
    """Linear probes per encoder layer and attribute (see the module docstring).

    Args:
        attributes: names of the ``attributes`` columns (embedded speech: pitch, speed, gender, volume).
        content: also probe the sentence id (``content``).
        max_examples: clips per split used for the probes.
        C: inverse L2 strength of the logistic regression.
        on_test: also probe at the end of ``test``.
        out_dir: where the table and plot go (default: trainer.log_dir or default_root_dir).
    """

    def __init__(self, attributes: list[str] | None = None, content: bool = True, max_examples: int = 600,
                 C: float = 1.0, on_test: bool = False, out_dir: str | None = None) -> None:
        self.attributes = list(attributes) if attributes is not None else ["pitch", "speed", "gender", "volume"]
        self.content, self.max_examples, self.C = content, max_examples, C
        self.on_test, self.out_dir = on_test, out_dir
        self.results: dict[str, list[float]] = {}

    @torch.no_grad()
    def features(self, module: LightningModule, loader) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        if not hasattr(module, "layer_states"):
            raise UserInputError(f"LayerProbing needs a module with layer_states(batch); {type(module).__name__} "
                                 "has none (use it with the audio modules of configs/pclm/).")
        was_training = module.training
        module.eval()
        per_layer: list[list[np.ndarray]] = []
        labels: dict[str, list[np.ndarray]] = {}
        seen = 0
        for batch in loader:
            batch = {k: v.to(module.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            states, mask = module.layer_states(batch)
            weights = mask.float()[..., None]
            pooled = [((s * weights).sum(1) / weights.sum(1).clamp(min=1)).float().cpu().numpy() for s in states]
            per_layer = per_layer or [[] for _ in pooled]
            for i, p in enumerate(pooled):
                per_layer[i].append(p)
            for j, name in enumerate(self.attributes):
                labels.setdefault(name, []).append(batch["attributes"][:, j].cpu().numpy())
            if self.content:
                labels.setdefault("content", []).append(batch["content"].cpu().numpy())
            seen += len(mask)
            if seen >= self.max_examples:
                break
        module.train(was_training)
        return ([np.concatenate(p)[:self.max_examples] for p in per_layer],
                {k: np.concatenate(v)[:self.max_examples] for k, v in labels.items()})

    def probe(self, module: LightningModule, train_loader, val_loader) -> dict[str, list[float]]:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        train_x, train_y = self.features(module, train_loader)
        val_x, val_y = self.features(module, val_loader)
        results = {}
        for name in train_y:
            keep_tr, keep_va = train_y[name] >= 0, val_y[name] >= 0
            if len(np.unique(train_y[name][keep_tr])) < 2 or not keep_va.any():
                continue
            accuracies = []
            for layer_tr, layer_va in zip(train_x, val_x):
                clf = make_pipeline(StandardScaler(), LogisticRegression(C=self.C, max_iter=PROBE_MAX_ITER))
                with warnings.catch_warnings():
                    # expected of these probes, once per layer and attribute: a fixed iteration budget (the probe's
                    # accuracy at that budget is the measurement, converged or not), and the sentence-id probe has
                    # many classes for few clips; any other warning (e.g. about the features) still shows
                    warnings.filterwarnings("ignore", category=ConvergenceWarning)
                    warnings.filterwarnings("ignore", message=EXPECTED_SKLEARN_NOTE, category=UserWarning)
                    clf.fit(layer_tr[keep_tr], train_y[name][keep_tr])
                accuracies.append(float((clf.predict(layer_va[keep_va]) == val_y[name][keep_va]).mean()))
            results[name] = accuracies
        return results

    def _run(self, trainer: Trainer, module: LightningModule) -> None:
        datamodule = trainer.datamodule
        if datamodule is None:
            return
        datamodule.setup("fit")
        self.results = self.probe(module, datamodule.train_dataloader(), datamodule.val_dataloader())
        for logger in trainer.loggers:
            logger.log_metrics({f"probe/{name}/layer{layer}": acc for name, accs in self.results.items()
                                for layer, acc in enumerate(accs)}, step=trainer.global_step)
        if trainer.is_global_zero:
            self.write(self.out_dir or trainer.log_dir or trainer.default_root_dir)

    def write(self, out_dir: str) -> None:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "layer_probes.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        for name, accs in self.results.items():
            ax.plot(range(len(accs)), accs, marker="o", label=name)
        ax.set_xlabel("encoder hidden state (0 = conv output)")
        ax.set_ylabel("linear probe accuracy (val)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "layer_probes.png"), dpi=110)
        plt.close(fig)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._run(trainer, pl_module)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.on_test:
            self._run(trainer, pl_module)
