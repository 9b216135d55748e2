"""LightGCN + BPR side by side with RecBole 1.2.1 on MovieLens-100k: ``python -m experiments.recbole_parity``.

Question: does the collection's `GraphCollaborativeFiltering` (``loss: bpr``, the LightGCN backbone of NT-SSM)
train LightGCN as well as a reference library does, on real data? The peer is RecBole 1.2.1's ``LightGCN``
(Xavier-uniform ego embeddings, one uniform negative per pair among the user's non-train items, BPR + 1e-5 EmbLoss
on the batch's ego embeddings, mean of layers 0..L, full ranking).

Protocol (RecBole's, given to both sides): MovieLens-100k (``ml-100k.inter`` shipped in the recbole wheel, every
rating an interaction), per-user random 80/10/10 split, d 64, 2 layers, Adam 1e-3, batch 2048, at most 50 epochs,
validation every epoch, early stopping on validation NDCG@20 (patience 10), test at the best validation epoch,
full ranking, K 10 and 20. The L2 term is made equal: RecBole's ``reg_weight * (||U_b|| + ||I_pos|| + ||I_neg||) / B``
is the collection's official (SELFRec) term with ``reg = 1e-5 * B``.

Arms (ours start from ``configs/nt_ssm/quick.yaml`` through `experiments.kit.from_config` and override only what
the protocol fixes):

* ``ours, test masks train only (NT-SSM protocol)``: the collection's defaults, i.e. the official NT-SSM
  (SELFRec) test protocol, where validation items stay rankable at test (``mask_valid_at_test: false``), and the
  split counts rounded to nearest;
* ``ours, test masks train + valid``: the same trained model, tested with ``mask_valid_at_test: true``;
* ``ours, RecBole protocol``: a second run with RecBole's split counts too (``split_rounding: floor``: held-out
  parts rounded down) and ``mask_valid_at_test: true``;
* ``RecBole 1.2.1``: RecBole's own ``Trainer`` in a child process (``--recbole-python``, by default this
  interpreter when ``recbole`` and ``pandas`` import here; otherwise the arm is skipped and the JSON says why).
  RecBole 1.2.1 needs an older stack than the collection (scipy < 1.12, pandas < 2.3): a virtual environment
  made with ``--system-site-packages`` plus ``pip install "scipy<1.12" "pandas<2.3" tensorboard thop tabulate
  colorlog colorama texttable`` and ``pip install --no-deps recbole==1.2.1`` runs it; its best-model reload needs
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (set for the child).

Seeds: seed s is the data split and model seed of ours and RecBole's ``seed = 2020 + s`` (its default 2020), so
the two sides see different random splits of the same protocol. Wall time: fit + test, one torch thread each.

``--smoke`` runs the two of our arms that train on a tiny synthetic graph for one epoch and skips RecBole.

Outputs: a markdown table and ``<out>/recbole_parity.json`` (kit schema; ``per_seed`` rows carry the validation
NDCG@20 curve of every run and the chosen epoch) and ``<out>/recbole_parity.png`` (the curves).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import EarlyStopping

from experiments.kit import (REPO_ROOT, KeepBest, experiment_parser, from_config, markdown_table, progress,
                             quiet_single_thread, quiet_trainer, summarise, write_result)

PAPER = "recbole_parity"
CONFIG = "configs/nt_ssm/quick.yaml"
MONITOR = "val/ndcg@20"
EPOCHS, PATIENCE, BATCH, REG_WEIGHT = 50, 10, 2048, 1e-5
ARM_TRAIN_ONLY = "ours, test masks train only (NT-SSM protocol)"
ARM_TRAIN_VALID = "ours, test masks train + valid"
ARM_RECBOLE_PROTOCOL = "ours, RecBole protocol (floor split, test masks train + valid)"
ARM_RECBOLE = "RecBole 1.2.1 LightGCN"
METRICS = ("test/ndcg@20", "test/recall@20", "val/ndcg@20", "wall_s")
SMOKE_DATA = ("--data.init_args.source=synthetic", "--data.init_args.synthetic_users=120",
              "--data.init_args.synthetic_items=200")


class ValidationCurve(Callback):
    """Validation NDCG@20 after every epoch (the curve the docs compare)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and MONITOR in trainer.callback_metrics:
            self.values.append(round(float(trainer.callback_metrics[MONITOR]), 4))


def run_ours(seed: int, split_rounding: str, test_masks: tuple[bool, ...], epochs: int, patience: int,
             smoke: bool) -> dict:
    """One training of the collection's LightGCN + BPR; test once per ``mask_valid_at_test`` value."""
    data = SMOKE_DATA if smoke else ("--data.init_args.source=movielens100k",)
    model, datamodule = from_config(
        CONFIG, f"--seed_everything={seed}", f"--data.init_args.seed={seed}", *data,
        "--data.init_args.split=[0.8,0.1,0.1]", f"--data.init_args.split_rounding={split_rounding}",
        f"--data.init_args.batch_size={BATCH}", "--data.init_args.eval_batch_size=4096",
        "--model.init_args.loss=bpr", "--model.init_args.embedding_dim=64", "--model.init_args.num_layers=2",
        f"--model.init_args.reg={REG_WEIGHT * BATCH}", "--model.init_args.ks=[10,20]")
    curve, best = ValidationCurve(), KeepBest(MONITOR)
    stop = EarlyStopping(monitor=MONITOR, mode="max", patience=patience, check_on_train_epoch_end=False)
    start = time.perf_counter()
    trainer = quiet_trainer([curve, best, stop], max_epochs=epochs)
    trainer.fit(model, datamodule)
    best.restore(model)
    tests = {}
    for mask in test_masks:
        model.hparams.mask_valid_at_test = mask
        tests[mask] = {k: float(v) for k, v in trainer.test(model, datamodule, verbose=False)[0].items()}
    wall = time.perf_counter() - start
    data_sizes = {"users": datamodule.num_users, "items": datamodule.num_items,
                  **{split: len(getattr(datamodule.data, split)[0]) for split in ("train", "valid", "test")}}
    return {"tests": tests, "val/ndcg@20": best.best_score, "best_epoch": curve.values.index(max(curve.values)) + 1,
            "curve": curve.values, "wall_s": wall, "data": data_sizes}


# ---------------------------------------------------------------------------------------------- RecBole side
def _recbole_worker(epochs: int, patience: int, seed: int) -> None:
    """Runs inside the child interpreter: RecBole's LightGCN under the protocol; prints one JSON line."""
    import torch

    torch.set_num_threads(1)
    import recbole
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.general_recommender import LightGCN
    from recbole.trainer import Trainer
    from recbole.utils import init_seed

    with tempfile.TemporaryDirectory() as saved:
        config = Config(model="LightGCN", dataset="ml-100k", config_dict={
            "data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"), "epochs": epochs,
            "stopping_step": patience, "train_batch_size": BATCH, "learning_rate": 1e-3, "embedding_size": 64,
            "n_layers": 2, "reg_weight": REG_WEIGHT,
            "eval_args": {"split": {"RS": [0.8, 0.1, 0.1]}, "order": "RO", "group_by": "user", "mode": "full"},
            "metrics": ["Recall", "NDCG"], "topk": [10, 20], "valid_metric": "NDCG@20", "device": "cpu",
            "use_gpu": False, "seed": seed, "show_progress": False, "checkpoint_dir": saved, "state": "WARNING"})
        init_seed(config["seed"], config["reproducibility"])
        dataset = create_dataset(config)
        train, valid, test = data_preparation(config, dataset)
        init_seed(config["seed"], config["reproducibility"])
        torch.set_num_threads(1)
        model = LightGCN(config, train._dataset)
        curve: list[float] = []

        class CurveTrainer(Trainer):
            def _valid_epoch(self, valid_data, show_progress=False):
                score, result = super()._valid_epoch(valid_data, show_progress)
                curve.append(round(float(result["ndcg@20"]), 4))
                return score, result

        start = time.perf_counter()
        trainer = CurveTrainer(config, model)
        _, best_valid = trainer.fit(train, valid, saved=True, show_progress=False, verbose=False)
        test_result = trainer.evaluate(test, load_best_model=True, show_progress=False)
        wall = time.perf_counter() - start
    print(json.dumps({"tests": {"True": {f"test/{k}": float(v) for k, v in test_result.items()}},
                      "val/ndcg@20": float(best_valid["ndcg@20"]), "best_epoch": curve.index(max(curve)) + 1,
                      "curve": curve, "wall_s": wall,
                      "data": {"users": dataset.user_num - 1, "items": dataset.item_num - 1,  # less RecBole's [PAD]
                               "train": len(train._dataset.inter_feat), "valid": len(valid._dataset.inter_feat),
                               "test": len(test._dataset.inter_feat)}}))


def default_recbole_python() -> str | None:
    """This interpreter when it can import recbole and pandas (RecBole's data layer), else None."""
    if importlib.util.find_spec("recbole") and importlib.util.find_spec("pandas"):
        return sys.executable
    return None


def run_recbole(python: str, seed: int, epochs: int, patience: int) -> dict:
    """RecBole's run in a child process (its own interpreter and stack); raises with its error output on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    command = [python, "-m", "experiments.recbole_parity", "--recbole-worker", str(epochs), str(patience), str(seed)]
    with tempfile.TemporaryDirectory() as scratch:  # RecBole writes log/ and log_tensorboard/ into its cwd
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"RecBole run failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    run["tests"] = {True: run["tests"]["True"]}
    return run


# ---------------------------------------------------------------------------------------------- the experiment
def run_seed(seed: int, epochs: int, patience: int, smoke: bool, recbole_python: str | None) -> dict:
    runs = {}
    trainings = progress(None, f"seed {seed} trainings", total=2 + (recbole_python is not None))
    base = run_ours(seed, "nearest", (False, True), epochs, patience, smoke)
    trainings.update()
    runs[ARM_TRAIN_ONLY] = {**base, "test_masks_valid": False}
    runs[ARM_TRAIN_VALID] = {**base, "test_masks_valid": True}
    runs[ARM_RECBOLE_PROTOCOL] = {**run_ours(seed, "floor", (True,), epochs, patience, smoke),
                                  "test_masks_valid": True}
    trainings.update()
    if recbole_python is not None:
        runs[ARM_RECBOLE] = {**run_recbole(recbole_python, 2020 + seed, epochs, patience), "test_masks_valid": True}
        trainings.update()
    trainings.close()
    arms = {}
    for arm, run in runs.items():
        test = run["tests"][run["test_masks_valid"]]
        arms[arm] = {"test/ndcg@20": test["test/ndcg@20"], "test/recall@20": test["test/recall@20"],
                     "val/ndcg@20": run["val/ndcg@20"], "wall_s": run["wall_s"]}
    details = {arm: {k: v for k, v in run.items() if k != "tests"} for arm, run in runs.items()}
    return {"seed": seed, "arms": arms, "runs": details}


def plot(per_seed: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in (ARM_TRAIN_ONLY, ARM_RECBOLE_PROTOCOL, ARM_RECBOLE):
        for index, row in enumerate(per_seed):
            if arm in row["runs"]:
                curve = row["runs"][arm]["curve"]
                ax.plot(range(1, len(curve) + 1), curve, label=arm if index == 0 else None,
                        color={ARM_TRAIN_ONLY: "tab:blue", ARM_RECBOLE_PROTOCOL: "tab:green"}.get(arm, "tab:red"))
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation NDCG@20")
    ax.set_title("LightGCN + BPR on MovieLens-100k")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--recbole-worker"]:  # the child process of `run_recbole`
        _recbole_worker(*(int(x) for x in argv[1:4]))
        return {}
    parser = experiment_parser(__doc__.splitlines()[0], seeds=1)
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="most epochs per run (RecBole's protocol: 50)")
    parser.add_argument("--recbole-python", default=None,
                        help="interpreter that runs RecBole 1.2.1 (default: this one if recbole and pandas import "
                             "here; otherwise the RecBole arm is skipped)")
    args = parser.parse_args(argv)
    quiet_single_thread()
    logging.getLogger("datamodules.interaction_graph").setLevel(logging.ERROR)
    epochs, patience = (1, 1) if args.smoke else (args.epochs, PATIENCE)
    recbole_python = None if args.smoke else (args.recbole_python or default_recbole_python())
    skipped = ("--smoke" if args.smoke else "no interpreter with recbole and pandas (--recbole-python)") \
        if recbole_python is None else None
    if importlib.util.find_spec("recbole") is None and not args.smoke:
        raise SystemExit("MovieLens-100k is read from the recbole wheel: pip install --no-deps recbole==1.2.1")
    start = time.perf_counter()
    per_seed = [run_seed(seed, epochs, patience, args.smoke, recbole_python)
                for seed in progress(range(args.seeds), "seeds")]
    wall = time.perf_counter() - start
    arms = summarise([row["arms"] for row in per_seed])
    config = {"config_file": CONFIG, "data": "synthetic 120 x 200 (smoke)" if args.smoke else "MovieLens-100k",
              "split": [0.8, 0.1, 0.1], "embedding_dim": 64, "num_layers": 2, "optimizer": "Adam 1e-3",
              "batch_size": BATCH, "reg_weight (RecBole EmbLoss)": REG_WEIGHT, "max_epochs": epochs,
              "early_stopping": {"monitor": MONITOR, "patience": patience}, "ks": [10, 20],
              "recbole_python": recbole_python, "recbole_skipped": skipped, "smoke": args.smoke}
    result = write_result(PAPER, seeds=args.seeds, wall_s=wall, config=config, arms=arms, per_seed=per_seed,
                          out=args.out)
    out = Path(args.out)
    plot(per_seed, out / f"{PAPER}.png")
    print(markdown_table(arms, METRICS, digits=4))
    if skipped:
        print(f"\nRecBole arm skipped: {skipped}")
    print(f"\nwall {wall:.0f} s; results in {out / (PAPER + '.json')} and {out / (PAPER + '.png')}")
    return result


if __name__ == "__main__":
    main()
