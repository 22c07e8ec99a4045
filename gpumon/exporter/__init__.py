"""Prometheus exposition of snapshots: metric table, collector, HTTP server."""
