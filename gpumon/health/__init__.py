"""Findings: pure engines over snapshots and events that say what is wrong and what to do."""
