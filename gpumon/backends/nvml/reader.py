"""What every NVML reader shares: the per-GPU state, the context, the registry entry and the reader body.

A *reader* is a plain function ``read(ctx, g, h, out) -> None`` that makes one group of NVML
calls for GPU ``g`` through its handle ``h`` and adds GpuSnapshot fields in base units to the
read's ``out`` dict (``out["power_watts"] = ...``): no dict of its own to build and merge, as the
FAST readers run every second for every GPU. It raises ``Unsupported`` when the GPU has none of
its fields, and lets any NVML error through: the backend core sorts errors (see the package
docstring). Each subsystem module lists its readers with their tier in one ``READERS`` tuple;
the core collects them.

A reader that raises has written nothing to ``out``: it makes all its calls first and writes its
fields after the last one (a reader of several calls keeps their answers in locals, or in a dict
of its own such as ``gather``'s, until then). So a reader's fields are all there or all left out,
as the package docstring says of a reader's error: e.g. video with the encoder answering and the
decoder failing with UNKNOWN leaves out both ratios, counted as the reader ``video``'s error.
A call NVML says the GPU lacks is not a failure: it only leaves its own field out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.backends.base import GpuLostError
from gpumon.backends.gpm import GpmSampler
from gpumon.backends.nvml.codes import NVML_SUCCESS, UNSUPPORTED_CODES, Unsupported, code_of, nvml_error
from gpumon.model.snapshot import Tier

_FIELD_VALUE_ATTRIBUTES = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""c_nvmlFieldValue_t.value member by valueType (NVML_VALUE_TYPE_DOUBLE, _UNSIGNED_INT, ...)."""


@dataclass
class GpuState:
    """What the backend remembers about one GPU."""

    index: int
    handle: Any | None
    """The NVML handle, None while the GPU is lost (re-acquired on the next read)."""
    uuid: str | None
    generation: int = 0
    """Bumped each time the handle is re-acquired after a loss."""
    confirmed: bool = True
    """A read of this handle succeeded (the GPU really answers)."""
    lost_reason: str | None = None
    pci_bus_id: str | None = None
    unsupported: set[str] = field(default_factory=set)
    """Readers and single calls NVML said this GPU does not support."""
    warned: set[str] = field(default_factory=set)
    plans: dict[Tier, tuple[tuple[tuple[str, Reader], ...], tuple[tuple[str, Reader], ...]]] = field(
        default_factory=dict
    )
    """Per tier, the readers still asked on this GPU: (liveness readers, the others), each (name, reader).
    Built on the first read of the tier; dropped when a reader turns out unsupported."""
    nvlink_count: int | None = None
    nvlink_names: tuple[str, ...] = ()
    """"0", "1", ... for links 0 .. nvlink_count-1 (the keys of nvlink_up, made once)."""
    fan_count: int | None = None
    clock_event_bits: tuple[tuple[str, int], ...] | None = None
    """The clock-event reasons this GPU supports (name, bit), from the first read."""
    clock_events_current: Callable[..., Any] = lambda _h: 0
    """The binding's nvmlDeviceGetCurrentClocksEventReasons (or the older Throttle spelling)."""
    clock_events_last: tuple[int, Mapping[str, bool]] = (-1, {})
    """The last reasons bitmask read and its decoded form (shared by snapshots: never mutated)."""
    memory_v1: bool = False
    process_util_timestamp: int = 0
    process_util_read_at: float | None = None
    """time.monotonic() of the last nvmlDeviceGetProcessUtilization call (None: never)."""
    process_util_pids: frozenset[int] = frozenset()
    """The compute pids when process utilization was last read."""
    process_shares: Mapping[int, float] = field(default_factory=dict)
    """SM share per pid from that read, reused until the next."""
    spaced_last: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    """Per spaced reader (``ReaderSpec.every_seconds``): when it last asked NVML (the context's clock)
    and the fields it wrote then, given again by the reads until it asks again."""
    pcie_bytes_last: tuple[float, Mapping[str, int]] | None = None
    """The PCIe byte counters of the last slow read and when (the context's clock): the throughput is their rate."""
    liveness_failures: int = 0
    """FAST reads in a row in which every liveness reader failed (kept across a re-acquired handle)."""

    def reset_caches(self) -> None:
        self.unsupported = set()
        self.warned = set()
        self.plans = {}
        self.nvlink_count = None
        self.nvlink_names = ()
        self.fan_count = None
        self.clock_event_bits = None
        self.clock_events_last = (-1, {})
        self.memory_v1 = False
        self.process_util_timestamp = 0
        self.process_util_read_at = None
        self.process_util_pids = frozenset()
        self.process_shares = {}
        self.spaced_last = {}
        self.pcie_bytes_last = None


@dataclass(frozen=True, slots=True)
class Context:
    """What the readers of every GPU share: the binding and a few services of the backend."""

    nv: Any
    """The pynvml module (or tests/fake_pynvml.py)."""
    gpm: GpmSampler
    peers: Callable[[GpuState], list[GpuState]]
    """The other GPUs that have a handle, by index."""
    record_error: Callable[[GpuState, Tier, str, Exception], None]
    """Count an error of one call inside a reader (logged, counted, the reader goes on)."""
    memory_temp_field: int = 82
    """NVML_FI_DEV_MEMORY_TEMP."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for readers that space out a costly call (process utilization)."""
    spaced: bool = False
    """Run the costly readers (``ReaderSpec.every_seconds``) at most that often: the daemon's backend.
    One-shot readers (gpumon burn, once, health) ask NVML on every read."""
    memory_v2_version: Any = None
    """The binding's ``nvmlMemory_v2`` (None in a binding without it), looked up once: memory is read
    every second."""


Reader = Callable[[Context, GpuState, Any, dict[str, Any]], None]
"""``read(ctx, g, h, out)``: one group of NVML calls for one GPU, its GpuSnapshot fields in base units
written into ``out`` (nothing written when it raises; see the module docstring)."""


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """One entry of a subsystem module's ``READERS``: the reader's name (read_errors' ``reader`` label,
    the key remembered when the GPU lacks it), the tier it runs in, and the function."""

    name: str
    tier: Tier
    read: Reader
    every_seconds: float = 0.0
    """The daemon's backend (``Context.spaced``) runs this reader at most this often, though its tier
    is read more often; the reads between give the fields of its last run (0: every read). For the
    calls that cost milliseconds of CPU (docs/nvml-notes.md, "What each read costs")."""


def spaced(spec: ReaderSpec) -> Reader:
    """``spec``'s reader, run at most every ``spec.every_seconds`` (the context's clock); between runs
    it writes the fields of its last run (the same objects: snapshots never change them). A run that
    raises leaves the last fields in force for the next read to try again."""
    inner, every, name = spec.read, spec.every_seconds, spec.name

    def read(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
        now = ctx.clock()
        last = g.spaced_last.get(name)
        if last is not None and now - last[0] < every:
            out.update(last[1])
            return
        mine: dict[str, Any] = {}
        inner(ctx, g, h, mine)
        g.spaced_last[name] = (now, mine)
        out.update(mine)

    return read


Call = tuple[str, str, Callable[..., Any], tuple[Any, ...]]
"""(output key, key remembered when unsupported, NVML function, its arguments)."""


def opt(g: GpuState, key: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when this single call is unsupported on this GPU (remembered under ``key``)."""
    if key in g.unsupported:
        return None
    try:
        return fn(*args)
    except Exception as exc:
        if code_of(exc) in UNSUPPORTED_CODES:
            g.unsupported.add(key)
            return None
        raise


def gather(
    g: GpuState, calls: Iterable[Call], convert: Callable[[Any], Any], *, zero_is_absent: bool = False
) -> dict[str, Any]:
    """The body most readers share: make each call, convert its answer, keep it under its output key.

    A call NVML says this GPU lacks is remembered (``opt``) and left out, as is an answer of
    None (or 0 with ``zero_is_absent``). Any other error goes up to the core. Raises
    Unsupported when no call answered, so the whole reader is not asked again. The reader
    writes the dict returned into its ``out`` (``out.update(...)`` or under one key).
    """
    out: dict[str, Any] = {}
    for name, key, fn, args in calls:
        value = opt(g, key, fn, *args)
        if value is None or (zero_is_absent and not value):
            continue
        out[name] = convert(value)
    if not out:
        raise Unsupported
    return out


def handle_of(g: GpuState) -> Any:
    """The GPU's handle; GpuLostError when it was lost between the check and the call."""
    handle = g.handle
    if handle is None:
        raise GpuLostError(g.index, g.lost_reason or "GPU lost")
    return handle


def text(value: Any) -> str:
    """A binding's string (bytes from older nvidia-ml-py) without padding."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\x00").strip()
    return str(value).strip()


def field_value(value: Any) -> float:
    """The number in a c_nvmlFieldValue_t, by its valueType (NVML_VALUE_TYPE_*)."""
    return float(getattr(value.value, _FIELD_VALUE_ATTRIBUTES.get(int(value.valueType), "uiVal")))


def field_value_of(nv: Any, h: Any, field_id: int) -> float | None:
    """One field's number by nvmlDeviceGetFieldValues (``field_values`` for one field, leaner: read every second)."""
    (value,) = nv.nvmlDeviceGetFieldValues(h, [field_id])
    code = int(value.nvmlReturn)
    if code == NVML_SUCCESS:
        return field_value(value)
    if code in UNSUPPORTED_CODES:
        return None
    raise nvml_error(nv, code)


def field_values(nv: Any, h: Any, field_ids: Iterable[int]) -> list[float | None]:
    """One nvmlDeviceGetFieldValues call: each field's number, None where NVML says this GPU lacks it.

    Any other answer of one field (GPU lost, NVML gone, UNKNOWN) raises it as NVML's error, for
    the core to sort like any failed call of the reader.
    """
    out: list[float | None] = []
    for value in nv.nvmlDeviceGetFieldValues(h, list(field_ids)):
        code = int(value.nvmlReturn)
        if code == NVML_SUCCESS:
            out.append(field_value(value))
        elif code in UNSUPPORTED_CODES:
            out.append(None)
        else:
            raise nvml_error(nv, code)
    return out


def function(nv: Any, *names: str) -> Callable[..., Any]:
    """The first of ``names`` the binding has (newer and older spellings); Unsupported if none."""
    for name in names:
        fn = getattr(nv, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise Unsupported


def cuda_version(value: int) -> str:
    """nvmlSystemGetCudaDriverVersion_v2's number as a version: 13000 -> "13.0", 12040 -> "12.4"."""
    return f"{value // 1000}.{value % 1000 // 10}"
