"""Run ``python -m gpumon ...`` under a sampling profiler (sys._current_frames every 5 ms).

    python benchmarks/sampling_profiler.py OUT.txt run --backend fake ...

On SIGTERM the daemon stops as usual and OUT.txt gets the busiest code: per sample, every
thread whose innermost frame is not a known wait (a lock, select, sleep) counts once for its
innermost gpumon/prometheus_client/stdlib function ("self") and once for each distinct
function on its stack ("total"). Cheap enough (~1 % of a core) to leave the figures honest.
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
import time
from types import FrameType

IDLE = {
    "wait",
    "_wait_for_tstate_lock",
    "acquire",
    "select",
    "sleep",
    "_worker",
    "accept",
    "run_forever",
    "_run_once",
    "get",
    "poll",
    "join",
    "readline",
}
PERIOD_SECONDS = 0.005


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    short = path[path.rfind("site-packages/") + 14 :] if "site-packages/" in path else path.rsplit("/", 2)[-2:]
    if isinstance(short, list):
        short = "/".join(short)
    return f"{short}:{code.co_name}"


def main() -> None:
    out_path = sys.argv[1]
    sys.argv = ["gpumon", *sys.argv[2:]]
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = [0]

    def sample() -> None:
        me = threading.get_ident()
        while True:
            time.sleep(PERIOD_SECONDS)
            samples[0] += 1
            for ident, frame in sys._current_frames().items():
                if ident == me or frame is None or frame.f_code.co_name in IDLE:
                    continue
                own[_where(frame)] += 1
                seen = set()
                f: FrameType | None = frame
                while f is not None:
                    seen.add(_where(f))
                    f = f.f_back
                for name in seen:
                    total[name] += 1

    def dump() -> None:
        with open(out_path, "w") as fh:
            fh.write(f"samples {samples[0]} every {PERIOD_SECONDS * 1e3:g} ms (busy thread-samples below)\n")
            fh.write("## self\n")
            for name, n in own.most_common(25):
                fh.write(f"{n:>7} {name}\n")
            fh.write("## total\n")
            for name, n in total.most_common(40):
                fh.write(f"{n:>7} {name}\n")

    atexit.register(dump)
    threading.Thread(target=sample, daemon=True, name="sampler").start()
    from gpumon.cli import main as gpumon_main

    sys.exit(gpumon_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
