"""python -m gpumon"""

import sys

from gpumon.early_hangup import hold_hangups

hold_hangups(sys.argv[1:])  # before the imports of the command: a SIGHUP while gpumon run starts is kept

from gpumon.cli import main  # noqa: E402

sys.exit(main())
