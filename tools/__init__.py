"""Development tools of the toolrl repository (not part of the `toolrl` distribution).

- `gpu_scheduler`: pack test files onto free GPUs by their declared need
  (``python -m tools.gpu_scheduler tests/ --devices auto -- -m "gpu or e2e"``).
"""
