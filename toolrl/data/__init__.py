"""Task rows: file loaders, a resumable batch loader, BFCL's files and converters of public
function-calling datasets (`toolrl.data.convert`)."""

from toolrl.data.bfcl import category_from_id, is_bfcl_row, load_bfcl
from toolrl.data.check import RowReport, check_rows, normalize_row, row_problems
from toolrl.data.loader import TaskLoader, load_rows

__all__ = ["RowReport", "TaskLoader", "category_from_id", "check_rows", "is_bfcl_row",
           "load_bfcl", "load_rows", "normalize_row", "row_problems"]
