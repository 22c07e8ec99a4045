"""Files under the state directory, written atomically."""
