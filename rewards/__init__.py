"""Built-in reward plugins (shipped as toolrl.rewards), one module each.

Importing this package registers every built-in: the ``toolrl.rewards`` entry point ``builtin``
points here, the same path a third-party reward package uses.
"""

from toolrl.rewards import (
    answer_match,
    bfcl_ast,
    exec_state,
    format,
    length_penalty,
    remote,
    success,
    tau2,
    tool_error_penalty,
    toolcall_fine,
    turn_penalty,
)

__all__ = [
    "answer_match",
    "bfcl_ast",
    "exec_state",
    "format",
    "length_penalty",
    "remote",
    "success",
    "tau2",
    "tool_error_penalty",
    "toolcall_fine",
    "turn_penalty",
]
