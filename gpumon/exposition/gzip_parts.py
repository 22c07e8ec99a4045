"""A gzip member made of parts deflated apart: a large part that many responses share is
compressed once, and each response compresses only its own small parts around it.

Each part is raw deflate from a fresh compressor, ended with a sync flush (on a byte
boundary, not the last block), so parts can be laid end to end in any order; the member's
CRC-32 is combined from the parts' own (zlib's ``crc32_combine``, which Python does not
expose), so the shared part is not read again. Any gzip reader inflates the member to the
parts' bytes joined.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

LEVEL = 1
"""Deflate level of every part: the fastest (5.2 MB of exposition in about 10 ms, 6 % of its size)."""

_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
"""gzip header: deflate, no flags, no modification time, extra flags 4 (fastest), OS unknown."""
_LAST_BLOCK = b"\x03\x00"
"""An empty final deflate block (the parts' blocks are never final)."""
_STORED_MAX = 65535
"""The most bytes one stored deflate block holds."""
_CRC_RUN_MAX = 64 << 10
"""A part up to this long keeps its bytes, and a member's CRC runs on over them (zlib.crc32, about
2 µs for 12 KB) instead of being combined with the part's own (``crc32_shift`` and ``_multiply`` in
Python: about 35 µs for the shift, once per part, and a few µs per member); longer parts (tens of
GPUs) are combined, which costs the same whatever their length."""
_POLY = 0xEDB88320
"""CRC-32 polynomial, bit-reversed, as zlib uses it."""


def _multiply(a: int, b: int) -> int:
    """a times b modulo the CRC polynomial (zlib's multmodp), bit-reversed representation."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


@cache
def _powers() -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, k = 0..31."""
    out = []
    p = 1 << 30  # x^1
    for _ in range(32):
        out.append(p)
        p = _multiply(p, p)
    return tuple(out)


def crc32_shift(length_bytes: int) -> int:
    """x^(8 * length_bytes) modulo the polynomial: what ``crc32_combine`` multiplies the first
    CRC by to append ``length_bytes`` bytes (zlib's x2nmodp(length_bytes, 3))."""
    powers = _powers()
    p = 1 << 31  # x^0
    k = 3
    n = length_bytes
    while n:
        if n & 1:
            p = _multiply(powers[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, shift: int) -> int:
    """CRC-32 of A + B from A's CRC, B's CRC and ``crc32_shift(len(B))``."""
    return _multiply(shift, crc1) ^ crc2


@dataclass(frozen=True)
class Part:
    """Bytes deflated on their own, ready to be laid into a gzip member."""

    deflated: bytes
    """Raw deflate (no header), ended by a sync flush: byte-aligned, not the last block."""
    crc32: int
    """CRC-32 of the bytes before deflating."""
    length_bytes: int
    """Their length before deflating, bytes."""
    shift: int | None
    """``crc32_shift(length_bytes)``: how a member lays this part's CRC after the parts before it.
    None for a part that keeps its bytes in ``data`` instead."""
    data: bytes | None = None
    """The part's own bytes when it is short (a stored part: a response's few kilobytes; a deflated
    one up to ``_CRC_RUN_MAX``): the member's CRC runs on over them (zlib.crc32 from the CRC so
    far), cheaper than working out their shift in Python."""


def deflate(data: bytes) -> Part:
    """``data`` as a part, compressed (zlib releases the GIL while it compresses)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    deflated = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
    if len(data) <= _CRC_RUN_MAX:
        return Part(deflated, zlib.crc32(data), len(data), None, data)
    return Part(deflated, zlib.crc32(data), len(data), crc32_shift(len(data)))


def stored(data: bytes) -> Part:
    """``data`` as a part, not compressed (stored blocks, 5 bytes more per 64 KiB): for the few
    kilobytes a response makes itself, where calling zlib would cost more than it saves (each
    call lets go of the GIL, and a thread that lets go of it while another thread computes
    waits up to a switch interval, 5 ms, to have it back)."""
    blocks = []
    for start in range(0, len(data), _STORED_MAX):
        chunk = data[start : start + _STORED_MAX]
        blocks.append(struct.pack("<BHH", 0, len(chunk), len(chunk) ^ 0xFFFF) + chunk)
    return Part(b"".join(blocks), zlib.crc32(data), len(data), None, data)


def member(parts: Sequence[Part]) -> list[bytes]:
    """A gzip member holding ``parts`` in order, as chunks to send one after the other."""
    crc = 0
    length = 0
    for part in parts:
        if part.data is not None:
            crc = zlib.crc32(part.data, crc)
        elif length == 0:
            crc = part.crc32
        else:
            assert part.shift is not None  # a deflated part always has its shift
            crc = crc32_combine(crc, part.crc32, part.shift)
        length += part.length_bytes
    trailer = struct.pack("<II", crc, length & 0xFFFFFFFF)
    return [_HEADER, *[p.deflated for p in parts], _LAST_BLOCK + trailer]
