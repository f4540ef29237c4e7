"""Core of toolrl, knowing nothing of Ray, workers or the trainer: tool envs (`env`), tools
(`tools`), tool-call formats (`parse`), the record of a finished episode (`trajectory`), env
registration (`registration`), checks (`checks`), BFCL's checkers (`bfcl`, `bfcl_multi_turn`,
`bfcl_scores`), wrappers and plain types. Plugin authors import these names from `toolrl` itself.

Submodules load on first use (``toolrl.core.bfcl`` as an attribute, too).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submodules=[
    "background", "bfcl", "bfcl_multi_turn", "bfcl_scores", "checks", "env", "parse",
    "registration", "tools", "trajectory", "types", "wrappers"])
