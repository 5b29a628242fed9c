"""The accounting ledger a dataset publishes: where every input sample went, row or reject.

``.nv-meta/accounting.parquet`` holds one entry per input sample, in input order (``sample_index`` 0..N-1):
its id and source, and either its place (``row``: the row's key as a number, the row stored under
``f"{row:09d}"``; ``position``: its index among the samples of that row) or why it was left out
(``stage`` and ``reason``, as in ``rejects.jsonl``). Finalize writes it with the rest of ``.nv-meta``, so it
appears with the dataset; ``omnipack verify`` checks the shards and ``rejects.jsonl`` against it, from the
dataset's own files (no scratch files of the run that made it). Energon reads only the files it knows in
``.nv-meta``, so the extra file does not disturb it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ACCOUNTING_FILE = "accounting.parquet"
LEDGER_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int64()),
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("row", pa.int64()),  # null: rejected
        ("position", pa.int32()),  # null: rejected
        ("stage", pa.string()),  # null: packed
        ("reason", pa.string()),  # null: packed
    ]
)


ROW_GROUP = 1 << 16  # entries per row group


class LedgerWriter:
    """Appends ledger entries (tables of ``LEDGER_SCHEMA``, or of ``schema``, in input order) to a Parquet
    file in row groups of ``ROW_GROUP`` entries whatever the tables given, so the file's bytes depend on its
    entries alone (not on how the input was split into parts)."""

    def __init__(self, path: Path, schema: pa.Schema = LEDGER_SCHEMA) -> None:
        self._schema = schema
        self._writer = pq.ParquetWriter(path, schema)
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        """Append ``table``'s entries; a column it lacks is null (placed samples have no stage, say)."""
        n = table.num_rows
        columns = [
            table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in self._schema
        ]
        self._pending.append(pa.Table.from_arrays(columns, schema=self._schema))
        self._rows += table.num_rows
        if self._rows >= ROW_GROUP:
            self._flush(whole_groups=True)

    def _flush(self, whole_groups: bool) -> None:
        table = pa.concat_tables(self._pending)
        n = table.num_rows - table.num_rows % ROW_GROUP if whole_groups else table.num_rows
        for start in range(0, n, ROW_GROUP):
            group = table.slice(start, min(ROW_GROUP, n - start)).combine_chunks()
            self._writer.write_table(group, row_group_size=ROW_GROUP)
        self._pending, self._rows = [table.slice(n)], table.num_rows - n

    def close(self) -> None:
        if self._rows:
            self._flush(whole_groups=False)
        self._writer.close()


def read_ledger(path: Path, schema: pa.Schema = LEDGER_SCHEMA) -> pa.Table:
    """The ledger (or another table ``LedgerWriter`` wrote with ``schema``) with its schema checked (a
    ``ValueError`` names what is wrong with the file, a ``FileNotFoundError`` says it is not there)."""
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"unreadable: {e}") from None
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ValueError(f"lacks the columns {missing}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"columns of unexpected types: {e}") from None
