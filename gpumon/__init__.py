"""gpumon: GPU monitoring, alerting and burn-in on nothing but the NVIDIA driver."""

__version__ = "0.1.0"
