"""scripts/transfer_table.py reads a run folder only after it re-checks (issue 51, items 2 and 9): an edited run is
refused naming its first difference; --alone must be a baseline and each --run a run that grafts from a library; a
missing or unfinished folder is one line, not a traceback; problem ids reach the terminal and the markdown with their
control characters escaped. Run folders written here as a run writes them (RunFolder.finish), rows scored by the
project's scorer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.record.folder import RunFolder
from harness.record.rows import Completion, Row, Summary
from harness.task.answers import score

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import transfer_table  # noqa: E402

EVIL = "kvg-\x1b[2J\x1b[31m001"
LIBRARY = {"name": "toy", "version": 1, "manifest_sha256": "c" * 64}


def write_run(path: Path, condition: str, outcomes: dict[str, bool], library: dict | None = None) -> Path:
    """A finished run folder at `path`: one row per problem (id -> answered right?), gold 42."""
    problems = [{"id": pid, "problem": f"What is 40 + 2? ({pid})", "answer": "42"} for pid in outcomes]
    rows = []
    for pid, right in outcomes.items():
        text = "So the answer is \\boxed{42}." if right else "So the answer is \\boxed{41}."
        c = Completion(prompt="p", context_ids=[1, 2], text=text, token_ids=[ord(x) for x in text], stop_reason="stop",
                       prefill_tokens=2, grafted_tokens=0, decode_tokens=len(text))
        rows.append(Row.scored(pid, 0, condition, None, c, "42", score(text, "42"), wall_s=0.5, cpu_s=0.5,
                               energy_j=None, energy_status="unavailable:test"))
    summary = Summary.of(rows, condition=condition, model="toy", dataset="toy", run_dir=str(path),
                         comparable_key="same-key", run_wall_s=1.0, energy_status="unavailable:test", energy_j=None,
                         group=None)
    config = {"condition": {"name": condition}, "dataset": {"name": "toy"}, "decoding": {"max_new_tokens": 16}}
    RunFolder(path).finish(config=config, problems=problems, rows=rows, summary=summary, prompt_template="{problem}",
                           model_fingerprint="a" * 64, tokenizer_fingerprint="b" * 64, determinism={},
                           environment={}, library=library)
    return path


def _flip_first_row(run: Path) -> None:
    """The edit of issue 51's probe: the first row's `correct` flipped, nothing re-sealed."""
    lines = (run / "outputs.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["correct"] = not row["correct"]
    lines[0] = json.dumps(row)
    (run / "outputs.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    ids = ["1983-1", "1983-2", "1983-3"]
    return {"alone": write_run(tmp_path / "alone", "baseline", dict.fromkeys(ids, True)),
            "graft": write_run(tmp_path / "graft", "graft", dict.fromkeys(ids, True), LIBRARY)}


def _main(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    try:
        rc = transfer_table.main(list(argv))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def test_intact_runs_are_tabulated(runs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = _main(capsys, "--alone", str(runs["alone"]), "--run", f"held-out={runs['graft']}")
    assert rc == 0 and "| alone | 3/3 = 1.000" in out and "| held-out | 3/3 = 1.000" in out


@pytest.mark.parametrize("which", ["alone", "graft"])
def test_an_edited_run_is_refused_naming_its_first_difference(runs: dict[str, Path], which: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    _flip_first_row(runs[which])
    rc, out, err = _main(capsys, "--alone", str(runs["alone"]), "--run", f"held-out={runs['graft']}")
    assert rc != 0 and "| alone |" not in out  # no figure is cited from an edited folder
    assert "does not re-check" in err and "outputs.jsonl line 1" in err and str(runs[which]) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_graft_run_as_alone_and_a_baseline_as_a_graft_run_are_refused(runs: dict[str, Path],
                                                                         capsys: pytest.CaptureFixture) -> None:
    rc, _, err = _main(capsys, "--alone", str(runs["graft"]), "--run", f"held-out={runs['graft']}")
    assert rc != 0 and "--alone" in err and "'graft' run" in err and "condition=baseline" in err
    rc, _, err = _main(capsys, "--alone", str(runs["alone"]), "--run", f"held-out={runs['alone']}")
    assert rc != 0 and "--run held-out" in err and "'baseline' run without a library" in err


@pytest.mark.parametrize("state", ["missing", "unfinished", "empty"])
def test_a_missing_or_unfinished_folder_is_one_line(runs: dict[str, Path], tmp_path: Path, state: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / state
    if state != "missing":
        bad.mkdir()
    if state == "unfinished":  # what a killed run leaves: its markers and partial rows, no manifest
        (bad / "resume.json").write_text("{}")
        (bad / "outputs.partial.jsonl").write_text((runs["graft"] / "outputs.jsonl").read_text())
    rc, out, err = _main(capsys, "--alone", str(runs["alone"]), "--run", f"x={bad}")
    assert rc != 0 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and str(bad) in err
    assert {"missing": "no such run folder", "unfinished": "an unfinished run",
            "empty": "manifest.json: file is missing"}[state] in err


def test_problem_ids_reach_the_terminal_and_the_markdown_escaped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ids = {EVIL: False, "1983-2": True}
    alone = write_run(tmp_path / "alone", "baseline", ids)
    graft = write_run(tmp_path / "graft", "graft", dict.fromkeys(ids, True), LIBRARY)
    md = tmp_path / "t.md"
    rc, out, err = _main(capsys, "--alone", str(alone), "--run", f"held\x1b[5m-out={graft}", "--markdown", str(md))
    assert rc == 0 and "\x1b" not in out + err and "\x1b" not in md.read_text()
    assert "kvg-\\x1b[2J\\x1b[31m001" in out and "held\\x1b[5m-out" in out  # shown, escaped: nothing hidden
