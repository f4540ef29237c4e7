"""``python -m tools.gpu_check --out DIR [--dry] [--only scoring,ipc,memory,pytest]``."""

import sys

from tools.gpu_check.run import main

sys.exit(main())
