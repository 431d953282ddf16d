"""MATH answers: extraction, normalization, and equivalence without a judge.

Extraction takes the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else the text
after the last "The (final) answer is" / "Final answer:". Normalization rewrites the LaTeX forms
that mean the same answer into one string (see :func:`normalize_answer`). Two answers are
equivalent when, in this order:

  1. their normalized strings are equal ("exact");
  2. both are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``) with the same exact
     rational value ("numeric"): ``0.5`` == ``\\frac{1}{2}``, ``1,000`` == ``1000``;
  3. both are tuples or intervals with the same brackets, or unbracketed lists (compared as
     multisets: "all solutions" answers), whose elements are pairwise equivalent ("elementwise");
  4. sympy (imported lazily, when installed) parses both and their difference simplifies to 0, or
     to a number within 1e-12 ("sympy"). Only short expressions (up to 80 characters) built from
     numbers, single-letter variables, + - * / ^, \\frac, \\sqrt, \\pi, \\infty, \\cdot, \\times
     and a few functions are handed to sympy; exponents must be small and not nested. Every
     exception counts as "not equivalent", so a strange answer can fail but never crash a run.

Not handled (graded as different unless the normalized strings match): rounded decimals
(``0.333`` vs ``\\frac{1}{3}``), percent vs fraction (``50\\%`` vs ``\\frac{1}{2}``: the percent
sign is dropped, so ``50\\%`` == ``50``), mixed numbers (``2\\frac{1}{2}`` reads as a product),
equations other than ``x = value``, matrices and sets beyond string equality, inequalities
(``x > 2``) vs intervals, units other than a few common words, and answers a judge would accept
only by meaning (for example "no solution" vs "none").
"""

from __future__ import annotations

import functools
import importlib.util
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from userturn.data.latex import braced, latex_to_sympy

SYMPY_TOLERANCE = 1e-12

# --- extraction --------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_ANSWER_PHRASE = re.compile(
    r"(?:\bfinal\s+answer|\bthe\s+answer)\s*(?:is\b|:|=)[\s*:]*", re.IGNORECASE
)


def extract_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (nested braces allowed), or None."""
    found = None
    for match in _BOXED.finditer(text or ""):
        start = match.end()
        if text.startswith("{", start):
            content = braced(text, start + 1)
            if content is None:
                continue  # cut off before its closing brace
        else:  # "\boxed 5"
            token = re.match(r"[^\s$]+", text[start:])
            if token is None or not match.group(0).endswith(" "):
                continue
            content = token.group(0)
        found = content.strip()
    return found


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last ``\\boxed{}``, else "The answer is ..."."""
    if not text:
        return None
    boxed = extract_boxed(text)
    if boxed:
        return boxed
    matches = list(_ANSWER_PHRASE.finditer(text))
    for match in reversed(matches):
        answer = _answer_after(text[match.end():])
        if answer:
            return answer
    return None


def _answer_after(rest: str) -> str | None:
    rest = rest.lstrip()
    for opening, closing in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if rest.startswith(opening):
            end = rest.find(closing, len(opening))
            if end > 0:
                return rest[len(opening):end].strip() or None
    line = rest.split("\n", 1)[0]
    line = re.split(r"\.\s", line, maxsplit=1)[0]  # "5. I hope it is correct."
    line = line.strip().strip("*").strip().rstrip(".").strip()
    return line or None


# --- normalization -----------------------------------------------------------------------------

_UNIT_WORDS = (
    "square units", "units", "unit", "degrees", "degree", "cm", "centimeters", "meters", "km",
    "inches", "inch", "feet", "foot", "ft", "miles", "mph", "hours", "hour", "minutes",
    "minute", "seconds", "second", "days", "day", "dollars", "dollar", "cents", "cent", "pounds",
)
_TEXT_COMMANDS = r"\\(?:text|textbf|textit|mathrm|mathbf|mathit|mbox|operatorname)\s*"
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def normalize_answer(answer: str) -> str:
    """One canonical string for the LaTeX forms of the same answer.

    Strips math delimiters, an outer ``\\boxed{}``, ``\\left``/``\\right``, spacing commands
    (``\\!``, ``\\,``, ``\\;``, ``\\quad``), ``\\displaystyle``, degrees (``^\\circ``, ``°``),
    ``\\%``, ``\\$``, trailing units (``\\text{ cm}``, "inches"), ``\\text{}``-like wrappers, an
    ``x =`` or ``x \\in`` prefix, all whitespace and a trailing period; rewrites ``\\dfrac`` and
    ``\\tfrac`` to ``\\frac``, ``\\frac12`` to ``\\frac{1}{2}``, ``\\sqrt2`` to ``\\sqrt{2}``,
    ``1,000`` to ``1000``, ``.5`` to ``0.5`` and ``(C)`` to ``C``.
    """
    text = str(answer).strip()
    text = text.replace("\u2212", "-").replace("\u221e", "\\infty").replace("\u03c0", "\\pi")
    text = re.sub(r"\u221a\s*(\d+|[a-zA-Z])", r"\\sqrt{\1}", text)
    text = _strip_delimiters(text)
    text = _unwrap_command(text, r"\\(?:boxed|fbox)\s*")
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    text = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg)(?![a-zA-Z])", "", text)
    text = re.sub(r"\\(?:displaystyle|textstyle|qquad|quad)(?![a-zA-Z])", " ", text)
    # Spacing commands become spaces; a LaTeX line break (two backslashes, in matrices) is kept.
    text = re.sub(r"\\\\|\\[!,;: ]", lambda m: m.group(0) if m.group(0) == "\\\\" else " ", text)
    text = text.replace("~", " ")
    text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])|°", "", text)
    text = text.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    text = text.replace("{,}", ",")
    text = _drop_units(text)
    text = _unwrap_command(text, _TEXT_COMMANDS)
    text = _drop_variable(text)
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)(?=\{)", r"\\frac{\1}", text)
    text = re.sub(r"\\frac(\{[^{}]*\})(\d)", r"\\frac\1{\2}", text)
    text = re.sub(r"\\sqrt(\d+|[a-zA-Z])(?![a-zA-Z])", r"\\sqrt{\1}", text)
    text = text.rstrip(".")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    text = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", text)
    choice = re.fullmatch(r"\(([A-Z])\)", text)
    return choice.group(1) if choice else text


def _strip_delimiters(text: str) -> str:
    for opening, closing in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(opening) and text.endswith(closing) and len(text) > 2 * len(opening):
            return text[len(opening):-len(closing)].strip()
    return text


def _unwrap_command(text: str, command: str) -> str:
    """Replace every ``\\command{X}`` by ``X`` (innermost first, so nesting works)."""
    pattern = re.compile(command + r"\{")
    for _ in range(20):
        match = pattern.search(text)
        if match is None:
            break
        content = braced(text, match.end())
        if content is None:
            break
        text = text[:match.start()] + content + text[match.end() + len(content) + 1:]
    return text


def _drop_units(text: str) -> str:
    """Drop a trailing unit: ``\\text{ cm}``, ``\\mbox{inches}``, a unit word after a number."""
    wrapped = re.search(_TEXT_COMMANDS + r"\{\s*([a-zA-Z][a-zA-Z ]*)\}\s*(\^\{?\d\}?)?\s*$", text)
    if wrapped and re.search(r"\d", text[:wrapped.start()]):
        return text[:wrapped.start()].strip()
    words = "|".join(re.escape(word) for word in sorted(_UNIT_WORDS, key=len, reverse=True))
    bare = re.search(r"(?<=[\d}])\s+(?:" + words + r")(?:\^\{?\d\}?|\^2)?\s*$", text)
    if bare and re.search(r"\d", text[:bare.start()]):
        return text[:bare.start()].strip()
    return text


def _drop_variable(text: str) -> str:
    """``x = 5`` -> ``5``; ``x \\in [1, 2)`` -> ``[1, 2)`` (one short variable on the left)."""
    match = re.fullmatch(r"\s*[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?\s*(?:=|\\in(?![a-zA-Z]))(.+)",
                         text, flags=re.DOTALL)
    if match and "=" not in match.group(1):
        return match.group(1).strip()
    return text


# --- equivalence -------------------------------------------------------------------------------

def equivalence(candidate: str | None, reference: str | None) -> str | None:
    """How two answers were found equal ("exact", "numeric", "elementwise", "sympy"), or None."""
    if candidate is None or reference is None:
        return None
    a, b = normalize_answer(candidate), normalize_answer(reference)
    if not a or not b:
        return None
    return _equivalent(a, b)


def is_equivalent(candidate: str | None, reference: str | None) -> bool:
    """Whether two answers are the same (see :func:`equivalence`)."""
    return equivalence(candidate, reference) is not None


def _equivalent(a: str, b: str, depth: int = 0) -> str | None:
    if a == b:
        return "exact"
    fa, fb = as_fraction(a), as_fraction(b)
    if fa is not None and fb is not None:
        return "numeric" if fa == fb else None
    if depth == 0:
        parts_a, parts_b = _split_list(a), _split_list(b)
        if parts_a is not None or parts_b is not None:
            if parts_a is None or parts_b is None:
                return None
            return "elementwise" if _lists_equal(parts_a, parts_b) else None
    return "sympy" if _sympy_equal(a, b) else None


def as_fraction(text: str) -> Fraction | None:
    """The exact value of a normalized plain number: ``-3``, ``2.5``, ``7/2``, ``\\frac{-7}{2}``."""
    sign = 1
    if text.startswith("-"):
        sign, text = -1, text[1:]
    match = re.fullmatch(r"\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}|(-?[\d.]+)/(-?[\d.]+)", text)
    try:
        if match:
            numerator = _decimal(match.group(1) or match.group(3))
            denominator = _decimal(match.group(2) or match.group(4))
            if numerator is None or denominator is None or denominator == 0:
                return None
            return sign * Fraction(numerator) / Fraction(denominator)
        value = _decimal(text)
        return None if value is None else sign * Fraction(value)
    except (ValueError, ArithmeticError):
        return None


def _decimal(text: str) -> Decimal | None:
    if not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


_OPEN, _CLOSE = "([{", ")]}"


def _split_top(text: str) -> list[str] | None:
    """Split at the commas outside every bracket; None when brackets do not balance."""
    parts, depth, start = [], 0, 0
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    if depth != 0:
        return None
    parts.append(text[start:])
    return parts


def _split_list(text: str) -> tuple[str, list[str]] | None:
    """``(1,2]`` -> ("(]", ["1", "2"]); ``\\{1,2\\}`` -> ("{}", ...); ``1,2`` -> ("", ...).

    None for a single value.
    """
    if text.startswith("\\{") and text.endswith("\\}") and len(text) > 4:
        parts = _split_top(text[2:-2])
        if parts is not None and all(parts):
            return "{}", parts
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        inner = text[1:-1]
        parts = _split_top(inner)
        # The first bracket must close at the end: "(1)+(2)" is not a tuple.
        if parts is not None and _closes_at_end(text) and len(parts) >= 2:
            return text[0] + text[-1], parts
    parts = _split_top(text)
    if parts is not None and len(parts) >= 2 and all(parts):
        return "", parts
    return None


def _closes_at_end(text: str) -> bool:
    depth = 0
    for index, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0:
                return index == len(text) - 1
    return False


def _lists_equal(a: tuple[str, list[str]], b: tuple[str, list[str]]) -> bool:
    (brackets_a, parts_a), (brackets_b, parts_b) = a, b
    if brackets_a != brackets_b or len(parts_a) != len(parts_b):
        return False
    if brackets_a and brackets_a != "{}":  # tuples and intervals: in order
        return all(_equivalent(x, y, 1) for x, y in zip(parts_a, parts_b))
    remaining = list(parts_b)  # a set, or a bare list of solutions: in any order
    for part in parts_a:
        match = next((i for i, other in enumerate(remaining) if _equivalent(part, other, 1)), None)
        if match is None:
            return False
        remaining.pop(match)
    return True


# --- sympy ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _sympy_expression(text: str) -> Any:
    converted = latex_to_sympy(text)
    if converted is None or importlib.util.find_spec("sympy") is None:
        return None
    try:
        import sympy
        from sympy.parsing.sympy_parser import (
            convert_xor,
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )

        letters = set(re.findall(r"(?<![a-zA-Z])[a-zA-Z](?![a-zA-Z])", converted))
        symbols = {letter: sympy.Symbol(letter) for letter in letters}
        transformations = standard_transformations + (
            implicit_multiplication_application, convert_xor,
        )
        return parse_expr(converted, local_dict=symbols, transformations=transformations)
    except Exception:  # noqa: BLE001 - any parse failure means "cannot compare"
        return None


def _sympy_equal(a: str, b: str) -> bool:
    left, right = _sympy_expression(a), _sympy_expression(b)
    if left is None or right is None:
        return False
    try:
        import sympy

        difference = sympy.simplify(left - right)
        if difference == 0:
            return True
        if difference.free_symbols:
            return False
        value = complex(difference.evalf(30))
        scale = max(1.0, abs(complex(right.evalf(30))))
        return abs(value) <= SYMPY_TOLERANCE * scale
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input; none may end a run
        return False


__all__ = [
    "SYMPY_TOLERANCE", "as_fraction", "equivalence", "extract_answer", "extract_boxed",
    "is_equivalent", "normalize_answer",
]
