"""What the ``toolrl`` commands run: one function a command, taking the parsed arguments and
returning the exit status.

`toolrl.cli` holds the parser and names each command's function as a ``"module:function"``
string (its ``COMMANDS`` table), imported only when that command runs: ``toolrl --help`` loads
none of these modules, so each of them imports what its commands need at the top.

- `catalog`: what toolrl knows by name (env ids, reward ids, model families) and the env check;
- `models`: checkpoints (tiny, GGUF imports, fetched models) and chat-template checks;
- `data`: task rows (conversion, contamination, data wheels);
- `score`: offline scoring of tool calls and of saved trajectories;
- `experiments`: experiments from a config file (train, its dry run, eval).
"""
