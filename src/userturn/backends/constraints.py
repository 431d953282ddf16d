"""Constrained decoding for local judges: the verdict's JSON schema as the engines take it.

A judge on an open model sometimes answers out of format; the strict parser then counts the
verdict invalid. vLLM and llama.cpp can constrain decoding to a JSON schema, so a local judge on
either always writes a parseable verdict (the parser still checks it):

- vLLM: ``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))``; vLLM before
  the structured-outputs API (removed ``guided_*`` fields in 0.12) takes
  ``guided_decoding=GuidedDecodingParams(json=schema)``.
- llama.cpp (llama-cpp-python): ``Llama.generate(..., grammar=LlamaGrammar.from_json_schema(
  schema_text))``, a GBNF grammar compiled from the schema.

A :class:`~userturn.records.Request` carries the schema as JSON text in ``constraint``; backends
without constrained decoding ignore it (transformers), and OpenAI-compatible servers get the
schema as ``response_format`` from the judge's chat client instead.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


def vllm_structured(constraint: str | None, sampling_params: Any) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` that constrain decoding to the schema
    ``constraint`` (JSON text); ``sampling_params`` is the ``vllm.sampling_params`` module."""
    if constraint is None:
        return {}
    schema = json.loads(constraint)
    if hasattr(sampling_params, "StructuredOutputsParams"):
        return {"structured_outputs": sampling_params.StructuredOutputsParams(json=schema)}
    return {"guided_decoding": sampling_params.GuidedDecodingParams(json=schema)}


@lru_cache(maxsize=8)
def _grammar(constraint: str, module: Any) -> Any:
    return module.LlamaGrammar.from_json_schema(constraint, verbose=False)


def llama_grammar(constraint: str | None, llama_cpp: Any) -> dict[str, Any]:
    """Keyword arguments for ``Llama.generate`` (a compiled grammar, cached per schema);
    ``llama_cpp`` is the ``llama_cpp`` module."""
    if constraint is None:
        return {}
    return {"grammar": _grammar(constraint, llama_cpp)}
