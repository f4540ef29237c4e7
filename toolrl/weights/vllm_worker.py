"""The receiving end inside vLLM's worker process: `WeightLoaderExtension`, mixed into vLLM's
worker class (``worker_extension_cls``, `toolrl.rollout.engine.WORKER_EXTENSION`).

It runs the push session of `toolrl.weights.staging` (begin, load each staged bucket, finish):
after the session the CPU-packed copy of every vocab embedding is rebuilt (vLLM's reload does
not, and with tied embeddings the lm_head would keep the old weights: a silent log-prob error).
vLLM imports this module in its own worker processes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from toolrl.weights.staging import staged_views

_QUIET = "vllm.model_executor.model_loader.reload.layerwise"


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the worker process.

    ``toolrl_begin_weight_update`` / ``toolrl_load_weight_bucket`` (any number of times) /
    ``toolrl_finish_weight_update`` is one push.
    """

    def toolrl_begin_weight_update(self) -> None:
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self._toolrl_model())
        self._toolrl_loaded = 0

    def toolrl_load_weight_bucket(self, bucket: dict[str, Any]) -> int:
        """Map a staging file and load its tensors (views of the mapping); returns how many."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config

        buf = torch.from_file(bucket["path"], shared=False, size=int(bucket["size"]),
                              dtype=torch.uint8)
        weights = staged_views(buf, bucket["tensors"])
        del buf  # the views keep the mapping for as long as a layer still needs them
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self._toolrl_model().load_weights(iter(weights))
        self._toolrl_loaded = getattr(self, "_toolrl_loaded", 0) + len(weights)
        return len(weights)

    def toolrl_finish_weight_update(self) -> int:
        """Process the layers still pending, restore the untouched ones, rebuild the CPU-packed
        vocab embeddings, drop caches built from the old weights; returns the tensors loaded."""
        # lazy: vLLM is optional and takes seconds to import
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._toolrl_model()
        runner = self.model_runner  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config), _quiet():  # type: ignore[attr-defined]
            # Layers without checkpoint weights (rotary, a tied lm_head) log "Failed to load
            # weights" here on every push: expected, so quieted.
            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if fn is not None:
                fn()
        # vLLM's reload does not rebuild the CPU-packed GEMM copy of the (tied) lm_head.
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, VocabParallelEmbedding):
                    module.quant_method.process_weights_after_loading(module)
        return int(getattr(self, "_toolrl_loaded", 0))

    def toolrl_torch_threads(self) -> int:
        """The torch threads of this worker's forward pass (`EngineConfig.cpu_threads`)."""
        return torch.get_num_threads()

    def _toolrl_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = logging.getLogger(_QUIET)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


__all__ = [
    "WeightLoaderExtension",
]
