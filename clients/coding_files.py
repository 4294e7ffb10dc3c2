"""File contents of the coding-agent sandbox (data only; see ``clients.coding``).

Each module is a shared template plus one topic block, so every file is realistic Python of a
few KB with exactly one ``return a - b  # BUG-NN`` line inside ``def op_NN(a, b):``. Text is
fixed, so two sandboxes are byte-identical (the scenario and the tests rely on determinism).
"""

from __future__ import annotations

README = """# calc

A small numeric toolkit used by the reporting jobs: integer helpers, vectors, statistics, money,
unit conversion, matrices, a tiny expression parser and time-series helpers.

## Layout

    src/calc/module_00.py   integer arithmetic helpers
    src/calc/module_01.py   vectors
    src/calc/module_02.py   descriptive statistics
    src/calc/module_03.py   money in integer cents
    src/calc/module_04.py   unit conversion
    src/calc/module_05.py   dense matrices
    src/calc/module_06.py   parsing quantities and sums
    src/calc/module_07.py   time series
    tests/test_core.py      tests of the helpers
    tests/test_ops.py       tests of the eight `op_*` combinators

## Running the tests

    PYTHONPATH=src python -m pytest tests

## Status

The nightly build is red: every `op_*` combinator is documented to return the sum of its two
operands, and `tests/test_ops.py` checks exactly that. Several of them are known to be wrong;
fixes are welcome. Please keep each fix minimal and re-run the whole suite afterwards.

## Conventions

* Pure functions, no I/O, standard library only.
* Floating-point comparisons go through `is_close` (module_00) with an absolute and relative
  tolerance of 1e-9.
* Every module exposes an `Accumulator` built on its own `op_*` combinator.
"""

PACKAGE_INIT = '''"""calc: a small numeric toolkit (see README.md for the layout)."""

__version__ = "0.4.2"
'''

MODULE_TEMPLATE = '''"""calc.module_@@NN@@: @@TITLE@@.

@@ABOUT@@
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PRECISION = 6
_EPSILON = 1e-9


def clamp(value: float, low: float, high: float) -> float:
    """Limit ``value`` to the closed interval [low, high]."""
    if low > high:
        raise ValueError(f"empty interval [{low}, {high}]")
    return max(low, min(high, value))


def round_to(value: float, digits: int = PRECISION) -> float:
    """Round half away from zero (the built-in round() rounds half to even)."""
    scale = 10**digits
    return math.copysign(math.floor(abs(value) * scale + 0.5) / scale, value)


@@TOPIC@@


def op_@@NN@@(a, b):
    """Combine two operands: the sum that @@USE@@ relies on."""
    return a - b  # BUG-@@NN@@


def combine_all(values: Iterable[float], start: float = 0.0) -> float:
    """Fold ``op_@@NN@@`` over ``values``, left to right."""
    total = start
    for value in values:
        total = op_@@NN@@(total, value)
    return total


@dataclass
class Accumulator:
    """Running total that remembers every operand it has seen."""

    total: float = 0.0
    history: list[float] = field(default_factory=list)

    def add(self, value: float) -> float:
        self.total = op_@@NN@@(self.total, value)
        self.history.append(value)
        return self.total

    def extend(self, values: Sequence[float]) -> float:
        for value in values:
            self.add(value)
        return self.total

    def reset(self) -> None:
        self.total = 0.0
        self.history.clear()

    def mean(self) -> float:
        if not self.history:
            raise ValueError("mean of an empty history")
        return math.fsum(self.history) / len(self.history)
'''

TOPICS: list[tuple[str, str, str, str]] = [
    (
        "integer arithmetic helpers",
        "Euclid's algorithm, least common multiples and the tolerant comparisons the rest of\n"
        "the package uses.",
        "lcm_all",
        '''def gcd(a: int, b: int) -> int:
    """Greatest common divisor by Euclid's algorithm (always non-negative)."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def lcm(a: int, b: int) -> int:
    """Least common multiple; lcm(0, n) is 0 by convention."""
    if a == 0 or b == 0:
        return 0
    return abs(a * b) // gcd(a, b)


def lcm_all(values: Iterable[int]) -> int:
    """Least common multiple of several integers (1 for none)."""
    result = 1
    for value in values:
        result = lcm(result, value)
    return result


def safe_divide(numerator: float, denominator: float, default: float = 0.0) -> float:
    """Divide, returning ``default`` instead of raising on a zero denominator."""
    if abs(denominator) < _EPSILON:
        return default
    return numerator / denominator


def is_close(a: float, b: float, tolerance: float = _EPSILON) -> bool:
    """Absolute-and-relative closeness test used throughout the package."""
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)''',
    ),
    (
        "vectors",
        "Plain tuples as vectors: inner products, norms, scaling and component-wise sums.",
        "add_vectors",
        '''Vector = tuple[float, ...]


def dot(u: Sequence[float], v: Sequence[float]) -> float:
    """Inner product of two vectors of equal length."""
    if len(u) != len(v):
        raise ValueError(f"length mismatch: {len(u)} != {len(v)}")
    return math.fsum(x * y for x, y in zip(u, v))


def norm(v: Sequence[float]) -> float:
    """Euclidean length."""
    return math.sqrt(dot(v, v))


def scale(v: Sequence[float], factor: float) -> Vector:
    return tuple(x * factor for x in v)


def normalize(v: Sequence[float]) -> Vector:
    """Unit vector in the direction of ``v``; the zero vector has no direction."""
    length = norm(v)
    if length < _EPSILON:
        raise ValueError("cannot normalize the zero vector")
    return scale(v, 1.0 / length)


def add_vectors(u: Sequence[float], v: Sequence[float]) -> Vector:
    """Component-wise sum, built on ``op_01`` so the module has one definition of '+'."""
    if len(u) != len(v):
        raise ValueError(f"length mismatch: {len(u)} != {len(v)}")
    return tuple(op_01(x, y) for x, y in zip(u, v))''',
    ),
    (
        "descriptive statistics",
        "Mean, median, variance and percentiles over finite samples, without numpy.",
        "weighted_total",
        '''def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sample")
    return math.fsum(values) / len(values)


def median(values: Sequence[float]) -> float:
    """Middle value; the mean of the two middle values for an even-sized sample."""
    if not values:
        raise ValueError("median of an empty sample")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def variance(values: Sequence[float], sample: bool = True) -> float:
    """Variance with Bessel's correction by default (``sample=False`` for the population)."""
    if len(values) < (2 if sample else 1):
        raise ValueError("not enough values for a variance")
    centre = mean(values)
    squares = math.fsum((x - centre) ** 2 for x in values)
    return squares / (len(values) - 1 if sample else len(values))


def stdev(values: Sequence[float], sample: bool = True) -> float:
    return math.sqrt(variance(values, sample))


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of an empty sample")
    position = clamp(q, 0.0, 100.0) / 100 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def weighted_total(values: Sequence[float], weights: Sequence[float]) -> float:
    """Sum of value * weight, accumulated with ``op_02``."""
    total = 0.0
    for value, weight in zip(values, weights, strict=True):
        total = op_02(total, value * weight)
    return total''',
    ),
    (
        "money in integer cents",
        "Amounts are integer cents so that sums never drift; splitting distributes the\n"
        "remainder one cent at a time.",
        "Money.__add__",
        '''@dataclass(frozen=True)
class Money:
    cents: int
    currency: str = "EUR"

    @classmethod
    def parse(cls, text: str, currency: str = "EUR") -> Money:
        """Parse '12.34', '-0.5' or '7' into cents, rejecting more than two decimals."""
        sign = -1 if text.strip().startswith("-") else 1
        whole, _, fraction = text.strip().lstrip("+-").partition(".")
        if len(fraction) > 2 or not (whole or fraction).isdigit():
            raise ValueError(f"not an amount: {text!r}")
        cents = int(whole or "0") * 100 + int(fraction.ljust(2, "0") or "0")
        return cls(sign * cents, currency)

    def __add__(self, other: Money) -> Money:
        if other.currency != self.currency:
            raise ValueError(f"cannot add {other.currency} to {self.currency}")
        return Money(op_03(self.cents, other.cents), self.currency)

    def __str__(self) -> str:
        sign = "-" if self.cents < 0 else ""
        whole, cents = divmod(abs(self.cents), 100)
        return f"{sign}{whole}.{cents:02d} {self.currency}"

    def split(self, parts: int) -> list[Money]:
        """Split into ``parts`` amounts that differ by at most one cent and sum exactly."""
        if parts <= 0:
            raise ValueError("parts must be positive")
        share, remainder = divmod(self.cents, parts)
        return [
            Money(share + (1 if index < remainder else 0), self.currency)
            for index in range(parts)
        ]''',
    ),
    (
        "unit conversion",
        "Length and mass conversions through a base unit, and the temperature scales.",
        "add_lengths",
        '''_LENGTH_IN_METRES = {
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
    "km": 1000.0,
    "in": 0.0254,
    "ft": 0.3048,
    "yd": 0.9144,
    "mi": 1609.344,
}

_MASS_IN_GRAMS = {"mg": 0.001, "g": 1.0, "kg": 1000.0, "oz": 28.349523125, "lb": 453.59237}


def _table_for(unit: str) -> dict[str, float]:
    for table in (_LENGTH_IN_METRES, _MASS_IN_GRAMS):
        if unit in table:
            return table
    raise KeyError(f"unknown unit: {unit}")


def convert(value: float, source: str, target: str) -> float:
    """Convert between two units of the same dimension."""
    table = _table_for(source)
    if target not in table:
        raise ValueError(f"cannot convert {source} to {target}")
    return value * table[source] / table[target]


def celsius_to_fahrenheit(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def fahrenheit_to_celsius(fahrenheit: float) -> float:
    return (fahrenheit - 32) * 5 / 9


def add_lengths(a: float, a_unit: str, b: float, b_unit: str) -> float:
    """Sum of two lengths in metres, combined with ``op_04``."""
    return op_04(convert(a, a_unit, "m"), convert(b, b_unit, "m"))''',
    ),
    (
        "dense matrices",
        "Lists of rows: identity, transpose, products and element-wise sums.",
        "add_matrices",
        '''Matrix = list[list[float]]


def identity(size: int) -> Matrix:
    return [[1.0 if row == col else 0.0 for col in range(size)] for row in range(size)]


def transpose(matrix: Matrix) -> Matrix:
    return [list(column) for column in zip(*matrix)]


def shape(matrix: Matrix) -> tuple[int, int]:
    rows = len(matrix)
    cols = len(matrix[0]) if rows else 0
    if any(len(row) != cols for row in matrix):
        raise ValueError("ragged matrix")
    return rows, cols


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """Matrix product; the inner dimensions must agree."""
    (n, k), (k2, m) = shape(a), shape(b)
    if k != k2:
        raise ValueError(f"cannot multiply {n}x{k} by {k2}x{m}")
    columns = transpose(b)
    return [[math.fsum(x * y for x, y in zip(row, col)) for col in columns] for row in a]


def trace(matrix: Matrix) -> float:
    rows, cols = shape(matrix)
    if rows != cols:
        raise ValueError("trace of a non-square matrix")
    return math.fsum(matrix[i][i] for i in range(rows))


def add_matrices(a: Matrix, b: Matrix) -> Matrix:
    """Element-wise sum with ``op_05``."""
    if shape(a) != shape(b):
        raise ValueError("shape mismatch")
    return [[op_05(x, y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]''',
    ),
    (
        "parsing quantities and sums",
        "Reads human-written numbers ('1.5k', '2M') and evaluates sums such as '1 + 2 + 3'.",
        "evaluate_sum",
        '''import re

_TOKEN = re.compile(r"\\s*(?:(?P<number>\\d+(?:\\.\\d+)?[kKmM]?)|(?P<op>[+]))")
_SUFFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6}


def parse_quantity(text: str) -> float:
    """'1.5k' -> 1500.0, '2M' -> 2000000.0, '42' -> 42.0."""
    text = text.strip()
    suffix = text[-1] if text and text[-1] in "kKmM" else ""
    number = text[: len(text) - len(suffix)]
    try:
        return float(number) * _SUFFIXES[suffix]
    except ValueError:
        raise ValueError(f"not a quantity: {text!r}") from None


def tokenize(expression: str) -> list[str]:
    """Split '1 + 2.5k' into ['1', '+', '2.5k']; anything else is a syntax error."""
    tokens: list[str] = []
    position = 0
    expression = expression.rstrip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise SyntaxError(f"unexpected input at column {position}: {expression[position:]!r}")
        tokens.append(match.group("number") or match.group("op"))
        position = match.end()
    return tokens


def evaluate_sum(expression: str) -> float:
    """Evaluate 'a + b + c' left to right with ``op_06``."""
    tokens = tokenize(expression)
    if not tokens or len(tokens) % 2 == 0:
        raise SyntaxError("expected operands separated by '+'")
    total = parse_quantity(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        if op != "+":
            raise SyntaxError(f"unsupported operator {op!r}")
        total = op_06(total, parse_quantity(operand))
    return total''',
    ),
    (
        "time series",
        "Moving averages, differences and running totals over evenly spaced samples.",
        "cumulative",
        '''def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over ``window`` samples; the first window-1 positions are skipped."""
    if window <= 0:
        raise ValueError("window must be positive")
    out: list[float] = []
    running = math.fsum(values[:window])
    if len(values) >= window:
        out.append(running / window)
    for index in range(window, len(values)):
        running += values[index] - values[index - window]
        out.append(running / window)
    return out


def differences(values: Sequence[float]) -> list[float]:
    """First differences: x[i] - x[i-1]."""
    return [b - a for a, b in zip(values, values[1:])]


def cumulative(values: Sequence[float]) -> list[float]:
    """Running totals combined with ``op_07``."""
    out: list[float] = []
    total = 0.0
    for value in values:
        total = op_07(total, value)
        out.append(total)
    return out


def resample(values: Sequence[float], factor: int) -> list[float]:
    """Downsample by averaging consecutive groups of ``factor`` samples (tail dropped)."""
    if factor <= 0:
        raise ValueError("factor must be positive")
    usable = len(values) - len(values) % factor
    return [
        math.fsum(values[i : i + factor]) / factor for i in range(0, usable, factor)
    ]''',
    ),
]

TEST_CORE = '''"""Tests of the calc helpers (everything except the op_* combinators)."""

import pytest

from calc.module_00 import clamp, gcd, is_close, lcm, lcm_all, round_to, safe_divide
from calc.module_01 import dot, norm, normalize
from calc.module_02 import mean, median, percentile, stdev, variance
from calc.module_03 import Money
from calc.module_04 import celsius_to_fahrenheit, convert
from calc.module_05 import identity, matmul, trace, transpose
from calc.module_06 import parse_quantity, tokenize
from calc.module_07 import differences, moving_average, resample


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    with pytest.raises(ValueError):
        clamp(1, 2, 0)


def test_round_to():
    assert round_to(2.5, 0) == 3.0
    assert round_to(-2.5, 0) == -3.0
    assert round_to(1.23456789, 3) == 1.235


def test_gcd_and_lcm():
    assert gcd(12, 18) == 6
    assert gcd(-4, 6) == 2
    assert lcm(4, 6) == 12
    assert lcm(0, 5) == 0
    assert lcm_all([2, 3, 4]) == 12


def test_safe_divide():
    assert safe_divide(1, 0, default=-1) == -1
    assert is_close(safe_divide(1, 3), 1 / 3)


def test_vectors():
    assert dot((1, 2, 3), (4, 5, 6)) == 32
    assert norm((3, 4)) == 5
    assert is_close(norm(normalize((3, 4))), 1.0)
    with pytest.raises(ValueError):
        normalize((0, 0))


def test_statistics():
    sample = [2, 4, 4, 4, 5, 5, 7, 9]
    assert mean(sample) == 5
    assert median(sample) == 4.5
    assert variance(sample, sample=False) == 4
    assert stdev(sample, sample=False) == 2
    assert percentile(sample, 50) == 4.5


def test_money():
    assert Money.parse("12.34").cents == 1234
    assert str(Money(-5)) == "-0.05 EUR"
    parts = Money(100).split(3)
    assert [p.cents for p in parts] == [34, 33, 33]
    with pytest.raises(ValueError):
        Money.parse("1.234")


def test_units():
    assert is_close(convert(1, "km", "m"), 1000)
    assert is_close(convert(12, "in", "ft"), 1)
    assert celsius_to_fahrenheit(100) == 212
    with pytest.raises(ValueError):
        convert(1, "km", "kg")


def test_matrices():
    m = [[1.0, 2.0], [3.0, 4.0]]
    assert matmul(m, identity(2)) == m
    assert transpose(m) == [[1.0, 3.0], [2.0, 4.0]]
    assert trace(m) == 5


def test_parsing():
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity("2M") == 2_000_000
    assert tokenize("1 + 2.5k") == ["1", "+", "2.5k"]
    with pytest.raises(SyntaxError):
        tokenize("1 * 2")


def test_time_series():
    assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
    assert differences([1, 4, 9]) == [3, 5]
    assert resample([1, 3, 5, 7, 9], 2) == [2, 6]
'''

TEST_OPS_HEADER = '''"""Every op_* combinator must return the sum of its two operands.

The vectors, money, matrix, parsing and time-series helpers all build on these combinators, so
a wrong combinator shows up here first, with the smallest possible reproduction.
"""

@@IMPORTS@@
'''

TEST_OPS_CASE = """

def test_op_@@NN@@():
    assert op_@@NN@@(2, 3) == 5
    assert op_@@NN@@(-4, 4) == 0
    assert op_@@NN@@(0.5, 0.25) == 0.75
"""
