"""toolrl/HttpApi-v0: the store service (service.py) and the env over it (env.py)."""
