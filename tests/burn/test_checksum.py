"""The matmul output fingerprint: any one or two flipped bits change it (docs/burn.md), computed with torch."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.burn.workloads.context import checksum
from tests.helpers import examples

CTX = SimpleNamespace(torch=torch)
N_WORDS = 64 * 64


def _output() -> torch.Tensor:
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)


def _flip(t: torch.Tensor, word: int, bit: int) -> None:
    words = t.view(-1).view(torch.int16)
    words[word] = int(words[word]) ^ (1 << bit) if bit < 15 else int(words[word]) ^ -(1 << 15)


def test_two_opposite_flips_that_cancel_in_a_sum_of_words_change_the_fingerprint():
    out = _output()
    words = out.view(-1).view(torch.int16)
    i = next(k for k in range(N_WORDS) if not int(words[k]) & 1)  # bit 0 goes 0 -> 1: +1
    j = next(k for k in range(N_WORDS) if int(words[k]) & 1)  # bit 0 goes 1 -> 0: -1
    flipped = out.clone()
    _flip(flipped, i, 0)
    _flip(flipped, j, 0)
    plain_sum = flipped.view(torch.int16).sum(dtype=torch.int64) == out.view(torch.int16).sum(dtype=torch.int64)
    assert plain_sum  # what the old checksum saw: nothing
    assert checksum(CTX, flipped) != checksum(CTX, out)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.tuples(st.integers(0, N_WORDS - 1), st.integers(0, 15)),
    st.tuples(st.integers(0, N_WORDS - 1), st.integers(0, 15)),
)
def test_any_one_or_two_flipped_bits_change_the_fingerprint(first, second):
    out = _output()
    flipped = out.clone()
    _flip(flipped, *first)
    assert checksum(CTX, flipped) != checksum(CTX, out)
    if second != first:
        _flip(flipped, *second)
        assert checksum(CTX, flipped) != checksum(CTX, out)


def test_identical_outputs_have_identical_fingerprints_in_any_dtype():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        a = _output().to(dtype)
        assert checksum(CTX, a) == checksum(CTX, a.clone())
