"""Independent answer checks for the bundled original problem set.

``problems/kvgraft_original.jsonl`` holds AIME-style problems written for kvgraft. This test recomputes
every answer from the problem statement alone, by brute-force enumeration in plain Python (or sympy for
exact algebra), never by reading the worked solution, and checks:

- each row's ``answer`` equals its recomputation (parametrized by id, so a failure names the problem);
- every id in the file has a recomputation and every recomputation has a row;
- the schema: required fields, canonical integer answers 0-999, unique ordered ids, a known topic, and a
  solution that ends with ``The final answer is \\boxed{N}.`` for the row's answer.

Run: ``python -m pytest tests/test_bundled_problems.py -q`` (a few seconds; the loops are small).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest
import sympy as sp

PROBLEMS_PATH = Path(__file__).resolve().parents[1] / "problems" / "kvgraft_original.jsonl"
REQUIRED_FIELDS = {"id", "problem", "answer", "solution", "source", "topic"}
TOPICS = {"algebra", "number theory", "combinatorics", "geometry", "probability"}
FINAL_SENTENCE = re.compile(r"The final answer is \\boxed\{(\d+)\}\.$")


def _m_plus_n(value: Fraction) -> int:
    """m + n for a probability or ratio written as m/n in lowest terms (Fraction keeps it reduced)."""
    return value.numerator + value.denominator


def _digits(n: int) -> list[int]:
    return [int(ch) for ch in str(n)]


def _is_square(n: int) -> bool:
    return n >= 0 and math.isqrt(n) ** 2 == n


def _heron_area(a: int, b: int, c: int) -> int:
    """Exact integer area of a triangle with integer sides (asserts the area is an integer)."""
    sixteen_k_squared = (a + b + c) * (-a + b + c) * (a - b + c) * (a + b - c)
    four_k = math.isqrt(sixteen_k_squared)
    assert four_k * four_k == sixteen_k_squared and four_k % 4 == 0
    return four_k // 4


def _shoelace(points: list[tuple]) -> object:
    """Absolute polygon area from vertices in order (works for Fractions and sympy numbers)."""
    twice = sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1], strict=True))
    return abs(twice) / 2


def _single(values: set) -> int:
    """The one value every solution branch agrees on, as an int."""
    assert len(values) == 1, values
    return int(values.pop())


def p001() -> int:
    x = sp.symbols("x")
    (root,) = sp.solve(sp.Eq(3 * x + 7, 5 * x - 29), x)
    return int(root**2)


def p002() -> int:
    return pow(7, 2024, 1000)


def p003() -> int:
    digit_lists = (_digits(n) for n in range(1000, 10000))
    return sum(1 for d in digit_lists if d == sorted(set(d)) and sum(d) == 20)


def p004() -> int:
    rolls = list(itertools.product(range(1, 7), range(1, 7), range(1, 5)))
    return _m_plus_n(Fraction(sum(1 for r in rolls if sum(r) == 10), len(rolls)))


def p005() -> int:
    return _heron_area(25, 39, 56)


def p006() -> int:
    a = 1
    for n in range(1, 10):  # a_{n+1} = a_n + n^2, from a_1 up to a_10
        a += n * n
    return a


def p007() -> int:
    return sum(1 for d in sp.divisors(math.factorial(12)) if _is_square(d))


def p008() -> int:
    width = 10
    cells = [(r, c) for c in range(width) for r in range(2)]
    shapes = (((0, 0), (0, 1)), ((0, 0), (1, 0)), ((0, 0), (1, 0), (0, 1), (1, 1)))

    @cache
    def tilings(filled: frozenset) -> int:
        free = next((cell for cell in cells if cell not in filled), None)
        if free is None:
            return 1
        total = 0
        for shape in shapes:
            piece = [(free[0] + dr, free[1] + dc) for dr, dc in shape]
            if all(0 <= r < 2 and 0 <= c < width and (r, c) not in filled for r, c in piece):
                total += tilings(filled | frozenset(piece))
        return total

    return tilings(frozenset())


def p009() -> int:
    marbles = ["R"] * 5 + ["B"] * 7
    draws = list(itertools.combinations(range(len(marbles)), 3))
    hits = sum(1 for draw in draws if [marbles[i] for i in draw].count("R") == 2)
    return _m_plus_n(Fraction(hits, len(draws)))


def p010() -> int:
    x = sp.symbols("x")
    roots = sp.Poly(x**3 - 6 * x**2 + 11 * x - 7, x).nroots(n=40)
    total = sum(r**4 for r in roots)
    value = round(float(sp.re(total)))
    assert abs(complex(total) - value) < 1e-9
    return value


def p011() -> int:
    return next(n for n in range(1, 7 * 11 * 13 + 1) if n % 7 == 3 and n % 11 == 5 and n % 13 == 8)


def p012() -> int:
    chosen = ([k + 1 for k in range(12) if mask >> k & 1] for mask in range(1 << 12))
    return sum(1 for s in chosen if len(s) >= 3 and all(b - a > 1 for a, b in itertools.pairwise(s)))


def p013() -> int:
    return sum(1 for n in range(1, 1001) if (n * n + n + 1) % 13 == 0)


def p014() -> int:
    # Right angle at the origin: A = (0, 0), B = (20, 0), C = (0, 21).
    pa, pb, pc = (Fraction(0), Fraction(0)), (Fraction(20), Fraction(0)), (Fraction(0), Fraction(21))

    def dist(p, q) -> int:
        d2 = (p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2
        assert _is_square(int(d2))
        return math.isqrt(int(d2))

    a, b, c = dist(pb, pc), dist(pa, pc), dist(pa, pb)
    incenter = tuple((a * pa[i] + b * pb[i] + c * pc[i]) / (a + b + c) for i in range(2))
    # Circumcenter: the point equidistant from A, B, C (solve the two perpendicular-bisector equations).
    ox, oy = sp.symbols("ox oy")
    sol = sp.solve(
        [
            (ox - pa[0]) ** 2 + (oy - pa[1]) ** 2 - (ox - pb[0]) ** 2 - (oy - pb[1]) ** 2,
            (ox - pa[0]) ** 2 + (oy - pa[1]) ** 2 - (ox - pc[0]) ** 2 - (oy - pc[1]) ** 2,
        ],
        [ox, oy],
    )
    circumcenter = (Fraction(str(sol[ox])), Fraction(str(sol[oy])))
    oi2 = (circumcenter[0] - incenter[0]) ** 2 + (circumcenter[1] - incenter[1]) ** 2
    return _m_plus_n(oi2)


def p015() -> int:
    flips = ["".join(s) for s in itertools.product("HT", repeat=10)]
    return _m_plus_n(Fraction(sum(1 for s in flips if "HHH" not in s), len(flips)))


def p016() -> int:
    count = 0
    for x in range(-2025, 2026):
        y2 = x * x - 2025
        if _is_square(y2):
            count += 1 if y2 == 0 else 2
    return count


def p017() -> int:
    x, y = sp.symbols("x y")
    sols = sp.solve([x + y - 7, x**3 + y**3 - 133], [x, y], dict=True)
    return _single({sp.simplify(s[x] ** 4 + s[y] ** 4) for s in sols})


def p018() -> int:
    # f(x) + 2 f(1 - x) = 3 x^2 at x = -20 and at x = 21 gives two equations in f(-20), f(21).
    f_m20, f_21 = sp.symbols("f_m20 f_21")
    sol = sp.solve([f_m20 + 2 * f_21 - 3 * (-20) ** 2, f_21 + 2 * f_m20 - 3 * 21**2], [f_m20, f_21])
    return int(sol[f_m20])


def p019() -> int:
    paths = {}
    for x in range(7):
        for y in range(7):
            if (x, y) == (3, 3):
                paths[x, y] = 0
            elif (x, y) == (0, 0):
                paths[x, y] = 1
            else:
                paths[x, y] = paths.get((x - 1, y), 0) + paths.get((x, y - 1), 0)
    return paths[6, 6]


def p020() -> int:
    n, zeros = math.factorial(100), 0
    while n % 12 == 0:
        n //= 12
        zeros += 1
    return zeros


def p021() -> int:
    hexagon = [(10 * sp.cos(k * sp.pi / 3), 10 * sp.sin(k * sp.pi / 3)) for k in range(6)]
    area = sp.nsimplify(sp.simplify(_shoelace([hexagon[0], hexagon[2], hexagon[4]])))
    square = int(sp.simplify(area**2))  # area = a * sqrt(b) with b squarefree  <=>  area^2 = a^2 b
    b = math.prod(p for p, e in sp.factorint(square).items() if e % 2 == 1)
    a = math.isqrt(square // b)
    assert a * a * b == square
    return a + b


def p022() -> int:
    return sum(1 for shares in itertools.product(range(1, 6), repeat=4) if sum(shares) == 12)


def p023() -> int:
    divisors = sp.divisors(720)
    return sum(1 for a in divisors for b in divisors if sp.ilcm(a, b) == 720)


def p024() -> int:
    return sum(math.isqrt(k) for k in range(1, 101))


def p025() -> int:
    # Long base on the x-axis from (0, 0) to (24, 0); short base at height h from (p, h) to (p + 10, h).
    p, h = sp.symbols("p h", real=True)
    sols = sp.solve([p**2 + h**2 - 13**2, (24 - (p + 10)) ** 2 + h**2 - 15**2], [p, h], dict=True)
    return _single({(10 + 24) * s[h] / 2 for s in sols if s[h] > 0})


def p026() -> int:
    fixed_counts = (sum(1 for i, v in enumerate(perm) if i == v) for perm in itertools.permutations(range(7)))
    return sum(1 for fixed in fixed_counts if fixed == 2)


def p027() -> int:
    good = 0
    for steps in itertools.product((1, -1), repeat=10):
        positions = list(itertools.accumulate(steps))
        good += min(positions) >= 0
    return _m_plus_n(Fraction(good, 2**10))


def p028() -> int:
    # B = (-7, 0), C = (7, 0), A = (0, height); circumcenter (0, k) is equidistant from A and B.
    height = math.isqrt(25**2 - 7**2)
    assert height**2 + 7**2 == 25**2
    k = sp.Rational(height**2 - 7**2, 2 * height)  # from 7^2 + k^2 = (height - k)^2
    assert 7**2 + k**2 == (height - k) ** 2
    return _m_plus_n(Fraction(int(sp.numer(height - k)), int(sp.denom(height - k))))


def p029() -> int:
    return sum(
        1
        for s in itertools.product("ABCD", repeat=5)
        if all(a != b for a, b in itertools.pairwise(s)) and s[0] != s[-1]
    )


def p030() -> int:
    # Markov chain: a = P(Alice eventually wins | Alice to roll), b = same with Bob to roll.
    a, b = sp.symbols("a b")
    sol = sp.solve([a - (sp.Rational(1, 6) + sp.Rational(5, 6) * b), b - sp.Rational(4, 6) * a], [a, b])
    return _m_plus_n(Fraction(int(sp.numer(sol[a])), int(sp.denom(sol[a]))))


def p031() -> int:
    x = sp.symbols("x")
    poly = sp.interpolate([(1, 3), (2, 11), (3, 25)], x)
    assert sp.degree(poly, x) == 2
    return int(poly.subs(x, 10))


def p032() -> int:
    return max(sp.primefactors(3**12 - 1))


def p033() -> int:
    pairs = list(itertools.combinations(range(1, 21), 2))
    return _m_plus_n(Fraction(sum(1 for a, b in pairs if a * b % 6 == 0), len(pairs)))


def p034() -> int:
    rolls = list(itertools.product(range(1, 7), repeat=4))
    return _m_plus_n(Fraction(sum(len(set(r)) for r in rolls), len(rolls)))


def p035() -> int:
    perms = list(itertools.permutations(range(1, 6)))
    good = sum(1 for p in perms if all(abs(a - b) != 1 for a, b in itertools.pairwise(p)))
    return _m_plus_n(Fraction(good, len(perms)))


def p036() -> int:
    # P at the origin, sides parallel to the axes: A = (-a, -b), B = (c, -b), C = (c, d), D = (-a, d).
    # Any admissible b gives a valid rectangle; check that PD^2 does not depend on the choice.
    values = set()
    for b2 in (Fraction(60), Fraction(100), Fraction(150), Fraction(200)):
        a2, c2 = 21**2 - b2, 15**2 - b2
        d2 = 13**2 - c2
        assert min(a2, b2, c2, d2) > 0
        values.add(a2 + d2)
    return _single(values)


def p037() -> int:
    # Circle x^2 + y^2 = 25^2; find the horizontal chords of lengths 48 and 40 by scanning heights.
    def height(length: int) -> int:
        return next(y for y in range(26) if 4 * (625 - y * y) == length * length)

    y1, y2 = height(48), -height(40)
    half1, half2 = math.isqrt(625 - y1 * y1), math.isqrt(625 - y2 * y2)
    return int(_shoelace([(-half1, y1), (half1, y1), (half2, y2), (-half2, y2)]))


def p038() -> int:
    ax, ay = sp.symbols("ax ay", real=True)
    equations = [ax**2 + ay**2 - 12**2, (ax - 25) ** 2 + ay**2 - 18**2]  # AB = 12, AC = 18
    (sol,) = [s for s in sp.solve(equations, [ax, ay], dict=True) if s[ay] > 0]
    a = sp.Matrix([sol[ax], sol[ay]])
    b, c = sp.Matrix([0, 0]), sp.Matrix([25, 0])
    direction = (b - a) / 12 + (c - a) / 18  # sum of unit vectors along AB and AC bisects angle A
    t = -a[1] / direction[1]  # where the bisector meets line BC (y = 0)
    d = a + t * direction
    return int(sp.simplify((d - a).dot(d - a)))


def p039() -> int:
    vertices = [(math.cos(2 * math.pi * k / 12), math.sin(2 * math.pi * k / 12)) for k in range(12)]

    def obtuse(tri: tuple[int, int, int]) -> bool:
        for i in range(3):
            p, q, r = (vertices[tri[(i + j) % 3]] for j in range(3))
            if (q[0] - p[0]) * (r[0] - p[0]) + (q[1] - p[1]) * (r[1] - p[1]) < -1e-9:
                return True
        return False

    return sum(1 for tri in itertools.combinations(range(12), 3) if obtuse(tri))


def p040() -> int:
    (x,) = [x for x in range(1, 1000) if math.isclose(math.log(x, 2) + math.log(x, 4) + math.log(x, 8), 11)]
    return x


COMPUTE: dict[str, Callable[[], int]] = {
    f"kvg-{int(name[1:]):03d}": fn for name, fn in sorted(globals().items()) if re.fullmatch(r"p\d{3}", name)
}


def _load_rows() -> list[dict]:
    with PROBLEMS_PATH.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


ROWS = _load_rows()
ROWS_BY_ID = {row["id"]: row for row in ROWS}


def test_problem_set_has_at_least_thirty_problems() -> None:
    assert len(ROWS) >= 30


def test_every_row_has_a_recomputation_and_every_recomputation_a_row() -> None:
    assert sorted(ROWS_BY_ID) == sorted(COMPUTE)


def test_ids_are_unique_and_numbered_in_order() -> None:
    ids = [row["id"] for row in ROWS]
    assert ids == [f"kvg-{i:03d}" for i in range(1, len(ROWS) + 1)]


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_row_schema(row: dict) -> None:
    assert set(row) == REQUIRED_FIELDS
    assert all(isinstance(row[field], str) and row[field].strip() for field in REQUIRED_FIELDS)
    assert re.fullmatch(r"0|[1-9]\d{0,2}", row["answer"]), "answer must be a canonical integer 0-999"
    assert row["source"] == "kvgraft-original"
    assert row["topic"] in TOPICS
    final = FINAL_SENTENCE.search(row["solution"])
    assert final, "solution must end with 'The final answer is \\boxed{N}.'"
    assert final.group(1) == row["answer"]


@pytest.mark.parametrize("problem_id", sorted(COMPUTE))
def test_answer_matches_independent_recomputation(problem_id: str) -> None:
    value = COMPUTE[problem_id]()
    assert 0 <= value <= 999
    assert ROWS_BY_ID[problem_id]["answer"] == str(value)


def test_the_harness_loader_reads_the_file_as_written() -> None:
    """load_problems (what every run uses) gives the same ids, answers, texts and solutions as the raw rows."""
    from harness.task.problems import load_problems

    problems = load_problems(str(PROBLEMS_PATH))
    assert [(p.id, p.answer, p.problem, p.solution) for p in problems] == [
        (row["id"], row["answer"], row["problem"], row["solution"]) for row in ROWS
    ]
    assert all(p.source == {"source": row["source"], "topic": row["topic"]} for p, row in zip(problems, ROWS, strict=True))


def test_every_bundled_solution_scores_as_its_own_answer() -> None:
    """The scorer reads each worked solution's final answer (what a library build verifies before deposit)."""
    from harness.task.answers import score

    wrong = [row["id"] for row in ROWS if not score(row["solution"], row["answer"]).correct]
    assert wrong == []
