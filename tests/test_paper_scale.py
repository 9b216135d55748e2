"""The paper-scale check (`experiments.paper_scale`): the memory formula, a meta build, the JSON schema, --gpu path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import REPO
from experiments import paper_scale
from lightning_modules.shared.errors import UserInputError

SCHEMA = {"params": int, "paper_params": (int, type(None)), "built_on": str, "train_memory_gib_per_device": float,
          "device_memory_gib": float, "fits": bool, "strategy": str, "cpu_steps": int, "step_s": (float, type(None)),
          "note": str}


def test_state_bytes_of_a_two_layer_mlp_with_adamw_in_fp32_is_16_bytes_per_parameter():
    mlp = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))   # 220 + 105 = 325 parameters
    rows = [(p.numel(), p.element_size(), True) for p in mlp.parameters()]
    terms = paper_scale.state_bytes(rows, states=2, ema=False)
    assert sum(n for n, _, _ in rows) == 325
    assert terms == {"weights": 1300, "gradients": 1300, "optimizer": 2600, "ema": 0}
    assert sum(terms.values()) == 16 * 325
    frozen = [(n, size, i == 0) for i, (n, size, _) in enumerate(rows)]          # only the first weight trains
    assert paper_scale.state_bytes(frozen, states=1, ema=True, shards=2) == {
        "weights": 650, "gradients": 400, "optimizer": 400, "ema": 400}


def test_saved_activations_of_the_mlp_are_its_input_hidden_and_relu_output():
    mlp = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    # saved for backward at batch 4: the input of layer 1 (4x10, only if it requires grad: it does not), the
    # ReLU output (4x20, saved by ReLU and by the second Linear: one storage) -> 80 fp32 = 320 bytes
    assert paper_scale.probe_activation_bytes(mlp, torch.zeros(4, 10), autocast=False) == 4 * 20 * 4


def test_decoder_activation_formula_by_hand():
    cfg = type("C", (), {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 10,
                         "num_attention_heads": 2, "num_key_value_heads": 1})()
    per_layer = (6 * 8 + 2 * 4 + 4 * 16) * 2                          # kv width 1 head x 4 = 4; 240 bytes
    assert paper_scale.decoder_activation_bytes(cfg, 3, 2, False, 4) == 3 * (2 * per_layer + 10 * 4)
    assert paper_scale.decoder_activation_bytes(cfg, 3, 2, True, 4) == 3 * (2 * 8 * 2 + per_layer + 10 * 4)
    # logits at one position per sequence (PCLM's option scores): 2 sequences of 3 tokens
    assert paper_scale.decoder_activation_bytes(cfg, 6, 2, False, 4, 2) == 6 * 2 * per_layer + 2 * 10 * 4


def test_optimizer_state_counts_and_unknown_optimizer_is_an_error():
    from jsonargparse import Namespace

    assert paper_scale.optimizer_states(Namespace(class_path="torch.optim.AdamW", init_args=Namespace()))[0] == 2
    assert paper_scale.optimizer_states(Namespace(class_path="torch.optim.SGD",
                                                  init_args=Namespace(momentum=0.9)))[0] == 1
    assert paper_scale.optimizer_states(Namespace(class_path="torch.optim.SGD", init_args=Namespace()))[0] == 0
    with pytest.raises(paper_scale.UserInputError, match="no state count"):
        paper_scale.optimizer_states(Namespace(class_path="torch.optim.LBFGS", init_args=Namespace()))


def test_meta_build_of_the_7b_policy_has_the_published_parameter_count():
    built = paper_scale.build("configs/dars/paper.yaml")
    assert built["on_meta"]
    params = sum(p.numel() for p in built["model"].parameters())
    assert params == 7_615_616_512                      # Qwen2.5-7B architecture: 7.61B (Qwen2.5 report)
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in built["model"].parameters())
    memory = paper_scale.estimate(built)                # FSDP2 over 8 devices (ModelParallelStrategy)
    assert memory["terms"]["weights"] == 2 * params / 8  # bf16 weights, gradients, two AdamW states, sharded
    assert memory["terms"]["optimizer"] == 2 * memory["terms"]["gradients"] == 4 * params / 8
    assert "datamodule not built" in built["data_note"] and "models/Qwen2.5-Math-7B" in built["data_note"]


def test_schema_of_one_small_config(tmp_path):
    result = paper_scale.main(["--config", "configs/tamed_sgd/paper.yaml", "--out", str(tmp_path),
                               "--cpu-steps", "0", "--release-steps", "0"])
    written = json.loads((tmp_path / "paper_scale.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert list(written) == ["configs"]
    entry = written["configs"]["configs/tamed_sgd/paper.yaml"]
    assert set(entry) == set(SCHEMA)
    for key, kind in SCHEMA.items():
        assert isinstance(entry[key], kind), key
    assert entry["params"] == 2 and entry["built_on"] == "cpu" and entry["fits"]
    assert entry["strategy"] == "one device per replica (DDP)"
    assert "| configs/tamed_sgd/paper.yaml |" in (tmp_path / "paper_scale.md").read_text()


def test_one_config_updates_its_entry_and_keeps_the_others(tmp_path):
    kept = {"params": 1, "paper_params": None, "built_on": "cpu", "train_memory_gib_per_device": 0.0,
            "device_memory_gib": 80.0, "fits": True, "cpu_steps": 0, "step_s": None, "note": "kept"}
    (tmp_path / "paper_scale.json").write_text(json.dumps({"configs": {"configs/zzz/paper.yaml": kept}}))
    paper_scale.main(["--config", "configs/tamed_sgd/paper.yaml", "--out", str(tmp_path), "--cpu-steps", "0",
                      "--release-steps", "0"])
    written = json.loads((tmp_path / "paper_scale.json").read_text())["configs"]
    assert list(written) == ["configs/tamed_sgd/paper.yaml", "configs/zzz/paper.yaml"]
    assert written["configs/zzz/paper.yaml"] == kept
    assert "| configs/zzz/paper.yaml |" in (tmp_path / "paper_scale.md").read_text()


@pytest.mark.slow
def test_gpu_path_on_cpu_with_a_tiny_batch(tmp_path):
    result = paper_scale.main(["--config", "configs/trew/classifier_paper.yaml", "--out", str(tmp_path),
                               "--cpu-steps", "0", "--release-steps", "0", "--gpu", "--device", "cpu", "--tiny",
                               "--steps", "2"])
    entry = result["configs"]["configs/trew/classifier_paper.yaml"]
    assert "cpu bf16 tiny:" in entry["note"] and "samples/s" in entry["note"]


@pytest.mark.slow
def test_release_steps_fill_cpu_steps_step_time_and_the_run_record(tmp_path):
    """`experiments.paper_steps` runs in its own process; its figures become cpu_steps, step_s and release_run,
    and a second run with --release-steps 0 keeps them."""
    path = "configs/tamed_sgd/paper.yaml"
    entry = paper_scale.main(["--config", path, "--out", str(tmp_path), "--cpu-steps", "0"])["configs"][path]
    assert entry["cpu_steps"] == 3 and entry["step_s"] > 0
    assert entry["release_run"]["resumed_from"] == 2 and entry["release_run"]["predict_batches"] >= 1
    assert "train.py: 3 optimizer steps (a resume from step 2)" in entry["note"]
    again = paper_scale.main(["--config", path, "--out", str(tmp_path), "--cpu-steps", "0", "--release-steps", "0"])
    assert again["configs"][path]["release_run"] == entry["release_run"]


def test_gpu_without_cuda_is_refused(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit):
        paper_scale.main(["--config", "configs/tamed_sgd/paper.yaml", "--out", str(tmp_path), "--gpu"])
    assert "--device cpu --tiny" in capsys.readouterr().err


def test_the_shard_count_follows_the_strategy():
    fsdp2 = {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
             "init_args": {"data_parallel_size": 4, "tensor_parallel_size": 1}}
    assert paper_scale._shards(fsdp2, 4) == 4
    assert paper_scale._shards({**fsdp2, "init_args": {"data_parallel_size": "auto"}}, 8) == 8
    assert paper_scale._shards("fsdp", 8) == 8
    assert paper_scale._shards("ddp", 8) == 1 and paper_scale._shards(None, 1) == 1


def test_the_readmes_scaling_table_is_generated_from_the_result():
    """README.md's "Scaling up" table is `paper_scale.readme_table` of results/paper_scale.json (regenerate it with
    ``python -m experiments.paper_scale --readme``)."""
    results = json.loads((REPO / "results" / "paper_scale.json").read_text())
    readme = (REPO / "README.md").read_text()
    table = paper_scale.readme_table(results)
    assert table in readme, "README.md's Scaling up table differs from results/paper_scale.json: run " \
                            "`python -m experiments.paper_scale --readme`"
    assert len(table.splitlines()) == len({Path(p).parent.name for p in results["configs"]}) + 4


def test_write_readme_needs_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no table here\n")
    with pytest.raises(UserInputError, match="no paper_scale table markers"):
        paper_scale.write_readme({"configs": {}}, readme)
