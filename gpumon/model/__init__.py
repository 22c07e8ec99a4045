"""Data every layer shares: snapshots, the field declarations, metric families, XID events, findings."""
