"""toolrl/MCP-v0: the textkit MCP server (server.py) and the env over it (env.py)."""
