"""Every docs page's ``## Your own data`` section is run as a user would run it: its example files are written, its
commands train on them (or, where the data is only probed, test on them) and predict with them.

The section's convention (one for every page):

* An example file is a fenced block whose first line is ``# file: <path>`` (e.g. ``# file: my_data/train.csv``);
  that line is dropped and the rest is the file's text.
* Files beyond a short text example (images, HDF5, ...) come from a fenced ``python`` block whose first line is
  ``# file-writer``: it runs in the working folder and writes a tiny valid dataset.
* The commands are ``bash`` blocks (``python train.py ...``, run in order from the same folder, so a command finds
  the checkpoint an earlier one wrote). Here each gets tiny limits appended (two training steps, one batch per
  evaluation, no logger); ``predict`` must write the prediction files of ``callbacks.prediction_writer``.

Any other fenced block in the section (a tree of the layout, say) must be a ``text`` block without ``# file:``;
a block that looks like a file but breaks the convention fails here, so nothing documented goes unchecked.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from experiments.timings import doc_files, own_data_commands, own_data_section

# pages that must have the section (the rest of the collection's pages get theirs the same way)
REQUIRED = ("trew", "tamed_sgd", "rsir", "nt_ssm", "rlvr", "ldarnet",
            "ec_cem", "phyb", "infogeo", "hide", "pclm", "causcibench",
            "coupled_diffusion", "spectral_guidance", "tivdiff", "rna_fm", "emotion_hierarchy")
# pages whose own data is only probed (there is nothing to fit on it): their section tests and predicts instead
PROBE_ONLY = {"emotion_hierarchy": "scenario files are probed by a given language model; fitting on them is refused"}
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
FILE_LINE = re.compile(r"#\s*file:\s*(\S+)\s*$")
WRITER_LINE = "# file-writer"
LIMITS = {
    "fit": ["--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0"],
    "validate": ["--trainer.limit_val_batches=1"],
    "test": ["--trainer.limit_test_batches=1"],
    "predict": ["--trainer.limit_predict_batches=1"],
}
COMMON = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
PAGES = [doc for doc in doc_files() if own_data_section((REPO / doc).read_text())]


def parse_section(section: str) -> tuple[dict[str, str], list[str]]:
    """``({path: text}, [file-writer code])`` of a section's fenced blocks (its commands: `own_data_commands`)."""
    files, writers = {}, []
    for language, body in FENCE.findall(section):
        first, _, rest = body.partition("\n")
        if FILE_LINE.match(first.strip()):
            path = FILE_LINE.match(first.strip()).group(1)
            assert not Path(path).is_absolute() and ".." not in Path(path).parts, f"{path}: a relative path"
            assert path not in files, f"{path} is written twice"
            files[path] = rest
        elif first.strip() == WRITER_LINE:
            assert language == "python", f"a `{WRITER_LINE}` block must be a python block, not {language!r}"
            writers.append(body)
        elif language not in ("bash", "text", ""):
            raise AssertionError(f"a {language!r} block that is neither `# file: <path>` nor `{WRITER_LINE}`: "
                                 f"{first!r}")
        else:
            assert "file:" not in first, f"{first!r}: write `# file: <path>` on the block's first line"
    return files, writers


def test_the_convention_is_parsed(tmp_path):
    section = ("\n## Your own data\n```text\n# file: d/a.csv\nx,y\n1,2\n```\n```python\n# file-writer\nprint(1)\n```\n"
               "```text\nd/\n  a.csv\n```\n```bash\npython train.py fit --config c.yaml \\\n  --x=1\n```\n")
    assert parse_section(section) == ({"d/a.csv": "x,y\n1,2\n"}, ["# file-writer\nprint(1)\n"])
    (tmp_path / "page.md").write_text("# T\n\nintro\n```bash\npython train.py fit --config a.yaml\n```\n" + section
                                      + "\n## Next\n```bash\npython train.py fit --config b.yaml\n```\n")
    assert own_data_commands("page.md", root=tmp_path) == [["python", "train.py", "fit", "--config", "c.yaml",
                                                            "--x=1"]]
    with pytest.raises(AssertionError, match="neither"):
        parse_section("```csv\nuser,item\n```\n")
    with pytest.raises(AssertionError, match="first line"):
        parse_section("```text\nsome text\n```\n```text\nfile: x.csv\n```\n")


@pytest.mark.parametrize("paper", REQUIRED)
def test_the_page_has_the_section(paper):
    doc = f"docs/{paper}.md"
    assert doc in PAGES, f"{doc} has no `## Your own data` section"
    commands = own_data_commands(doc)
    subcommands = [words[2] for words in commands if words[:2] == ["python", "train.py"]]
    first = "test" if paper in PROBE_ONLY else "fit"
    assert first in subcommands and "predict" in subcommands, \
        f"{doc}: the section runs {first} and predict: {commands}"
    assert all(words[:2] == ["python", "train.py"] for words in commands), f"{doc}: only train.py commands"
    files, writers = parse_section(own_data_section((REPO / doc).read_text()))
    assert files or writers, f"{doc}: the section shows no example file"
    for path, text in files.items():
        assert len(text.splitlines()) <= 12, f"{doc}: {path} is longer than a short copyable example"


def _prediction_files(root: Path) -> dict[Path, int]:
    """``{path: modification time}`` of every prediction file under ``root``."""
    return {p: p.stat().st_mtime_ns for p in root.rglob("predictions*")
            if p.is_file() and p.suffix in (".pt", ".csv", ".jsonl")}


@pytest.mark.parametrize("doc", PAGES)
def test_the_documented_example_trains_and_predicts(doc, tmp_path):
    files, writers = parse_section(own_data_section((REPO / doc).read_text()))
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for code in writers:
        exec(compile(code, f"{doc} (file-writer)", "exec"), {"__name__": "file_writer"})  # noqa: S102
    for words in own_data_commands(doc):
        command = shlex.join(words)
        subcommand = words[2]
        assert subcommand in LIMITS, f"{doc}: `{command}`: no limits known for {subcommand!r}"
        before = _prediction_files(tmp_path)
        cli = run_cli(*words[2:], *LIMITS[subcommand], *COMMON)
        assert cli.trainer.state.finished, f"{doc}: `{command}`"
        if subcommand == "predict":
            written = [p for p, stamp in _prediction_files(tmp_path).items() if before.get(p) != stamp]
            assert any(p.suffix == ".pt" for p in written), f"{doc}: `{command}` wrote no predictions.pt"
            tables = [p for p in written if p.suffix in (".csv", ".jsonl")]
            assert tables and all(len(p.read_text().splitlines()) >= 2 for p in tables), \
                f"{doc}: `{command}` wrote no prediction rows ({sorted(map(str, written))})"
