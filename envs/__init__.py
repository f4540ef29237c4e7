"""Built-in tool environments (shipped as ``toolrl.envs``).

Importing this package registers every built-in env id, exactly as a third-party package does
from its ``toolrl.envs`` entry point (``builtin = "toolrl.envs"`` in toolrl's pyproject). The
env modules themselves load only when an env is made.
"""

from toolrl import register_env

BUILTIN_ENVS = {
    "toolrl/Calculator-v0": "toolrl.envs.calculator:CalculatorEnv",
    "toolrl/FunctionCalling-v0": "toolrl.envs.function_calling:FunctionCallingEnv",
    "toolrl/BFCLMultiTurn-v0": "toolrl.envs.bfcl_multi_turn:BFCLMultiTurnEnv",  # bfcl-eval
    "toolrl/Bank-v0": "toolrl.envs.bank:BankEnv",
    "toolrl/HttpApi-v0": "toolrl.envs.http_api.env:HttpApiEnv",
    "toolrl/MCP-v0": "toolrl.envs.mcp.env:MCPEnv",
    "toolrl/PythonSandbox-v0": "toolrl.envs.python_sandbox.env:PythonSandboxEnv",
    "toolrl/Tau2-v0": "toolrl.envs.tau2:Tau2Env",  # needs the tau2 extra
}

for _id, _entry_point in BUILTIN_ENVS.items():
    register_env(_id, _entry_point)
