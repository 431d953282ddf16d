"""A judge by its spec: an OpenAI-compatible chat API, or a model run here.

``openai/MODEL`` is a chat API whose verdict is written and parsed (:mod:`.judge`); any other model
spec is loaded here, and where its engine can score continuations (transformers, llama.cpp) the
verdict is read from the labels' probabilities (:mod:`.local_judge`).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from userturn.errors import ConfigError
from userturn.labels.judge import (
    OPENAI_HOST,
    BackendChatClient,
    Judge,
    OpenAIChatClient,
)
from userturn.settings import check_url

if TYPE_CHECKING:
    from userturn.labels.local_judge import JudgeCalibration


def judge_from_spec(spec: str, *, base_url: str | None = None, api_key: str | None = None,
                    sleep: Callable[[float], None] | None = None,
                    concurrency: int = 8,
                    calibration: JudgeCalibration | None = None) -> Judge:
    """A judge from a spec: ``openai/MODEL`` is an OpenAI-compatible chat API (the paper used
    gpt-5.4-mini); any other model spec (``smollm2``, a local folder) is a local model.
    ``sleep`` is how the API client waits between retries (a test passes one that records);
    ``concurrency``: an API judge's requests in flight at most (a local model takes one case at
    a time, whatever is asked); ``calibration``: a local judge's, fit for it."""
    provider, _, model = spec.strip().partition("/")
    if provider != "openai":
        return local_judge(spec, calibration)
    if calibration is not None:
        raise ConfigError(f"judge {spec} writes its verdict: a calibration applies to a judge "
                          "run here and read from its label probabilities")
    if not model.strip() or any(c.isspace() for c in model):
        raise ConfigError(f"unknown judge {spec!r}: expected openai/MODEL, "
                          "for example openai/gpt-5.4-mini")
    # The address is checked here, before any request: a typo in --base-url or in
    # OPENAI_BASE_URL is one line, not a request retried until it gives up.
    base_url = check_url(base_url) if base_url else check_url(
        os.environ.get("OPENAI_BASE_URL") or None, "OPENAI_BASE_URL")
    client = OpenAIChatClient(model, base_url=base_url, api_key=api_key, sleep=sleep)
    if urllib.parse.urlparse(client.base_url).hostname == OPENAI_HOST and not client.has_key:
        raise ConfigError(f"judge {spec} calls the OpenAI API: set OPENAI_API_KEY "
                          "(or give --judge-base-url for a local OpenAI-compatible server)")
    return Judge(client, concurrency=concurrency)


def expected_judge_name(spec: str, calibration: Path | None = None) -> str:
    """The source name the judge of ``spec`` stores its labels under, without building it (a
    local judge's model is not loaded): an API judge writes its verdict under rubric
    ``RUBRIC_VERSION``; a local model is read from label probabilities (``...-labels``), with
    its calibration's tag. A guess for a local engine that cannot score labels: the caller
    builds the judge wherever the name finds nothing stored."""
    from userturn.labels.judge import RUBRIC_VERSION
    from userturn.labels.local_judge import LABEL_RUBRIC_VERSION, JudgeCalibration

    provider, _, model = spec.strip().partition("/")
    if provider == "openai":
        return f"judge:openai/{model}@rubric{RUBRIC_VERSION}"
    tag = f"+cal:{JudgeCalibration.load(calibration).tag}" if calibration is not None else ""
    return f"judge:{spec.strip()}@rubric{LABEL_RUBRIC_VERSION}{tag}"


def local_judge(spec: str, calibration: JudgeCalibration | None = None) -> Judge:
    from userturn.backends import load_backend
    from userturn.backends.options import OptionScorer
    from userturn.errors import ModelError
    from userturn.labels.local_judge import LabelProbabilityJudge

    try:
        backend = load_backend(spec, batch_size=1)
    except ModelError as exc:
        raise ConfigError(f"unknown judge {spec!r}: expected openai/MODEL (for example "
                          f"openai/gpt-5.4-mini) or a local model ({exc})") from None
    if isinstance(backend, OptionScorer):
        # A model we run ourselves: the verdict is read from the labels' probabilities (one
        # forward pass, a calibrated distribution, nothing to parse).
        return LabelProbabilityJudge(backend, calibration=calibration)
    if calibration is not None:
        raise ConfigError(f"judge {spec}: its engine gives no label probabilities, so a "
                          "calibration cannot apply")
    # One local model, one stream: threads would only contend for the same cores.
    return Judge(BackendChatClient(backend), concurrency=1)
