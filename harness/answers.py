"""Answer extraction, normalisation and scoring for AIME-style problems.

Pure functions only: no model, no I/O, no global state, safe to call from any thread. An AIME answer is
an integer 0..999. Model completions are scored in three steps: :func:`extract_answer` finds the raw
final-answer string, :func:`normalize_answer` turns it into an integer (or ``None``), and :func:`score`
compares it with the gold answer parsed by :func:`parse_gold`.

Arithmetic in answers (``\\frac{84}{2}``, ``2^{3}``) is evaluated with ``sympy.sympify`` only after the
string has been reduced to digits, operators and parentheses; nothing else is ever evaluated.
"""

from __future__ import annotations

import re
import tokenize
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral

import sympy

from harness.errors import AnswerError

__all__ = ["AIME_MAX", "AIME_MIN", "Score", "extract_answer", "normalize_answer", "parse_gold", "score"]

AIME_MIN = 0
AIME_MAX = 999

# --- extraction -------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s${}]+)")  # \boxed 42
_ANSWER_IS = re.compile(r"(?:final|the)\s+answer[\s*_]*(?:is\b|:|=)[\s*_:]*(?P<ans>[^\n]*)", re.IGNORECASE)
_ANSWER_COLON = re.compile(r"\banswer[\s*_]*:[\s*_:]*(?P<ans>[^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w)}\]])[-\u2212]?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?")
_SENTENCE_END = re.compile(r"\.(?:\s|$)")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), else ``\\boxed 42``."""
    best: tuple[int, str] | None = None
    for match in _BOXED.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = (match.start(), text[match.end() : i - 1])
    for match in _BOXED_BARE.finditer(text):
        if best is None or match.start() > best[0]:
            best = (match.start(), match.group(1))
    return None if best is None else best[1].strip()


def _last_phrase(pattern: re.Pattern[str], text: str) -> str | None:
    """The last capture of ``pattern`` that contains a digit, cut at the end of its sentence."""
    found = None
    for match in pattern.finditer(text):
        ans = _SENTENCE_END.split(match.group("ans"), maxsplit=1)[0].strip()
        if any(ch.isdigit() for ch in ans):
            found = ans
    return found


def extract_answer(text: str) -> str | None:
    """Find the final answer in a completion and return it as a stripped raw string, or None.

    Priority: the last ``\\boxed{..}``/``\\fbox{..}``; else the last "final answer is .."/"the answer
    is .."; else the last "Answer: .."; else the last number in the text. Phrase matches count only
    when the rest of their sentence contains a digit ("the answer is unclear" is skipped).
    """
    if not text:
        return None
    for found in (_last_boxed(text), _last_phrase(_ANSWER_IS, text), _last_phrase(_ANSWER_COLON, text)):
        if found:
            return found
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


# --- normalisation ----------------------------------------------------------------------------------

_MINUS = str.maketrans(dict.fromkeys("\u2212\u2012\u2013\u2014\ufe63\uff0d", "-"))
_REMOVE = re.compile(
    r"\\[,;:! ]|\\q?quad\b|~|\\displaystyle|\\left\b|\\right\b|\\\$|\\%|%"
    r"|\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b|°|\{,\}"
)
_WRAPPER_NAMES = "text|textbf|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname"
_WRAPPER = re.compile(rf"\\(?:{_WRAPPER_NAMES})\s*\{{([^{{}}]*)\}}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_SQRT = re.compile(r"\\sqrt\s*\{([^{}]*)\}")
_MATH_DELIMS = re.compile(r"^(?:\$\$|\$|\\\(|\\\[)(.*?)(?:\$\$|\$|\\\)|\\\])$", re.DOTALL)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_INTEGER = re.compile(r"^[-+]?\d+$")
_DECIMAL = re.compile(r"^[-+]?\d*\.\d*$")
_LEADING_ZEROS = re.compile(r"(?<![\d.])0+(?=\d)")
_WHITELIST = re.compile(r"^(?:[0-9+\-*/().]|sqrt)+$")
_IMPLICIT_CALL = re.compile(r"[\d.)](?:\(|sqrt)")  # "2(3)" would be compiled as a call: reject, never guess
_SAFE_EXPONENT = re.compile(r"(?>\(?\d{1,2}\)?)(?!\d|\*\*)")
_MAX_EXPR_LEN = 100
_SYMPIFY_ERRORS = (
    sympy.SympifyError,
    SyntaxError,
    TypeError,
    ValueError,
    AttributeError,
    ZeroDivisionError,
    RecursionError,
    tokenize.TokenError,
)


def _unwrap(s: str) -> str:
    """Strip markdown, math delimiters and trailing punctuation around an answer until stable."""
    prev = None
    while s != prev:
        prev = s
        s = s.strip().strip("*_").strip()
        s = s.rstrip(".").strip()
        match = _MATH_DELIMS.match(s)
        if match:
            s = match.group(1)
        if s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
            s = s[1:-1]
    return s


def _balanced(s: str) -> bool:
    """True when every brace in ``s`` is matched."""
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _sub_until_stable(pattern: re.Pattern[str], repl: str, s: str) -> str:
    """Apply ``pattern.sub`` repeatedly, so nested constructs unwrap from the inside out."""
    prev = None
    while s != prev:
        prev, s = s, pattern.sub(repl, s)
    return s


def _to_number(s: str) -> Fraction | None:
    """Exact value of a cleaned answer string, or None when it is not a plain number/arithmetic."""
    if len(s) > _MAX_EXPR_LEN:  # also keeps int() below Python's digit-count limit
        return None
    if _INTEGER.match(s):
        return Fraction(int(s))
    if _DECIMAL.match(s) and any(ch.isdigit() for ch in s):
        return Fraction(s)
    if not _WHITELIST.match(s) or _IMPLICIT_CALL.search(s) or not _safe_powers(s):
        return None
    try:
        value = sympy.sympify(_LEADING_ZEROS.sub("", s), rational=True)
    except _SYMPIFY_ERRORS:  # malformed arithmetic (whitelisted, so never arbitrary code): not a number
        return None
    if not isinstance(value, sympy.Rational):
        return None
    return Fraction(int(value.p), int(value.q))


def _safe_powers(s: str) -> bool:
    """Bound exponentiation (at most two ``**``, each to a 1-2 digit literal, never chained) for sympify."""
    if s.count("**") > 2:
        return False
    return all(_SAFE_EXPONENT.match(s, m.end()) for m in re.finditer(r"\*\*", s))


def normalize_answer(raw: str | None) -> int | None:
    """Turn an extracted answer string into an AIME integer 0..999, or None if it is not one.

    Handles markdown bold, math delimiters, ``\\text{}``-style wrappers, ``\\frac``/``\\dfrac``,
    degrees, thousands separators, unicode minus, leading zeros and integral decimals (``42.0``).
    Non-integers, negatives and values above 999 give None.
    """
    if raw is None:
        return None
    s = raw.translate(_MINUS)
    if _BOXED.search(s) or _BOXED_BARE.search(s):
        s = _last_boxed(s) or ""
    s = _unwrap(s)
    s = _sub_until_stable(_WRAPPER, r"\1", s)
    s = _REMOVE.sub("", s).replace("$", "")
    s = _unwrap(s)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    s = _unwrap(s)
    if _THOUSANDS.match(s.strip()):
        s = s.replace(",", "")
    s = _FRAC_SHORT.sub(r"(\1)/(\2)", s)
    s = _sub_until_stable(_FRAC, r"((\1)/(\2))", s)
    s = _sub_until_stable(_SQRT, r"sqrt(\1)", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\u00d7", "*").replace("\u00b7", "*")
    s = s.replace("\\div", "/").replace("\u00f7", "/")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    s = re.sub(r"\s+", "", s)
    if not s:
        return None
    value = _to_number(s)
    if value is None or value.denominator != 1:
        return None
    result = int(value)
    return result if AIME_MIN <= result <= AIME_MAX else None


# --- scoring ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """Outcome of scoring one completion against its gold answer."""

    extracted: str | None
    answer: int | None
    gold: int
    correct: bool


def parse_gold(gold: str | int) -> int:
    """Parse a gold answer strictly: an integer 0..999 (leading zeros allowed), else raise AnswerError."""
    allowed = f"an integer {AIME_MIN}..{AIME_MAX} given as int or digit string (leading zeros ok, e.g. '007')"
    if isinstance(gold, Integral) and not isinstance(gold, bool):
        value = int(gold)
    elif isinstance(gold, str) and re.fullmatch(r"\d+", gold.strip()):
        value = int(gold.strip())
    else:
        raise AnswerError(f"invalid gold answer {gold!r} ({type(gold).__name__}): expected {allowed}")
    if not AIME_MIN <= value <= AIME_MAX:
        raise AnswerError(f"gold answer {gold!r} is out of range: expected {allowed}")
    return value


def score(completion: str, gold: str | int) -> Score:
    """Extract, normalise and compare a completion's answer with ``gold`` (raises AnswerError on bad gold)."""
    gold_value = parse_gold(gold)
    extracted = extract_answer(completion)
    answer = normalize_answer(extracted)
    return Score(extracted=extracted, answer=answer, gold=gold_value, correct=answer == gold_value)
