"""The probe prompt shown without a model to generate with: what ``userturn render`` prints.

A model spec brings its own chat template (read without the weights); a template file is read
as it is, with the BOS and EOS text the user gives. Either way the prompt is the one a run would
send under the chosen user-turn variant, after ``[system?, user, assistant]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from userturn.chat.render import ChatTemplate, Prompt
from userturn.errors import ConfigError
from userturn.probe.user_variants import UserVariant, parse_user_variant, variant_prompt
from userturn.records import Message


@dataclass(frozen=True)
class Preview:
    """A probe prompt and what it was rendered from."""

    source: str  # "model: smollm2" or "template file chat.jinja"
    variant: UserVariant
    prompt: Prompt


def preview_prompt(*, model: str | None, template_file: Path | None, query: str, answer: str,
                   system: str | None = None, variant: str = "native",
                   tokenizer: str | None = None, bos: str | None = None,
                   eos: str | None = None) -> Preview:
    """The prompt that opens a user turn after ``query`` and ``answer`` (and ``system``, if
    given), rendered by ``model``'s template or by ``template_file`` (exactly one of them).
    ``tokenizer`` serves only a model (``openai/MODEL``); ``bos`` and ``eos`` only a template
    file, since a model brings its own: either given to the other is refused before anything
    loads."""
    template: ChatTemplate
    if model is None:
        if template_file is None:
            raise ConfigError("render needs --model or --template")
        if tokenizer is not None:
            raise ConfigError("--tokenizer is for --model openai/MODEL, not --template")
        from userturn.chat.template_file import load_template_file

        template = load_template_file(template_file, bos=bos, eos=eos)
        source = f"template file {template_file}"
    else:
        from userturn.backends import load_template

        if bos is not None or eos is not None:
            raise ConfigError("--bos and --eos are for --template: a model brings its own")
        template = load_template(model, tokenizer)
        source = f"model: {model}"
    chosen = parse_user_variant(variant)
    messages: list[Message] = [*([{"role": "system", "content": system}] if system else []),
                {"role": "user", "content": query}, {"role": "assistant", "content": answer}]
    return Preview(source, chosen, variant_prompt(template, chosen, messages))
