"""toolrl/PythonSandbox-v0: isolated Python runs (launcher.py, sandbox.py) and the env (env.py)."""
