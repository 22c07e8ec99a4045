"""GPU events: XIDs from NVML's event API and from the kernel log."""
