"""The real backend: NVML through nvidia-ml-py (``pynvml``).

This is the only package of gpumon that imports ``pynvml`` (in ``NvmlBackend.from_system``);
everything else receives the module object, so tests hand in ``tests/fake_pynvml.py``.

Layout (one collector per subsystem, as node_exporter does):

* ``core``: ``NvmlBackend``: lifecycle, read dispatch, GPUs lost and found again.
  ``error_policy``: the error policy below, liveness, error counting.
  ``events``: the XID event set. ``codes``: NVML return codes.
  ``reader``: the per-GPU state, the readers' context and their shared body (``gather``).
* one module per subsystem, each listing its readers with their tier in ``READERS``:
  ``identity``, ``utilization`` (and memory), ``temperature`` (and thresholds), ``power``
  (and energy), ``clocks`` (clock events, violations), ``fans``, ``pcie``, ``ecc`` (row
  remapping, retired pages), ``modes`` (persistence, MIG, compute), ``fabric``, ``nvlink``
  (state, errors), ``topology`` (and P2P), ``processes``, ``profiling`` (GPM, through
  ``gpumon.backends.gpm``). Adding a field = a reader function in its subsystem module
  and a line in that module's ``READERS``.

How a read works
----------------
``read(index, tier)`` runs the small *readers* of that tier (one group of NVML calls each,
see ``registry.collect_readers``); each writes its fields into the read's one dict, in base
units: bytes, watts (NVML: mW), joules (mJ), hertz (MHz), ratios 0-1 (percent), seconds (ns).

* NOT_SUPPORTED, FUNCTION_NOT_FOUND and NOT_FOUND mean "absent": the reader (or the single
  call inside it) is remembered per GPU and never asked again; its fields are omitted.
  (A failed call costs ~160 µs on an H200, far more than a successful one.)
* GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND (NVML says the GPU is gone): ``GpuLostError``.
  The next read of that GPU re-acquires its handle (nvmlDeviceGetHandleByIndex), checks the
  UUID and re-probes everything, so a GPU that comes back after a reset reports again.
* The GPU is also lost when its liveness reads fail ``LIVENESS_FAILURES_LOST`` (3) FAST reads
  in a row: memory info and utilization (``LIVENESS_READERS``), the two calls every GPU
  answers; a read where at least one of them answers proves the GPU alive. A GPU that was
  lost must pass its liveness reads once before it counts as up again (no flapping).
* UNKNOWN (and any other error of one call) is that reader's error, not a lost GPU: its
  fields are left out of the read, the rest of the read is kept, and it is counted per GPU
  and reader (``read_errors()``) and per tier (``take_errors()``).
* UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH: ``NvmlUnavailableError`` (NVML
  itself is gone, e.g. the driver was upgraded under us): the caller should shut down and
  ``init()`` again with backoff.
* A function missing from an older nvidia-ml-py (AttributeError on the module) is treated
  like NOT_SUPPORTED.
* Any other error inside one reader does not spoil the others: the read returns what the
  other readers got, the error is logged (warning the first time per GPU and reader) and
  counted per tier for ``take_errors()`` -> {"fast": n, ...}, which the poller adds to its
  poll errors. ``read`` never raises for such partial failures, even if every reader failed.

gpumon never changes a card: only getters here, no setter, clear, reset, clock/power/ECC/MIG call.
"""

from __future__ import annotations

from gpumon.backends.nvml.clocks import PERF_POLICIES
from gpumon.backends.nvml.codes import LOST_CODES, NVML_GONE_CODES, UNSUPPORTED_CODES
from gpumon.backends.nvml.core import NvmlBackend
from gpumon.backends.nvml.error_policy import LIVENESS_FAILURES_LOST, LIVENESS_READERS
from gpumon.backends.nvml.events import EVENT_XID
from gpumon.backends.nvml.nvlink import NVLINK_ERROR_COUNTERS, NVLINK_ERROR_FIELDS
from gpumon.backends.nvml.topology import P2P_CAPABILITIES, TOPOLOGY_LEVELS
from gpumon.model.nvml_vocabulary import CLOCK_EVENT_BITS

__all__ = [
    "CLOCK_EVENT_BITS",
    "EVENT_XID",
    "LIVENESS_FAILURES_LOST",
    "LIVENESS_READERS",
    "LOST_CODES",
    "NVLINK_ERROR_COUNTERS",
    "NVLINK_ERROR_FIELDS",
    "NVML_GONE_CODES",
    "P2P_CAPABILITIES",
    "PERF_POLICIES",
    "TOPOLOGY_LEVELS",
    "UNSUPPORTED_CODES",
    "NvmlBackend",
]
