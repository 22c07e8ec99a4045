"""``python -m tests.health.nvml_node KMSG [INIT_DELAY_SECONDS] -- ARGS...``: ``gpumon ARGS`` on a fake
NVML (two H200s at bus ids 00000000:18:00.0 and 00000000:28:00.0, tests/fake_pynvml.py) whose kernel log
is the file KMSG (lines as /dev/kmsg gives them) instead of /dev/kmsg.

For the multi-node cluster (tests/health/slurm_nodes.py): a node whose daemon runs ``--backend nvml``
keeps its health state in the node's own state directory and follows the kernel log, as on a GPU host
(simulated backends do neither). ``nvmlInit`` first waits INIT_DELAY_SECONDS, so that the kernel-log
backfill reaches the daemon before its first poll has mapped any bus id (issue 28, item 2).
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    split = argv.index("--")
    own, gpumon_args = argv[:split], argv[split + 1 :]
    kmsg = Path(own[0])
    delay_seconds = float(own[1]) if len(own) > 1 else 0.0

    from tests.fake_pynvml import h200_pair

    fake = h200_pair()
    init = fake.nvmlInit

    def slow_init() -> None:
        time.sleep(delay_seconds)
        init()

    fake.nvmlInit = slow_init  # type: ignore[method-assign]
    sys.modules["pynvml"] = fake  # type: ignore[assignment]  # NvmlBackend.from_system imports it

    from gpumon import daemon
    from gpumon.cli import main as gpumon_main
    from gpumon.events.kernel_follow import KernelLogFollower

    daemon.KernelLogFollower = functools.partial(  # type: ignore[attr-defined,assignment]
        KernelLogFollower, kmsg_path=kmsg, journal_command=None
    )
    return gpumon_main(gpumon_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
