"""XID 74 (NVLink error) says which NVLink problem it is: the driver's register values, decoded.

The driver prints XID 74 with the link and seven register values, e.g.::

    NVRM: Xid (PCI:0000:d8:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)

NVIDIA's XID documentation (the WORKFLOW_NVLINK_ERR workflow of its Xid Catalog, as NVIDIA/NVSentinel#364
quotes it) reads the first register's bits:

==================  ==========================  =================================================
bits                class                       first action
==================  ==========================  =================================================
21, 22              ``signal_integrity``        marginal channel: check the link's mechanical
                                                connections, run field diagnostics (check_nvlink)
4, 5                ``ecc_parity``              likely hardware ECC / parity: report it to NVIDIA
                                                when it repeats on the link (contact_support)
8, 9, 12, 16, 17,   ``hardware``                possibly hardware: check and re-seat the link's
24, 28                                          connections, run diagnostics (check_hardware)
1, 20 alone, or     ``unexpected``              a bit NVIDIA does not expect: report a bug
any other bit                                   (contact_support)
0, 23, 30 only      ``benign``                  can be ignored (ignore: no fault, no warning)
==================  ==========================  =================================================

The worst class present wins (unexpected, hardware, ecc_parity, signal_integrity, benign); bits 1 and 20
beside another class are its secondary errors. A line without that layout (another driver's wording,
fewer values, a first register of 0) is None: the catalog's action for XID 74 holds (check_nvlink).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINK_RE = re.compile(r"link\s+(?P<link>\d+)\s*\((?P<values>(?:\s*0x[0-9A-Fa-f]+\s*,){6}\s*0x[0-9A-Fa-f]+\s*)\)")

_CLASSES: tuple[tuple[str, frozenset[int], str], ...] = (
    ("hardware", frozenset({8, 9, 12, 16, 17, 24, 28}), "check_hardware"),
    ("ecc_parity", frozenset({4, 5}), "contact_support"),
    ("signal_integrity", frozenset({21, 22}), "check_nvlink"),
)
_BENIGN = frozenset({0, 23, 30})
_SECONDARY = frozenset({1, 20})
_KNOWN = _BENIGN | _SECONDARY | frozenset().union(*(bits for _, bits, _ in _CLASSES))


@dataclass(frozen=True)
class Xid74:
    """What an XID 74 line says about its NVLink problem."""

    link: int
    registers: tuple[int, ...]
    """The seven register values as printed."""
    kind: str
    """signal_integrity, ecc_parity, hardware, unexpected or benign."""
    action: str
    """The catalog action for that class (check_nvlink, contact_support, check_hardware, ignore)."""
    bits: tuple[int, ...]
    """The bits set in the first register."""

    def words(self) -> str:
        """``signal integrity, link 14``: for a finding's summary."""
        return f"{self.kind.replace('_', ' ')}, link {self.link}"


def decode_xid74(message: str | None) -> Xid74 | None:
    """The class of an XID 74 line from its first register; None for a line without the seven values."""
    if not message:
        return None
    m = _LINK_RE.search(message)
    if m is None:
        return None
    registers = tuple(int(v.strip(), 16) for v in m.group("values").split(","))
    first = registers[0]
    if first == 0:
        return None  # the class is in the first register; without it the line says no more than "XID 74"
    bits = tuple(b for b in range(first.bit_length()) if first >> b & 1)
    kind, action = _classify(frozenset(bits))
    return Xid74(link=int(m.group("link")), registers=registers, kind=kind, action=action, bits=bits)


def _classify(bits: frozenset[int]) -> tuple[str, str]:
    if bits - _KNOWN:
        return "unexpected", "contact_support"
    for kind, members, action in _CLASSES:
        if bits & members:
            return kind, action
    if bits & _SECONDARY:
        return "unexpected", "contact_support"  # secondary errors alone: NVIDIA asks for a bug report
    return "benign", "ignore"
