"""Prometheus exposition of snapshots: the metric table, the collector over the store, and the
HTTP server (with a web config's TLS and basic auth) that serves /metrics without touching NVML."""
