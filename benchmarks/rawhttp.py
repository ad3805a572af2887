"""A minimal asyncio HTTP/1.1 keep-alive client for the latency benchmark.

One request at a time per connection: write the request, read the status line and the
headers, then a Content-Length body. No chunked bodies, redirects or TLS (the service
never sends chunked answers to these requests). It costs a few tens of microseconds of CPU
per request, where httpx costs about a millisecond, so a benchmark that runs its simulated
workers on the same cores as the service measures the service rather than the client.
"""
from __future__ import annotations

import asyncio
import json
from typing import Optional


class HttpError(Exception):
    pass


def _errors() -> tuple:
    try:
        import httpx
        return (OSError, asyncio.IncompleteReadError, HttpError, httpx.HTTPError)
    except ImportError:
        return (OSError, asyncio.IncompleteReadError, HttpError)


class Conn:
    def __init__(self, host: str, port: int, token: str):
        self.host, self.port = host, port
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def request(self, method: str, path: str, body: Optional[dict] = None
                      ) -> tuple[int, bytes]:
        """(status, body bytes). Reconnects once if a kept-alive connection was closed."""
        data = b"" if body is None else json.dumps(body).encode()
        msg = (f"{method} {path} HTTP/1.1\r\n{self.head}"
               + (f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                  if body is not None else "") + "\r\n").encode() + data
        for attempt in (0, 1):
            if self.writer is None:
                await self._open()
            try:
                self.writer.write(msg)
                return await self._response()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                raise HttpError(f"unsupported transfer-encoding: {value.strip()}")
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, data


ERRORS = _errors()  # what a request may raise, with either client


class HttpxConn:
    """httpx behind the same interface as Conn (for comparison); imported on first use."""

    def __init__(self, url, token):
        import httpx
        self.client = httpx.AsyncClient(base_url=url, timeout=60,
                                        headers={"Authorization": f"Bearer {token}"})

    async def request(self, method, path, body=None):
        resp = await self.client.request(method, path, json=body)
        return resp.status_code, resp.content

    async def aclose(self):
        await self.client.aclose()


def connect(kind: str, url: str, token: str):
    """A raw Conn or an HttpxConn to `url` (http://host:port) with a bearer token."""
    if kind == "httpx":
        return HttpxConn(url, token)
    host, port = url.removeprefix("http://").split(":")
    return Conn(host, int(port), token)


async def close(conn) -> None:
    await conn.aclose() if isinstance(conn, HttpxConn) else conn.close()


def run_loop(coro):
    """asyncio.run, on uvloop when it is installed (cheaper clients)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
