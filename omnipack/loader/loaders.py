"""Thin Energon loader factories for an omnipack dataset or a metadataset blending several (the task
encoder does the work; ``blend.task_encoder_for`` checks that one encoder serves every blended dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..dataset.location import energon_location
from .blend import task_encoder_for


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

    ``path`` is a prepared dataset directory or an Energon metadataset YAML (``blend`` weights,
    ``blend_epochized`` repetitions, subflavors, nested metadatasets) whose leaves are omnipack datasets;
    every leaf is checked against the first and against the parallel layout (``BlendMismatchError`` names
    the leaf and the field). Either may be remote: ``msc://PROFILE/path``, or a store URL such as
    ``s3://bucket/prefix`` (multi-storage-client's implicit profile; omnipack's ``s3`` extra, ``pip install ".[s3]"`` in its repository).

    ``rank``/``world_size`` (or ``data_parallel_group``) are the data-parallel coordinates.
    ``encoder_options`` go to ``OmnipackTaskEncoder.from_dataset`` (tp, cp, cp_rank, sequence_parallel,
    fp8 -- checked against the dataset's alignment -- decode_media, check_media, pixel_dtype, audio_features,
    check_rows, reuse_buffers);
    ``dataset_options`` to Energon's ``get_train_dataset``. ``savable`` returns a loader with
    ``save_state_rank``/``restore_state_rank``.
    """
    from megatron.energon import get_loader, get_savable_loader, get_train_dataset

    options = dict(dataset_options or {})
    path = energon_location(path)
    te = task_encoder_for(path, split_part=options.get("split_part", "train"), **encoder_options)
    ds = get_train_dataset(
        str(path),
        worker_config=_worker_config(num_workers, rank, world_size, data_parallel_group),
        batch_size=batch_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        packing_buffer_size=None,  # rows are packed offline
        task_encoder=te,
        **options,
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
    """One deterministic pass over ``split_part`` (``omnipack prepare --val-fraction`` fills "val") of a
    dataset or a metadataset's ``split_part`` split; options as for ``get_train_loader``."""
    from megatron.energon import get_loader, get_val_dataset

    path = energon_location(path)
    ds = get_val_dataset(
        str(path),
        split_part=split_part,
        worker_config=_worker_config(num_workers, rank, world_size, data_parallel_group),
        batch_size=batch_size,
        task_encoder=task_encoder_for(path, split_part=split_part, **encoder_options),
        **(dataset_options or {}),
    )
    return get_loader(ds)
