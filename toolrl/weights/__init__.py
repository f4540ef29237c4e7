"""Weight sync between the actors and the rollout engines: ONE home for how weights travel.

What both ends share:

- `buckets`: how a push cuts the weights (`iter_buckets`, `meta_buckets`, flat bucket
  buffers) and proves what it holds (`Checksum`, `weights_checksum`).
- `canary`: the weight-sync canary's probe, tolerances and verdict (engine vs actor log-probs
  after each push).

The routes, one module for each way the bytes travel:

- `colocated`: engines living in an actor's process (`register_local_engine`,
  `engine_loader`), pushed into directly;
- `group`: split pools on CPU, `WeightSyncGroup` (a gloo broadcast group of its own);
- `nccl`: split pools on GPU, vLLM's NCCL weight transfer (its request payloads);
- `staging`: the CPU push's bytes, shared-memory staging files (`SharedMemoryPush`);
- `ipc`: the colocated GPU push's bytes, vLLM's CUDA IPC transfer (`IpcPush`);
- `vllm_worker`: the receiving end inside vLLM's worker process (`WeightLoaderExtension`);
- `engine_routes`: the engine's end of every route (`EngineWeightRoutes`, which each
  `toolrl.rollout.engine.VLLMEngine` builds and hands itself to: ``engine.weights``; LoRA
  adapters go in by disk, ``load_adapter_sync``).

The actor's end, which gathers an FSDP2 model's shards into the stream these routes carry, is
`toolrl.workers.weight_push.WeightSync`. ``weights`` imports no other toolrl layer: the
rollout and the workers both import it, neither imports the other. vLLM is imported only inside
functions (``# lazy``), so the package imports without it; vLLM itself imports
``toolrl.weights.vllm_worker`` in its worker processes. The package imports nothing itself.
"""
