"""LDARNet: routing, ratio loss, dechunk EMA, chunked SSD vs a sequential scan, BiMamba-2 padding, MLM masking,
reverse complement, layout parsing, the whole network's padding invariance, and the DNA loaders and their errors."""
from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
import torch

from datamodules.genomics import (MOTIFS, DNAClassificationDataModule, DNAPretrainDataModule, PadCollate, encode,
                                  motif_edge_mask, motif_hits, read_bed_windows, read_fasta, read_genomic_benchmarks,
                                  read_nucleotide_transformer, synthetic_motif_task)
from lightning_modules.ldarnet.bimamba2 import BiMamba2, mamba_ssm_available, ssd_chunked, ssd_scan, ssd_sequential
from lightning_modules.shared.errors import UserInputError
from lightning_modules.ldarnet.ldarnet import (IGNORE_INDEX, LDARNetClassifier, LDARNetPretraining, WSDSchedule,
                                               mlm_mask, no_weight_decay, reverse_complement)
from lightning_modules.ldarnet.ldarnet_network import (MASK_TOKEN, PAD_TOKEN, STE, BidirectionalRouter,
                                                       check_arch_layout, chunk, dechunk_ema, fixed_boundaries,
                                                       parse_layout, ratio_loss, upsample)


def decode(tokens) -> str:
    """Token ids back to a DNA string (the inverse of `encode` on A/C/G/T/N)."""
    return "".join("ACGTN??"[int(t)] for t in tokens)


TINY = dict(arch_layout=["m1t1", ["M1"], "m1"], d_model=[16, 32], d_intermediate=[0, 32], d_state=8, headdim=16,
            ssd_chunk_size=8, attn_heads=2, attn_window=4, rotary_dim=4)


# ============================================================================================ routing / chunking
def test_router_matches_hand_computed_symmetrised_cosine():
    router = BidirectionalRouter(2)
    with torch.no_grad():
        router.q_proj.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))  # k stays the identity
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]])
    # q0 = (1,0), q1 = (1,1)/sqrt2, q2 = -(1,1)/sqrt2; k_t = x_t
    # cos_1 = (q0.k1 + q1.k0)/2 = (0 + 1/sqrt2)/2;  cos_2 = (q1.k2 + q2.k1)/2 = -1/sqrt2
    c1, c2 = (1 / math.sqrt(2)) / 2, -1 / math.sqrt(2)
    p, b = router(x, torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(p, torch.tensor([[1.0, (1 - c1) / 2, (1 - c2) / 2]]))
    assert b.tolist() == [[True, False, True]]  # p_0 = 1; p_1 = 0.32 < 0.5; p_2 = 0.85 > 0.5
    # the one-sided H-Net similarity q_t . k_{t-1} would give p_1 = (1 - 1/sqrt2)/2 = 0.146: the symmetrisation matters
    assert p[0, 1].item() == pytest.approx(0.3232233, abs=1e-6)
    _, b = router(x, torch.tensor([[True, True, False]]))
    assert b.tolist() == [[True, False, False]]  # no boundary on padding


def test_router_is_identity_initialised_and_p_half_is_not_a_boundary():
    router = BidirectionalRouter(3)
    assert torch.equal(router.q_proj.weight, torch.eye(3)) and torch.equal(router.k_proj.weight, torch.eye(3))
    x = torch.tensor([[[1.0, 0, 0], [0, 1.0, 0], [0, 1.0, 0]]])  # orthogonal -> p = 0.5 (not > 0.5); equal -> p = 0
    p, b = router(x, torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(p, torch.tensor([[1.0, 0.5, 0.0]]))
    assert b.tolist() == [[True, False, False]]


def test_ratio_loss_hand_values():
    valid = torch.ones(1, 4, dtype=torch.bool)
    b = torch.tensor([[True, False, False, False]])
    loss, f, g = ratio_loss(b, torch.tensor([[1.0, 0.0, 0.0, 0.0]]), valid, 4.0)
    assert (f.item(), g.item()) == (0.25, 0.25)
    assert loss.item() == pytest.approx(4 / 3 * (3 * 0.25 * 0.25 + 0.75 * 0.75))  # = 1 at the target
    assert loss.item() == pytest.approx(1.0)
    b = torch.tensor([[True, False, True, False, True]])
    p = torch.tensor([[1.0, 0.2, 0.6, 0.2, 0.9]])
    valid = torch.tensor([[True, True, True, True, False]])  # the padded position is ignored
    loss, f, g = ratio_loss(b, p, valid, 4.0)
    assert f.item() == pytest.approx(0.5) and g.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(4 / 3 * (3 * 0.25 + 0.25))


def test_chunk_and_upsample_on_a_hand_example():
    hidden = torch.arange(12.0).view(2, 6, 1)
    b = torch.tensor([[True, False, True, True, False, False], [True, False, False, False, True, False]])
    chunks, mask, order = chunk(hidden, b)
    assert chunks.squeeze(-1).tolist()[0] == [0.0, 2.0, 3.0] and chunks[1, :2].squeeze(-1).tolist() == [6.0, 10.0]
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    assert upsample(chunks, b).squeeze(-1).tolist() == [[0, 0, 2, 3, 3, 3], [6, 6, 6, 6, 10, 10]]
    assert fixed_boundaries(torch.ones(1, 9, dtype=torch.bool), 4).tolist() == [[1, 0, 0, 0, 1, 0, 0, 0, 1]]


def _ema_loop(z, p, length):
    out_f, out_b = torch.zeros_like(z), torch.zeros_like(z)
    state = torch.zeros(z.shape[-1], dtype=z.dtype)
    for j in range(length):
        state = p[j] * z[j] + (1 - p[j]) * state
        out_f[j] = state
    state = torch.zeros(z.shape[-1], dtype=z.dtype)
    for j in reversed(range(length)):
        state = p[j] * z[j] + (1 - p[j]) * state
        out_b[j] = state
    return 0.5 * (out_f + out_b)


def test_dechunk_ema_equals_a_python_loop_and_ignores_padding():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 11, 3, generator=gen)
    p = torch.rand(2, 11, generator=gen)
    p[:, 0] = 1.0
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    out = dechunk_ema(z, p, mask, chunk_size=4)
    for row, length in ((0, 11), (1, 7)):
        expected = _ema_loop(z[row].double(), p[row].double().clamp(1e-4, 1 - 1e-4), length)
        torch.testing.assert_close(out[row, :length].double(), expected[:length], atol=1e-5, rtol=1e-5)


def test_dechunk_ema_runs_in_fp32_under_bf16_autocast():
    z = torch.randn(1, 300, 4).bfloat16()
    p = torch.full((1, 300), 0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dechunk_ema(z, p, torch.ones(1, 300, dtype=torch.bool), chunk_size=64)
    assert out.dtype == torch.float32
    expected = _ema_loop(z[0].double(), p[0].double(), 300)
    torch.testing.assert_close(out[0].double(), expected, atol=1e-4, rtol=1e-4)


def test_ste_forward_is_one_and_gradient_passes():
    c = torch.tensor([0.6, 0.9], requires_grad=True)
    out = STE.apply(c)
    assert out.tolist() == [1.0, 1.0]
    (out * torch.tensor([2.0, 3.0])).sum().backward()
    assert c.grad.tolist() == [2.0, 3.0]


# ============================================================================================ SSD / BiMamba-2
@pytest.mark.parametrize("length,chunk_size", [(37, 8), (64, 16), (5, 64), (33, 1)])
def test_chunked_ssd_equals_sequential_scan(length, chunk_size):
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(2, length, 3, 4, generator=gen, dtype=torch.float64)
    a = -torch.rand(2, length, 3, generator=gen, dtype=torch.float64) * 2
    b, c = (torch.randn(2, length, 3, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(ssd_chunked(x, a, b, c, chunk_size), ssd_sequential(x, a, b, c))


def test_chunked_ssd_gradients_equal_sequential_scan_gradients():
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, 13, 2, 3, generator=gen, dtype=torch.float64), -torch.rand(1, 13, 2, generator=gen,
              dtype=torch.float64), torch.randn(1, 13, 2, 4, generator=gen, dtype=torch.float64),
              torch.randn(1, 13, 2, 4, generator=gen, dtype=torch.float64)]
    grads = []
    for fn in (lambda *t: ssd_chunked(*t, 4), ssd_sequential):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        (fn(*leaves) ** 2).sum().backward()
        grads.append([t.grad for t in leaves])
    for g1, g2 in zip(*grads):
        torch.testing.assert_close(g1, g2)


def test_ssd_scan_groups_and_dt_match_the_recurrence():
    gen = torch.Generator().manual_seed(2)
    x, dt = torch.randn(1, 9, 4, 2, generator=gen), torch.rand(1, 9, 4, generator=gen)
    a_head = -torch.tensor([1.0, 2.0, 3.0, 4.0])
    b, c = torch.randn(1, 9, 1, 3, generator=gen), torch.randn(1, 9, 1, 3, generator=gen)
    out = ssd_scan(x, dt, a_head, b, c, chunk_size=4, impl="torch")
    state = torch.zeros(4, 2, 3)
    for t in range(9):
        state = torch.exp(dt[0, t] * a_head)[:, None, None] * state + (dt[0, t, :, None] * x[0, t])[..., None] * b[0, t]
        torch.testing.assert_close(out[0, t], (state * c[0, t]).sum(-1), atol=1e-5, rtol=1e-5)


def test_bimamba2_torch_path_equals_sequential_path_and_is_padding_invariant():
    torch.manual_seed(0)
    block = BiMamba2(16, d_state=8, headdim=8, chunk_size=4, ssd_impl="torch")
    hidden = torch.randn(2, 10, 16)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, 6:] = False
    out = block(hidden, valid)
    block.fwd.ssd_impl = block.bwd.ssd_impl = "sequential"
    torch.testing.assert_close(block(hidden, valid), out, atol=1e-5, rtol=1e-5)
    alone = block(hidden[1:, :6], None)
    torch.testing.assert_close(out[1, :6], alone[0], atol=1e-5, rtol=1e-5)
    # bidirectional: the first output depends on the last input
    changed = hidden.clone()
    changed[0, -1] += 1.0
    assert not torch.allclose(block(changed, valid)[0, 0], out[0, 0])


@pytest.mark.skipif(not (mamba_ssm_available() and torch.cuda.is_available()), reason="mamba-ssm kernels need CUDA")
def test_mamba_ssm_kernel_agrees_with_the_pure_torch_scan():  # pragma: no cover - runs only where both exist
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 300, 4, 16, device="cuda", generator=gen)
    dt = torch.rand(2, 300, 4, device="cuda", generator=gen) * 0.1
    a_head = -torch.arange(1.0, 5.0, device="cuda")
    b, c = (torch.randn(2, 300, 1, 32, device="cuda", generator=gen) for _ in range(2))
    torch.testing.assert_close(ssd_scan(x, dt, a_head, b, c, 64, impl="mamba_ssm"),
                               ssd_scan(x, dt, a_head, b, c, 64, impl="torch"), atol=2e-3, rtol=2e-3)


# ============================================================================================ MLM data ops
def test_reverse_complement_keeps_padding_and_is_an_involution():
    tokens = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, PAD_TOKEN, PAD_TOKEN]])
    valid = tokens != PAD_TOKEN
    rc = reverse_complement(tokens, valid)
    assert decode(rc[0]) == "NACGT"  # ACGTN -> reverse NTGCA -> complement NACGT
    assert rc[1].tolist() == [2, 3, 3, PAD_TOKEN, PAD_TOKEN]  # AAC -> GTT
    assert torch.equal(reverse_complement(rc, valid), tokens)


def test_mlm_masking_proportions_on_a_big_sample():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5, (400, 500), generator=gen)  # ~20 % N
    tokens[:, 450:] = PAD_TOKEN
    valid = tokens != PAD_TOKEN
    inputs, targets = mlm_mask(tokens, valid, 0.15, gen)
    selected = targets != IGNORE_INDEX
    acgt = (tokens < 4) & valid
    assert not (selected & ~acgt).any()  # only A/C/G/T positions, never N or padding
    assert torch.equal(inputs[~selected], tokens[~selected])
    assert torch.equal(targets[selected], tokens[selected])
    assert selected.sum().item() / acgt.sum().item() == pytest.approx(0.15, abs=0.003)
    n = selected.sum().item()
    masked = (inputs[selected] == MASK_TOKEN).sum().item() / n
    changed = ((inputs[selected] != MASK_TOKEN) & (inputs[selected] != tokens[selected])).sum().item() / n
    kept = (inputs[selected] == tokens[selected]).sum().item() / n
    assert masked == pytest.approx(0.8, abs=0.01)
    assert changed == pytest.approx(0.1 * 0.75, abs=0.006)  # a random base differs from the original 3/4 times
    assert kept == pytest.approx(0.1 + 0.1 * 0.25, abs=0.006)
    assert ((inputs[selected] < 4) | (inputs[selected] == MASK_TOKEN)).all()


# ============================================================================================ layout / config errors
def test_layout_parser():
    assert parse_layout("m3t1") == [("mamba", False)] * 3 + [("attention", False)]
    assert parse_layout("M10") == [("mamba", True)] * 10
    assert parse_layout("T2m1") == [("attention", True)] * 2 + [("mamba", False)]
    assert check_arch_layout(["m3t1", ["M10"], "m4"]) == ("m3t1", "M10", "m4")


@pytest.mark.parametrize("layout", ["", "x3", "m", "m0", "3m", "m3t", "m3 t1", "m-1"])
def test_layout_parser_errors(layout):
    with pytest.raises(UserInputError, match="layout"):
        parse_layout(layout)


@pytest.mark.parametrize("arch", [["m3t1", "M10", "m4"], ["m3t1", ["M10", "m2"], "m4"], ["m3t1", [["M2"]], "m4"],
                                  ["m3t1", ["M10"]], ["m3t1", ["Q1"], "m4"]])
def test_arch_layout_errors(arch):
    with pytest.raises(UserInputError):
        check_arch_layout(arch)


@pytest.mark.parametrize("override,match", [({"d_intermediate": [0, 0]}, "d_intermediate is 0"),
                                            ({"d_model": [32, 16]}, "d_backbone"),
                                            ({"target_compression": 1.0}, "target_compression"),
                                            ({"boundaries": "fixed", "target_compression": 2.5}, "integer"),
                                            ({"headdim": 12}, "headdim"),
                                            ({"rotary_dim": 3}, "rotary_dim"),
                                            ({"mask_prob": 0.0}, "mask_prob")])
def test_bad_module_arguments_raise(override, match):
    with pytest.raises(UserInputError, match=match):
        LDARNetPretraining(**{**TINY, **override})


def test_wsd_schedule_shape():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WSDSchedule(opt, total_steps=100, warmup_fraction=0.1, decay_fraction=0.2, final_ratio=0.05)
    assert sched.factor(0) == pytest.approx(0.1) and sched.factor(9) == pytest.approx(1.0)
    assert sched.factor(50) == 1.0 and sched.factor(79) == 1.0
    assert sched.factor(100) == pytest.approx(0.05)
    assert sched.factor(85) == pytest.approx(0.05 + 0.95 * (1 - math.sqrt(5 / 20)))
    with pytest.raises(UserInputError):
        WSDSchedule(opt, total_steps=0)


# ============================================================================================ modules
def _batch(lengths, total, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), total), PAD_TOKEN)
    for row, length in enumerate(lengths):
        tokens[row, :length] = torch.randint(0, 4, (length,), generator=gen)
    return {"tokens": tokens, "mask": tokens != PAD_TOKEN, "label": torch.tensor([0, 1][: len(lengths)])}


@pytest.mark.parametrize("boundaries", ["learned", "fixed"])
def test_classifier_output_does_not_depend_on_padding(boundaries):
    torch.manual_seed(0)
    model = LDARNetClassifier(**TINY, boundaries=boundaries).eval()
    with torch.no_grad():  # make the residual path and the router non-trivial
        model.net.residual_proj.weight.normal_(0, 0.1)
    batch = _batch([30, 19], 30)
    with torch.no_grad():
        both = model.predict_step(batch, 0)
        alone = model.predict_step({"tokens": batch["tokens"][1:, :19], "mask": batch["mask"][1:, :19]}, 0)
    torch.testing.assert_close(both[1], alone[0], atol=1e-5, rtol=1e-5)


def test_fixed_control_compresses_exactly_by_n_and_freezes_the_router():
    model = LDARNetPretraining(**TINY, boundaries="fixed", target_compression=4)
    batch = _batch([32, 32], 32)
    _, aux = model.net(batch["tokens"], batch["mask"])
    assert aux["compression"].item() == 0.25 and aux["ratio_loss"].item() == 0.0
    assert not any(p.requires_grad for p in model.net.router.parameters())


def test_pretraining_loss_is_finite_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = LDARNetPretraining(**TINY)
    loss = model._step(_batch([32, 20], 32), "train")
    loss.backward()
    assert torch.isfinite(loss)
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


def test_optimizer_groups_weight_decay_and_lr_multiplier():
    from functools import partial
    model = LDARNetClassifier(**TINY, outer_lr_multiplier=3.0, head_lr_multiplier=10.0,
                              optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1))
    optimizer = model.configure_optimizers()
    lookup = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lookup[id(named["head.weight"])]["lr"] == pytest.approx(1e-2)
    assert lookup[id(named["net.main.blocks.0.mixer.in_proj.weight"])]["lr"] == pytest.approx(1e-3)
    assert lookup[id(named["net.encoder.blocks.0.mixer.in_proj.weight"])]["lr"] == pytest.approx(3e-3)
    for name in ("net.encoder.blocks.0.mixer.fwd.A_log", "net.main.blocks.0.norm1.weight", "head.bias",
                 "net.encoder.blocks.0.mixer.bwd.dt_bias"):
        assert no_weight_decay(name, named[name]) and lookup[id(named[name])]["weight_decay"] == 0.0
    assert lookup[id(named["net.main.blocks.0.mixer.in_proj.weight"])]["weight_decay"] == 0.1
    model.lr_scheduler_factory = partial(WSDSchedule, total_steps=100)  # warm-up starts at 1/10 of the scaled LR
    config = model.configure_optimizers()
    lrs = {g["lr_multiplier"]: g["lr"] for g in config["optimizer"].param_groups}
    assert lrs == pytest.approx({10.0: 1e-3, 1.0: 1e-4, 3.0: 3e-4})
    config["lr_scheduler"]["scheduler"].step()
    lrs = {g["lr_multiplier"]: g["lr"] for g in config["optimizer"].param_groups}
    assert lrs == pytest.approx({10.0: 2e-3, 1.0: 2e-4, 3.0: 6e-4})


def test_classifier_init_from_pretraining_checkpoint(tmp_path):
    pre = LDARNetPretraining(**TINY)
    path = tmp_path / "pre.ckpt"
    torch.save({"state_dict": pre.state_dict()}, path)
    clf = LDARNetClassifier(**TINY, init_from=str(path))
    report = clf.load_initial_weights()
    assert "net.router.q_proj.weight" in report["loaded"] and "lm_head.weight" in report["not_in_model"]
    assert torch.equal(clf.net.encoder.blocks[0].mixer.in_proj.weight, pre.net.encoder.blocks[0].mixer.in_proj.weight)


def test_bad_batches_raise():
    model = LDARNetClassifier(**TINY)
    batch = _batch([10, 10], 10)
    batch["tokens"][0, 0] = 9
    with pytest.raises(UserInputError, match="token ids"):
        model.predict_step(batch, 0)
    batch = _batch([10, 10], 10)
    batch["mask"][1] = False
    with pytest.raises(UserInputError, match="empty"):
        model.predict_step(batch, 0)


# ============================================================================================ data
def test_synthetic_task_labels_are_motif_pairs_and_deterministic():
    tokens, labels = synthetic_motif_task(300, 128, seed=3)
    pair = motif_hits(tokens, MOTIFS[0]).any(1) & motif_hits(tokens, MOTIFS[1]).any(1)
    assert np.array_equal(labels, pair.astype(np.int64))
    assert 0.4 < labels.mean() < 0.6
    again, _ = synthetic_motif_task(300, 128, seed=3)
    assert np.array_equal(tokens, again)
    edges = motif_edge_mask(tokens, radius=0)
    row, start = map(int, np.argwhere(motif_hits(tokens, "TATAAA"))[0])
    assert edges[row, start] and (start + 6 >= 128 or edges[row, start + 6])


def test_encode_decode_and_invalid_characters():
    assert encode("acgtNRY").tolist() == [0, 1, 2, 3, 4, 4, 4]
    assert decode(encode("ACGTN")) == "ACGTN"
    with pytest.raises(UserInputError, match="invalid DNA character '1'"):
        encode("AC1T", "file.txt")


def _write_fasta(path, text, gz=False):
    (gzip.open(path, "wt") if gz else open(path, "w")).write(text)


@pytest.mark.parametrize("gz", [False, True])
def test_read_fasta(tmp_path, gz):
    path = str(tmp_path / ("g.fa.gz" if gz else "g.fa"))
    _write_fasta(path, ">chr1 description\nACGT\nacgtn\n\n>chr2\nTTTT\n", gz)
    genome = read_fasta(path)
    assert decode(genome["chr1"]) == "ACGTACGTN" and decode(genome["chr2"]) == "TTTT"


@pytest.mark.parametrize("text,match", [("ACGT\n>chr1\nAC\n", "before the first"), (">a\nAC\n>a\nGG\n", "duplicate"),
                                        (">a\nAC*T\n", "invalid DNA"), ("\n\n", "no FASTA record")])
def test_read_fasta_errors(tmp_path, text, match):
    path = str(tmp_path / "g.fa")
    _write_fasta(path, text)
    with pytest.raises(UserInputError, match=match):
        read_fasta(path)
    with pytest.raises(UserInputError, match="not found"):
        read_fasta(str(tmp_path / "missing.fa"))


@pytest.mark.parametrize("line,match", [("chr1 0 10", "4 columns"), ("chr1 a 10 train", "integers"),
                                        ("chr1 0 10 dev", "split"), ("chrX 0 10 train", "not in the FASTA"),
                                        ("chr1 0 99 train", "outside")])
def test_bed_errors_name_the_line(tmp_path, line, match):
    genome = {"chr1": np.zeros(40, dtype=np.uint8)}
    (tmp_path / "w.bed").write_text(f"chr1 0 20 train\n{line}\n")
    with pytest.raises(UserInputError, match=rf"w.bed:2: .*{match}"):
        read_bed_windows(str(tmp_path / "w.bed"), genome)


def test_pretrain_datamodule_fasta_with_bed_windows(tmp_path):
    _write_fasta(str(tmp_path / "ldar_data.fa"), ">chr1\n" + "ACGT" * 25 + "\n>chr2\n" + "GGCC" * 10 + "\n")
    (tmp_path / "w.bed").write_text("chr1 0 64 train\nchr1 64 100 valid\nchr2 0 40 test\n")
    dm = DNAPretrainDataModule(source="fasta", data_dir=str(tmp_path), bed_name="w.bed", seq_len=16, batch_size=3)
    dm.setup("fit")
    assert len(dm.train_set) == 4 and len(dm.val_set) == 3 and len(dm.test_set) == 3  # 36 -> 16 + 16 + 4
    batch = next(iter(dm.val_dataloader()))
    assert batch["tokens"].shape == (3, 16) and batch["mask"].sum().item() == 36
    assert decode(batch["tokens"][0]) == "ACGT" * 4
    with pytest.raises(UserInputError, match="data_dir"):
        DNAPretrainDataModule(source="fasta")


def test_pretrain_datamodule_fasta_without_bed_splits_tiles(tmp_path):
    _write_fasta(str(tmp_path / "ldar_data.fa"), ">chr1\n" + "ACGT" * 100 + "\n")
    dm = DNAPretrainDataModule(source="fasta", data_dir=str(tmp_path), seq_len=8, val_fraction=0.1,
                               test_fraction=0.1)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (40, 5, 5)


def _write_nt_csv(path, rows):
    path.write_text("sequence,label,task\n" + "".join(f"{s},{y},{t}\n" for s, y, t in rows))


def test_nucleotide_transformer_csv(tmp_path):
    rows = [("ACGTAC", 0, "H3"), ("GGGG", 1, "H3"), ("TTTT", 1, "H4"), ("CCAT", 0, "H3")]
    _write_nt_csv(tmp_path / "train.csv", rows)
    _write_nt_csv(tmp_path / "test.csv", [("ACGT", 1, "H3"), ("AAAA", 0, "H4")])
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "train", "H3")
    assert [decode(s) for s in seqs] == ["ACGTAC", "GGGG", "CCAT"] and labels.tolist() == [0, 1, 0]
    dm = DNAClassificationDataModule(source="nucleotide_transformer", data_dir=str(tmp_path), task="H3",
                                     max_length=5, val_fraction=0.34)
    dm.setup("fit")
    assert dm.num_classes == 2 and len(dm.train_set) + len(dm.val_set) == 3 and len(dm.test_set) == 1
    assert max(len(s) for s in dm.train_set.sequences + dm.val_set.sequences) <= 5


def test_nucleotide_transformer_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", exc_type=ImportError)  # absent or broken (numpy ABI)
    import pyarrow as pa
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"sequence": ["ACGT", "AAAA", "CC"], "label": [1, 0, 0], "task": ["H3", "H4", "H3"]}),
                   tmp_path / "data" / "train-00000-of-00001.parquet")
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "train", "H3")
    assert [decode(s) for s in seqs] == ["ACGT", "CC"] and labels.tolist() == [1, 0]


@pytest.mark.parametrize("problem,match", [("task", "no rows"), ("column", "missing column"), ("label", "integer"),
                                           ("split", "no 'test' split"), ("notask", "set data.init_args.task")])
def test_nucleotide_transformer_errors(tmp_path, problem, match):
    if problem == "column":
        (tmp_path / "train.csv").write_text("seq,label,task\nACGT,0,H3\n")
    elif problem == "label":
        _write_nt_csv(tmp_path / "train.csv", [("ACGT", "x", "H3")])
    elif problem == "notask":  # several tasks in one table (a single one is read without a name)
        _write_nt_csv(tmp_path / "train.csv", [("ACGT", 0, "H3"), ("ACGT", 1, "H4")])
    else:
        _write_nt_csv(tmp_path / "train.csv", [("ACGT", 0, "H3")])
    task = {"task": "H9", "notask": None}.get(problem, "H3")
    split = "test" if problem == "split" else "train"
    with pytest.raises(UserInputError, match=match):
        read_nucleotide_transformer(str(tmp_path), split, task)


def test_genomic_benchmarks_layout_and_errors(tmp_path):
    for split in ("train", "test"):
        for name, seq in (("negative", "AAAA"), ("positive", "CCGG")):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(3):
                (tmp_path / split / name / f"{i}.txt").write_text(seq + "\n")
    seqs, labels, classes = read_genomic_benchmarks(str(tmp_path), "train")
    assert classes == ["negative", "positive"] and labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert decode(seqs[3]) == "CCGG"
    dm = DNAClassificationDataModule(source="genomic_benchmarks", data_dir=str(tmp_path), val_fraction=0.2)
    dm.setup("fit")
    assert dm.num_classes == 2 and len(dm.test_set) == 6
    with pytest.raises(UserInputError, match="classes"):
        read_genomic_benchmarks(str(tmp_path), "test", ["a", "b"])
    with pytest.raises(UserInputError, match="not found"):
        read_genomic_benchmarks(str(tmp_path / "nothing"), "train")
    (tmp_path / "train" / "empty").mkdir()
    with pytest.raises(UserInputError, match="no .txt"):
        read_genomic_benchmarks(str(tmp_path), "train")



# The released NT downstream-task snapshot (HF InstaDeepAI/nucleotide_transformer_downstream_tasks): one folder per
# task with train/test parquet (columns sequence, name, label; a task column in later revisions) next to the original
# FASTA files whose headers are ">name|label"; the dataset's loading script took the label after the last "|".
NT_H3_TRAIN = [("ACGTAC", "chr1:0-6|0", 0), ("GGGG", "chr2:5-9|1", 1), ("CCAT", "chr3:1-5|0", 0)]
NT_H3_TEST = [("ACGT", "chr4:0-4|1", 1), ("AATT", "chr5:0-4|0", 0)]


def _write_nt_fna(path, rows):
    # wrapped at 4 bases per line, as FASTA writers do for long records
    path.write_text("".join(f">{name}\n" + "\n".join(seq[i:i + 4] for i in range(0, len(seq), 4)) + "\n"
                            for seq, name, _ in rows))


def _write_nt_snapshot(root, parquet=True, fna=True, converted=False):
    for task, train, test, with_task_column in (("H3", NT_H3_TRAIN, NT_H3_TEST, True),
                                                ("promoter_tata", NT_H3_TEST, NT_H3_TRAIN, False)):
        (root / task).mkdir(parents=True)
        for split, rows in (("train", train), ("test", test)):
            if parquet:
                pq = pytest.importorskip("pyarrow.parquet", exc_type=ImportError)
                import pyarrow as pa
                columns = {"sequence": [r[0] for r in rows], "name": [r[1] for r in rows],
                           "label": pa.array([r[2] for r in rows], pa.int32())}
                if with_task_column:
                    columns["task"] = [task] * len(rows)
                if converted:  # the Hub's parquet conversion: <task>/<split>/0000.parquet
                    (root / task / split).mkdir()
                pq.write_table(pa.table(columns), root / task / (f"{split}/0000.parquet" if converted else
                                                                 f"{split}.parquet"))
            if fna:
                _write_nt_fna(root / task / f"{split}.fna", rows)


@pytest.mark.parametrize("files", ["parquet", "fna", "both", "converted"])
def test_nucleotide_transformer_snapshot_root(tmp_path, files):
    _write_nt_snapshot(tmp_path, parquet=files != "fna", fna=files in ("fna", "both"), converted=files == "converted")
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "train", "H3")
    assert [decode(s) for s in seqs] == [r[0] for r in NT_H3_TRAIN] and labels.tolist() == [0, 1, 0]
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "test", "promoter_tata")
    assert [decode(s) for s in seqs] == [r[0] for r in NT_H3_TRAIN] and labels.tolist() == [0, 1, 0]
    # one task folder given directly reads the same rows
    seqs, labels = read_nucleotide_transformer(str(tmp_path / "H3"), "test", None)
    assert [decode(s) for s in seqs] == ["ACGT", "AATT"] and labels.tolist() == [1, 0]
    dm = DNAClassificationDataModule(source="nucleotide_transformer", data_dir=str(tmp_path), task="H3",
                                     val_fraction=0.34)
    dm.setup("fit")
    assert dm.num_classes == 2 and len(dm.train_set) + len(dm.val_set) == 3 and len(dm.test_set) == 2
    with pytest.raises(UserInputError, match=r"task 'H9' is not under .*tasks found: \['H3', 'promoter_tata'\]"):
        DNAClassificationDataModule(source="nucleotide_transformer", data_dir=str(tmp_path), task="H9").setup("fit")
    with pytest.raises(UserInputError, match=r"2 NT tasks: set data.init_args.task to one of"):
        read_nucleotide_transformer(str(tmp_path), "train", None)


def test_nucleotide_transformer_fna_only_task_is_found_and_headers_checked(tmp_path):
    (tmp_path / "enhancers").mkdir()
    _write_nt_fna(tmp_path / "enhancers" / "train.fna", NT_H3_TRAIN)
    _write_nt_fna(tmp_path / "enhancers" / "test.fna", NT_H3_TEST)
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "train", None)  # the only task: no name needed
    assert [decode(s) for s in seqs] == ["ACGTAC", "GGGG", "CCAT"] and labels.tolist() == [0, 1, 0]
    (tmp_path / "enhancers" / "test.fna").write_text(">chr4:0-4\nACGT\n")
    with pytest.raises(UserInputError, match=r"test.fna:1: header '>chr4:0-4' does not end in '\|<integer label>'"):
        read_nucleotide_transformer(str(tmp_path), "test", None)
    (tmp_path / "enhancers" / "test.fna").unlink()
    with pytest.raises(UserInputError, match="no 'test' split"):
        read_nucleotide_transformer(str(tmp_path), "test", None)



def test_nucleotide_transformer_reads_the_fna_when_pyarrow_is_unusable(tmp_path, monkeypatch):
    import datamodules.genomics as genomics

    _write_nt_snapshot(tmp_path)  # parquet and FASTA side by side, as released
    monkeypatch.setattr(genomics, "_pyarrow_error", lambda: "numpy ABI mismatch")
    seqs, labels = read_nucleotide_transformer(str(tmp_path), "train", "H3")
    assert [decode(s) for s in seqs] == [r[0] for r in NT_H3_TRAIN] and labels.tolist() == [0, 1, 0]
    for split in ("train", "test"):
        (tmp_path / "H3" / f"{split}.fna").unlink()
    with pytest.raises(UserInputError, match=r"needs a working pyarrow \(numpy ABI mismatch\).*\.fna"):
        read_nucleotide_transformer(str(tmp_path), "train", "H3")

def _write_genomic_benchmark(folder, classes=("negative", "positive")):
    for split in ("train", "test"):
        for label, name in enumerate(classes):
            (folder / split / name).mkdir(parents=True)
            for i in range(2):
                (folder / split / name / f"{i}.txt").write_text("ACGT"[label] * 4 + "\n")


def test_genomic_benchmarks_cache_root(tmp_path):
    # genomic-benchmarks' download_dataset writes ~/.genomic_benchmarks/<dataset_name>/{train,test}/<class>/<id>.txt
    _write_genomic_benchmark(tmp_path / "human_nontata_promoters")
    (tmp_path / "fasta").mkdir()  # other cache content without a train/ folder is not a dataset
    seqs, labels, classes = read_genomic_benchmarks(str(tmp_path), "train")
    assert classes == ["negative", "positive"] and labels.tolist() == [0, 0, 1, 1] and decode(seqs[2]) == "CCCC"
    dm = DNAClassificationDataModule(source="genomic_benchmarks", data_dir=str(tmp_path), val_fraction=0.25)
    dm.setup("fit")
    assert dm.num_classes == 2 and len(dm.test_set) == 4
    _write_genomic_benchmark(tmp_path / "demo_coding_vs_intergenomic_seqs", ("coding", "intergenomic"))
    with pytest.raises(UserInputError, match=r"2 Genomic Benchmarks datasets: set data.init_args.task"):
        read_genomic_benchmarks(str(tmp_path), "train")
    dm = DNAClassificationDataModule(source="genomic_benchmarks", data_dir=str(tmp_path),
                                     task="demo_coding_vs_intergenomic_seqs", val_fraction=0.25)
    dm.setup("fit")
    assert dm.class_names == ["coding", "intergenomic"]
    with pytest.raises(UserInputError, match=r"dataset 'x' is not under .*datasets found: \['demo_coding"):
        read_genomic_benchmarks(str(tmp_path), "train", dataset="x")

def test_classification_datamodule_errors_and_collate():
    with pytest.raises(UserInputError, match="data_dir"):
        DNAClassificationDataModule(source="genomic_benchmarks")
    with pytest.raises(UserInputError, match="source"):
        DNAClassificationDataModule(source="hub")
    batch = PadCollate()([{"tokens": torch.tensor([0, 1, 2]), "label": 1}, {"tokens": torch.tensor([3]), "label": 0}])
    assert batch["tokens"].tolist() == [[0, 1, 2], [3, PAD_TOKEN, PAD_TOKEN]]
    assert batch["mask"].tolist() == [[True, True, True], [True, False, False]]


def test_classifier_num_classes_must_match_the_data():
    model = LDARNetClassifier(**TINY, num_classes=3)

    class FakeDM:
        num_classes = 2

    model._trainer = type("T", (), {"datamodule": FakeDM(), "ckpt_path": None})()
    with pytest.raises(UserInputError, match="num_classes=2"):
        model.setup("fit")


# ============================================================================================ experiment (slow)
@pytest.mark.slow
def test_reduced_experiment_learned_router_compresses_towards_one_over_n():
    """Reduced `experiments.ldarnet` (~1.5 min; one run per arm through the runner, `train_run`): after MLM the
    learned router's compression is near 1/N = 0.25 with a ratio loss near 1; the fixed control compresses by
    exactly 1/4; MLM beats chance in both arms."""
    from experiments.ldarnet import train_run

    pretrain = {"trainer.max_steps": 80, "trainer.val_check_interval": 80}
    finetune = {"trainer.max_steps": 30, "data.init_args.synthetic_train": 400, "data.init_args.synthetic_test": 200}
    learned, fixed = (train_run(arm, 0, pretrain, finetune) for arm in ("learned", "fixed"))
    summary = {k: (learned[k], fixed[k]) for k in ("pretrain_compression", "pretrain_ratio_loss", "compression",
                                                   "mlm_accuracy", "mcc")}
    assert 0.1 < learned["pretrain_compression"] < 0.5, summary
    assert learned["pretrain_ratio_loss"] < 1.3, summary
    assert fixed["compression"] == 0.25 and fixed["pretrain_compression"] == 0.25, summary
    for run in (learned, fixed):  # 30 fine-tuning steps are too few to beat chance on the task (fixed: MCC 0.02),
        assert run["mlm_accuracy"] > 0.25, summary  # so only MLM above chance on A/C/G/T is asserted here


def test_classifier_test_mcc_is_matthews_of_its_own_predictions():
    """test/mcc (the paper's metric) equals the Matthews correlation of the predicted classes, by formula."""
    from lightning.pytorch import Trainer

    dm = DNAClassificationDataModule(synthetic_train=64, synthetic_test=64, synthetic_length=64, batch_size=16,
                                     eval_batch_size=16, seed=0)
    torch.manual_seed(1)
    model = LDARNetClassifier(**TINY, num_classes=2)
    with torch.no_grad():  # a head that splits the classes on the pooled features: both classes get predicted
        model.head.bias.copy_(torch.tensor([0.0, 0.0]))
        model.head.weight.copy_(torch.randn_like(model.head.weight) * 5)
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    mcc = trainer.test(model, datamodule=dm, verbose=False)[0]["test/mcc"]
    pred = torch.cat(trainer.predict(model, dataloaders=dm.test_dataloader())).argmax(-1)
    label = torch.cat([batch["label"] for batch in dm.test_dataloader()])
    tp, tn = float(((pred == 1) & (label == 1)).sum()), float(((pred == 0) & (label == 0)).sum())
    fp, fn = float(((pred == 1) & (label == 0)).sum()), float(((pred == 0) & (label == 1)).sum())
    assert min(tp + fp, tn + fn, tp + fn, tn + fp) > 0, (tp, tn, fp, fn)  # not a degenerate confusion matrix
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert mcc == pytest.approx(expected, abs=1e-5)


def test_published_sizes_110m_and_micro_2m():
    """The paper config has the README's 110.69M parameters; the micro config (SwiGLU 384) the paper's 2.01M."""
    import yaml

    from conftest import REPO

    config = yaml.safe_load((REPO / "configs/ldarnet/pretrain_paper.yaml").read_text())["model"]["init_args"]
    config = {k: v for k, v in config.items() if k not in ("optimizer", "lr_scheduler")}
    with torch.device("meta"):
        model = LDARNetPretraining(**config)
        micro = LDARNetPretraining(arch_layout=["m3t1", ["M6"], "m3"], d_model=[64, 128], d_intermediate=[0, 384],
                                   attn_heads=2)
    assert sum(p.numel() for p in model.parameters()) == 110_686_791
    assert round(sum(p.numel() for p in micro.parameters()) / 1e6, 2) == 2.01
