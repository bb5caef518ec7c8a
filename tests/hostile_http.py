"""A hostile llama-server on 127.0.0.1 for the serving clients' tests (issue 39): it answers ``/health`` and
``/completion`` from a raw socket, so it can do what no real server does — trickle its status line or its headers a
byte at a time, flood ``100 Continue``, redirect, announce or send 64 MiB of ``[],[],…``, or reply with figures no
request allows. ``HostileServer(mode, reply=…)`` runs in a thread of the test process; ``hits`` counts requests per
path (a redirect target that is never asked proves the redirect was not followed).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable

#: modes for /completion ("health-trickle" trickles /health instead)
MODES = ("reply", "trickle-headers", "continue-flood", "trickle-body", "redirect", "huge", "huge-announced",
         "strings", "short-body", "health-trickle")


def completion_reply(n: int, *, draft: bool, n_max: int = 15, **timings: Any) -> dict[str, Any]:
    """A reply as llama-server gives it for ``n`` generated tokens (greedy ids 7..11), with draft counts when
    ``draft``; ``timings`` override any figure."""
    t: dict[str, Any] = {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": 0.05 * max(n - 1, 0)}
    if draft:
        rounds = -(-(n - 1) // (n_max + 1))
        t.update(draft_n=rounds * n_max, draft_n_accepted=(n - 1) - rounds)
    t.update(timings)
    return {"content": "x", "tokens": [7 + (i % 5) for i in range(n)], "stop_type": "limit", "id_slot": 0, "timings": t}


class HostileServer:
    def __init__(self, mode: str = "reply", *, draft: bool = True,
                 reply: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
                 location: str | None = None) -> None:
        assert mode in MODES, mode
        self.mode, self.draft, self.reply, self.location = mode, draft, reply, location
        self.hits: dict[str, int] = {}
        self.first_completion_at: float | None = None  # time.monotonic() of the first /completion request
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()

    def __enter__(self) -> "HostileServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> tuple[str, dict[str, Any] | None]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return "", None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = next((int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length")),
                      0)
        while len(body) < length:
            body += conn.recv(65536)
        return path, (json.loads(body) if length else None)

    def _send(self, conn: socket.socket, status: str, body: bytes, extra: str = "") -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"{extra}Connection: close\r\n\r\n".encode() + body)

    def _trickle(self, conn: socket.socket, data: bytes, forever: bool = True) -> None:
        """A byte every 0.2 s (never ending with ``forever``): each read returns well inside a per-read timeout."""
        while not self.stopped.is_set():
            for b in data:
                conn.sendall(bytes([b]))
                time.sleep(0.2)
            if not forever:
                return

    def _handle(self, conn: socket.socket) -> None:
        try:
            path, request = self._read_request(conn)
            self.hits[path] = self.hits.get(path, 0) + 1
            if path == "/completion" and self.first_completion_at is None:
                self.first_completion_at = time.monotonic()
            if path == "/health":
                if self.mode == "health-trickle":
                    self._trickle(conn, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 10_000)
                else:
                    self._send(conn, "200 OK", b'{"status":"ok"}')
                return
            n = int(request["n_predict"]) if request else 8
            if self.mode == "trickle-headers":
                self._trickle(conn, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 10_000)
            elif self.mode == "continue-flood":
                while not self.stopped.is_set():
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    time.sleep(0.2)
            elif self.mode == "trickle-body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                self._trickle(conn, b"{" + b" " * 999_999)
            elif self.mode == "redirect":
                self._send(conn, "301 Moved Permanently", b"", f"Location: {self.location}\r\n")
            elif self.mode == "huge":  # just under the 16 MiB bound: refused for its containers, unparsed
                self._send(conn, "200 OK", b"[]," * ((15 << 20) // 3))
            elif self.mode == "huge-announced":  # over the bound: refused by its Content-Length, unread
                self._send(conn, "200 OK", b"[]," * ((64 << 20) // 3))
            elif self.mode == "short-body":  # announces more than it sends, then closes
                doc = json.dumps(completion_reply(n, draft=self.draft)).encode()
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(doc) + 500}\r\nConnection: close\r\n\r\n"
                             .encode() + doc)
            elif self.mode == "strings":  # 15 MiB of short strings: the most Python objects per byte JSON allows
                self._send(conn, "200 OK", ('"\u0100",' * ((15 << 20) // 9)).encode())
            else:
                doc = (self.reply(n) if callable(self.reply) else self.reply) if self.reply is not None else \
                    completion_reply(n, draft=self.draft)
                time.sleep(float(doc.get("timings", {}).get("predicted_ms", 0) or 0) / 1e3 if
                           isinstance(doc.get("timings", {}).get("predicted_ms"), (int, float)) and
                           doc["timings"]["predicted_ms"] < 5e3 else 0)
                self._send(conn, "200 OK", json.dumps(doc).encode())
        except (OSError, ValueError, KeyError, IndexError):
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass
