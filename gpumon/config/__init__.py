"""The config file (``file``), its line positions, the DCGM compat file, and the settings a running daemon derives."""
