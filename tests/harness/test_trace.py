"""Reasoning traces (harness/task/trace.py, model.trace): the answer follows the last closing delimiter, a trace cut
by the budget is overlong with no answer, a trace the model ends without closing is only unanswered; rows, summary
and audit carry it, and a run without the setting writes what it wrote before. Fake backend (scripted, with tags) and
the tiny random Gemma 3 (the real decode stack: its noise never closes a trace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.schema import compose_config
from harness.errors import ConfigError
from harness.record.audit import audit
from harness.record.folder import RunFolder
from harness.run.loop import run
from harness.task.trace import Trace, after_trace, resolve_trace, score_traced
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]
ASK = "\nGive the answer as an integer from 0 to 999.\nFinal answer:"  # the answer prompt's end: the fake types after it
FAKE = FakeBackend({
    # kvg-001 (gold 324): a closed trace holding a decoy box, then the answer
    "value of $x^2$?" + ASK: " <think>\\boxed{7} so x = 18</think> 324",
    # kvg-002 (gold 401): a trace longer than the budget (48 tokens), never closed
    "divided by $1000$." + ASK: " <think>the answer is 401, let me check it again and again and again",
    "Final answer:": " 12",  # kvg-003 (gold 12): no trace at all, ended by EOS
})


def _run(tmp: Path, *extra: str) -> tuple[RunFolder, list[dict], dict]:
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp}", "dataset.limit=3",
                          "decoding.max_new_tokens=48", "tracking=off", "energy.meter=none", *extra])
    folder, _ = run(cfg, be=FAKE, progress=False)
    rows = [json.loads(line) for line in folder.file("outputs.jsonl").read_text().splitlines()]
    return folder, rows, json.loads(folder.file("summary.json").read_text())


def test_delimiters_by_name_from_the_chat_template_or_as_a_pair() -> None:
    assert resolve_trace(None, None) is None
    assert resolve_trace("think", None) == Trace("<think>", "</think>")
    assert resolve_trace("model", "{{ '<think>\\n' }}...{{ '</think>' }}") == Trace("<think>", "</think>")
    assert resolve_trace("<reason> </reason>", None) == Trace("<reason>", "</reason>")
    with pytest.raises(ConfigError, match="model.trace=model: the model's chat template writes no trace"):
        resolve_trace("model", "{{ messages[0].content }}")
    with pytest.raises(ConfigError, match="model.trace='thinking'"):
        resolve_trace("thinking", None)


def test_the_answer_follows_the_last_closing_tag_and_an_unclosed_trace_has_none() -> None:
    assert after_trace("<think>a</think>b</think> 5", "</think>") == " 5"
    assert after_trace("<think>no end", "</think>") is None
    s = score_traced("<think>\\boxed{7}</think> so 12", "12", "eos", "</think>")
    assert (s.answer, s.correct, s.overlong) == (12, True, False)
    cut = score_traced("<think>the answer is 12", "12", "length", "</think>")
    assert (cut.extracted, cut.answer, cut.correct, cut.overlong) == (None, None, False, True)
    assert score_traced("<think>the answer is 12", "12", "eos", "</think>").overlong is False  # ended, not cut
    plain = score_traced("<think>\\boxed{7}</think> 12", "12", "length", None)  # no trace: the whole text
    assert (plain.answer, plain.overlong) == (7, None)


def test_a_traced_run_scores_after_the_trace_and_counts_overlong_rows(tmp_path: Path) -> None:
    folder, rows, summary = _run(tmp_path / "t", "model.trace=think")
    got = [(r["problem_id"], r["stop_reason"], r["answer"], r["correct"], r["overlong"], r["trace_close"])
           for r in rows]
    assert got == [("kvg-001", "eos", 324, True, False, "</think>"),   # the decoy \boxed{7} is in the trace
                   ("kvg-002", "length", None, False, True, "</think>"),  # cut by the budget inside the trace
                   ("kvg-003", "eos", None, False, False, "</think>")]  # never opened or closed: no answer
    sc = summary["scores"]
    assert sc["overlong"] == 1 and sc["overlong_rate"] == pytest.approx(1 / 3) and sc["maj@1"] == pytest.approx(1 / 3)
    assert audit(folder).ok, audit(folder).findings
    assert folder.read_config()["model"]["trace"] == "think"


def test_without_the_setting_rows_and_config_are_as_before(tmp_path: Path) -> None:
    folder, rows, summary = _run(tmp_path / "p")
    assert [r["answer"] for r in rows] == [7, 401, 12]  # the whole text: the trace's box and phrase count
    assert not any("trace_close" in r or "overlong" in r for r in rows)
    assert "trace" not in folder.read_config()["model"] and summary["scores"]["overlong"] == 0
    _, _, traced = _run(tmp_path / "t", "model.trace=think")
    assert traced["comparable_key"] != summary["comparable_key"]  # other scores for the same completions


def test_an_edited_overlong_flag_or_trace_is_a_finding(tmp_path: Path) -> None:
    folder, rows, _ = _run(tmp_path / "t", "model.trace=think")
    rows[1]["overlong"] = False
    rows[2]["trace_close"] = "</reason>"
    folder.file("outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    findings = audit(folder).findings
    assert any("field 'overlong' is False but re-scoring the completion gives True" in f for f in findings)
    assert any("trace_close" in f and "model.trace='think'" in f for f in findings)


def test_the_tiny_model_under_a_trace_opened_in_the_prompt_runs_out_of_budget(tmp_path: Path) -> None:
    """The real decode stack: the prompt opens the trace (as an R1 distill's template does), the random model's
    bytes never close it within 4 tokens, so every row is overlong, and the folder re-checks."""
    cfg = compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}", "dataset.limit=2",
                          "decoding.max_new_tokens=4", "tracking=off", "energy.meter=none", "model.trace=think",
                          "prompt.template='Problem: {problem}\\n<think>'"])
    folder, summary = run(cfg, progress=False)
    assert summary.scores.overlong == 2 and summary.scores.overlong_rate == 1.0 and summary.scores.maj() == (1, 0.0)
    assert audit(folder).ok


# --- issue 51, item 9: a trace re-opened after its last close ends the completion inside a trace -------------------

def test_a_trace_reopened_after_its_last_close_has_no_answer() -> None:
    """`<think>x</think> 324 <think> 7` cut by the budget was scored 7, from inside the unclosed trace, and not
    overlong; the docs say a budget-cut trace has no answer."""
    cut = score_traced("<think>x</think> 324 <think> 7", "7", "length", "</think>")
    assert (cut.extracted, cut.answer, cut.correct, cut.overlong) == (None, None, False, True)
    ended = score_traced("<think>x</think> 324 <think> 7", "7", "eos", "</think>")
    assert (ended.answer, ended.correct, ended.overlong) == (None, False, False)  # ended inside it: unanswered
    assert after_trace("<think>a</think> 5 <think> 6", "</think>") is None
    assert after_trace("<think>a</think> 5 <think> 6</think> 8", "</think>") == " 8"  # closed again: after it
    # a custom pair: its opening delimiter is given (the run's model.trace), else only its close is known
    assert score_traced("<r>a</r> 3 <r> 9", "9", "length", "</r>", "<r>").overlong is True
    assert score_traced("<r>a</r> 3 <r> 9", "9", "length", "</r>").answer == 9


@pytest.mark.parametrize("setting, text", [("think", " <think>so</think> 324 <think> then 7 again and again"),
                                           ("<r> </r>", " <r>so</r> 324 <r> then 7 again and again")])
def test_a_run_and_its_audit_score_a_reopened_trace_as_overlong(tmp_path: Path, setting: str, text: str) -> None:
    fake = FakeBackend({"value of $x^2$?" + ASK: text, "Final answer:": " 12"})
    cfg = compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp_path}", "dataset.limit=1",
                          "decoding.max_new_tokens=40", "tracking=off", "energy.meter=none",
                          f"model.trace={setting!r}" if " " in setting else f"model.trace={setting}"])
    folder, _ = run(cfg, be=fake, progress=False)
    [row] = [json.loads(line) for line in folder.file("outputs.jsonl").read_text().splitlines()]
    assert (row["stop_reason"], row["answer"], row["correct"], row["overlong"]) == ("length", None, False, True)
    assert audit(folder).ok, audit(folder).findings
    folder.file("config.yaml").unlink()  # the custom pair's opening delimiter is named only there
    findings = audit(folder).findings
    assert any("config.yaml, which names its opening delimiter, is missing" in f for f in findings) == (
        setting != "think"), findings
