"""Task rows: file loaders, a resumable batch loader, BFCL's files and converters of public
function-calling datasets (`toolrl.data.convert`)."""

from toolrl.data.bfcl import category_from_id, is_bfcl_row, load_bfcl
from toolrl.data.bfcl_multi_turn import bfcl_multi_turn_file, load_bfcl_multi_turn
from toolrl.data.check import RowReport, check_rows, normalize_row, row_problems
from toolrl.data.loader import TaskLoader, load_rows

__all__ = ["RowReport", "TaskLoader", "bfcl_multi_turn_file", "category_from_id", "check_rows",
           "is_bfcl_row", "load_bfcl", "load_bfcl_multi_turn", "load_rows", "normalize_row",
           "row_problems"]
