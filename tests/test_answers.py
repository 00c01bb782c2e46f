"""Tests for harness.answers: data-driven extraction/normalisation cases plus scoring and gold parsing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from harness.answers import Score, extract_answer, normalize_answer, parse_gold, score
from harness.errors import AnswerError, HarnessError

CASES_PATH = Path(__file__).parent / "cases" / "answers.yaml"
CASES: list[dict] = yaml.safe_load(CASES_PATH.read_text(encoding="utf-8"))


def test_case_file_is_well_formed() -> None:
    assert len(CASES) >= 40
    for case in CASES:
        assert set(case) == {"text", "expected"}, case
        assert isinstance(case["text"], str), case
        assert case["expected"] is None or isinstance(case["expected"], int), case


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"])[:60] for c in CASES])
def test_extract_and_normalize(case: dict) -> None:
    assert normalize_answer(extract_answer(case["text"])) == case["expected"]


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        (r"The answer is \boxed{840}. So \boxed{840}.", "840"),
        (r"\boxed{\frac{1}{\frac{1}{2}}}", r"\frac{1}{\frac{1}{2}}"),
        (r"\boxed{12} then 13", "12"),
        ("**Answer:** 42", "42"),
        ("The final answer is 204. Done.", "204"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer_raw(text: str, extracted: str | None) -> None:
    assert extract_answer(text) == extracted


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("**73**", 73),
        ("$42$", 42),
        (r"\(42\)", 42),
        ("42 .", 42),
        ("4 2", 42),
        (r"\text{13}", 13),
        (r"\textbf{13}", 13),
        (r"\mathrm{13}", 13),
        (r"\frac{84}{2}", 42),
        (r"\dfrac{84}{2}", 42),
        (r"\frac{1}{\frac{1}{2}}", 2),
        (r"\frac{1}{3}", None),
        (r"\frac{1}{0}", None),
        ("42.0", 42),
        ("42.5", None),
        ("\u22125", None),
        ("1,000", None),
        ("999", 999),
        ("1000", None),
        ("004", 4),
        (r"90^\circ", 90),
        ("90\u00b0", 90),
        (r"\boxed{5}", 5),
        (r"2 \times 3", 6),
        # never evaluated: not whitelisted, or exponent bound exceeded
        ("__import__('os').system('true')", None),
        ("x + 1", None),
        ("9^{99^{99}}", None),
        ("2^{1000}", None),
        ("9" * 10_000, None),
        ("0" * 10_000 + "7", None),
    ],
)
def test_normalize_answer(raw: str | None, expected: int | None) -> None:
    assert normalize_answer(raw) == expected


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
    assert results[:-1] == [case["expected"] for case in CASES]
    assert results[-1] == Score(extracted=r"\frac{84}{2}", answer=42, gold=42, correct=True)
