"""Write what ``python train.py predict`` computes into files a user can open.

``PredictionWriter`` (a Lightning ``BasePredictionWriter``) collects every predict batch and, at the end of the
predict epoch, writes the module's predictions into ``output_dir``. Each module turns its ``predict_step`` outputs
into named per-example fields with ``prediction_fields(outputs, batch)`` (`lightning_modules.shared.base.PaperModule`;
a module without the hook gets its dict passed through, or a bare tensor named ``prediction``). Files:

* ``predictions.pt``: every field concatenated over the batches (``torch.load``), plus ``example``, the index of
  each example in the predict dataset.
* ``predictions.csv`` (or ``predictions.jsonl`` when a field holds text, e.g. generated completions): one row per
  example: ``example``, one column per 1-D field or list field, and for 2-D fields of at most ``max_columns``
  columns one column per entry (``top_items_0`` is the best item; in JSONL one list); a field whose name ends in
  ``probs`` (class probabilities) also gets its argmax, ``predicted_class``. Wider or higher-dimensional fields
  are only in the ``.pt`` file.
* ``<field>.png``: a grid of the first ``max_images`` examples of every image field ([N, 1 or 3, H, W] in [0, 1]).
* ``expression.csv``: the ``expression`` field as genes x examples (rows named by the datamodule's ``gene_names``
  when it has them, columns by the ``id`` field when there is one, else by ``example``).

``output_dir`` defaults to ``predictions/`` inside the run's own folder: the logger's version folder
(``trainer.log_dir``, e.g. ``runs/trew/classifier/version_3``), the W&B run's files folder with a W&B logger, or
``default_root_dir`` without a logger. The folder is printed at the end. Under DDP every process writes its own
shard with a ``_rank{r}`` suffix (``predictions_rank0.csv``, ``predictions_rank1.csv``, ...); the ``example``
column says where each row belongs in the dataset, so the parts can be concatenated and sorted.
"""
from __future__ import annotations

import csv
import json
import math
import os
from typing import Any

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from lightning_modules.shared.data_contract import SlideExpressionData, data_view
from lightning_modules.shared.errors import check_range


class PredictionWriter(BasePredictionWriter):
    """Save the predictions of a ``predict`` run (see the module docstring for the files).

    Args:
        output_dir: folder for the files; None: ``predictions/`` in the run's own folder.
        max_images: images per PNG grid (0: no PNG).
        max_columns: widest 2-D field spread into table columns (wider ones are only in ``predictions.pt``).
    """

    def __init__(self, output_dir: str | None = None, max_images: int = 64, max_columns: int = 64) -> None:
        super().__init__(write_interval="batch_and_epoch")
        check_range("max_images", max_images, low=0)
        check_range("max_columns", max_columns, low=1)
        self.output_dir, self.max_images, self.max_columns = output_dir, max_images, max_columns
        self.resolved_dir: str | None = None
        self._batches: dict[int, list[dict[str, Any]]] = {}
        self._seen: dict[int, int] = {}

    # ------------------------------------------------------------------------------------------ collecting
    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "predict":
            self.resolved_dir = self._output_dir(trainer)
            self._batches, self._seen = {}, {}

    def _output_dir(self, trainer) -> str:
        if self.output_dir is not None:
            return self.output_dir
        log_dir = trainer.log_dir  # broadcasts: called on every rank
        if isinstance(trainer.logger, WandbLogger):  # its log_dir is the save_dir shared by every W&B run
            log_dir = trainer.strategy.broadcast(trainer.logger.experiment.dir if trainer.is_global_zero else None)
        return os.path.join(log_dir or ".", "predictions")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx) -> None:
        hook = getattr(pl_module, "prediction_fields", None)
        fields = hook(prediction, batch) if hook is not None else default_fields(prediction)
        fields = {name: _to_cpu(value) for name, value in fields.items()}
        size = _batch_size(fields, type(pl_module).__name__)
        seen = self._seen.get(dataloader_idx, 0)
        indices = list(batch_indices) if batch_indices is not None and len(batch_indices) == size else None
        fields["example"] = torch.tensor(indices if indices is not None else range(seen, seen + size))
        self._seen[dataloader_idx] = seen + size
        self._batches.setdefault(dataloader_idx, []).append(fields)

    # ------------------------------------------------------------------------------------------ writing
    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        suffix = f"_rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        gene_names = data_view(SlideExpressionData, trainer.datamodule).gene_names
        written = []
        for dataloader_idx, batches in sorted(self._batches.items()):
            stem_suffix = (f"_dataloader{dataloader_idx}" if len(self._batches) > 1 else "") + suffix
            written += write_predictions(_concatenate(batches), self.resolved_dir, stem_suffix, self.max_images,
                                         self.max_columns, gene_names)
        self._batches, self._seen = {}, {}
        if written:
            rank_zero_info(f"Predictions written to {self.resolved_dir}: "
                           f"{', '.join(sorted({os.path.basename(p) for p in written}))}")


def default_fields(outputs: Any) -> dict[str, Any]:
    """A dict of outputs as it is; anything else as the single field ``prediction``."""
    return dict(outputs) if isinstance(outputs, dict) else {"prediction": outputs}


def write_predictions(fields: dict[str, Any], output_dir: str, suffix: str = "", max_images: int = 64,
                      max_columns: int = 64, gene_names: list[str] | None = None) -> list[str]:
    """Write concatenated ``fields`` (one entry per example, ``example`` included) as the module docstring says;
    returns the paths written."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"predictions{suffix}.pt")
    torch.save(fields, path)
    written = [path]
    text = any(isinstance(value, list) and not all(isinstance(v, (int, float)) for v in value)
               for value in fields.values())
    columns = _table_columns(fields, max_columns, spread=not text)
    rows = [{name: values[i] for name, values in columns.items()} for i in range(len(fields["example"]))]
    path, stale = (os.path.join(output_dir, f"predictions{suffix}.{ext}") for ext in
                   (("jsonl", "csv") if text else ("csv", "jsonl")))
    if os.path.exists(stale):  # the other table format, left by an earlier run into the same folder
        os.remove(stale)
    with open(path, "w", newline="") as f:
        if text:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
    written.append(path)
    for name, value in fields.items():
        if _is_image(value) and max_images > 0:
            path = os.path.join(output_dir, f"{name}{suffix}.png")
            save_image_grid(value[:max_images], path)
            written.append(path)
    if torch.is_tensor(fields.get("expression")) and fields["expression"].dim() == 2:
        path = os.path.join(output_dir, f"expression{suffix}.csv")
        _write_expression(fields["expression"], fields.get("id"), fields["example"], gene_names, path)
        written.append(path)
    return written


def save_image_grid(images: torch.Tensor, path: str, padding: int = 2) -> None:
    """[N, 1 or 3, H, W] images in [0, 1] -> one PNG, a near-square grid with white gaps."""
    import matplotlib.image  # noqa: PLC0415  (only needed for image predictions)

    n, c, h, w = images.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = torch.ones(c, rows * (h + padding) + padding, cols * (w + padding) + padding)
    for i, image in enumerate(images.float().clamp(0, 1)):
        top, left = padding + (i // cols) * (h + padding), padding + (i % cols) * (w + padding)
        grid[:, top:top + h, left:left + w] = image
    array = grid.permute(1, 2, 0).numpy()
    matplotlib.image.imsave(path, array[..., 0] if c == 1 else array, cmap="gray", vmin=0.0, vmax=1.0)


# ---------------------------------------------------------------------------------------------- helpers
def _to_cpu(value: Any) -> Any:
    if torch.is_tensor(value):
        value = value.detach().cpu()
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    return list(value) if isinstance(value, tuple) else value


def _batch_size(fields: dict[str, Any], module: str) -> int:
    sizes = {name: (len(value) if torch.is_tensor(value) and value.dim() > 0 or isinstance(value, list) else None)
             for name, value in fields.items()}
    if not fields or None in sizes.values() or len(set(sizes.values())) != 1:
        raise ValueError(f"{module}.prediction_fields must return per-example fields of one length (a tensor or a "
                         f"list with one entry per example); got sizes {sizes}.")
    return next(iter(sizes.values()))


def _concatenate(batches: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(batches[0])
    out = {}
    for name in names:
        values = [batch[name] for batch in batches]
        out[name] = torch.cat(values) if torch.is_tensor(values[0]) else [v for value in values for v in value]
    return {"example": out.pop("example"), **out}


def _is_image(value: Any) -> bool:
    return torch.is_tensor(value) and value.dim() == 4 and value.shape[1] in (1, 3) and value.is_floating_point()


def _table_columns(fields: dict[str, Any], max_columns: int, spread: bool) -> dict[str, list]:
    """Column name -> one plain Python value per example; 2-D fields are spread over columns (CSV) or kept as one
    list per example (``spread=False``, JSONL)."""
    columns: dict[str, list] = {}
    for name, value in fields.items():
        if isinstance(value, list):
            columns[name] = value
        elif value.dim() == 1:
            columns[name] = value.tolist()
        elif value.dim() == 2 and value.shape[1] <= max_columns and name != "expression":
            if name.endswith("probs"):
                columns[f"{name[:-len('probs')]}predicted_class"] = value.argmax(1).tolist()
            if not spread:
                columns[name] = value.tolist()
                continue
            for j, column in enumerate(value.T.tolist()):
                columns[f"{name}_{j}"] = column
    return columns


def _write_expression(expression: torch.Tensor, ids: list | None, examples: torch.Tensor,
                      gene_names: list[str] | None, path: str) -> None:
    heads = [str(i) for i in (ids if ids is not None else examples.tolist())]
    genes = list(gene_names) if gene_names is not None and len(gene_names) == expression.shape[1] else \
        [f"gene_{g}" for g in range(expression.shape[1])]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gene", *heads])
        for gene, row in zip(genes, expression.T.tolist()):
            writer.writerow([gene, *row])
