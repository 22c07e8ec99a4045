"""Exit codes of ``gpumon burn`` and the errors that map to them."""

from __future__ import annotations

EXIT_PASSED = 0
"""Every selected GPU and link passed."""
EXIT_FAULT = 1
"""A fault was found; the report names the GPU, link or rank."""
EXIT_USAGE = 2
"""Bad command line (unknown GPU index, test or dtype); every problem is listed."""
EXIT_CANNOT_RUN = 3
"""The burn could not run: no torch, no GPU, NCCL would not initialise, GPU busy without --force."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C / SIGTERM (the conventional 128 + SIGINT)."""


class BurnUsageError(Exception):
    """The command line is wrong; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class CannotRunError(Exception):
    """The burn cannot run here; the message is the one line the user sees."""
