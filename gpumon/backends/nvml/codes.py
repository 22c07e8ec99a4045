"""NVML return codes (nvml.h) and how the backend sorts them: absent, GPU lost, NVML gone.

The numbers are ABI-stable: the same values pynvml's NVML_ERROR_* constants hold, so this
module needs no pynvml.
"""

from __future__ import annotations

from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

UNSUPPORTED_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND})
"""NVML's word that a GPU lacks a call: remembered per GPU, never asked again, its fields omitted."""
LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_GPU_NOT_FOUND})
"""NVML's own word that a GPU is gone. UNKNOWN is not one: it is one call's error."""
NVML_GONE_CODES = frozenset(
    {NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH}
)
"""NVML itself is gone (e.g. the driver was upgraded under us): shut down and init() again."""


class Unsupported(Exception):
    """Raised by a reader whose fields this GPU does not have (remember, omit)."""


def code_of(exc: BaseException) -> int | None:
    """The NVML return code of an NVMLError (any binding or fake), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def missing_in_binding(exc: BaseException, nv: Any) -> bool:
    """An AttributeError for a function this pynvml (an older nvidia-ml-py) does not have."""
    return isinstance(exc, AttributeError) and getattr(exc, "obj", None) is nv and nv is not None


def nvml_error(nv: Any, code: int) -> Exception:
    """The binding's NVMLError for ``code`` (a RuntimeError with ``.value`` if it has none)."""
    error_class = getattr(nv, "NVMLError", None)
    if error_class is not None:
        try:
            err = error_class(code)
            if isinstance(err, Exception):
                return err
        except Exception:
            pass
    err = RuntimeError(f"NVML error {code}")
    err.value = code  # type: ignore[attr-defined]
    return err


def init_message(exc: BaseException) -> str:
    """One line saying why nvmlInit failed, in words for the usual causes."""
    code = code_of(exc)
    reasons = {
        NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found (is the NVIDIA driver installed?)",
        NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "libnvidia-ml and the kernel driver differ (driver upgraded without reboot?)",
    }
    reason = reasons.get(code) if code is not None else None
    return f"{reason} [nvmlInit: {exc}]" if reason else f"nvmlInit failed: {exc}"
