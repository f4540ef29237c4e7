"""``python -m tools.gpu_scheduler [paths] --devices N [-- pytest args]``."""

import sys

from tools.gpu_scheduler.scheduler import main

sys.exit(main())
