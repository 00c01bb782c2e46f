"""A problem found by its content, whatever the wording around it (issue 60): the normal form that makes two
spellings of one problem compare equal, and the similarity that finds a near duplicate.

    normal(text)              # NFKC, LaTeX math delimiters dropped, lower-cased, whitespace removed
    contains(request, problem)   # `problem`'s normal form inside `request`'s: where it ends, or -1
    shingles(text)            # the set of 3-word shingles of the normal words (letters and digits runs)
    containment(a, b)         # the share of a's shingles in b (0..1)
    ContentIndex(items).present(texts)   # which of `items` (key, problem text) are in `texts`, by the rule below

The normal form: Unicode NFKC (full-width and compatibility forms folded), the LaTeX delimiters `\\(` `\\)` `\\[`
`\\]` `$$` `$` removed, case folded, and every whitespace character removed (so a space more or less, a line break,
or a delimiter changed never makes another text). Two texts with the same normal form are one problem. Near
duplicates: a library problem whose shingles lie in a request's for at least NEAR_DUPLICATE of them (and at least
MIN_SHINGLES shingles: a shorter problem is found only by its normal form); the threshold is measured in
docs/vllm.md ("The rule that finds a request's problem") on the 975 AIME problems of 1983-2023.

ContentIndex is the one rule both sides apply: the library-aware server to a request's texts (harness/serve) and the
harness's own held-out and random retrieval to the evaluated problem's text (harness.library.build.Library.retrieve),
so the two exclude the same entries for the same problem.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["MIN_SHINGLES", "NEAR_DUPLICATE", "ContentIndex", "containment", "contains", "normal", "normal_map",
           "shingles", "words"]

#: a library problem whose 3-word shingles lie in the request for at least this share is a near duplicate
NEAR_DUPLICATE = 0.7
#: fewer shingles than this: too short for a share to mean anything; only the normal form finds it
MIN_SHINGLES = 4

_DELIMITERS = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$")
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+")


def _folded(text: str) -> str:
    return _DELIMITERS.sub(" ", unicodedata.normalize("NFKC", text)).casefold()


def normal(text: str) -> str:
    """`text` in the normal form (module docstring): equal normal forms are one problem."""
    return _SPACE.sub("", _folded(text))


def normal_map(text: str) -> tuple[str, str, list[int]]:
    """(`text` in NFKC, its normal form, for each character of the normal form the index in the NFKC text it came
    from, plus one past the end): where a piece of the normal form lies in the text."""
    src = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    where: list[int] = []
    i = 0
    for m in _DELIMITERS.finditer(src):
        _fold_into(src, i, m.start(), out, where)
        i = m.end()
    _fold_into(src, i, len(src), out, where)
    where.append(len(src))
    return src, "".join(out), where


def _fold_into(src: str, start: int, stop: int, out: list[str], where: list[int]) -> None:
    for k in range(start, stop):
        if src[k].isspace():
            continue
        for c in src[k].casefold():
            out.append(c)
            where.append(k)


def contains(request: str, problem: str) -> int:
    """Where the last occurrence of `problem`'s normal form ends in `request`'s normal form (an index into it), or
    -1. Both are normal forms already (`normal`)."""
    if not problem:
        return -1
    at = request.rfind(problem)
    return -1 if at < 0 else at + len(problem)


def words(text: str) -> list[str]:
    """The words of the normal form: runs of letters and digits, case folded."""
    return _WORD.findall(_folded(text))


def shingles(text: str, n: int = 3) -> frozenset[tuple[str, ...]]:
    """The set of `n`-word shingles of `text`'s words."""
    w = words(text)
    return frozenset(tuple(w[i:i + n]) for i in range(len(w) - n + 1))


def containment(a: frozenset, b: frozenset) -> float:
    """The share of `a`'s shingles that are in `b` (0.0 when `a` has none)."""
    return len(a & b) / len(a) if a else 0.0


class ContentIndex:
    """Problems (`items`: key, problem text) found by content in a request's texts: a problem is *in* the texts when
    its normal form lies inside any text's normal form (share 1.0), or when at least NEAR_DUPLICATE of its 3-word
    shingles (and it has at least MIN_SHINGLES) lie in the texts' shingles; and, given the problem asked (`asked`),
    when at least NEAR_DUPLICATE of the asked problem's shingles lie in its (a near duplicate either way: the
    containment of one problem in the other is not symmetric). Shingles are looked up in an inverted index, so a
    request costs its own shingles, not the library's size."""

    def __init__(self, items: Iterable[tuple[str, str]]) -> None:
        self._normal: list[tuple[str, str]] = []
        self._size: dict[str, int] = {}
        self._posting: dict[tuple[str, ...], list[str]] = {}
        for key, text in items:
            self._normal.append((normal(text), key))
            own = shingles(text)
            self._size[key] = len(own)
            for s in own:
                self._posting.setdefault(s, []).append(key)

    def _hits(self, request: frozenset) -> Counter:
        return Counter(key for s in request for key in self._posting.get(s, ()))

    def present(self, texts: Sequence[str], asked: str = "") -> dict[str, float]:
        """key -> share (1.0: its normal form is inside a text) for every problem in `texts` or a near duplicate
        of the problem `asked` (class docstring)."""
        whole = [normal(t) for t in texts]
        out = {key: 1.0 for n, key in self._normal if n and any(n in w for w in whole)}
        for key, count in self._hits(frozenset().union(*(shingles(t) for t in texts))).items():
            size = self._size[key]
            if key not in out and size >= MIN_SHINGLES and count / size >= NEAR_DUPLICATE:
                out[key] = round(count / size, 3)
        mine = shingles(asked) if asked else frozenset()
        if len(mine) >= MIN_SHINGLES:
            for key, count in self._hits(mine).items():
                share = round(count / len(mine), 3)
                if share >= NEAR_DUPLICATE and share > out.get(key, 0.0):
                    out[key] = share
        return out
