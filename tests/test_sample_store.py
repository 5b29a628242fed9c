"""Repack without re-decoding: the write stage keeps each processed media payload once in a sample store,
and a repack (other seq length, parallel layout, seed, packing limits) copies the stored bytes instead of
decoding and resizing again; the dataset is byte-identical to a fresh prepare with the same settings."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import tarfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import xxhash

import omnipack.stages.write as write_stage
import omnipack.text.chat as chat
from omnipack.pipeline import PrepareConfig, run_prepare
from omnipack.tools.verify import run_verify


@pytest.fixture
def corpus(tmp_path, demo_corpus):
    """A private copy of the demo corpus: the tests move its media away during a repack."""
    manifest, media = demo_corpus
    copy = tmp_path / "corpus"
    shutil.copytree(media, copy / "media")
    shutil.copy(manifest, copy / "manifest.jsonl")
    return copy / "manifest.jsonl", copy / "media"


@pytest.fixture
def decodes(monkeypatch):
    """Counts the write stage's media decodes (one process: the local executor runs one worker inline)."""
    calls = []
    real = write_stage.materialize

    def counting(source, *args, **kwargs):
        calls.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(write_stage, "materialize", counting)
    return calls


@pytest.fixture
def hashed(monkeypatch):
    """How often each buffer (by its sha1) went through xxh3-64, the row's media digest and the store's check."""
    seen: Counter[bytes] = Counter()
    real, real_int = xxhash.xxh3_64, xxhash.xxh3_64_intdigest

    class Counting:
        def __init__(self) -> None:
            self._h = real()

        def update(self, data) -> None:
            seen[hashlib.sha1(data).digest()] += 1
            self._h.update(data)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

    def counting_int(data, *args) -> int:
        seen[hashlib.sha1(data).digest()] += 1
        return real_int(data, *args)

    monkeypatch.setattr(xxhash, "xxh3_64", Counting)
    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", counting_int)
    return seen


def media_members(root: Path) -> Counter[bytes]:
    """Each stored media payload of a dataset's shards (by its sha1), and how many rows hold it."""
    found: Counter[bytes] = Counter()
    for path in root.rglob("*.tar"):
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                if ".media." in m.name:
                    found[hashlib.sha1(tar.extractfile(m).read()).digest()] += 1
    return found


def _prepare(out: Path, tokenizer: Path, corpus: tuple[Path, Path], **kw) -> dict:
    manifest, media = corpus
    cfg = PrepareConfig(
        manifest=[str(manifest)], media_root=str(media), tokenizer=str(tokenizer), output=str(out),
        progress=False, **kw,
    )  # fmt: skip
    return run_prepare(cfg)


def dataset_bytes(root: Path) -> dict[str, bytes]:
    """Every shard, index and Energon metadata file of a dataset (not the run's own records)."""
    skip = ("stages/", ".nv-meta/omnipack.json")
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith(skip) and p.suffix != ".parquet"
    }


def test_repack_copies_stored_payloads_and_matches_a_fresh_prepare(
    tmp_path, demo_tokenizer, corpus, decodes, hashed, monkeypatch
):
    fresh = tmp_path / "fresh"
    _prepare(fresh, demo_tokenizer, corpus, seq_length=2048, cp=2, sample_store="off")
    decoded_fresh = len(decodes)
    assert decoded_fresh > 0

    repacked = tmp_path / "repacked"
    hashed.clear()
    _prepare(repacked, demo_tokenizer, corpus, seq_length=4096, seed=3)
    assert len(list((repacked / "stages" / "samples").rglob("*.bin"))) >= 1
    # one xxh3 per stored payload: the store keeps the digest the row's meta.json records
    stored = media_members(repacked)
    assert stored and {k: hashed[k] for k in stored} == stored
    decodes.clear()
    hashed.clear()
    media = corpus[1]
    hidden = media.with_name("media-away")
    media.rename(hidden)  # any decode now fails: the repack must not read the media at all
    loaded = []  # nor load the tokenizer: the earlier run recorded what the run takes from it
    real_init = chat.ChatTokenizer.__init__

    def counting_init(self, *args, **kwargs):
        loaded.append(args[0])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(chat.ChatTokenizer, "__init__", counting_init)
    try:
        summary = _prepare(repacked, demo_tokenizer, corpus, seq_length=2048, cp=2, from_stage="pack")
    finally:
        hidden.rename(media)
    assert decodes == []
    assert loaded == []
    assert summary["tokenizer"] == json.loads((fresh / ".nv-meta" / "omnipack.json").read_text())["tokenizer"]
    assert summary["counts"]["rows"] > 0
    # no xxh3-64 of a copied payload: its segment's stamp is the committed one, so the store's recorded xxh3
    # is the row's digest unchecked (the shard's xxh3-128 is the payload's one pass)
    copied = media_members(repacked)
    assert copied and {k: hashed[k] for k in copied} == dict.fromkeys(copied, 0)
    want, got = dataset_bytes(fresh), dataset_bytes(repacked)
    assert any(k.endswith(".tar") for k in want)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    failed = {r.name: r.failures for r in run_verify(repacked, progress=False) if r.status == "fail"}
    assert not failed, failed


def test_changed_pixel_settings_do_not_reuse_stored_payloads(tmp_path, demo_tokenizer, corpus, decodes):
    """The store's keys hold what shapes a payload: a repack with other settings decodes again."""
    fresh = tmp_path / "fresh"
    _prepare(fresh, demo_tokenizer, corpus, seq_length=2048, image_encoding="png", sample_store="off")
    out = tmp_path / "out"
    _prepare(out, demo_tokenizer, corpus, seq_length=2048)
    decodes.clear()
    _prepare(out, demo_tokenizer, corpus, seq_length=2048, image_encoding="png", from_stage="pack")
    assert len(decodes) > 0
    want, got = dataset_bytes(fresh), dataset_bytes(out)
    assert [k for k in want if got.get(k) != want[k]] == []


def test_a_shared_store_keys_payloads_by_profile_options(tmp_path, demo_tokenizer, corpus, decodes):
    """Two packings share one ``--sample-store``: other profile options (another image size) never take the
    first packing's payloads, the same options take all of them."""
    store = tmp_path / "store"
    small = {"max_pixels": 50176}
    fresh = tmp_path / "fresh"
    _prepare(fresh, demo_tokenizer, corpus, profile_options=small, sample_store="off")
    _prepare(tmp_path / "first", demo_tokenizer, corpus, sample_store=str(store))
    decodes.clear()
    second = tmp_path / "second"
    _prepare(second, demo_tokenizer, corpus, profile_options=small, sample_store=str(store))
    assert len(decodes) > 0
    want, got = dataset_bytes(fresh), dataset_bytes(second)
    assert [k for k in want if got.get(k) != want[k]] == []
    decodes.clear()
    _prepare(tmp_path / "third", demo_tokenizer, corpus, profile_options=small, seed=5, sample_store=str(store))
    assert decodes == []
    assert len([p for p in store.iterdir() if p.is_dir()]) == 2  # one folder per payload shape


def test_a_second_packing_into_another_folder_copies_the_shared_store_and_matches_a_fresh_prepare(
    tmp_path, demo_tokenizer, corpus, decodes
):
    """Packings side by side (other seq length, parallel layout, seed) into their own folders, one
    ``--sample-store``: the second decodes nothing and writes the bytes of a fresh prepare with its settings."""
    store = tmp_path / "store"
    fresh = tmp_path / "fresh"
    _prepare(fresh, demo_tokenizer, corpus, seq_length=2048, cp=2, seed=3, sample_store="off")
    _prepare(tmp_path / "first", demo_tokenizer, corpus, seq_length=4096, sample_store=str(store))
    decodes.clear()
    second = tmp_path / "second"
    _prepare(second, demo_tokenizer, corpus, seq_length=2048, cp=2, seed=3, sample_store=str(store))
    assert decodes == []
    assert not (second / "stages" / "samples").exists()  # its payloads stay in the shared store only
    want, got = dataset_bytes(fresh), dataset_bytes(second)
    assert any(k.endswith(".tar") for k in want)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


def test_each_run_opens_its_own_store_and_a_worker_gets_it_unopened(tmp_path, demo_tokenizer, corpus):
    """The store lives on the run's spec, not in the process: a second run in this process over an overwritten
    output (its store folder removed and made again) keeps its payloads in the new folder, and a spec pickled
    to a worker carries no open store (each worker maps its own)."""
    from omnipack.pipeline import build_spec

    manifest, media = corpus
    small = manifest.with_name("small.jsonl")
    small.write_text("\n".join(manifest.read_text().splitlines()[:8]) + "\n")  # 8 sound samples, 5 images
    out = tmp_path / "out"
    _prepare(out, demo_tokenizer, (small, media))
    first = sorted(p.name for p in (out / "stages" / "samples").rglob("*.parquet"))
    _prepare(out, demo_tokenizer, (small, media), seed=3, overwrite=True)
    again = sorted(p.name for p in (out / "stages" / "samples").rglob("*.parquet"))
    assert first and again and set(first).isdisjoint(again)  # written anew by the second run
    cfg = PrepareConfig(
        manifest=[str(small)], media_root=str(media), tokenizer=str(demo_tokenizer), output=str(out), progress=False
    )
    spec = build_spec(cfg)
    store = write_stage.sample_store(spec)
    assert store is not None and store is write_stage.sample_store(spec)  # once per run and process
    assert store.folder.parent == out / "stages" / "samples"
    assert write_stage.sample_store(replace(spec)) is not store  # another run's spec: opened anew
    store.refresh_index()  # the run's segments merged, and one of them mapped in this process
    store.load_index()
    assert store.get((int(store._index.key0[0]), int(store._index.key1[0]))) is not None
    shipped = pickle.loads(pickle.dumps(spec))  # as the local executor ships it to its workers
    assert shipped == spec
    assert write_stage.sample_store(shipped) is not store


def _damage_a_payload(store_root: Path, keep_stamp: bool) -> None:
    """Flip a byte inside the first stored payload of a segment; with ``keep_stamp``, record the damaged file's
    stamp as its commit's (a damage no stamp shows, such as bit rot under an unchanged inode)."""
    import pyarrow.parquet as pq

    from omnipack.stages.records import output_stamp

    index = sorted(store_root.rglob("segments/*.parquet"))[0]
    segment = index.with_suffix(".bin")
    table = pq.ParquetFile(index).read()
    at = int(table.column("offset")[0].as_py()) + int(table.column("length")[0].as_py()) // 2
    with open(segment, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_stamp:
        meta = {**table.schema.metadata, b"stamp": json.dumps(output_stamp(segment)).encode()}
        pq.write_table(table.replace_schema_metadata(meta), index)
        for merged in store_root.rglob("index-*.arrow"):  # merged again with the stamp now recorded
            merged.unlink()


@pytest.mark.parametrize("keep_stamp", [False, True])
def test_a_damaged_store_is_decoded_again_or_caught_by_verify(
    tmp_path, demo_tokenizer, corpus, decodes, keep_stamp
):
    """A stored payload changed on disk after its segment's commit: when the segment's stamp moved (any write
    moves its ctime) the payload is checked, found damaged and decoded again, and the repack still equals a
    fresh prepare; a damage the stamp does not show is copied unchecked, and ``verify`` fails the row (its
    meta.json's media digest is the payload's recorded xxh3)."""
    fresh, out = tmp_path / "fresh", tmp_path / "out"
    _prepare(fresh, demo_tokenizer, corpus, seq_length=2048, sample_store="off")
    _prepare(out, demo_tokenizer, corpus, seq_length=4096)
    _damage_a_payload(out / "stages" / "samples", keep_stamp)
    decodes.clear()
    _prepare(out, demo_tokenizer, corpus, seq_length=2048, from_stage="pack")
    failed = {r.name: r.failures for r in run_verify(out, progress=False) if r.status == "fail"}
    want, got = dataset_bytes(fresh), dataset_bytes(out)
    if not keep_stamp:
        assert len({d.ref for d in decodes}) == 1  # the damaged item (in every sample that holds it)
        assert [k for k in want if got.get(k) != want[k]] == []
        assert not failed, failed
    else:
        assert decodes == []
        assert [k for k in want if got.get(k) != want[k]] != []
        assert list(failed) == ["content"], failed
        assert all("bytes differ from what was written" in f for f in failed["content"]), failed


def test_store_segments_merge_into_one_index_and_damaged_payloads_read_as_absent(tmp_path):
    from omnipack.dataset.contract import media_digest
    from omnipack.stages.sample_store import SampleStore, item_key

    store = SampleStore.at(tmp_path / "store", {"format": 1, "profile": "p"})
    keys = [item_key(None, f"img{i}.jpg", {"target_hw": [28, 28]}) for i in range(5)]
    payloads = [bytes([i]) * (100 + i) for i in range(3)] + [b"z" * 7, b"never committed"]
    first, second = store.writer("shard-000000"), store.writer("shard-000001")
    for i, k in enumerate(keys[:3]):
        first.put(k, "npy", payloads[i], media_digest(payloads[i]))
    second.put(keys[2], "npy", payloads[2], media_digest(payloads[2]))  # stored by two units: one index entry
    second.put(keys[3], "npz", payloads[3], media_digest(payloads[3]))
    first.commit()
    second.commit()
    third = store.writer("shard-000002")
    third.put(keys[4], "npy", payloads[4], media_digest(payloads[4]))  # a unit killed before its commit
    store.load_index()
    assert store.get(keys[0]) is None  # nothing merged yet
    store.refresh_index()
    store.load_index()

    def read(key):  # (ext, bytes), and the place and digest the payload is copied by are its own
        got = store.get(key)
        if got is None:
            return None
        ext, payload = got
        with open(payload.path, "rb") as f:
            f.seek(payload.offset)
            assert f.read(len(payload)) == payload.data
        assert payload.digest == media_digest(payload.data)
        return ext, payload.data

    assert [read(k) for k in keys] == [
        ("npy", b"\x00" * 100), ("npy", b"\x01" * 101), ("npy", b"\x02" * 102), ("npz", b"z" * 7), None,
    ]  # fmt: skip
    assert store.refresh_index() == store.refresh_index()  # unchanged segments: the same merged index
    assert len(list(store.folder.glob("index-*.arrow"))) == 1
    # a payload changed on disk after it was indexed is absent (decoded again), never copied
    segment = next(p for p in store.segments.glob("shard-000000-*.bin"))
    data = bytearray(segment.read_bytes())
    data[150] ^= 0xFF
    segment.write_bytes(bytes(data))
    store.close_files()
    assert store.get(keys[1]) is None
    assert read(keys[0]) == ("npy", b"\x00" * 100)


def test_repack_copies_the_processor_tensors_of_the_hf_profile(tmp_path, decodes):
    """The hf profile stores its processor's tensors (npz): a repack copies them too, byte for byte."""
    from omnipack.cli import main
    from tests.test_profile_hf import _corpus, build_llava_model_dir

    model = build_llava_model_dir(tmp_path / "model")
    manifest, media, _ = _corpus(tmp_path / "src")

    def prepare(out: Path, seq_length: int, *extra: str) -> None:
        args = [
            "prepare", "--manifest", str(manifest), "--media-root", str(media), "--model", str(model),
            "-o", str(out), "--seq-length", str(seq_length), "--shard-max-rows", "2", "--no-progress", *extra,
        ]  # fmt: skip
        assert main(args) == 0

    prepare(tmp_path / "fresh", 1024, "--sample-store", "off")
    out = tmp_path / "out"
    prepare(out, 2048)
    decodes.clear()
    hidden = media.with_name("away")
    media.rename(hidden)
    try:
        prepare(out, 1024, "--from-stage", "pack")
    finally:
        hidden.rename(media)
    assert decodes == []
    want, got = dataset_bytes(tmp_path / "fresh"), dataset_bytes(out)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


def test_an_object_store_url_as_sample_store_is_refused_before_any_work(
    tmp_path, demo_tokenizer, corpus, monkeypatch
):
    # Path("s3://bucket/samples") is the relative folder s3:/bucket/samples: nothing may appear in the cwd
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ValueError, match="--sample-store must be a local or mounted folder"):
        _prepare(tmp_path / "out", demo_tokenizer, corpus, sample_store="s3://bucket/samples")
    assert not (tmp_path / "out").exists()
    assert list(cwd.iterdir()) == []


def _resident_bytes(address: int) -> int:
    """The resident bytes of this process's mapping that starts at ``address`` (``/proc/self/smaps``)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    start = f"{address:x}-"
    for i, line in enumerate(lines):
        if line.startswith(start):
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc")
def test_populate_maps_the_pages_of_the_payload_and_no_others(tmp_path):
    """A stored payload's pages are mapped in one call before the shard's hash reads them, through libc's
    madvise (which releases the GIL, unlike ``mmap.madvise``), at the map's address: the payload's pages,
    not the whole file."""
    import mmap

    from omnipack.stages.sample_store import MADV_POPULATE_READ, _address, _libc_madvise, _populate

    assert _libc_madvise() is not None
    path = tmp_path / "segment.bin"
    path.write_bytes(b"\x01" * (16 << 20))
    with open(path, "rb") as f:
        probe = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if _libc_madvise()(_address(probe), mmap.PAGESIZE, MADV_POPULATE_READ) != 0:
        pytest.skip("MADV_POPULATE_READ needs Linux >= 5.14")  # EINVAL: an advice the kernel does not know
    probe.close()
    address = _address(mapped)
    assert _resident_bytes(address) == 0
    start, length = (3 << 20) + 100, 2 << 20
    _populate(mapped, address, start, length)
    # the page cache may hold the file in folios of up to 2 MiB (ext4's large folios), mapped whole
    assert length <= _resident_bytes(address) <= length + 2 * (2 << 20) < len(mapped)
    mapped.close()


def test_rows_built_on_several_threads_give_the_same_shards_and_store(tmp_path, demo_tokenizer, corpus, monkeypatch):
    """A worker with spare CPUs builds a unit's rows on several threads (``WorkerContext.cpus``): the shards
    and the sample store's segments are those of one builder, byte for byte (the store keeps new payloads
    in row order, whichever thread decoded them), and several threads did build."""
    import threading

    import omnipack.executors.local as local

    builders: dict[int, set[str]] = {1: set(), 3: set()}
    run = {"cpus": 1}
    real = write_stage.build_row

    def build_row(*args, **kwargs):
        builders[run["cpus"]].add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(write_stage, "build_row", build_row)
    got = {}
    for cpus in (1, 3):
        run["cpus"] = cpus
        monkeypatch.setattr(local, "available_cpus", lambda cpus=cpus: cpus)  # the inline worker's CPUs
        out = tmp_path / f"cpus{cpus}"
        _prepare(out, demo_tokenizer, corpus, seq_length=4096, shard_max_rows=3)
        segments = sorted((out / "stages" / "samples").rglob("*.bin"))
        assert segments
        got[cpus] = dataset_bytes(out), [p.read_bytes() for p in segments]
    assert got[3] == got[1]
    pool_threads = {cpus: {name for name in names if name.startswith("omnipack-write")} for cpus, names in builders.items()}
    assert len(pool_threads[1]) == 1 and len(pool_threads[3]) > 1, builders
