"""uvicorn's HTTP protocol, answering a request it cannot parse (a bad request line, a bad header, a broken chunked
body) with OpenAI's error object, as every other error of the server, instead of uvicorn's plain text."""

from __future__ import annotations

import json
from typing import Any


def error_body(message: str) -> bytes:
    """OpenAI's error object for a 400 that no route saw."""
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()


def protocol_class() -> type[Any]:
    """The class for uvicorn's ``http=``: the protocol uvicorn's ``"auto"`` picks (httptools' when it is installed,
    else h11's), with its answer to an unparseable request in JSON."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return _h11_protocol()
    return _httptools_protocol()


def _h11_protocol() -> type[Any]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorsH11Protocol(H11Protocol):  # type: ignore[misc]
        def send_400_response(self, msg: str) -> None:
            body = error_body(msg)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JsonErrorsH11Protocol


def _httptools_protocol() -> type[Any]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class JsonErrorsHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        def send_400_response(self, msg: str) -> None:
            body = error_body(msg)
            content = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                content += [name, b": ", value, b"\r\n"]
            content += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                        b"connection: close\r\n", b"\r\n", body]
            self.transport.write(b"".join(content))
            self.transport.close()

    return JsonErrorsHttpToolsProtocol
