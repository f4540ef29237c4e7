"""Built-in reward plugins (shipped as toolrl.rewards)."""
