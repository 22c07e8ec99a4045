"""Acquisition: the tiered poller, the snapshot store, scheduling, host figures, process attribution, energy."""
