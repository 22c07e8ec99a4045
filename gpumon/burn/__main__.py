"""``python -m gpumon.burn`` — what ``torchrun --nnodes N --nproc-per-node G -m gpumon.burn`` starts."""

import sys

from gpumon.burn.command import main

if __name__ == "__main__":
    sys.exit(main())
