"""Thin Energon loader factories for an omnipack dataset (the task encoder does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .task_encoder import OmnipackTaskEncoder


def _worker_config(num_workers: int, rank: int, world_size: int, data_parallel_group: Any) -> Any:
    from megatron.energon import WorkerConfig

    if data_parallel_group is not None:
        return WorkerConfig.default_worker_config(num_workers, data_parallel_group)
    return WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)


def get_train_loader(
    path: str | Path,
    *,
    batch_size: int = 1,
    num_workers: int = 2,
    rank: int = 0,
    world_size: int = 1,
    data_parallel_group: Any = None,
    shuffle_buffer_size: int | None = None,
    max_samples_per_sequence: int | None = None,
    savable: bool = True,
    dataset_options: dict[str, Any] | None = None,
    **encoder_options: Any,
) -> Any:
    """An endless (repeating) Energon loader of ``PackedBatch`` micro-batches of ``batch_size`` rows.

    ``rank``/``world_size`` (or ``data_parallel_group``) are the data-parallel coordinates.
    ``encoder_options`` go to ``OmnipackTaskEncoder.from_dataset`` (tp, cp, cp_rank, sequence_parallel,
    fp8 -- checked against the dataset's alignment -- decode_media, check_media, pixel_dtype, check_rows);
    ``dataset_options`` to Energon's ``get_train_dataset``. ``savable`` returns a loader with
    ``save_state_rank``/``restore_state_rank``.
    """
    from megatron.energon import get_loader, get_savable_loader, get_train_dataset

    ds = get_train_dataset(
        str(path),
        worker_config=_worker_config(num_workers, rank, world_size, data_parallel_group),
        batch_size=batch_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        packing_buffer_size=None,  # rows are packed offline
        task_encoder=OmnipackTaskEncoder.from_dataset(path, **encoder_options),
        **(dataset_options or {}),
    )
    return get_savable_loader(ds) if savable else get_loader(ds)


def get_val_loader(
    path: str | Path,
    *,
    split_part: str = "val",
    batch_size: int = 1,
    num_workers: int = 2,
    rank: int = 0,
    world_size: int = 1,
    data_parallel_group: Any = None,
    dataset_options: dict[str, Any] | None = None,
    **encoder_options: Any,
) -> Any:
    """One deterministic pass over ``split_part`` (``omnipack prepare --val-fraction`` fills "val");
    options as for ``get_train_loader``."""
    from megatron.energon import get_loader, get_val_dataset

    ds = get_val_dataset(
        str(path),
        split_part=split_part,
        worker_config=_worker_config(num_workers, rank, world_size, data_parallel_group),
        batch_size=batch_size,
        task_encoder=OmnipackTaskEncoder.from_dataset(path, **encoder_options),
        **(dataset_options or {}),
    )
    return get_loader(ds)
