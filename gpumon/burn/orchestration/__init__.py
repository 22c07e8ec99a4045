"""How a burn runs: options, the runner, one agent per host, one worker process per GPU, the
messages between them, the watchdog that names a hung rank, the telemetry watcher and the live view.
"""
