"""Run a command; print each line of its output with the seconds since it started.

    python3 scripts/timeline.py gpumon burn --gpus all --quick
"""

import subprocess
import sys
import time


def main() -> int:
    started = time.monotonic()
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"{time.monotonic() - started:7.2f} {line}", end="", flush=True)
    code = proc.wait()
    print(f"{time.monotonic() - started:7.2f} exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
