"""python -m gpumon"""

import sys

from gpumon.cli import main

sys.exit(main())
