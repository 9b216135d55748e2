"""The paper registry (`icml26.registry`): every card loads and is complete, the README table agrees with the cards,
the ``icml26 papers`` command works, and a broken card fails with one line naming the card and the field."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import PAPER_CONFIGS, PAPERS, QUICK_CONFIGS, REPO, SWEEP_FILES
from experiments import runner
from icml26 import registry
from icml26.commands import run_command
from lightning_modules.shared.errors import UserInputError

# configs/ folders that are not papers: reusable groups, sweeps and the shared GRPO/RLVR core
NOT_PAPERS = {"trainer", "logger", "sweeps", *registry.SHARED_CONFIG_FOLDERS}
# files under configs/<paper>/ that are not CLI configs: the card itself and the experiment protocol
NOT_CLI_CONFIGS = {"card.yaml", "experiment.yaml"}
# nor the protocols of a paper's further experiments (configs/<paper>/<stem>.yaml, run as <paper>/<stem>)
FURTHER_EXPERIMENTS = {str(runner.experiment_path(name).relative_to(REPO))
                       for name in runner.available(secondary=True) if runner.is_secondary(name)}
# result files of the collection as a whole (test-suite timings, the GRPO core's speed and memory)
SHARED_RESULTS = {"results/timings.json", "results/rlvr_speed.json", "results/rlvr_memory.json",
                  "results/paper_scale.json"}
# a callback every config attaches (the files `predict` writes): infrastructure, not a paper's piece
INFRASTRUCTURE = {"callbacks.prediction_writer.PredictionWriter"}
COLLECTION = ("lightning_modules.", "datamodules.", "callbacks.")


def test_every_paper_folder_has_a_card_and_the_grpo_core_has_none():
    folders = sorted(p.name for p in (REPO / "configs").iterdir() if p.is_dir() and p.name not in NOT_PAPERS)
    assert PAPERS == folders
    assert len(PAPERS) == 19 and "grpo" not in PAPERS
    assert not (REPO / "configs/grpo/card.yaml").exists()


@pytest.mark.parametrize("name", PAPERS)
def test_the_card_loads_and_every_class_has_its_fields_kind(name):
    card = registry.card(name)
    assert card["name"] == name
    registry.check_classes(card)  # imports every class; raises naming the card and field


@pytest.mark.parametrize("name", PAPERS)
def test_the_card_lists_every_collection_class_its_own_configs_name(name):
    """A class its configs build (model, data, callbacks, injected pieces) is in the card, so the card is complete."""
    card = registry.card(name)
    listed = {c for field in registry.CLASS_FIELDS for c in card[field]}

    def class_paths(node):
        if isinstance(node, dict):
            own = [node["class_path"]] if isinstance(node.get("class_path"), str) else []
            return own + [c for value in node.values() for c in class_paths(value)]
        return [c for value in node for c in class_paths(value)] if isinstance(node, list) else []

    own_configs = [c for c in card["configs"] if c.startswith(f"configs/{name}/")]
    named = {c for config in own_configs for c in class_paths(yaml.safe_load((REPO / config).read_text()))}
    missing = sorted(c for c in named if c.startswith(COLLECTION) and c not in listed | INFRASTRUCTURE)
    assert not missing, f"configs/{name}/card.yaml does not list {missing}, which its configs build"


def test_every_config_belongs_to_exactly_one_card_or_to_the_grpo_core():
    """Adding a paper = a card plus its code: a config no card lists (or two cards claim) is caught here."""
    cards = registry.papers()
    configs = sorted({*QUICK_CONFIGS, *PAPER_CONFIGS, *(str(p.relative_to(REPO)) for p in REPO.glob("configs/*/*.yaml")
                                                         if p.parent.name not in NOT_PAPERS
                                                         and p.name not in NOT_CLI_CONFIGS
                                                         and str(p.relative_to(REPO)) not in FURTHER_EXPERIMENTS)})
    assert "configs/trew/classifier_quick.yaml" in configs and "configs/emotion_hierarchy/probe.yaml" in configs
    wrong = {}
    for config in configs:
        owners = [c["name"] for c in cards if config in c["configs"]]
        folder = config.split("/")[1]
        if folder in registry.SHARED_CONFIG_FOLDERS:
            continue
        if owners != [folder]:
            wrong[config] = owners
    assert not wrong, f"configs listed by no card, by several, or by another folder's card: {wrong}"
    shared = {c for card in cards for c in card["configs"] if c.split("/")[1] in registry.SHARED_CONFIG_FOLDERS}
    assert shared == {"configs/grpo/sft_quick.yaml"}  # the SFT warm-up Knapsack RL and DARS start from


def test_every_sweep_file_belongs_to_one_card_or_to_the_grpo_core():
    cards = registry.papers()
    wrong = {sweep: owners for sweep in SWEEP_FILES
             if len(owners := [c["name"] for c in cards if sweep in c["configs"]]) != 1
             and sweep != "configs/sweeps/grpo.yaml"}
    assert not wrong, f"sweep files listed by no card or by several: {wrong}"


def test_every_listed_result_exists_and_every_result_has_a_card():
    cards = registry.papers()
    listed = [r for card in cards for r in card["results"]]
    for result in listed:
        assert isinstance(json.loads((REPO / result).read_text()), dict), result
    unowned = sorted(str(p.relative_to(REPO)) for p in REPO.glob("results/*.json")
                     if str(p.relative_to(REPO)) not in set(listed) | SHARED_RESULTS)
    assert not unowned, f"result files no card lists (add them to the paper's card 'results'): {unowned}"


def test_every_paper_has_its_experiment_doc_and_tests():
    for card in registry.papers():
        assert card["experiment"] and (REPO / (card["experiment"].replace(".", "/") + ".py")).is_file(), card["name"]
        assert (REPO / card["doc"]).is_file() and card["tests"], card["name"]
        assert registry.quick_config(card) == f"configs/{card['name']}/quick.yaml"


def test_the_readme_table_is_the_one_the_cards_give():
    readme = (REPO / "README.md").read_text()
    assert readme.count(registry.README_BEGIN) == 1 and readme.count(registry.README_END) == 1
    assert registry.readme_with_table(readme, registry.papers()) == readme, \
        "README.md's paper table is out of date: run `python -m icml26.registry --readme`"
    assert len(readme.splitlines()) < 300


def test_readme_with_table_replaces_only_the_marked_table():
    old = f"intro\n{registry.README_BEGIN}\n| stale |\n{registry.README_END}\noutro\n"
    new = registry.readme_with_table(old, registry.papers())
    assert new.startswith("intro\n") and new.endswith(f"{registry.README_END}\noutro\n")
    assert "| stale |" not in new and "[trew](docs/trew.md)" in new
    with pytest.raises(UserInputError, match="lacks the paper table markers"):
        registry.readme_with_table("no markers here\n", [])


def test_prerequisites_follow_the_comment_lines_first_stage_first():
    assert registry.prerequisites("configs/pclm/dpo_quick.yaml") == [
        "configs/pclm/pretrain_quick.yaml", "configs/pclm/sft_quick.yaml", "configs/pclm/quick.yaml",
        "configs/pclm/stage2_quick.yaml"]
    assert registry.prerequisites("configs/infogeo/quick.yaml") == []


# ------------------------------------------------------------------------------------------------ the command
def test_papers_lists_every_paper_with_its_quick_config(capsys):
    assert run_command("papers", []) == 0
    out = capsys.readouterr().out.splitlines()
    for name in PAPERS:
        line = next(line for line in out if line.split()[:1] == [name])
        assert f"configs/{name}/quick.yaml" in line
    assert "Unlearning Isn't Forgetting" in next(line for line in out if line.startswith("trew "))


def test_papers_name_prints_the_whole_card(capsys):
    assert run_command("papers", ["trew"]) == 0
    out = capsys.readouterr().out
    card = registry.card("trew")
    assert out.startswith(f"trew: {card['title']}\n")
    for text in ("arXiv 2506.20893", "lightning_modules.trew.trew.ClassUnlearning", "lightning_modules/trew/trew.py",
                 "callbacks.trew.TREWReweighting", "configs/sweeps/trew.yaml", "python -m experiments.trew",
                 "docs/trew.md", "results/trew.json", "tests/test_trew.py",
                 "configs/trew/quick.yaml  (fit first: configs/trew/classifier_quick.yaml)"):
        assert text in out, text
    assert " ".join(card["claim"].split()[:6]) in " ".join(out.split())


def test_an_unknown_paper_fails_in_one_line_with_the_closest_name(capsys):
    assert run_command("papers", ["trw"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "error: no paper named 'trw' (did you mean trew?); `icml26 papers` lists them"


@pytest.mark.parametrize("argv", [["trew", "rsir"], ["--bogus"], ["trew", "--check"]])
def test_bad_arguments_fail_in_one_line(argv, capsys):
    assert run_command("papers", argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unexpected arguments") and err.count("\n") == 1


def test_help_prints_the_usage(capsys):
    assert run_command("papers", ["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: icml26 papers")


# ------------------------------------------------------------------------------------------------ bad cards
def _demo_tree(tmp_path):
    """A minimal repository with one valid card (`demo`) whose paths all exist."""
    for path in ("lightning_modules/demo.py", "datamodules/demo.py", "configs/demo/quick.yaml", "docs/demo.md",
                 "tests/test_demo.py", "experiments/demo.py", "results/demo.json", "configs/sweeps/demo.yaml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}\n" if path.endswith(".json") else "\n")
    card = {"name": "demo", "title": "A demo paper", "arxiv": "2501.00001", "venue": "ICML 2026",
            "claim": "Demos work.", "modules": ["lightning_modules.demo.Demo"],
            "datamodules": ["datamodules.demo.DemoData"], "callbacks": [], "components": [],
            "files": ["lightning_modules/demo.py", "datamodules/demo.py"],
            "configs": ["configs/demo/quick.yaml", "configs/sweeps/demo.yaml"], "sweep": "configs/sweeps/demo.yaml",
            "experiment": "experiments.demo", "doc": "docs/demo.md", "results": ["results/demo.json"],
            "tests": ["tests/test_demo.py"]}
    return card


def _write(tmp_path, card) -> None:
    (tmp_path / "configs/demo/card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))


def test_a_valid_demo_card_loads_and_a_check_key_is_allowed(tmp_path):
    card = _demo_tree(tmp_path)
    check = {"result": "demo.json", "paired": [{"method": "a", "baseline": "b", "label": "a - b, accuracy"}]}
    _write(tmp_path, {**card, "check": check})
    loaded = registry.papers(tmp_path)[0]
    assert loaded["check"] == check
    shown = registry.format_card(loaded, tmp_path)
    assert "check        on demo.json" in shown and "- a - b, accuracy" in shown
    # a regular install ships no docs/, results/ or tests/: their paths are not checked there
    for folder in ("docs", "results", "tests"):
        for path in (tmp_path / folder).iterdir():
            path.unlink()
        (tmp_path / folder).rmdir()
    assert registry.papers(tmp_path)[0]["name"] == "demo"


@pytest.mark.parametrize("change, field, words", [
    ({"summary": "x"}, "summary", "is not a card field"),
    ({"claims": "x"}, "claims", "did you mean claim"),
    ({"doc": None}, "doc", "is not a page under docs/"),
    ({"name": "other"}, "name", "is not the card's folder name"),
    ({"arxiv": 2501.00001}, "arxiv", "is not an arXiv id"),
    ({"claim": ""}, "claim", "one non-empty line"),
    ({"modules": []}, "modules", "is empty"),
    ({"modules": "lightning_modules.demo.Demo"}, "modules", "must be a list"),
    ({"modules": ["Demo"]}, "modules", "is not a dotted class path"),
    ({"modules": ["lightning_modules.nowhere.Demo"]}, "modules", "no module file lightning_modules/nowhere.py"),
    ({"files": ["lightning_modules/demo.py"]}, "datamodules", "which 'files' does not list"),
    ({"configs": ["configs/demo/gone.yaml"]}, "configs", "configs/demo/gone.yaml does not exist"),
    ({"results": ["results/demo.json", "results/demo.json"]}, "results", "more than once"),
    ({"tests": ["tests/test_gone.py"]}, "tests", "tests/test_gone.py does not exist"),
    ({"sweep": "configs/demo/quick.yaml"}, "sweep", "is not a configs/sweeps/ file"),
    ({"experiment": "experiments.gone"}, "experiment", "experiments/gone.py does not exist"),
])
def test_a_bad_card_fails_with_one_line_naming_the_card_and_field(tmp_path, change, field, words):
    card = _demo_tree(tmp_path)
    _write(tmp_path, {**card, **change})
    with pytest.raises(UserInputError) as info:
        registry.papers(tmp_path)
    message = str(info.value)
    assert "configs/demo/card.yaml" in message and f"field '{field}'" in message and words in message, message
    assert "\n" not in message


def test_a_missing_field_and_broken_yaml_name_the_card(tmp_path):
    card = _demo_tree(tmp_path)
    _write(tmp_path, {k: v for k, v in card.items() if k != "tests"})
    with pytest.raises(UserInputError, match=r"card.yaml, field 'tests': is missing; add it"):
        registry.papers(tmp_path)
    (tmp_path / "configs/demo/card.yaml").write_text("name: [unclosed\n")
    with pytest.raises(UserInputError, match=r"configs/demo/card.yaml: cannot be read as YAML"):
        registry.papers(tmp_path)


def test_a_class_that_does_not_import_or_has_the_wrong_kind_is_named():
    card = registry.card("trew")
    with pytest.raises(UserInputError, match=r"field 'modules': lightning_modules.trew.trew.Nope does not import"):
        registry.check_classes({**card, "modules": ["lightning_modules.trew.trew.Nope"]})
    with pytest.raises(UserInputError, match=r"field 'modules': callbacks.trew.TREWReweighting is not a "
                                             r"LightningModule class"):
        registry.check_classes({**card, "modules": ["callbacks.trew.TREWReweighting"]})


def test_the_command_reports_a_broken_card_in_one_line(tmp_path, monkeypatch, capsys):
    card = _demo_tree(tmp_path)
    _write(tmp_path, {**card, "venue": None})
    monkeypatch.setattr(registry, "ROOT", tmp_path)
    assert run_command("papers", []) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "field 'venue'" in err and err.count("\n") == 1
