"""The small all-reduce sizes are captured as NCCL's own call on torch's communicator, or say why not."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gpumon.burn.workloads import nccl_direct
from gpumon.burn.workloads.nccl_direct import NCCL_DTYPES, DirectAllReduce, direct_allreduce, loaded_libnccl

MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
7f0000004000-7f0000005000 r-xp 00000000 08:01 456 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
"""


def test_the_libnccl_torch_loaded_is_found_in_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert loaded_libnccl(maps) == "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
    maps.write_text(MAPS.splitlines()[0] + "\n")
    assert loaded_libnccl(maps) is None
    assert loaded_libnccl(tmp_path / "missing") is None


def test_without_a_mapped_libnccl_there_is_no_direct_call_and_the_reason_says_so() -> None:
    # this torch is a CPU build: no libnccl in the process, never a second copy loaded from disk
    direct, why = direct_allreduce(torch, SimpleNamespace(), None, torch.zeros(8))
    assert direct is None and why == "no libnccl mapped in this process"


def test_a_dtype_nccl_cannot_sum_is_refused_by_name() -> None:
    direct, why = direct_allreduce(torch, SimpleNamespace(), None, torch.zeros(8, dtype=torch.complex64))
    assert direct is None and why == "NCCL has no data type for complex64"


def test_a_torch_without_the_communicator_pointer_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_direct, "loaded_libnccl", lambda: "/x/libnccl.so.2")
    group = SimpleNamespace(_get_backend=lambda device: SimpleNamespace())  # no _comm_ptr
    direct, why = direct_allreduce(torch, SimpleNamespace(), group, torch.zeros(8))
    assert direct is None and why is not None and why.startswith("no NCCL communicator from torch: AttributeError")


class _Library:
    """ncclAllReduce and ncclGetErrorString as ctypes would call them."""

    def __init__(self, result: int) -> None:
        self.result, self.calls = result, []
        self.ncclAllReduce = self._all_reduce
        self.ncclGetErrorString = lambda code: b"unhandled cuda error"

    def _all_reduce(self, *args: Any) -> int:
        self.calls.append(args)
        return self.result


def test_the_call_is_an_in_place_sum_of_every_element_on_the_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = SimpleNamespace(cuda_stream=0xABC)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    buf = torch.zeros(1024, dtype=torch.bfloat16)
    library = _Library(0)
    DirectAllReduce(library, comm=0x1234, datatype=NCCL_DTYPES["bfloat16"], count=buf.numel())(torch, buf)
    ((send, recv, count, dtype, op, comm, on_stream),) = library.calls
    assert send.value == recv.value == buf.data_ptr()
    assert isinstance(count, ctypes.c_size_t) and count.value == 1024
    assert dtype.value == 9 and op.value == 0  # ncclBfloat16, ncclSum (nccl.h)
    assert comm.value == 0x1234 and on_stream.value == 0xABC


def test_an_nccl_error_is_raised_with_nccls_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=1))
    direct = DirectAllReduce(_Library(1), comm=1, datatype=7, count=4)
    with pytest.raises(RuntimeError, match="ncclAllReduce returned 1: unhandled cuda error"):
        direct(torch, torch.zeros(4))
