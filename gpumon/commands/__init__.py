"""The subcommands other than ``run``: argument parsing and wiring of the subsystems for one command each."""
