"""Tests for harness.task.answers: the data-driven cases of tests/cases/answers.yaml, scoring and gold parsing.

Run: ``python -m pytest -q tests/test_answers.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from harness.errors import AnswerError, HarnessError
from harness.task.answers import Score, extract_answer, normalize_answer, parse_gold, score

CASES_PATH = Path(__file__).parent / "cases" / "answers.yaml"
_CASE_FILE: dict = yaml.safe_load(CASES_PATH.read_text(encoding="utf-8"))
CASES: list[dict] = _CASE_FILE["completions"]
RAW_CASES: list[dict] = _CASE_FILE["normalize"]


def test_case_file_is_well_formed() -> None:
    assert set(_CASE_FILE) == {"completions", "normalize"}
    assert len(CASES) >= 80 and len(RAW_CASES) >= 30
    for case in CASES:
        assert {"text", "answer"} <= set(case) <= {"text", "answer", "extracted", "gold", "correct"}, case
        assert ("gold" in case) == ("correct" in case), case
        assert isinstance(case["text"], str), case
        assert case["answer"] is None or isinstance(case["answer"], int), case
        assert case.get("extracted") is None or isinstance(case["extracted"], str), case
    for case in RAW_CASES:
        assert set(case) == {"raw", "answer"}, case
    texts = [case["text"] for case in CASES]
    assert len(set(texts)) == len(texts), "a completion appears twice in the case file"


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"])[:60] for c in CASES])
def test_completion_case(case: dict) -> None:
    result = score(case["text"], case.get("gold", 0))
    assert result.answer == case["answer"]
    if "extracted" in case:
        assert result.extracted == case["extracted"]
    if "correct" in case:
        assert result.correct is case["correct"]
    assert result.answer == normalize_answer(extract_answer(case["text"]))


@pytest.mark.parametrize("case", RAW_CASES, ids=[repr(c["raw"])[:60] for c in RAW_CASES])
def test_normalize_case(case: dict) -> None:
    assert normalize_answer(case["raw"]) == case["answer"]


@pytest.mark.parametrize("raw", ["9" * 10_000, "0" * 10_000 + "7"])
def test_normalize_refuses_huge_strings(raw: str) -> None:
    assert normalize_answer(raw) is None


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 20_000,  # unclosed boxes: quadratic brace matching would take minutes
        "the answer is " * 20_000,
        "the answer is 7 0 " * 20_000,
        ("Answer: " + "1 " * 50) * 2_000,
        "{" * 100_000 + "\\boxed 7",
    ],
    ids=["unclosed-boxes", "repeated-phrase", "repeated-hedge", "long-answer-lines", "open-braces"],
)
def test_adversarial_long_completions_score_quickly(text: str) -> None:
    started = time.perf_counter()
    score(text, 7)
    assert time.perf_counter() - started < 5.0


def test_score_gold_with_leading_zeros() -> None:
    result = score("So the answer is 7", "007")
    assert result == Score(extracted="7", answer=7, gold=7, correct=True)


@pytest.mark.parametrize("gold", ["007", "7", 7, " 7 "])
def test_score_gold_forms(gold: str | int) -> None:
    assert score(r"\boxed{007}", gold).correct


def test_score_incorrect_and_missing() -> None:
    wrong = score(r"\boxed{8}", 7)
    assert (wrong.answer, wrong.correct) == (8, False)
    missing = score("I don't know.", 7)
    assert missing == Score(extracted=None, answer=None, gold=7, correct=False)


def test_score_is_frozen() -> None:
    result = score("7", 7)
    with pytest.raises(AttributeError):
        result.correct = False  # type: ignore[misc]


@pytest.mark.parametrize(("gold", "expected"), [("007", 7), ("0", 0), ("999", 999), (42, 42), ("0042", 42)])
def test_parse_gold_valid(gold: str | int, expected: int) -> None:
    assert parse_gold(gold) == expected


@pytest.mark.parametrize("gold", ["1000", 1000, -1, "-1", "7.0", "", "seven", None, True, 7.0, "\\boxed{7}"])
def test_parse_gold_invalid(gold: object) -> None:
    with pytest.raises(AnswerError) as info:
        parse_gold(gold)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(gold) in message
    assert "0..999" in message
    assert isinstance(info.value, HarnessError)


def test_score_bad_gold_raises() -> None:
    with pytest.raises(AnswerError):
        score(r"\boxed{7}", "1000")


def test_works_from_worker_thread() -> None:
    results: list[object] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for case in CASES:
                results.append(normalize_answer(extract_answer(case["text"])))
            results.append(score(r"\boxed{\frac{84}{2}}", "042"))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread via the assertion below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors == []
    assert results[:-1] == [case["answer"] for case in CASES]
    assert results[-1] == Score(extracted=r"\frac{84}{2}", answer=42, gold=42, correct=True)
