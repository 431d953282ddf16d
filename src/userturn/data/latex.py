"""LaTeX read as text: balanced brace groups, and short expressions translated to sympy syntax.

Only short expressions (up to 80 characters) built from numbers, single-letter variables,
+ - * / ^, ``\\frac``, ``\\sqrt``, ``\\pi``, ``\\infty``, ``\\cdot``, ``\\times`` and a few
functions are translated; exponents must be small and not nested, so sympy is never handed a power
tower or a huge number. Standard library only: sympy itself runs in
:mod:`userturn.data.math_answers`.
"""

from __future__ import annotations

import re

SYMPY_MAX_CHARS = 80


def braced(text: str, start: int) -> str | None:
    """The text up to the brace closing the group opened before ``start``; None if never closed."""
    depth = 1
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2  # an escaped brace \{ \} does not count
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
        index += 1
    return None


_FUNCTIONS = {"sin": "sin", "cos": "cos", "tan": "tan", "ln": "log", "log": "log", "exp": "exp"}
_SYMBOLS = {"pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "div": "/"}


def latex_to_sympy(text: str) -> str | None:
    """A sympy-parsable string for a short normalized LaTeX expression, or None if unsupported."""
    if len(text) > SYMPY_MAX_CHARS:
        return None
    try:
        converted = _convert(text)
    except _Unsupported:
        return None
    if re.search(r"(?<!\d)\.(?!\d)", converted) or re.search(r"\d{16,}", converted):
        return None
    return converted


class _Unsupported(Exception):
    pass


def _convert(text: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            match = re.match(r"\\([a-zA-Z]+)", text[index:])
            if match is None:
                raise _Unsupported(text)
            name = match.group(1)
            index += len(match.group(0))
            if name == "frac":
                numerator, index = _group(text, index)
                denominator, index = _group(text, index)
                out.append(f"(({_convert(numerator)})/({_convert(denominator)}))")
            elif name == "sqrt":
                root = None
                if text.startswith("[", index):
                    end = text.find("]", index)
                    if end < 0:
                        raise _Unsupported(text)
                    root, index = _convert(text[index + 1:end]), end + 1
                argument, index = _group(text, index)
                inner = _convert(argument)
                out.append(f" sqrt({inner}) " if root is None else f"(({inner})**(1/({root})))")
            elif name in _FUNCTIONS:
                out.append(f" {_FUNCTIONS[name]} ")
            elif name in _SYMBOLS:
                out.append(_SYMBOLS[name])
            else:
                raise _Unsupported(name)
        elif char == "{":
            content, index = _group(text, index)
            out.append(f"({_convert(content)})")
        elif char == "^":
            exponent, index = _group(text, index + 1)
            converted = _convert(exponent)
            numbers = [int(n) for n in re.findall(r"\d+", converted)]
            if "**" in converted or any(n > 1000 for n in numbers) or len(converted) > 12:
                raise _Unsupported(exponent)  # no towers, no huge powers
            out.append(f"**({converted})")
        elif char in "0123456789+-*/().":
            out.append(char)
            index += 1
        elif char.isascii() and char.isalpha():
            out.append(f" {char} ")
            index += 1
        else:
            raise _Unsupported(char)
    return "".join(out)


def _group(text: str, index: int) -> tuple[str, int]:
    """A ``{...}`` group or a single character at ``index``; returns it and the index after it."""
    if index >= len(text):
        raise _Unsupported(text)
    if text[index] == "{":
        content = braced(text, index + 1)
        if content is None:
            raise _Unsupported(text)
        return content, index + len(content) + 2
    if text[index] == "\\":
        match = re.match(r"\\[a-zA-Z]+", text[index:])
        if match is None:
            raise _Unsupported(text)
        return match.group(0), index + len(match.group(0))
    return text[index], index + 1


__all__ = ["SYMPY_MAX_CHARS", "braced", "latex_to_sympy"]
