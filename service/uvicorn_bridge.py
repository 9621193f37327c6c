"""uvicorn's HTTP protocol, answering the requests it cannot parse in the service's JSON error shape.

uvicorn refuses a request it cannot parse (a negative or non-numeric Content-Length, a malformed
request line or header) before any ASGI app sees it, with a plain-text 400 written by the protocol's
`send_400_response` (uvicorn 0.54, the same method in its h11 and httptools protocols; no setting
changes it). Every other error of the service is JSON, `{"error": {"type", "message"}, "request_id"}`,
so this subclass of whichever protocol uvicorn's "auto" picks (httptools where installed, as in the
image; else h11) overrides that one method and nothing else. LitServe passes `http=` through to
uvicorn.Config (service/__main__.py).
"""

from __future__ import annotations

import json
import uuid

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class JsonErrorHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    def send_400_response(self, msg: str) -> None:
        rid = uuid.uuid4().hex   # no request was parsed, so none came with one
        body = json.dumps({"error": {"type": "invalid_http", "message": f"{msg} (malformed request line or "
                                     "headers, e.g. a Content-Length that is not a non-negative integer)"},
                           "request_id": rid}).encode()
        head = [b"HTTP/1.1 400 Bad Request"]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close",
                 b"x-request-id: " + rid.encode()]
        # Written whole and the connection closed, as uvicorn does: the parser's state no longer matters.
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()
