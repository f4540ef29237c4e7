"""toolrl/Tau2-v0: tau2-bench's domains as a toolrl environment, scored by tau2's own evaluator.

Needs the ``tau2`` extra (see docs/guides/tau2.md). Importing this package sets litellm's documented
``LITELLM_LOCAL_MODEL_COST_MAP`` switch (unless already set) so that importing tau2 does not
fetch litellm's price table from the network, and silences tau2's loguru DEBUG logging.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger

logger.disable("tau2")

from .env import Tau2Env  # noqa: E402

__all__ = ["Tau2Env"]
