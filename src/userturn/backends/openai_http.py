"""JSON POSTs to an OpenAI-compatible server, on the standard library, with bounded retries.

Shared by the judge's chat client (``/chat/completions``) and the completions backend
(``/completions``). Retried: 408, 409, 429, 5xx, timeouts and dropped connections, after the
server's ``Retry-After`` when it gives one, else after an exponential backoff with jitter. The API
key (read by ``credentials``: given, else OPENAI_API_KEY) goes into the Authorization header and
nowhere else: every error message passes ``credentials.scrub``.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import math
import random
import time
import urllib.error
import urllib.request
from typing import Any, Callable, TypeVar

from userturn import credentials

T = TypeVar("T")


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


class OpenAIHTTP:
    """POSTs JSON bodies to ``{base_url}{path}``; ``parse`` turns a 200 body into the result (it
    raises ``APIError`` for a malformed one, which is not retried)."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout: float = 60.0,
                 max_attempts: int = 5, backoff: float = 1.0, max_backoff: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.base_url = base_url.rstrip("/")
        # private: the Authorization header only; None reads OPENAI_API_KEY
        self._api_key = credentials.api_key(given=api_key)
        self.timeout, self.max_attempts = timeout, max(1, max_attempts)
        self.backoff, self.max_backoff, self.sleep = backoff, max_backoff, sleep

    @property
    def has_key(self) -> bool:
        return bool(self._api_key)

    def __repr__(self) -> str:
        return f"OpenAIHTTP(base_url={self.base_url!r})"

    def post(self, path: str, body: dict[str, Any] | bytes, parse: Callable[[bytes], T]) -> T:
        """POST with retries; the final error says how many attempts were made."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self.post_once(path, data, parse)
            except APIError as exc:
                if not exc.retryable or attempt == self.max_attempts:
                    raise APIError(f"{exc} (attempt {attempt}/{self.max_attempts})", exc.retryable,
                                   status=exc.status, detail=exc.detail) from None
                self.sleep(self.delay(attempt, exc.retry_after))
        raise AssertionError("unreachable")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # the server knows best; bounded so a run cannot stall
            return min(max(retry_after, 0.0), self.max_backoff)
        exponential = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
        return exponential * random.uniform(0.5, 1.0)  # jitter: parallel workers spread out

    def post_once(self, path: str, data: bytes, parse: Callable[[bytes], T]) -> T:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except urllib.error.URLError as exc:  # refused, reset, DNS, or a connect timeout
            raise APIError(self.redact(f"connection failed: {exc.reason}"), True) from None
        except (TimeoutError, OSError, http.client.HTTPException, ValueError) as exc:
            # read timeouts, dropped connections (RemoteDisconnected, IncompleteRead)
            raise APIError(self.redact(f"{type(exc).__name__}: {exc}"), True) from None
        return parse(raw)

    def _http_error(self, exc: urllib.error.HTTPError) -> APIError:
        try:
            detail = exc.read().decode("utf-8", "replace")
        except Exception:  # the body is only a hint; the status decides
            detail = ""
        detail = self.redact(" ".join(self.redact(detail).split())[:300])
        retryable = exc.code in (408, 409, 429) or exc.code >= 500
        return APIError(f"HTTP {exc.code}: {detail}", retryable,
                        retry_after(exc.headers.get("Retry-After")), exc.code, detail)

    @staticmethod
    def redact(text: str) -> str:
        # Servers echo keys back ("Incorrect API key provided: sk-..."): never let one through.
        return credentials.scrub(text)


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
