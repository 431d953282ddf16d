"""User turns from GGUF models on CPU through llama-cpp-python (``llamacpp/FILE.gguf``).

The chat template is the one embedded in the GGUF (``tokenizer.chat_template`` metadata), with
the BOS/EOS token texts from the GGUF vocabulary. The prompt is our rendered text, tokenized once
with special tokens parsed and BOS exactly once (the rule of ``render.prompt_token_ids``), and
completed raw: llama.cpp's chat API would render the conversation a second time and open an
assistant turn.

Every end-of-generation token the vocabulary defines stops a turn (llama.cpp's EOG set: EOS, EOT,
EOM and the end tokens it recognises by name, such as Qwen's ``<|endoftext|>`` beside its EOS
``<|im_end|>``), unless the request goes on past the end (``Request.past_end``: only its stop
markers and budget end it, and the end tokens stay in ``raw_text``). Every control token is
stripped from the clean text, as the transformers backend strips the tokenizer's special tokens:
one model, one visible text, whichever backend.

Requests run one after another (llama-cpp-python keeps one sequence). Its KV cache keeps the
longest common prefix of consecutive prompts, so the n samples of one prompt evaluate it once.
Before each request the sampler is seeded with the request's seed, and only temperature and
top_p shape the distribution (llama.cpp's default top-k 40 and min-p 0.05 are switched off), so a
sample depends on its prompt, parameters and seed only, never on the other requests of a chunk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.backends.constraints import llama_grammar
from userturn.backends.models import ModelRef
from userturn.backends.turns import end_texts, finish_turn, specials_longest_first, split_stops
from userturn.chat.render import ChatTemplate
from userturn.errors import ModelError
from userturn.records import Generation, Request

DEFAULTS: dict[str, Any] = {"n_ctx": 4096, "verbose": False}


CONTROL = 1 << 3  # LLAMA_TOKEN_ATTR_CONTROL: a special token (special=True in transformers)


class LlamaCppBackend:
    constrained_decoding = True  # a judge's verdict schema becomes a grammar (constraints.py)

    def _grammar(self, constraint: str | None) -> dict[str, Any]:
        if constraint is None:
            return {}
        import llama_cpp

        return llama_grammar(constraint, llama_cpp)

    def __init__(self, ref: ModelRef, *, options: Mapping[str, Any] | None = None,
                 chunk_size: int = 8, llama: Any = None, lib: Any = None) -> None:
        """``llama``/``lib``: a loaded ``llama_cpp.Llama`` and the ``llama_cpp`` bindings module
        (tests pass stand-ins); by default the GGUF at ``ref.path`` is loaded."""
        if llama is None:
            try:
                import llama_cpp
                from llama_cpp import Llama
            except ImportError as exc:
                raise ModelError("llamacpp/ models need llama-cpp-python: pip install "
                                 "'userturn[llamacpp]' (a 7-minute source build on 2 cores)"
                                 ) from exc
            settings = {**DEFAULTS, "n_threads": os.cpu_count() or 1, **dict(options or {})}
            try:
                llama = Llama(model_path=ref.path, **settings)
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"llama.cpp cannot load {ref.path}: {exc}") from exc
            lib = llama_cpp
        self._lib = lib
        self.spec, self.revision, self.chunk_size = ref.spec, f"llamacpp:{ref.revision}", chunk_size
        self.llama = llama
        self.template = gguf_template(self.llama.metadata, self._token_text, ref.spec)
        self.n_ctx = self.llama.n_ctx()
        self._bos_id = self.llama.token_bos()
        self._adds_bos = bool(self.llama._model.add_bos_token()) and self._bos_id >= 0
        self._eos_ids, controls = vocabulary_ends_and_controls(self.llama._model, lib)
        self._special = specials_longest_first(self._token_text(i) for i in controls)
        self.end_texts = end_texts(self._eos_ids, self._token_text)

    def _token_text(self, token: int) -> str:
        return self.llama.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.llama.detokenize(list(tokens), special=True).decode("utf-8", errors="replace")

    def _encode(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _is_control(self, marker: str) -> bool:
        """A special token's text (``<|im_end|>``): it is one token only when parsed as special."""
        plain = self.llama.tokenize(marker.encode("utf-8"), add_bos=False, special=False)
        return plain != self._encode(marker)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a rendered prompt, special tokens parsed, BOS exactly once."""
        ids = self._encode(text)
        bos = self._token_text(self._bos_id) if self._bos_id >= 0 else ""
        if self._adds_bos and not (bos and text.startswith(bos)) and ids[:1] != [self._bos_id]:
            ids.insert(0, self._bos_id)
        return ids

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        return [self._one(r) for r in requests]

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """log P(option | prompt) of each option (a local judge's verdict: backends/options.py)."""
        from userturn.backends.options import OPTION_ROOM, LlamaCppOptions

        def check_fits(ids: Sequence[int]) -> None:
            if len(ids) + OPTION_ROOM > self.n_ctx:
                raise ValueError(f"the prompt fills the context ({self.n_ctx}); raise n_ctx in "
                                 "the llama.cpp options")

        if self._lib is None:
            raise ValueError("scoring options needs the llama_cpp bindings")
        try:
            return LlamaCppOptions(self.llama, self.prompt_ids, self._encode, self._lib,
                                   check_fits).score_options(prompt, options, whole=whole)
        except (ValueError, RuntimeError):
            self.llama.reset()  # a half-evaluated context must not be continued
            raise

    def _one(self, request: Request) -> Generation:
        ids = self.prompt_ids(request.prompt)
        params = request.params
        budget = min(params.max_tokens, self.n_ctx - len(ids))
        if budget <= 0:
            return Generation("", "", "error", len(ids), 0,
                              f"the prompt ({len(ids)} tokens) fills the context ({self.n_ctx}); "
                              "raise n_ctx in the llama.cpp options")
        # Past the end, no end-of-generation id stops the turn (llama.cpp's generate loop does
        # not stop by itself: this loop is what stops it).
        ends = [] if request.past_end else self._eos_ids
        stop_ids, stop_strings = split_stops(request.stop, self._encode, ends,
                                             [m for m in request.stop if self._is_control(m)])
        stop_set = set(stop_ids)
        window = 4 + max((len(self._encode(m)) for m in stop_strings), default=0)
        self.llama.set_seed(request.seed)
        tokens: list[int] = []
        try:
            for token in self.llama.generate(
                    ids, temp=max(params.temperature, 0.0), top_p=params.top_p, top_k=0,
                    min_p=0.0, typical_p=1.0, repeat_penalty=1.0, reset=True,
                    **self._grammar(request.constraint)):
                tokens.append(token)
                if token in stop_set or len(tokens) >= budget:
                    break
                if stop_strings:
                    tail = self._decode(tokens[-window:])
                    if any(m in tail for m in stop_strings):
                        break
        except (ValueError, RuntimeError) as exc:  # stored as data, retried on a re-run
            self.llama.reset()
            return Generation("", "", "error", len(ids), 0, f"{type(exc).__name__}: {exc}")
        return finish_turn(tokens, len(ids), request.stop, stop_set, self._decode, self._special)


def vocabulary_ends_and_controls(model: Any, lib: Any) -> tuple[list[int], list[int]]:
    """(every end-of-generation id, every control token id) of a llama.cpp vocabulary.

    ``model`` is llama-cpp-python's ``LlamaModel`` (``Llama._model``: ``vocab``, ``n_vocab()``,
    ``token_get_attr()``, ``token_eos()``, ``token_eot()``); ``lib`` the ``llama_cpp`` bindings,
    whose ``llama_vocab_is_eog(vocab, id)`` (``llama_token_is_eog(model, id)`` in releases before
    the vocab API) is llama.cpp's own EOG test."""
    is_eog = getattr(lib, "llama_vocab_is_eog", None)
    if is_eog is not None:
        def ends(token: int) -> bool:
            return bool(is_eog(model.vocab, token))
    else:
        old = lib.llama_token_is_eog

        def ends(token: int) -> bool:
            return bool(old(model.model, token))
    size = model.n_vocab()
    eog = {t for t in range(size) if ends(t)}
    eog |= {t for t in (model.token_eos(), model.token_eot()) if t is not None and 0 <= t < size}
    controls = [t for t in range(size) if model.token_get_attr(t) & CONTROL]
    return sorted(eog), controls


def gguf_template(metadata: Mapping[str, str], token_text: Any, spec: str) -> ChatTemplate:
    """The GGUF's own chat template, with its BOS and EOS token texts."""
    source = metadata.get("tokenizer.chat_template")
    if not source:
        raise ModelError(f"{spec}: the GGUF has no tokenizer.chat_template; userturn probes chat "
                         "models with their own template")

    def text(key: str) -> str | None:
        value = metadata.get(key)
        return token_text(int(value)) if value not in (None, "") and int(value) >= 0 else None

    return ChatTemplate(source, spec, text("tokenizer.ggml.bos_token_id"),
                        text("tokenizer.ggml.eos_token_id"))


def read_gguf_template(path: str | Path, spec: str) -> ChatTemplate:
    """The chat template of a GGUF file without llama.cpp (for ``userturn render``): read with
    the ``gguf`` package that the transformers extra installs."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ModelError("reading a GGUF's template needs the gguf package: pip install gguf") \
            from exc
    reader = GGUFReader(str(path))
    fields = reader.fields

    def scalar(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    tokens = fields.get("tokenizer.ggml.tokens")

    def token_text(index: int) -> str:
        return tokens.contents(index) if tokens is not None else ""

    metadata = {key: scalar(key) for key in ("tokenizer.chat_template",
                                             "tokenizer.ggml.bos_token_id",
                                             "tokenizer.ggml.eos_token_id")}
    return gguf_template({k: v for k, v in metadata.items() if v is not None}, token_text, spec)
