"""Answer extraction, normalisation and scoring for AIME-style problems.

Pure functions only: no model, no I/O, no global state, safe to call from any thread. An AIME answer is
an integer 0..999. Model completions are scored in three steps: :func:`extract_answer` finds the raw
final-answer string, :func:`normalize_answer` turns it into an integer (or ``None``), and :func:`score`
compares it with the gold answer parsed by :func:`parse_gold`. Cases: ``tests/cases/answers.yaml``.

The rules, including what an adversarial completion gets:

- **Where the answer is.** The last ``\\boxed{..}``/``\\fbox{..}`` wins (a correction boxed after a first
  guess counts; boxing several candidates earns nothing, only the last is read). Without a box, the last
  "the/final answer is .." phrase, then the last "Answer: ..", then the last number in the text.
- **Which part of a phrase.** The answer at its start: ``$204$ minutes`` -> ``$204$``; ``70 degrees``,
  ``70 because ..``, ``70, not 71``, ``070 (i.e. 70)`` -> 70. Tokens are taken while they look like
  mathematics (digits, operators, LaTeX commands, single-letter variables); a prose word, a
  parenthetical remark or a ``,``/``;`` ends it. A phrase without a digit there is skipped.
- **Hedges score nothing.** "70 or 71", "70, 71", "$70$ or $71$" (another number offered after a comma,
  ``or``, ``and``, ``/``) and ``7 0`` (digits split by whitespace: 70, or 7 then 0?) give no answer.
  So does "70, and 71 is wrong": a completion that needs a second number next to its answer should box it.
- **Values.** Negatives, non-integers (``\\frac{7}{2}``, ``3.5``), and values above 999 are no answer:
  nothing is clipped or taken mod 1000. ``1,000`` is one thousand; ``004`` and ``42.0`` are 4 and 42.
- **Notation.** Markdown bold, math delimiters, ``\\text{}``-style wrappers, units after the number
  (``70 \\text{ degrees}``, ``^\\circ``, ``°``), ``\\frac``/``\\dfrac``, ``\\sqrt``, ``\\times``/``\\cdot``,
  ``x = 5`` (the right-most side) and unicode minus are understood.

Arithmetic in answers (``\\frac{84}{2}``, ``2^{3}``) is evaluated with ``sympy.sympify`` only after the
string has been reduced to digits, operators and parentheses, at most 100 characters with bounded
exponents; nothing else is ever evaluated. ``math-verify`` is not used: it compares general expressions
(sets, intervals, symbols) and needs a gold in the same notation, while an AIME answer is one integer;
the exact-integer rules above are stricter and auditable.
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
_ANSWER_IS = re.compile(r"(?:final|the)\s+answer[\s*_]*(?:is\b|:|=)[\s*_:]*(?=(?P<ans>[^\n]{0,200}))", re.IGNORECASE)
_ANSWER_COLON = re.compile(r"\banswer[\s*_]*:[\s*_:]*(?=(?P<ans>[^\n]{0,200}))", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w)}\]])[-\u2212]?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?")
_SENTENCE_END = re.compile(r"\.(?:\s|$)")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its matching ``}``, in one pass (unmatched braces are left out)."""
    opened: list[int] = []
    closing: dict[int, int] = {}
    for match in re.finditer(r"[{}]", text):
        if match.group() == "{":
            opened.append(match.start())
        elif opened:
            closing[opened.pop()] = match.start()
    return closing


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), else ``\\boxed 42``."""
    best: tuple[int, str] | None = None
    closing = _closing_braces(text) if "{" in text else {}
    for match in _BOXED.finditer(text):
        end = closing.get(match.end() - 1)
        if end is not None:
            best = (match.start(), text[match.end() : end])
    for match in _BOXED_BARE.finditer(text):
        if best is None or match.start() > best[0]:
            best = (match.start(), match.group(1))
    return None if best is None else best[1].strip()


_DELIM_CLOSE = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")
_HEDGE = re.compile(r"\s*(?:[,;/]\s*(?:(?:or|and)\b\s*)?|(?:or|and)\b\s*)[-\u2212$\\(*_]*\d", re.IGNORECASE)


def _is_math_token(token: str) -> bool:
    """A whitespace-free token that can belong to an answer: digits, operators, LaTeX, single letters."""
    bare = _LATEX_COMMAND.sub("", token)
    if _PROSE_WORD.search(bare):  # "degrees", "because", "not": prose starts here
        return False
    return not (bare.startswith("(") and any(ch.isalpha() for ch in bare))  # "(i.e." opens a remark


def _answer_span(capture: str) -> str:
    """The answer at the start of a phrase capture ("70 degrees" -> "70"), or the capture when it hedges.

    A math-delimited start (``$204$ minutes``) is taken to its closing delimiter. Otherwise whitespace
    tokens are taken while they look like mathematics; a token ending in ``,``/``;`` ends the answer
    after itself. When what follows offers another number ("70 or 71", "70, 71") the answer is
    ambiguous and the whole capture is returned, which normalises to no answer.
    """
    s = capture.lstrip(" \t*_")
    end = None
    for opener in ("$$", "$", "\\(", "\\["):
        if s.startswith(opener):
            close = s.find(_DELIM_CLOSE[opener], len(opener))
            end = None if close < 0 else close + len(_DELIM_CLOSE[opener])
            break
    if end is None:
        end = 0
        for match in re.finditer(r"\S+", s):
            token = match.group()
            if not _is_math_token(token):
                break
            end = match.end()
            if token[-1] in ",;":
                end -= 1
                break
    while end < len(s) and s[end] in "*_":  # closing markdown: "**70**"
        end += 1
    if _HEDGE.match(s, end):
        return s.strip()
    return s[:end].strip()


def _last_phrase(pattern: re.Pattern[str], text: str) -> str | None:
    """The answer span of the last capture of ``pattern`` whose span has a digit (sentence-bounded)."""
    found = None
    for match in pattern.finditer(text):
        sentence = _SENTENCE_END.split(match.group("ans"), maxsplit=1)[0].strip()
        ans = _answer_span(sentence)
        if any(ch.isdigit() for ch in ans):
            found = ans
    return found


def extract_answer(text: str) -> str | None:
    """Find the final answer in a completion and return it as a stripped raw string, or None.

    Priority: the last ``\\boxed{..}``/``\\fbox{..}``; else the last "final answer is .."/"the answer
    is .."; else the last "Answer: .."; else the last number in the text. A phrase yields the answer at
    its start ("70 degrees", "$204$ minutes", "70, not 71", "070 (i.e. 70)" give 70, $204$, 70, 070) and
    counts only when that contains a digit ("the answer is unclear" is skipped). A hedge ("70 or 71")
    is returned whole, so it scores as no answer.
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
_SPLIT_DIGITS = re.compile(r"\d\s+\d")
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
    degrees and unit words after the number, thousands separators, unicode minus, leading zeros and
    integral decimals (``42.0``). Non-integers, negatives, values above 999, hedges ("70 or 71") and
    digits split by whitespace ("7 0") give None.
    """
    if raw is None:
        return None
    s = raw.translate(_MINUS)
    if _BOXED.search(s) or _BOXED_BARE.search(s):
        s = _last_boxed(s) or ""
    s = _unwrap(s)
    s = _sub_until_stable(_WRAPPER, r"\1", s)
    s = _answer_span(s)  # "70 \text{ degrees}" -> "70"; "70 or 71" stays whole (and fails below)
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
    if _SPLIT_DIGITS.search(s):  # "7 0": 70, or 7 then 0? ambiguous, so no answer
        return None
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
    overlong: bool | None = None  # scored under a reasoning trace (harness.task.trace): cut by the budget inside it


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
