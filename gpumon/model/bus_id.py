"""A GPU's PCI bus id in NVML's form, whatever form the kernel log, sysfs or a baseline wrote it in."""

from __future__ import annotations

import re

_BUS_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):(?P<device>[0-9A-Fa-f]{1,2})"
    r"(?:\.(?P<function>[0-7]))?$"
)


def normalize_bus_id(text: str) -> str | None:
    """``0000:06:00`` / ``PCI:0000:3b:00`` / ``00000000:06:00.0`` -> ``00000000:06:00.0``; None if not a bus id.

    NVML's ``pciInfo.busId`` (nvidia-smi ``pci.bus_id``) is 8 hex digits of domain,
    then bus, device and function, upper case.
    """
    m = _BUS_RE.match(text.strip())
    if m is None:
        return None
    domain = int(m.group("domain") or "0", 16)
    function = int(m.group("function") or "0")
    return f"{domain:08X}:{int(m.group('bus'), 16):02X}:{int(m.group('device'), 16):02X}.{function:X}"
