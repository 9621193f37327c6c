"""Python client for the transerve HTTP API: `Client` (blocking) and `AsyncClient` (asyncio).

    from service.client import Client
    with Client("http://127.0.0.1:8000") as c:
        r = c.translate("Das geht zu weit.", source_lang="de", target_lang="en")
        print(r.translations[0].text)

Needs only the `client` extra (httpx, pydantic): importing it loads neither onnxruntime nor litserve. Request building and response parsing live
in `BaseClient`, which does no I/O; the two clients only differ in how they send.

Exceptions:

    TranserveError
    ├── APIConnectionError          the server could not be reached (retried with backoff)
    │   └── APITimeoutError         ... or did not answer in time (not retried: it may have run)
    └── APIStatusError              an error status; .status_code, .request_id, .type, .limit, .body
        ├── BadRequestError         400, 422: the request is wrong (see .message)
        ├── AuthenticationError     401, 403
        ├── PayloadTooLargeError    413: over a limit (.limit says which value)
        ├── OverloadedError         429, 503: queue full; .retry_after seconds (retried automatically)
        └── InternalServerError     500 and other 5xx, 504 (timed out in the queue)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Sequence, Union

import httpx

from .schemas import Language, TranslateResponse

__all__ = ["Client", "AsyncClient", "TranserveError", "APIConnectionError", "APITimeoutError", "APIStatusError",
           "BadRequestError", "AuthenticationError", "PayloadTooLargeError", "OverloadedError", "InternalServerError"]


class TranserveError(Exception):
    pass


class APIConnectionError(TranserveError):
    pass


class APITimeoutError(APIConnectionError):
    pass


class APIStatusError(TranserveError):
    def __init__(self, message: str, *, status_code: int, request_id: Optional[str], body: Any):
        super().__init__(f"{status_code}: {message}")
        self.message, self.status_code, self.request_id, self.body = message, status_code, request_id, body
        err = body.get("error") if isinstance(body, dict) else None
        self.type = err.get("type") if isinstance(err, dict) else None
        self.limit = err.get("limit") if isinstance(err, dict) else None


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PayloadTooLargeError(APIStatusError):
    pass


class OverloadedError(APIStatusError):
    @property
    def retry_after(self) -> float:
        return float(self.body.get("_retry_after", 1.0)) if isinstance(self.body, dict) else 1.0


class InternalServerError(APIStatusError):
    pass


_STATUS = {400: BadRequestError, 422: BadRequestError, 401: AuthenticationError, 403: AuthenticationError,
           413: PayloadTooLargeError, 429: OverloadedError, 503: OverloadedError}


class BaseClient:
    """Builds requests and parses responses; no I/O."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: Optional[str] = None,
                 timeout: float = 60.0, max_retries: int = 2):
        self.base_url = base_url.rstrip("/")
        self.api_key, self.timeout, self.max_retries = api_key, timeout, max_retries

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    @staticmethod
    def _translate_body(text: Union[str, Sequence[str]], source_lang: str, target_lang: str, options: dict) -> dict:
        body = {"text": text if isinstance(text, str) else list(text), "source_lang": source_lang,
                "target_lang": target_lang}
        body.update({k: v for k, v in options.items() if v is not None})
        return body

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        """The response itself when it succeeded; otherwise the matching APIStatusError."""
        if response.status_code < 400:
            return response
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"type": "http_error", "message": response.text[:200]}}
        err = body.get("error") if isinstance(body, dict) else None
        message = err.get("message") if isinstance(err, dict) else str(err or response.reason_phrase)
        if isinstance(body, dict) and "retry-after" in response.headers:
            body["_retry_after"] = response.headers["retry-after"]
        cls = _STATUS.get(response.status_code, InternalServerError if response.status_code >= 500 else APIStatusError)
        raise cls(message, status_code=response.status_code,
                  request_id=response.headers.get("x-request-id") or (body.get("request_id") if isinstance(body, dict) else None),
                  body=body)

    def _retry_delay(self, error: TranserveError, attempt: int) -> Optional[float]:
        """Seconds to wait before retrying, or None to give up. Overload: the server's Retry-After;
        connection errors: exponential backoff (0.5 s, 1 s, 2 s, ...)."""
        if attempt >= self.max_retries:
            return None
        if isinstance(error, OverloadedError):
            return min(error.retry_after, 10.0)
        if isinstance(error, APIConnectionError) and not isinstance(error, APITimeoutError):
            return 0.5 * 2 ** attempt
        return None


class Client(BaseClient):
    """Blocking client. Use as a context manager, or call close()."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.Client(base_url=self.base_url, timeout=self.timeout, headers=self._headers())

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return self._check(self._send(method, path, **kwargs))
            except TranserveError as e:
                delay = self._retry_delay(e, attempt)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt += 1

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{method} {path}: no answer within {self.timeout} s") from e
        except httpx.TransportError as e:
            raise APIConnectionError(f"{method} {path}: {e}") from e

    def translate(self, text: Union[str, Sequence[str]], *, source_lang: str, target_lang: str,
                  beam_size: Optional[int] = None, num_alternatives: Optional[int] = None,
                  length_penalty: Optional[float] = None, max_length: Optional[int] = None,
                  no_repeat_ngram_size: Optional[int] = None, repetition_penalty: Optional[float] = None
                  ) -> TranslateResponse:
        """Translates one text or a list; options left None take the server's defaults."""
        body = self._translate_body(text, source_lang, target_lang, dict(
            beam_size=beam_size, num_alternatives=num_alternatives, length_penalty=length_penalty,
            max_length=max_length, no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty))
        return TranslateResponse.model_validate(self._request("POST", "/translate", json=body).json())

    def languages(self) -> list[Language]:
        return [Language.model_validate(x) for x in self._request("GET", "/languages").json()]

    def info(self) -> dict:
        return self._request("GET", "/info").json()

    def health(self) -> bool:
        return self._request("GET", "/health").status_code == 200

    def ready(self) -> bool:
        try:
            return self._http.get("/ready").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(BaseClient):
    """asyncio client, the mirror of Client. Use `async with`, or await aclose()."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, headers=self._headers())

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return self._check(await self._send(method, path, **kwargs))
            except TranserveError as e:
                delay = self._retry_delay(e, attempt)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt += 1

    async def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{method} {path}: no answer within {self.timeout} s") from e
        except httpx.TransportError as e:
            raise APIConnectionError(f"{method} {path}: {e}") from e

    async def translate(self, text: Union[str, Sequence[str]], *, source_lang: str, target_lang: str,
                        beam_size: Optional[int] = None, num_alternatives: Optional[int] = None,
                        length_penalty: Optional[float] = None, max_length: Optional[int] = None,
                        no_repeat_ngram_size: Optional[int] = None, repetition_penalty: Optional[float] = None
                        ) -> TranslateResponse:
        body = self._translate_body(text, source_lang, target_lang, dict(
            beam_size=beam_size, num_alternatives=num_alternatives, length_penalty=length_penalty,
            max_length=max_length, no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty))
        return TranslateResponse.model_validate((await self._request("POST", "/translate", json=body)).json())

    async def languages(self) -> list[Language]:
        return [Language.model_validate(x) for x in (await self._request("GET", "/languages")).json()]

    async def info(self) -> dict:
        return (await self._request("GET", "/info")).json()

    async def health(self) -> bool:
        return (await self._request("GET", "/health")).status_code == 200

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/ready")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
