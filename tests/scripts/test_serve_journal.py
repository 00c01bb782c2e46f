"""scripts/serve_journal.py (issue 60, item 5): the counts of a library-aware server's journal: own-entry and
in-request grafts, outcomes, and the connector's graft lines that record an unconfirmed response's graft (a chat
answer's id included)."""

from __future__ import annotations

import json

from scripts.serve_journal import summary


def _library(response: str, problem: str, entry: str, outcome: str, in_request: list[str]) -> dict:
    return {"event": "library", "retrieval": "held-out", "response": response, "outcome": outcome,
            "problem": {"problem_id": problem, "in_request": in_request},
            "entry": {"entry": f"e-{entry}", "problem_id": entry, "artifact": f"a-{entry}"}}


def test_counts_own_entry_in_request_and_graft_lines(tmp_path) -> None:
    lines = [_library("cmpl-1", "p1", "p2", "unconfirmed", ["p1"]),
             {"event": "graft", "request": "cmpl-1-0-abcd1234", "artifact": "a-p2"},
             _library("chatcmpl-2", "p2", "p2", "grafted", ["p2"]),  # the own entry: counted twice over
             {"event": "graft", "request": "cmpl-2-0-ffff0000", "artifact": "a-p2"},
             _library("cmpl-3", "p3", "p1", "grafted", ["p3", "p1"]),  # a few-shot example's entry
             _library("cmpl-4", "p4", "p1", "grafted", ["p4"]) | {"entry": None, "outcome": "not grafted"}]
    j = tmp_path / "journal.jsonl"
    j.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = summary(j)
    assert (s["requests"], s["own_entry"], s["in_request"], s["graft_lines"]) == (4, 1, 2, 2)
    assert s["outcomes"] == {"unconfirmed": 1, "grafted": 2, "not grafted": 1} and s["entries"] == 2
