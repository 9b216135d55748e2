"""RSIR's sampled evaluation protocol and LDARNet's validation/test MLM masks do not depend on the number of processes.

RSIR draws each user's ``num_eval_negatives`` negatives from a generator seeded by (``eval_seed``, the user's row
index) and computes Recall/NDCG once from every rank's per-user ranks; LDARNet masks each sequence from a generator
seeded by (``val_mask_seed``, the sequence's index) and reports epoch totals of per-sequence sums. Both drop the
sampler's padding copies (`lightning_modules.shared.example_rng.gather_examples`). The fast tests show that an
example's draws and its contribution do not depend on the batch it is in; the slow ones run ``validate`` and
``test`` of the quick configs on one and on two CPU processes (gloo, `conftest.TWO_PROCESSES`)
from the same checkpoint and require every metric to agree.
"""
from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Trainer
from torch import Tensor
from torch.utils.data import DataLoader, Subset, TensorDataset

from conftest import TWO_PROCESSES, config_path
from datamodules.genomics import PadCollate, SequenceDataset
from lightning_modules.ldarnet.ldarnet import LDARNetPretraining, mlm_mask
from lightning_modules.rsir.sequential_rec import SequentialRecommender, sample_eval_negatives
from lightning_modules.shared.errors import UserInputError
from lightning_modules.shared.example_rng import ExampleGenerators
from test_process_count_invariance import _in, _metrics  # one process and two, the same way

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
TINY_LDARNET = dict(arch_layout=["m1t1", ["M1"], "m1"], d_model=[16, 32], d_intermediate=[0, 32], d_state=8,
                    headdim=16, ssd_chunk_size=8, attn_heads=2, attn_window=4, rotary_dim=4)


# ============================================================================================ RSIR (fast)
def _recommender() -> SequentialRecommender:
    torch.manual_seed(0)
    return SequentialRecommender(num_items=30, hidden_dim=8, num_blocks=1, max_len=6, dropout=0.0,
                                 eval_protocol="sampled", num_eval_negatives=10).eval()


def _users(n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    history = torch.randint(1, 31, (n, 6), generator=g)
    history[::3, :2] = 0  # some left padding
    return history, torch.randint(1, 31, (n,), generator=g)


def test_rsir_negatives_depend_only_on_the_user_index_and_are_allowed_items():
    model = _recommender()
    history, target = _users(3)
    index = torch.tensor([11, 4, 7])
    allowed = torch.isfinite(model.masked_scores(history.clone()))
    allowed.scatter_(1, target.view(-1, 1), False)
    whole = sample_eval_negatives(allowed, 10, ExampleGenerators(5, index))
    part = sample_eval_negatives(allowed[[2, 0]], 10, ExampleGenerators(5, index[[2, 0]]))
    assert torch.equal(part, whole[[2, 0]])
    assert not torch.equal(whole[0], sample_eval_negatives(allowed[:1], 10, ExampleGenerators(6, index[:1]))[0])
    for row in range(3):  # distinct, never pad, the target or a history item
        items = set(whole[row].tolist())
        assert len(items) == 10 and not items & ({0, int(target[row])} | set(history[row].tolist()))
    with torch.no_grad():  # the ranks too
        ranks = model._ranks(history, target, ExampleGenerators(0, index))
        ranks_part = model._ranks(history[[2, 0]], target[[2, 0]], ExampleGenerators(0, index[[2, 0]]))
    assert torch.equal(ranks_part, ranks[[2, 0]])


def test_rsir_negatives_are_uniform_without_replacement():
    allowed = torch.ones(4000, 8, dtype=torch.bool)
    allowed[:, 0] = False
    allowed[:, 5] = False  # 6 allowed items, 3 drawn: each with probability 1/2
    negatives = sample_eval_negatives(allowed, 3, ExampleGenerators(0, range(4000)))
    counts = torch.bincount(negatives.flatten(), minlength=8)
    assert counts[0] == 0 and counts[5] == 0
    assert ((counts[[1, 2, 3, 4, 6, 7]].double() / 4000 - 0.5).abs() < 0.03).all()  # sd 0.008
    assert all(len(set(row)) == 3 for row in negatives.tolist())
    with pytest.raises(UserInputError, match="num_eval_negatives=7"):
        sample_eval_negatives(allowed, 7, ExampleGenerators(0, range(4000)))


def _rsir_metrics(model, rows: list[int], batch_size: int, history, target) -> dict[str, float]:
    dataset = Subset(TensorDataset(history, target, torch.arange(len(target))), rows)
    result = Trainer(**QUIET).validate(model, dataloaders=DataLoader(dataset, batch_size=batch_size), verbose=False)
    return result[0]


@pytest.mark.parametrize("protocol", ["sampled", "full"])
def test_rsir_metrics_count_each_user_once_in_any_batching(protocol):
    model = _recommender()
    model.hparams.eval_protocol = protocol
    model.metric_prefix = "" if protocol == "full" else "_sampled10"
    history, target = _users(40)
    reference = _rsir_metrics(model, list(range(40)), 40, history, target)
    # other batches, another order, and padding copies of users 0 and 1 (as DistributedSampler appends them)
    shuffled = _rsir_metrics(model, list(torch.randperm(40, generator=torch.Generator().manual_seed(1))) + [0, 1], 7,
                             history, target)
    assert reference.keys() == shuffled.keys() and len(reference) == 6
    for name, value in reference.items():
        assert shuffled[name] == pytest.approx(value, abs=1e-7), name
    assert 0 < reference[f"val{model.metric_prefix}/recall@20"] <= 1


# ============================================================================================ LDARNet (fast)
def _sequences(lengths, seed=0) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 5, (n,), generator=g) for n in lengths]  # A C G T N


def test_ldarnet_masks_depend_only_on_the_sequence_index_not_its_batch_or_padding():
    seqs = _sequences([30, 19, 25])
    batch = PadCollate()([{"tokens": s, "index": i} for s, i in zip(seqs, [8, 3, 40])])
    alone = PadCollate()([{"tokens": seqs[1], "index": 3}])  # padded to 19, not 30
    inputs, targets = mlm_mask(batch["tokens"], batch["mask"], 0.3, ExampleGenerators(1234, batch["index"]))
    inputs1, targets1 = mlm_mask(alone["tokens"], alone["mask"], 0.3, ExampleGenerators(1234, alone["index"]))
    assert torch.equal(inputs1[0], inputs[1, :19]) and torch.equal(targets1[0], targets[1, :19])
    assert (targets[1, 19:] == -100).all() and (inputs[1, 19:] == batch["tokens"][1, 19:]).all()  # padding kept
    selected = targets != -100
    assert selected.any() and not (selected & ~batch["mask"]).any()
    assert not (selected & (batch["tokens"] == 4)).any()  # N is never selected
    other, _ = mlm_mask(batch["tokens"], batch["mask"], 0.3, ExampleGenerators(1235, batch["index"]))
    assert not torch.equal(other, inputs)


def test_ldarnet_training_masks_still_come_from_the_global_rng():
    tokens = torch.randint(0, 4, (4, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    torch.manual_seed(3)
    inputs, targets = mlm_mask(tokens, valid, 0.5)
    torch.manual_seed(3)
    draws, base = torch.rand((3, 4, 12)), torch.randint(0, 4, (4, 12))
    selected = draws[0] < 0.5
    assert torch.equal(targets != -100, selected)
    expected = torch.where(selected & (draws[1] < 0.8), 5, tokens)
    expected = torch.where(selected & (draws[1] >= 0.8) & (draws[1] < 0.9), base, expected)
    assert torch.equal(inputs, expected)


def _ldarnet_metrics(model, seqs, rows: list[int], batch_size: int, stage: str = "validate") -> dict[str, float]:
    loader = DataLoader(Subset(SequenceDataset(seqs), rows), batch_size=batch_size, collate_fn=PadCollate())
    return getattr(Trainer(**QUIET), stage)(model, dataloaders=loader, verbose=False)[0]


def test_ldarnet_evaluation_metrics_do_not_depend_on_batching_or_padding_copies():
    torch.manual_seed(0)
    model = LDARNetPretraining(**TINY_LDARNET, mask_prob=0.3)
    with torch.no_grad():  # a non-trivial residual path and router
        model.net.residual_proj.weight.normal_(0, 0.1)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 4, (int(n),), generator=g).numpy() for n in torch.randint(12, 40, (13,), generator=g)]
    reference = _ldarnet_metrics(model, seqs, list(range(13)), 13)
    order = torch.randperm(13, generator=torch.Generator().manual_seed(1)).tolist()
    shuffled = _ldarnet_metrics(model, seqs, order + order[:2], 4)  # other batches and padding, 2 padding copies
    assert set(reference) == {f"val/{k}" for k in ("loss", "mlm_loss", "mlm_accuracy", "ratio_loss", "compression",
                                                     "mean_prob")}
    for name, value in reference.items():
        assert shuffled[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert reference["val/mlm_loss"] > 0 and 0 < reference["val/compression"] <= 1
    test = _ldarnet_metrics(model, seqs, list(range(13)), 5, "test")
    assert test["test/mlm_loss"] == pytest.approx(reference["val/mlm_loss"], rel=1e-5)  # same masks, same seed


# ============================================================================================ 1 vs 2 processes
CLI_QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.logger=false"]
SHORT_FIT = ["--trainer.max_epochs=1", "--trainer.max_steps=-1", "--trainer.limit_train_batches=2",
             "--trainer.limit_val_batches=0", "--trainer.val_check_interval=1.0", "--trainer.check_val_every_n_epoch=1",
             *CLI_QUIET]
# family: (config, extra flags, metric prefix that must be logged)
FAMILIES = {
    "rsir_sampled": ("configs/rsir/quick.yaml", ["--model.init_args.eval_protocol=sampled"], "_sampled100/ndcg@10"),
    "rsir_full": ("configs/rsir/quick.yaml", [], "/ndcg@10"),
    "ldarnet_pretraining": ("configs/ldarnet/pretrain_quick.yaml", [], "/mlm_loss"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_processes_evaluate_exactly_as_one(family, tmp_path):
    config, extra, logged = FAMILIES[family]
    common = ["--config", config_path(config), *extra]
    fit = _in(tmp_path / "fit", "fit", *common, *SHORT_FIT)
    ckpt = str(tmp_path / "short.ckpt")
    fit.trainer.save_checkpoint(ckpt)
    for stage, split in (("validate", "val"), ("test", "test")):
        results = {}
        for devices, strategy in ((1, "auto"), (2, TWO_PROCESSES)):
            args = [stage, *common, f"--ckpt_path={ckpt}", f"--trainer.devices={devices}",
                    f"--trainer.strategy={strategy}", "--trainer.limit_val_batches=1.0",
                    "--trainer.limit_test_batches=1.0", *CLI_QUIET]
            results[devices] = _metrics(tmp_path / f"{stage}{devices}", args)
        assert split + logged in results[1], f"{stage} did not log {split + logged}: {sorted(results[1])}"
        assert results[2].keys() == results[1].keys()
        assert all(math.isfinite(v) for v in results[1].values()), results[1]
        different = {k: (results[1][k], results[2][k]) for k in results[1]
                     if results[2][k] != pytest.approx(results[1][k], rel=1e-5, abs=1e-6)}
        assert not different, f"{stage}: 1 process vs 2 processes: {different}"
