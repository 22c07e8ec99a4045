"""Which network interface a CPU burn's gloo uses to reach the other nodes.

gloo picks its interface from this host's name: where the name resolves to a loopback address
(Debian's ``127.0.1.1 HOST`` line in /etc/hosts, or nodes that share one host name) the workers of
the other nodes are told to connect to 127.0.x.x and never meet. Unless ``GLOO_SOCKET_IFNAME`` is
set, gpumon then names the interface its route to the rendezvous address leaves by.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

ENV_VAR = "GLOO_SOCKET_IFNAME"


def gloo_interface(env: Mapping[str, str], rendezvous_address: str) -> str | None:
    """The interface for gloo, or None to leave gloo to choose (it will choose well, or was told)."""
    if env.get(ENV_VAR) or not _name_is_loopback():
        return None
    try:
        local = _local_address_towards(rendezvous_address)
    except OSError:
        return None
    if local is None or ipaddress.ip_address(local).is_loopback:
        return None  # every node on this host: loopback is right
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return name
    return None


def _name_is_loopback() -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(socket.gethostname())).is_loopback
    except (OSError, ValueError):
        return False


def _local_address_towards(address: str) -> str | None:
    """This host's IPv4 address on the route to ``address`` (a UDP connect sends nothing)."""
    target = socket.gethostbyname(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target, 9))
        return str(s.getsockname()[0])
