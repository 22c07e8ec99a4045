"""Small helpers with no knowledge of GPUs: bounded reads, YAML, JSON output, pipes, clocks, state files."""
