"""Built-in tool environments (shipped as toolrl.envs)."""
