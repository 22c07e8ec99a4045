"""Alerting: rules over snapshots, XIDs and health findings, with Prometheus' pending, firing and
resolved semantics, delivered to Alertmanagers and webhooks from queues that survive restarts."""
