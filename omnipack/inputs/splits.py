"""Splits of a folder input, named as the Hugging Face Hub names them, and the choice of the one to read.

A Hub dataset folder names its splits by file and folder names (``datasets.data_files``): first
``data/{split}-NNNNN-of-NNNNN.*`` (any split name), else a folder or file name holding a split keyword
(``train``/``training``; ``validation``/``valid``/``dev``/``val``; ``test``/``testing``/``eval``/``evaluation``)
between separators (``-._ `` or digits), else no split (the whole folder). A ``save_to_disk`` ``DatasetDict``
lists its splits in ``dataset_dict.json`` (see ``arrow.py``). One split is read: ``--split``, or ``train``,
or the only one; a folder with several and none of them ``train`` needs ``--split``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .records import InputError

DEFAULT_SPLIT = "train"
# canonical split -> the keywords that name it in file and folder names, in the Hub's order
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEP = r"[-._ 0-9]"
_SHARDED = re.compile(r"^data/(?P<split>\w+(?:\.\w+)*)-\d{5}-of-\d{5}[^/]*\.[^/]*$")


def _keyword_re(keyword: str, *, dir_name: bool) -> re.Pattern[str]:
    # a folder name is the keyword, or holds it after a separator or before one; a file name holds it
    # followed by a separator (``train.jsonl``, ``llava-train-0.parquet``)
    after = f"(?:{_SEP}.*)?" if dir_name else f"{_SEP}.*"
    return re.compile(f"^(?:.*{_SEP})?{re.escape(keyword)}{after}$")


_IN_DIR = {s: [_keyword_re(k, dir_name=True) for k in kws] for s, kws in SPLIT_KEYWORDS.items()}
_IN_NAME = {s: [_keyword_re(k, dir_name=False) for k in kws] for s, kws in SPLIT_KEYWORDS.items()}


def _hidden(rel: Path) -> bool:
    """Hidden files and folders, and ``__special__`` folders: the Hub's loader skips them (e.g. a download
    cache's ``.cache/`` with half-written files)."""
    return any(p.startswith(".") or p.startswith("__") for p in rel.parts[:-1]) or rel.name.startswith(".")


def _hub_order(names: set[str]) -> list[str]:
    return [s for s in SPLIT_KEYWORDS if s in names] + sorted(names - set(SPLIT_KEYWORDS))


def find_splits(root: Path, files: list[Path]) -> dict[str, list[Path]]:
    """The splits that the names of ``files`` (a folder's data files) give, as the Hub's loader finds them:
    ``{split: files}`` in the Hub's split order, files in their given order; ``{}`` when no name gives one."""
    rels = [(f, f.relative_to(root)) for f in files]
    rels = [(f, r) for f, r in rels if not _hidden(r)]
    sharded: dict[str, list[Path]] = {}
    in_data = root.resolve().name == "data"  # the input is a Hub dataset's data/ folder itself
    for f, r in rels:
        m = _SHARDED.match(f"data/{r.as_posix()}" if in_data else r.as_posix())
        if m:
            sharded.setdefault(m["split"], []).append(f)
    if sharded:
        return {s: sharded[s] for s in _hub_order(set(sharded))}
    for patterns, parts in ((_IN_DIR, lambda r: r.parts[:-1]), (_IN_NAME, lambda r: r.parts[-1:])):
        found = {
            split: [f for f, r in rels if any(p.match(part) for p in pats for part in parts(r))]
            for split, pats in patterns.items()
        }
        found = {s: fs for s, fs in found.items() if fs}
        if found:
            return found
    return {}


@dataclass(frozen=True)
class SplitChoice:
    """What one input path reads: its files of the chosen split (``split`` None: the input names no split,
    all of it is read), and what it leaves (the other splits' files, and files in no split)."""

    path: Path
    split: str | None
    files: list[Path]
    others: dict[str, list[Path]] = field(default_factory=dict)
    unsplit: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        """One line for the run's log: which files of which split it takes, and what it leaves."""
        where = f"input {self.path}"
        taken = f"{_files(self.files)}: {_names(self.path, self.files)}"
        line = f"{where}: {taken}" if self.split is None else f"{where}: split {self.split!r}, {taken}"
        if self.others:
            line += "; not read: " + ", ".join(f"split {s!r} ({_files(fs)})" for s, fs in self.others.items())
        if self.unsplit:
            line += f"; in no split (not read): {_names(self.path, self.unsplit)}"
        return line


def _files(files: list[Path]) -> str:
    return f"{len(files)} file{'s' * (len(files) != 1)}"


def _names(root: Path, files: list[Path], most: int = 4) -> str:
    rel = [f.relative_to(root).as_posix() if root.is_dir() else f.name for f in files]
    return ", ".join(rel[:most]) + (f", ... ({len(rel) - most} more)" if len(rel) > most else "")


def _canonical(name: str, splits: dict[str, list[Path]]) -> str | None:
    if name in splits:
        return name
    return next((s for s, kws in SPLIT_KEYWORDS.items() if name in kws and s in splits), None)


def choose_split(
    path: Path, files: list[Path], splits: dict[str, list[Path]] | None, requested: str | None
) -> SplitChoice:
    """The split of a folder input to read (``splits``: its splits, ``{}`` when it names none; None for a
    file input, which is read as given). Raises :class:`InputError` naming the input's splits when the
    requested one is not there, or when there are several, none of them ``train``, and no request."""
    if splits is None:
        return SplitChoice(path, None, files)
    hidden = [f for f in files if _hidden(f.relative_to(path))]
    if not splits:
        if requested not in (None, DEFAULT_SPLIT):  # the Hub reads such a folder as its train split
            raise InputError(
                f"input {path}: no split {requested!r}: its file names name no split, so all of it is one "
                f"({DEFAULT_SPLIT!r}); leave out --split to read it"
            )
        return SplitChoice(path, None, [f for f in files if f not in hidden], unsplit=hidden)
    names = ", ".join(splits)
    if requested is not None:
        split = _canonical(requested, splits)
        if split is None:
            raise InputError(f"input {path}: no split {requested!r}; its splits: {names} (--split)")
    elif DEFAULT_SPLIT in splits or len(splits) == 1:
        split = DEFAULT_SPLIT if DEFAULT_SPLIT in splits else next(iter(splits))
    else:
        raise InputError(f"input {path} holds the splits {names} and none is {DEFAULT_SPLIT!r}: choose one with --split")
    in_any = {f for fs in splits.values() for f in fs}
    others = {s: fs for s, fs in splits.items() if s != split}
    return SplitChoice(path, split, splits[split], others, [f for f in files if f not in in_any])
