"""Server-sent events, the one writer every streaming route uses: each event one `data:` line of JSON (or a
sentinel such as OpenAI's `[DONE]`), sent as it is made, with the headers that keep proxies from buffering."""

from __future__ import annotations

import json
from typing import AsyncIterator

from fastapi.responses import StreamingResponse

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}   # nginx buffers a response without the latter


def event(data: dict | str) -> str:
    """One event: a dict as JSON (non-ASCII as it is), a string as it is."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)
