"""Task rows: file loaders and a resumable batch loader."""

from toolrl.data.loader import TaskLoader, load_rows

__all__ = ["TaskLoader", "load_rows"]
