"""What one client can hold of the HTTP server, and the listening socket.

``HttpLimits`` are the server's limits; ``raise_open_files_limit`` makes room for the
connection limit at start; ``bind_listener`` binds the address (IPv4, IPv6 or both).
"""

from __future__ import annotations

import logging
import resource
import socket
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """What one client can hold of the server. Defaults fit a Prometheus scraping every 15–60 s."""

    workers: int = 4
    """Threads that answer complete requests (render /metrics, the JSON routes)."""
    max_connections: int = 1024
    """Open client connections at most; lowered to fit the open-files limit."""
    header_timeout_seconds: float = 10.0
    """A new connection must finish its TLS handshake and first request headers within this."""
    idle_timeout_seconds: float = 65.0
    """A kept-alive connection must send its next request's headers within this (a 60 s scrape fits)."""
    write_timeout_seconds: float = 30.0
    """A response must be taken by the client within this."""
    max_header_bytes: int = 16384
    """Request line and headers together; more gets 431."""
    backlog: int = 1024
    """Listen backlog (the kernel caps it at net.core.somaxconn)."""


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go programs do at start); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1048576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a seccomp filter (systemd @resources) or a container
            log.debug("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return int(soft)


def bind_listener(address: tuple[str, int], backlog: int) -> socket.socket:
    """A listening socket for ``(host, port)``: IPv4 or IPv6 literal or name; ``::`` also takes IPv4."""
    host, port = address
    # An ASCII name goes as bytes: for a str, socket loads the IDNA codec (and unicodedata).
    name = (host.encode() if host.isascii() else host) if host else None
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _type, _proto, _name, sockaddr = infos[0]
    dual = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
    sock = socket.create_server(sockaddr[:2], family=family, backlog=backlog, dualstack_ipv6=dual)
    sock.setblocking(False)
    return sock
