"""JSON POSTs to an OpenAI-compatible server, on httpx, with bounded retries of what is transient.

Shared by the judge's chat client (``/chat/completions``) and the completions backend
(``/completions``). Retried: 408, 409, 429, 5xx, read timeouts and connections the server dropped,
after the server's ``Retry-After`` when it gives one, else after an exponential backoff with
jitter. Not retried: every other status, and a server that cannot be reached at all (refused, no
such host, no answer to the connect: a dead ``--base-url`` is one fast error, not minutes of
retries); after such a failure the same client sends nothing for ``UNREACHABLE_FOR`` seconds, so a
batch against a dead server fails at once instead of waiting out a connect timeout per request.

Why httpx and not the ``openai`` client: the official client retries refused connections (the
cost this module exists to avoid), sleeps where a test cannot inject a clock, insists on an API
key, and would put its own words on every error line; httpx gives the pooled, thread-safe
transport with separate connect and read timeouts, and the policy stays here, in a few lines.

The API key (read by ``credentials``: given, else OPENAI_API_KEY) goes into the Authorization
header and nowhere else: every error message passes ``credentials.scrub``.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import threading
import time
from typing import Any, Callable, TypeVar

import httpx

from userturn import credentials

T = TypeVar("T")
CONNECT_TIMEOUT = 10.0  # seconds: a server that has not accepted by then is not coming
UNREACHABLE_FOR = 5.0  # seconds a connect failure keeps the next requests from being sent


class APIError(Exception):
    """A request failed. ``retryable``: the same request may succeed later. ``status``: the HTTP
    status when the server answered, else None. ``detail``: the server's error text (redacted)."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None,
                 status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.detail = detail


def backoff_wait(seconds: float) -> None:
    """How a client without a clock of its own waits between attempts (looked up when it waits:
    a test that drives the CLI replaces this one function, not ``time.sleep`` everywhere)."""
    time.sleep(seconds)


class OpenAIHTTP:
    """POSTs JSON bodies to ``{base_url}{path}``; ``parse`` turns a 200 body into the result (it
    raises ``APIError`` for a malformed one, which is not retried)."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout: float = 60.0,
                 max_attempts: int = 5, backoff: float = 1.0, max_backoff: float = 60.0,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        # private: the Authorization header only; None reads OPENAI_API_KEY
        self._api_key = credentials.api_key(given=api_key)
        self.timeout, self.max_attempts = timeout, max(1, max_attempts)
        self.backoff, self.max_backoff = backoff, max_backoff
        self.sleep = sleep if sleep is not None else backoff_wait
        # One pooled client for every thread (httpx's Client is thread-safe); the callers' own
        # thread pools bound the requests in flight, so the pool does not.
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self._down: tuple[float, APIError] | None = None  # when the server was last unreachable
        self._lock = threading.Lock()

    @property
    def has_key(self) -> bool:
        return bool(self._api_key)

    def __repr__(self) -> str:
        return f"OpenAIHTTP(base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict[str, Any] | bytes, parse: Callable[[bytes], T]) -> T:
        """POST with retries; the final error says how many attempts were made."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self.post_once(path, data, parse)
            except APIError as exc:
                if not exc.retryable or attempt == self.max_attempts:
                    raise self._final(exc, attempt) from None
                self.sleep(self.delay(attempt, exc.retry_after))
        raise AssertionError("unreachable")

    def reach(self) -> set[str]:
        """Raise the ``connection failed`` error ``post`` would, if nothing answers at the
        address (any HTTP answer, even 404, is a server): a check that costs no completion and
        can run before a tokenizer loads. Returns what the server says its models are owned by
        (``GET /models``: ``vllm``, ``sglang``, ``llamacpp``: the servers name themselves
        there), empty where it says nothing readable."""
        self._refuse_while_down()
        try:
            response = self._client.get(f"{self.base_url}/models",
                                        headers={"Accept": "application/json"})
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol,
                httpx.ProxyError) as exc:
            raise self._final(self._unreachable(exc), 1) from None
        except httpx.HTTPError:
            return set()  # it accepted the connection: whatever went wrong next, post will say
        return _owners(response)

    def _final(self, exc: APIError, attempt: int) -> APIError:
        return APIError(f"{exc} (attempt {attempt}/{self.max_attempts})", exc.retryable,
                        status=exc.status, detail=exc.detail)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # the server knows best; bounded so a run cannot stall
            return min(max(retry_after, 0.0), self.max_backoff)
        exponential = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
        return exponential * random.uniform(0.5, 1.0)  # jitter: parallel workers spread out

    def post_once(self, path: str, data: bytes, parse: Callable[[bytes], T]) -> T:
        self._refuse_while_down()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = self._client.post(f"{self.base_url}{path}", content=data, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol,
                httpx.ProxyError) as exc:  # refused, no such host, no answer: not transient
            raise self._unreachable(exc) from None
        except httpx.TimeoutException:  # the server took the request and went quiet
            raise APIError("TimeoutError: timed out", True) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            # the server dropped the connection (restarting, overloaded): worth another try
            raise APIError(self.redact(f"{type(exc).__name__}: {exc}"), True) from None
        except httpx.HTTPError as exc:  # a local protocol or decoding fault: trying again won't help
            raise APIError(self.redact(f"{type(exc).__name__}: {exc}"), False) from None
        if response.status_code != 200:
            raise self._http_error(response)
        return parse(response.content)

    def _refuse_while_down(self) -> None:
        with self._lock:
            down = self._down
        if down is not None and time.monotonic() - down[0] < UNREACHABLE_FOR:
            raise APIError(str(down[1]), False)

    def _unreachable(self, exc: httpx.HTTPError) -> APIError:
        error = APIError(self.redact(f"connection failed: {exc or type(exc).__name__}"), False)
        with self._lock:
            self._down = (time.monotonic(), error)
        return error

    def _http_error(self, response: httpx.Response) -> APIError:
        detail = self.redact(" ".join(self.redact(response.text).split())[:300])
        code = response.status_code
        retryable = code in (408, 409, 429) or code >= 500
        return APIError(f"HTTP {code}: {detail}", retryable,
                        retry_after(response.headers.get("Retry-After")), code, detail)

    @staticmethod
    def redact(text: str) -> str:
        # Servers echo keys back ("Incorrect API key provided: sk-..."): never let one through.
        return credentials.scrub(text)


def _owners(response: httpx.Response) -> set[str]:
    if response.status_code != 200:
        return set()
    try:
        models = json.loads(response.content).get("data")
    except (ValueError, AttributeError):  # not JSON, or not an object
        return set()
    if not isinstance(models, list):
        return set()
    return {m["owned_by"] for m in models
            if isinstance(m, dict) and isinstance(m.get("owned_by"), str)}


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date. Anything else (``nan``,
    ``inf``, words) is None: the normal backoff, as if the server had given no header."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())
