"""Task rows: file loaders, a resumable batch loader, BFCL's files and converters of public
function-calling datasets (`toolrl.data.convert`)."""

from toolrl.data.loader import TaskLoader, load_rows

__all__ = ["TaskLoader", "load_rows"]
