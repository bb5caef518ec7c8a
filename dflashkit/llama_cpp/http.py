"""One HTTP exchange with a llama-server, bounded in time and bytes, redirects refused.

urllib's ``timeout`` bounds each socket operation, not the exchange: a server that trickles its status line,
its headers, a flood of ``100 Continue`` responses or its body a byte at a time keeps it waiting for ever (seen:
110 s under a 5 s ``--llama-cpp-timeout``). It also follows redirects — a POST turned into a GET without the
prompt, answered by another port or another host, reported under the first URL. `exchange` uses http.client
directly (no redirect handling, no proxy), sets every socket operation's timeout to what is left of one deadline,
and a watchdog shuts the socket down when the deadline passes, whatever http.client is reading then; a reply over
``max_bytes`` is refused unread. `parse_json_reply` parses a body under the container bound `read_json` applies to
files, so a 64 MiB reply of ``[],[],…`` is refused at its size, not after 2 GB of Python lists.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ..errors import DFlashError

#: objects + arrays one reply may hold: a completion reply has a few dozen (its settings, the token list)
MAX_REPLY_CONTAINERS = 10_000
#: status line and header bytes of one reply (1xx responses included)
MAX_HEADER_BYTES = 64 * 1024


class ExchangeTimeout(Exception):
    """The deadline passed before the reply was whole."""


class ExchangeFailed(Exception):
    """No HTTP exchange: refused, reset, not HTTP (the message says which)."""


@dataclass(frozen=True)
class Reply:
    status: int
    reason: str
    location: str | None  # a redirect's target, shown, never followed
    body: bytes
    elapsed_s: float  # from the connect to the last byte


def split_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an ``http://`` / ``https://`` URL, or a DFlashError naming it."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise DFlashError(f"{url}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DFlashError(f"{url}: give an http:// or https:// URL with a host (e.g. http://127.0.0.1:8080)")
    return parts.scheme, parts.hostname, port if port is not None else (443 if parts.scheme == "https" else 80)


def public_url(url: str | None) -> str | None:
    """``url`` without a ``user:password@`` part: llama-server takes no such credentials (they were never sent), and
    a report or record must not carry them."""
    if url is None:
        return None
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def same_server(a: str, b: str) -> bool:
    """Whether two URLs reach the same listening socket: the same port on addresses that resolve alike
    (``localhost`` and ``127.0.0.1`` are one server)."""
    _, host_a, port_a = split_url(a)
    _, host_b, port_b = split_url(b)
    if port_a != port_b:
        return False

    def addresses(host: str) -> set[str]:
        try:
            found = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except (OSError, UnicodeError, ValueError):  # a name no resolver takes: compared as written
            return {host}
        out = set()
        for a in found:
            try:
                ip = ipaddress.ip_address(a.split("%", 1)[0])
            except ValueError:
                out.add(a)
                continue
            mapped = getattr(ip, "ipv4_mapped", None)
            ip = mapped or ip
            # a server listening on every address (0.0.0.0, ::) is the one loopback reaches
            out.add("loopback" if ip.is_loopback or ip.is_unspecified else str(ip))
        return out

    return bool(addresses(host_a) & addresses(host_b))


class _Watchdog:
    """Shuts a connection's socket down at the deadline: a read blocked in http.client returns at once."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self.conn, self.fired = conn, False
        self.timer = threading.Timer(max(deadline - time.monotonic(), 0.0), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self.timer.cancel()


def _resolve(host: str, port: int, deadline: float) -> list[Any]:
    """getaddrinfo bounded by the deadline: a resolver that hangs is left to its daemon thread."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError, ValueError) as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(_left(deadline))
    if not box:
        raise ExchangeTimeout
    if isinstance(box[0], BaseException):
        raise OSError(f"cannot resolve {host} ({box[0]})")
    return box[0]


def _connect(address: tuple[str, int], deadline: float) -> socket.socket:
    """socket.create_connection with every address tried only in what is left of the deadline (create_connection
    gives each address the whole timeout: N addresses that do not answer took N timeouts)."""
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(address[0], address[1], deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    raise last or OSError(f"no address for {address[0]}")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ExchangeTimeout
    return left


def exchange(url: str, path: str, *, deadline: float, payload: dict[str, Any] | None = None,
             max_bytes: int) -> Reply:
    """``POST path`` with ``payload`` as JSON (``GET`` without), the whole exchange before ``deadline``
    (``time.monotonic()``). Raises `ExchangeTimeout` past it, `ExchangeFailed` when no HTTP exchange took place,
    DFlashError for a reply over ``max_bytes``."""
    scheme, host, port = split_url(url)
    base_path = urllib.parse.urlsplit(url).path.rstrip("/")
    started = time.monotonic()
    connection = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = connection(host, port, timeout=_left(deadline))
    conn._create_connection = lambda address, timeout=None, source_address=None: _connect(address, deadline)
    dog = _Watchdog(conn, deadline)
    try:
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request("POST" if body is not None else "GET", base_path + path, body=body, headers=headers)
        if conn.sock is not None:
            conn.sock.settimeout(_left(deadline))
        reply = conn.getresponse()
        length = reply.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise DFlashError(f"{url}{path}: a reply of {int(length)} bytes announced, over {max_bytes >> 20} MiB — "
                              "refused unread")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            if conn.sock is not None:
                conn.sock.settimeout(_left(deadline))
            chunk = reply.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise DFlashError(f"{url}{path}: a reply over {max_bytes >> 20} MiB — refused")
        _left(deadline)
        if dog.fired:  # the watchdog cut the read: the deadline, not the server, ended it
            raise ExchangeTimeout
        if reply.length:  # Content-Length said more than came before the connection closed
            raise ExchangeFailed(f"the reply ended {reply.length} bytes short of its Content-Length")
        return Reply(reply.status, reply.reason or "", reply.getheader("Location"), b"".join(chunks),
                     time.monotonic() - started)
    except (socket.timeout, TimeoutError):
        raise ExchangeTimeout from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if dog.fired or time.monotonic() >= deadline:
            raise ExchangeTimeout from None
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ExchangeFailed(f"{type(exc).__name__}: {str(reason).splitlines()[0][:200] if reason else ''}") from None
    finally:
        dog.cancel()
        conn.close()


def parse_json_reply(body: bytes, where: str) -> Any:
    """The JSON document of a reply, or a one-line DFlashError: not JSON, or more containers than any reply of a
    llama-server holds (`MAX_REPLY_CONTAINERS`, counted before parsing)."""
    containers = body.count(b"{") + body.count(b"[")
    if containers > MAX_REPLY_CONTAINERS:
        raise DFlashError(f"{where}: the server's reply holds {containers} objects/arrays, over the "
                          f"{MAX_REPLY_CONTAINERS} any completion reply has — refused unparsed")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise DFlashError(f"{where}: the server's reply is not JSON ({body[:120]!r})") from None
