"""The preparation stages as units of work with plain-data inputs and outputs.

measure (``measure.py``): an input part (a range of manifest records) -> ``stages/measure/part-K.parquet``
    and its rejects, keyed by (input file, record);
pack (``pack.py``): the length columns of all parts -> the plan and the shard layout (once, one node);
write (``write.py``): one shard's rows -> its tar, ``.tar.idx`` and record;
finalize (``finalize.py``): the shard records -> ``.nv-meta/``, ``omnipack.json``, ``rejects.jsonl``,
    written last and atomically.

Each unit records its completion with a key (``records.py``: the records' types), and runs through one
helper (``unit.run_once``), so a rerun redoes only what is unfinished or changed; a mapped stage (measure,
write) is a ``unit.Stage`` (units, key, run) that executors (``omnipack.executors``) run anywhere, and the
output never depends on which.
"""
