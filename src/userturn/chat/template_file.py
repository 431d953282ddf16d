"""A chat template read from a file, without weights or a tokenizer download.

Two kinds of file: a Jinja template (``chat_template.jinja`` or any text file), whose special
tokens come from ``--bos``/``--eos``; or a ``tokenizer_config.json``, which carries the template,
its BOS/EOS tokens and the added tokens (so turn markers are cut at the tokenizer's own token
boundaries). Flags given override what the file says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from userturn.chat.render import ChatTemplate
from userturn.errors import TemplateError
from userturn.settings import parse_json


def load_template_file(path: str | Path, *, bos: str | None = None, eos: str | None = None,
                       name: str | None = None) -> ChatTemplate:
    """The chat template in ``path``; ``bos``/``eos`` fill in (or override) its special tokens."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TemplateError(f"template file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"cannot read the template file {path}: {exc}") from None
    model = name or str(path)
    if path.suffix.lower() != ".json":
        if not text.strip():
            raise TemplateError(f"the template file {path} is empty")
        return ChatTemplate(text, model, bos, eos)
    tokenizer = _json(path, text)  # a tokenizer_config.json
    source = _chat_template(tokenizer, path)
    added = tokenizer.get("added_tokens_decoder") or {}
    specials = tuple(sorted({token for t in added.values() if (token := _token_text(t))}))
    return ChatTemplate(source, model,
                        bos if bos is not None else _token_text(tokenizer.get("bos_token")),
                        eos if eos is not None else _token_text(tokenizer.get("eos_token")),
                        special_tokens=specials)


def _json(path: Path, text: str) -> dict[str, Any]:
    try:
        config = parse_json(text)  # bounded: a file nested too deep is one line
    except ValueError as exc:
        raise TemplateError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise TemplateError(f"{path} must hold a JSON object (a tokenizer_config.json)")
    return config


def _chat_template(tokenizer: dict[str, Any], path: Path) -> str:
    """The default template: a string, or the one named ``default`` in a list of named ones."""
    source = tokenizer.get("chat_template")
    if isinstance(source, list):
        named = {entry.get("name"): entry.get("template") for entry in source
                 if isinstance(entry, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        raise TemplateError(f"{path} has no chat_template (give the .jinja file instead, or the "
                            "tokenizer_config.json of a chat model)")
    return source


def _token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
