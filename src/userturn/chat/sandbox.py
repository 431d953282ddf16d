"""The one Jinja environment every chat template renders in: the model's template, ``render
--template`` and a ``template:FILE`` user-turn variant alike.

It is transformers' own (its filters, globals and extensions, sandboxed as there, so a render
is what ``apply_chat_template(tokenize=False)`` gives), bounded by the render's budget
(:mod:`userturn.chat.budget`) at every place a template can make work or memory:

- every ``{% for %}`` iterates through :class:`~userturn.chat.budget.BudgetedIterable` (a step
  per item, whatever is iterated, and the body's text charged per item);
- the operators that can multiply (``*``, ``+``, ``%``, ``**``), every call (methods, macros,
  ``loop()``), every filter, ``~``, list and dict literals and each ``{{ }}`` output charge
  what they make;
- the few that can make a huge value in one go are sized before they run and refused there:
  ``'x' * 10**9``, ``[1] * 10**9``, ``'x'|center(10**9)``, ``'x'.ljust(10**9)``,
  ``'{:>1000000000}'.format('x')``, ``'%1000000000s' % 'x'``, ``s.replace('', big)``,
  ``sep.join(many)``, ``9 ** 9 ** 9``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping, Sequence

from jinja2 import Environment, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from userturn.chat.budget import (
    BudgetedIterable,
    afford,
    afford_digits,
    charge,
    digits,
    render_budget,
    size,
    spend,
)

Estimate = Callable[..., int]  # (value, the call's arguments) -> about how many characters
_NUMBER = re.compile(r"\d+")


def render_template(source: str, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool, **variables: Any) -> str:
    """``source`` rendered for ``messages`` as transformers' ``render_jinja_template`` does
    (``tools`` and ``documents`` None), on one render's budget."""
    with render_budget():  # filters folded at compile time are bounded too
        template = _compiled(source)
    with render_budget():
        return template.render(messages=[dict(m) for m in messages], tools=None,
                               documents=None, add_generation_prompt=add_generation_prompt,
                               **variables)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> Any:
    return environment().from_string(source)


class _BoundedGenerator(CodeGenerator):
    """Jinja's compiler, with ``~`` and list, tuple and dict literals charged: a literal of
    one value repeated ten times, nested nine deep, prints as a billion copies."""

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # Chat templates render without autoescape (as transformers', whose options these are):
        # the plain join of str() is what Jinja writes for ``~`` there.
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.made(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.made(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # a target (``{% for a, b in ... %}``) is no value
            super().visit_Tuple(node, frame)
            return
        self.write("environment.made(")
        super().visit_Tuple(node, frame)
        self.write(")")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with every way to make work or memory on the budget."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})
    code_generator_class = _BoundedGenerator

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("budgeted_loop"),
                                   [loop.iter, nodes.Const(_text_size(loop.body))], [],
                                   None, None, lineno=loop.lineno)
        return tree

    def budgeted_loop(self, iterable: Any, chars: int) -> BudgetedIterable:
        return BudgetedIterable(iterable, chars)

    def made(self, value: Any) -> Any:
        spend()
        return charge(value)

    def joined(self, values: Sequence[Any]) -> str:
        """``a ~ b``: (``Environment.concat`` is the join of a whole render's output)"""
        spend()
        afford(sum(size(value) for value in values))
        return charge("".join(map(str, values)))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        spend()
        afford(_binop_size(operator, left, right))
        return charge(super().call_binop(context, operator, left, right))

    def call(__self, __context: Context, __obj: Any, *args: Any,  # noqa: N805 (as Jinja's)
             **kwargs: Any) -> Any:
        spend()
        if isinstance(__obj, LoopContext) and args:  # ``loop(children)`` of a recursive loop
            args = (BudgetedIterable(args[0]), *args[1:])
        receiver = getattr(__obj, "__self__", None)
        estimate = STR_METHODS.get(getattr(__obj, "__name__", ""))
        if isinstance(receiver, str) and estimate is not None:
            if __obj.__name__ == "join" and args:
                args = (_listed(args[0]), *args[1:])
            afford(_estimated(estimate, receiver, args, kwargs))
        return charge(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text, by_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if by_map and args and isinstance(args[0], Mapping) else {}
            afford(_format_size(text, [*args, *kwargs.values(), *mapping.values()], "{"))
            return wrapped(*args, **kwargs)

        return bounded


def _output(value: Any) -> Any:
    """Each ``{{ }}`` output, charged before it is turned into text."""
    spend()
    return charge(value)


@functools.lru_cache(maxsize=1)
def environment() -> BoundedEnvironment:
    """transformers' chat-template environment (its options, filters, globals, tests and
    extensions: ``{% generation %}``, ``tojson``, ``raise_exception``, ``namespace``...), as a
    :class:`BoundedEnvironment` with every filter on the budget."""
    from transformers.utils import chat_template_utils

    # The environment transformers compiles every chat template in, read off an empty one.
    base: Environment = chat_template_utils._compile_jinja_template("").environment
    env = BoundedEnvironment(
        trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
        keep_trailing_newline=base.keep_trailing_newline,
        extensions=[type(extension) for extension in base.extensions.values()],
        finalize=_output)
    env.globals.update(base.globals)
    env.tests.update(base.tests)
    env.filters.update({name: _bounded_filter(name, f) for name, f in base.filters.items()})
    return env


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` on the budget: its value sized before it runs (``|string`` of a list that holds
    one string a million times), with ``FILTERS[name]``'s estimate where it can make more
    than its value, and its result charged."""
    estimate = FILTERS.get(name)
    # Jinja passes the context, eval context or environment first to a filter marked so.
    lead = 0 if getattr(f, "jinja_pass_arg", None) is None else 1

    @functools.wraps(f)  # keeps the mark
    def bounded(*args: Any, **kwargs: Any) -> Any:
        spend()
        if len(args) > lead:
            if name in ("join", "sum"):  # an iterator is counted as it is
                args = (*args[:lead], _listed(args[lead]), *args[lead + 1:])
            value = args[lead]
            afford(size(value) + (_estimated(estimate, value, args[lead + 1:], kwargs)
                                  if estimate is not None else 0))
        return charge(f(*args, **kwargs))

    return bounded


def _estimated(estimate: Estimate, value: Any, args: Sequence[Any],
               kwargs: Mapping[str, Any]) -> int:
    try:
        return estimate(value, *args, **kwargs)
    except (TypeError, ValueError, AttributeError):
        return 0  # arguments the operation itself refuses: it says so, in one line


def _listed(value: Any) -> Any:
    if isinstance(value, (str, list, tuple, Mapping)):
        return value
    try:
        return list(value)
    except TypeError:
        return value  # not iterable: the operation says so


def _text_size(body: Sequence[nodes.Node]) -> int:
    """The text a loop's body writes per item, at most: its template text and string
    constants (nested loops' included; they charge their own items too)."""
    found = [node for stmt in body for node in (stmt, *stmt.find_all(
        (nodes.TemplateData, nodes.Const)))]
    return sum(len(node.data) for node in found if isinstance(node, nodes.TemplateData)) + sum(
        len(node.value) for node in found
        if isinstance(node, nodes.Const) and isinstance(node.value, str))


def _binop_size(operator: str, left: Any, right: Any) -> int:
    """About the characters ``left operator right`` makes (an integer's digits are checked
    apart: a template has no use for a huge number, and making one takes minutes)."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*" and ints:
        afford_digits(digits(left) + digits(right))
    elif operator == "*":
        sequence, times = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(sequence, (str, list, tuple)) and isinstance(times, int):
            return size(sequence) * max(times, 0)
    elif operator == "**" and ints and right > 0 and abs(left) > 1:
        afford_digits(digits(left) * right)
    elif operator == "+" and not ints:
        return size(left) + size(right)
    elif operator == "%" and isinstance(left, str):
        values = list(right.values()) if isinstance(right, Mapping) else (
            list(right) if isinstance(right, tuple) else [right])
        return _format_size(left, values, "%")
    return 0


def _format_size(text: str, values: Sequence[Any], opener: str) -> int:
    """About the characters a format (``%`` for printf style, ``{`` for ``str.format``) makes:
    each field as wide as the widest width in it, or the largest value."""
    fields = text.count(opener)
    if not fields:
        return len(text)
    widths = [_number(found) for found in _NUMBER.findall(text)]
    nested = "*" in text if opener == "%" else re.search(r"\{[^}]*\{", text) is not None
    if nested:  # a width given as an argument: '%*s' % (n, s), '{:>{}}'.format(s, n)
        widths += [value for value in values if isinstance(value, int)]
    widest = max((size(value) for value in values), default=0)
    return len(text) + fields * (max(widths, default=0) + widest)


def _number(text: str) -> int:
    return int(text) if len(text) <= 9 else 10 ** 10  # longer: past every budget


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _replaced(s: Any, old: Any, new: Any, *_: Any) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    places = s.count(old) if old else len(s) + 1
    return len(s) + places * len(new)


def _joined(value: Any, sep: Any = "", *_: Any, **__: Any) -> int:
    items = value if isinstance(value, (list, tuple, str)) else list(value)
    return sum(size(item) for item in items) + len(str(sep)) * len(items)


def _translated(s: str, table: Any) -> int:
    widest = max((size(v) for v in table.values()), default=0) if isinstance(table, Mapping) \
        else 1
    return len(s) * (1 + widest)


def _json_indented(value: Any, ensure_ascii: bool = False, indent: Any = None,
                   *_: Any, **__: Any) -> int:
    width = _int(indent) if not isinstance(indent, str) else len(indent)
    return size(value) * (1 + 8 * width)  # a line per item, indented a few levels deep


# What the methods of a string make, at most, where it can be more than the string:
# (the string, the call's arguments) -> characters.
STR_METHODS: dict[str, Estimate] = {
    "center": lambda s, width, *_: _int(width),
    "ljust": lambda s, width, *_: _int(width),
    "rjust": lambda s, width, *_: _int(width),
    "zfill": lambda s, width: _int(width),
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * _int(tabsize),
    "replace": _replaced,
    "join": lambda sep, items: _joined(items, sep),
    "translate": _translated,
}

# The same for the filters that can make more than their value, with the filters' own
# parameter names (Jinja's, and transformers' ``tojson``).
FILTERS: dict[str, Estimate] = {
    "center": lambda value, width=80: _int(width),
    "indent": lambda s, width=4, *_, **__: (str(s).count("\n") + 1) * (
        len(width) if isinstance(width, str) else _int(width)),
    "wordwrap": lambda s, width=79, break_long_words=True, wrapstring=None, *_, **__: size(s) * (
        1 + len(wrapstring or "\n")),
    "replace": _replaced,
    "format": lambda value, *args, **kwargs: _format_size(
        str(value), list(kwargs.values()) or list(args), "%"),
    "join": _joined,
    "sum": lambda iterable, attribute=None, start=0: sum(size(item) for item in iterable)
    + size(start),
    "batch": lambda value, linecount, fill_with=None: 2 * _int(linecount),
    "slice": lambda value, slices, fill_with=None: 2 * _int(slices),
    "tojson": _json_indented,
}
