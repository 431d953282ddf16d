"""Constrained verdict decoding for local judges: the requests vLLM and llama.cpp get (neither
engine is installed in CI, so their documented parameter objects are stood in for by recorders),
and the judge handing its schema only to backends that can constrain decoding."""

from __future__ import annotations

import json
import types

from userturn.backends.constraints import llama_grammar, vllm_structured
from userturn.backends.fake import ScriptedBackend
from userturn.labels.judge import VERDICT_SCHEMA, BackendChatClient, Judge
from userturn.records import Case


class Recorder:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_vllm_gets_structured_outputs_or_the_older_guided_decoding():
    current = types.ModuleType("sampling_params")
    current.StructuredOutputsParams = Recorder
    current.GuidedDecodingParams = Recorder
    kwargs = vllm_structured(json.dumps(VERDICT_SCHEMA), current)
    assert list(kwargs) == ["structured_outputs"]
    assert kwargs["structured_outputs"].kwargs == {"json": VERDICT_SCHEMA}
    older = types.ModuleType("sampling_params")  # before vLLM 0.12's structured outputs
    older.GuidedDecodingParams = Recorder
    kwargs = vllm_structured(json.dumps(VERDICT_SCHEMA), older)
    assert list(kwargs) == ["guided_decoding"]
    assert kwargs["guided_decoding"].kwargs == {"json": VERDICT_SCHEMA}
    assert vllm_structured(None, current) == {}


def test_llama_cpp_gets_a_grammar_compiled_once_per_schema():
    compiled = []

    class LlamaGrammar:
        @classmethod
        def from_json_schema(cls, text, verbose=True):
            compiled.append((text, verbose))
            return ("grammar", text)

    module = types.ModuleType("llama_cpp")
    module.LlamaGrammar = LlamaGrammar
    schema = json.dumps(VERDICT_SCHEMA)
    first, second = llama_grammar(schema, module), llama_grammar(schema, module)
    assert first == second == {"grammar": ("grammar", schema)}
    assert compiled == [(schema, False)]
    assert llama_grammar(None, module) == {}


def _backend(constrained: bool) -> ScriptedBackend:
    backend = ScriptedBackend(lambda request: '{"label": "generic", "rationale": "ok"}<|im_end|>')
    if constrained:
        backend.constrained_decoding = True  # type: ignore[attr-defined]
    return backend


def test_the_judge_sends_its_schema_to_constrained_backends_only():
    case = Case("What is 2+2?", "4", "Thanks!")
    for constrained in (True, False):
        backend = _backend(constrained)
        (label,) = Judge(BackendChatClient(backend), concurrency=1).classify_many([case])
        assert label.label == "generic"
        (request,) = backend.requests
        if not constrained:
            assert request.constraint is None
            continue
        # The verdict schema, with the rationale bounded inside the token budget (a grammar
        # would otherwise let a long rationale run into the budget and be cut mid-string).
        sent = json.loads(request.constraint)
        assert sent["required"] == VERDICT_SCHEMA["required"]
        assert sent["properties"]["label"] == VERDICT_SCHEMA["properties"]["label"]
        bound = sent["properties"]["rationale"]["maxLength"]
        assert 40 <= bound <= 3 * request.params.max_tokens // 2
