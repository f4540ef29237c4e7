"""toolrl: reinforcement learning of tool-calling language models.

The public API is re-exported here; everything else is reachable by module path.
"""

from toolrl.registry import Registry, RegistryError

__version__ = "0.1.0"

__all__ = ["Registry", "RegistryError", "__version__"]
