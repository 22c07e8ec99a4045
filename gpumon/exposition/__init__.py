"""Prometheus exposition of snapshots: the metric table, the collector over the store, the text and
OpenMetrics writers, and the DCGM-compatible names (the HTTP server that serves them is gpumon.http)."""
