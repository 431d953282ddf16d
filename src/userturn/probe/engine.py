"""How the models run: the engine's settings (batching, servers, tokenizer, engine arguments) and
where generations run (in this process, or on Ray actors). The probe's plan says what to
generate (:mod:`.plan`); this says how, and builds each model's :class:`BackendSpec`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Sequence

from pydantic import Field, field_validator

from userturn.backends import BackendSpec
from userturn.settings import Spec, url_setting

MAX_BATCH = 4096  # prompts in one backend batch at most


class EngineSpec(Spec):
    """The engine and executor settings of a run (the YAML keys and flags of the same names)."""

    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] | Literal["auto"] = Field(
        default="auto", description="prompts per backend batch; auto: on a GPU the largest "
        "batch that fits (halved on running out of memory, once per run), on the CPU 8")
    base_url: str | list[str] | None = Field(
        default=None, description="openai/MODEL models: the OpenAI-compatible server (its "
        "/v1/completions endpoint), or a list of servers of the same model")
    endpoint_concurrency: int = Field(default=8, ge=1, description="openai/MODEL models: "
                                      "requests in flight at most, per server")
    executor: Literal["local", "ray"] = Field(
        default="local", description="where generations run: in this process (local) or on Ray "
        "actors, each holding one backend (pip install 'userturn[ray]')")
    ray_address: str | None = Field(default=None, description="executor ray: the cluster "
                                    "(auto, or HOST:PORT); default: a local cluster")
    replicas: int = Field(default=1, ge=1, description="executor ray: actors per model")
    gpus_per_replica: float = Field(default=0.0, ge=0.0, description="executor ray: GPUs of "
                                    "each actor (vLLM: its tensor_parallel_size)")
    unit_size: int = Field(default=256, ge=1, description="executor ray: requests per work unit")
    unit_timeout: float = Field(default=1800.0, gt=0.0, description="executor ray: seconds a "
                                "unit may run before it is cancelled and requeued")
    unit_retries: int = Field(default=2, ge=0, description="executor ray: requeues of a failed "
                              "unit before its requests are stored as errors")
    max_restarts: int = Field(default=3, ge=0, description="executor ray: restarts of a dead "
                              "actor (Ray's max_restarts)")
    tokenizer: str | None = Field(default=None, description="openai/MODEL models: where the "
                                  "tokenizer and chat template come from (default: MODEL)")
    prompt_as: Literal["tokens", "text"] = Field(
        default="tokens", description="openai/MODEL models: send the rendered prompt as token "
        "ids (vLLM, SGLang, llama.cpp) or as text (transformers serve)")
    backend_args: dict[str, Any] = Field(
        default_factory=dict, description="engine arguments for vllm/ and llamacpp/ models, "
        "as they are (e.g. tensor_parallel_size, data_parallel_size, n_ctx, n_gpu_layers)")

    @field_validator("base_url")
    @classmethod
    def _base_urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        """One address, or several replicas' addresses, each checked (one in a list: as given
        alone)."""
        if isinstance(value, list):
            if not value or not all(value):
                raise ValueError("base_url takes one address or a list of addresses")
            checked = [url_setting(url) or url for url in value]
            return checked[0] if len(checked) == 1 else checked
        return url_setting(value)

    def backend_specs(self, models: Sequence[str]) -> list[BackendSpec]:
        """What each of ``models`` is built from (each once: a prober and an answerer share
        one)."""
        urls = self.base_url if isinstance(self.base_url, (str, type(None))) \
            else tuple(self.base_url)
        return [BackendSpec(spec, batch_size=self.batch_size, base_url=urls,
                            tokenizer=self.tokenizer, prompt_as=self.prompt_as,
                            backend_args=dict(self.backend_args),
                            endpoint_concurrency=self.endpoint_concurrency)
                for spec in dict.fromkeys(models)]
