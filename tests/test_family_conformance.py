"""The family conformance kit: every registered family (``available_profiles()``) runs every check.

Per family: the interface is complete (``ModelProfile`` / ``EncoderInputs``, documented in their modules);
token ids of a conversation with one item of every kind it takes equal its HF processor's (the reference it
registers in ``tests/references/<family>.py``) and the labels supervise exactly the assistant answers; and
one small demo dataset, prepared once per session, passes ``omnipack verify``, keeps the packed-row contract
in every row, and loads in a trainer-only process (the prepare stack blocked) bit for bit as in the full
install, at cp=1 and on each rank of cp=2 (``tests/trainer_only_check.py``). Nothing here names a family.
"""

from __future__ import annotations

import ast
import inspect
import json
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from omnipack.profiles import available_profiles, get_encoder_inputs, get_profile, profile_class
from omnipack.profiles.base import ModelProfile
from omnipack.profiles.model_inputs import EncoderInputs, MediaInputOptions
from tests import trainer_only_check
from tests.family_kit import ANSWERS, conversation, family_profile, kit_media, reference, supervised_runs

pytest.importorskip("transformers")

ROOT = Path(__file__).parents[1]
# discovered: a family module is all it takes to be checked (the processor-backed profile needs a model folder
# to plan anything: tests/test_profile_hf.py checks it on real checkpoints)
FAMILIES = [n for n in available_profiles() if not profile_class(n).processor_backed]


@pytest.fixture(scope="session", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def prepared(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``OUT`` with the family's demo dataset in ``OUT/<family>`` and ``OUT/expected.json`` (its batches'
    digests in this, the full, install), as ``trainer_only_check.py check-family`` reads them."""
    out = tmp_path_factory.mktemp(f"kit_{family}")
    expected = {family: trainer_only_check.prepare_family(out, family)}
    (out / "expected.json").write_text(json.dumps(expected))
    return out


def test_families_are_discovered():
    assert FAMILIES, "no family module found"
    assert "base" not in FAMILIES and "model_inputs" not in FAMILIES


def test_interface_is_complete(family):
    cls = profile_class(family)
    assert issubclass(cls, ModelProfile) and not inspect.isabstract(cls), inspect.getmembers(cls)
    inputs_cls = cls.inputs_class
    assert issubclass(inputs_cls, EncoderInputs) and not inspect.isabstract(inputs_cls)
    assert cls.name == inputs_cls.name == family
    planner = cls()
    assert planner.kinds and set(planner.kinds) <= {"image", "video", "audio"}
    for kind in planner.kinds:  # every kind the template writes is planned by the family itself
        assert getattr(cls, f"plan_{kind}") is not getattr(ModelProfile, f"plan_{kind}"), kind
        assert inputs_cls.placeholder_tokens.get(kind), f"no placeholder tokens for {kind}"
    assert inputs_cls.batch_keys and set(inputs_cls.pixel_keys) <= set(inputs_cls.batch_keys)
    assert planner.turn_end in planner.special_tokens()
    settings = planner.settings()
    assert json.loads(json.dumps(settings)) == settings  # recorded in omnipack.json as is
    inputs = get_encoder_inputs(family, settings)
    norm = inputs.pixel_normalization()
    assert norm is None or (len(norm[0]) == len(norm[1]) == 3)
    repeats = inputs.pixel_repeats("uint8")
    assert set(repeats) <= set(inputs_cls.pixel_keys) and all(r > 1 for r in repeats.values())


def test_token_ids_match_the_hf_processor_and_labels_the_answers(family, tmp_path):
    from transformers import AutoTokenizer

    from omnipack.text.chat import ChatTokenizer

    ref = reference(family)
    profile = family_profile(family, ref)
    tok_dir = ref.tokenizer(tmp_path / "tokenizer", family)
    media = kit_media(tmp_path / "media", profile)
    assert [m.kind for m in media] == list(sorted(profile.kinds, key=("image", "video", "audio").index))
    messages = conversation(media)
    enc = ChatTokenizer(tok_dir, profile, mrope=profile.uses_mrope()).encode(messages, [m.plan for m in media])
    want = ref.hf_input_ids(tok_dir, messages, media, profile)
    assert enc.input_ids.tolist() == want
    assert [s.num_placeholders for s in enc.spans] == [m.plan.num_tokens for m in media]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    runs = [tok.decode(r) for r in supervised_runs(enc.input_ids, enc.labels)]
    assert runs == [a + profile.turn_end for a in ANSWERS]


def test_dataset_passes_verify(prepared, family):
    from omnipack.tools.verify import run_verify

    results = run_verify(prepared / family, progress=False)
    failed = {r.name: r.failures for r in results if r.status == "fail"}
    assert not failed, failed


def test_every_row_keeps_the_packed_row_contract(prepared, family):
    from omnipack.dataset.codec import decode_row
    from omnipack.dataset.contract import row_contract_errors
    from omnipack.dataset.meta import read_omnipack_meta
    from omnipack.profiles.hf_config import dataset_placeholder_ids
    from tests.test_pipeline import read_rows_from_tars

    meta = read_omnipack_meta(prepared / family)
    placeholder_ids, source = dataset_placeholder_ids(meta, get_profile(family))
    assert placeholder_ids is not None, source
    rows = read_rows_from_tars(prepared / family)
    kinds = set()
    for key, parts in rows.items():
        row, _ = decode_row(parts)
        assert row_contract_errors(row, int(meta["align"]), placeholder_ids) == [], key
        kinds |= {m.kind for m in row.media}
    assert kinds == set(get_profile(family).kinds)  # the dataset exercises every kind the family takes


def test_stored_media_give_the_planned_features_under_every_option(prepared, family):
    """Each stored item's features equal its row's placeholder count, and the loader's option variants
    (eager or deferred, float32 or uint8, compact) give the same normalized batch."""
    import torch

    from omnipack.dataset.codec import decode_row
    from omnipack.loader.media import decode_payload, expand_temporal, normalize_pixels
    from tests.test_pipeline import read_rows_from_tars

    inputs = get_profile(family).inputs()
    items = []
    for parts in read_rows_from_tars(prepared / family).values():
        row, _ = decode_row(parts)
        for m in row.media:
            payload = decode_payload(m.part, parts[m.part])
            assert inputs.feature_count(m, payload) == m.num_tokens
            items.append((m, payload))
    plain = MediaInputOptions()
    want = inputs.collate_media([inputs.media_inputs(m, p, plain) for m, p in items], plain)
    assert set(want) <= set(inputs.batch_keys)
    variants = [MediaInputOptions(deferred=True)]
    norm = inputs.pixel_normalization()
    if norm is not None:
        variants.append(MediaInputOptions(pixel_dtype="uint8", deferred=True, compact=True))
    for options in variants:
        got = inputs.collate_media([inputs.media_inputs(m, p, options) for m, p in items], options)
        assert got.keys() == want.keys(), options
        for k, v in got.items():
            v = torch.as_tensor(v)
            if v.dtype == torch.uint8 and k in inputs.pixel_keys:
                v = normalize_pixels(v, *norm)
                if options.compact and k in inputs.pixel_repeats("uint8"):
                    v = expand_temporal(v, 3, inputs.pixel_repeats("uint8")[k])
            assert torch.equal(v, torch.as_tensor(want[k])), (options, k)


CHECK_TIMEOUT_S = 600  # one family's check; a hung one fails its test and ends the server


@pytest.fixture(scope="module")
def trainer_checks(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[Path, str], subprocess.CompletedProcess]]:
    """``trainer_only_check.py serve-checks``: one process with the prepare stack blocked and torch and the
    task encoder imported, forking each family's check (as ``.ci/run``'s trainer-only check does): a
    child starts with what a fresh process has at that point, without importing torch again."""
    scratch = tmp_path_factory.mktemp("trainer-checks")
    log = scratch / "server.log"
    with open(log, "w") as err:
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "trainer_only_check.py"), "serve-checks"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
        )  # fmt: skip

    def reply() -> str:
        ready, _, _ = select.select([server.stdout], [], [], CHECK_TIMEOUT_S)
        line = server.stdout.readline().strip() if ready else ""
        if not line:
            server.kill()
            why = "it ended" if ready else f"none in {CHECK_TIMEOUT_S} s"
            server_log = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"no answer from the trainer-only check server ({why}):\n{server_log}")
        return line

    def check(out: Path, family: str) -> subprocess.CompletedProcess:
        files = [str(scratch / f"{family}.stdout"), str(scratch / f"{family}.stderr")]
        server.stdin.write(json.dumps([str(out), family, [family, *FAMILIES], *files]) + "\n")
        server.stdin.flush()
        code = int(reply())
        stdout, stderr = (Path(f).read_text(errors="replace") for f in files)
        return subprocess.CompletedProcess(["check-family", family], code, stdout, stderr)

    try:
        assert reply() == "ready"
        yield check
    finally:
        if server.poll() is None:
            server.stdin.close()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_trainer_only_load_with_and_without_context_parallel(prepared, family, trainer_checks):
    """``trainer_only_check.py``'s family check: a process with the prepare stack blocked imports only this
    family's module and gives the full install's batches, at cp=1 and on each cp=2 rank (its tokens the
    full stream's at ``cp_token_indices``, encoder inputs whole)."""
    proc = trainer_checks(prepared, family)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cp=1 and cp=2 match" in proc.stdout


def test_profiles_import_nothing_of_the_loader():
    """Model rules never reach into the trainer's loader (its memory management included): the loader
    hands what it owns (the batch allocator) in through ``MediaInputOptions``."""
    offenders = []
    for path in sorted((ROOT / "omnipack" / "profiles").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                if target.startswith("..loader") or target.startswith("omnipack.loader"):
                    offenders.append(f"{path.name}: from {target}")
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("omnipack.loader")]
                offenders += [f"{path.name}: import {n}" for n in names]
    assert not offenders, offenders
    code = "import sys, omnipack.profiles as p\nfor n in p.available_profiles(): p.get_profile(n).inputs()\n"
    code += "print(sorted(m for m in sys.modules if m.startswith('omnipack.loader')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_media_input_options_are_checked():
    with pytest.raises(ValueError, match="pixel_dtype must be one of"):
        MediaInputOptions(pixel_dtype="float16")
    storage, offset = MediaInputOptions().allocate(10)
    assert offset == 0 and storage.nbytes() == 10


def test_the_allocator_given_is_the_one_used():
    """``collate_media`` builds batch tensors in the storage ``options.allocate`` returns."""
    import torch

    taken = []

    def allocate(nbytes: int):
        storage = torch.UntypedStorage(nbytes + 64)
        taken.append(storage)
        return storage, 64

    inputs = get_profile(FAMILIES[0]).inputs()
    parts = [{"k": np.arange(6, dtype=np.int64).reshape(3, 2)}, {"k": np.ones((1, 2), np.int64)}]
    out = EncoderInputs.collate_media(inputs, parts, MediaInputOptions(allocate=allocate))["k"]
    assert len(taken) == 1 and out.untyped_storage().data_ptr() == taken[0].data_ptr()
    assert out.data_ptr() == taken[0].data_ptr() + 64
    assert out.tolist() == [[0, 1], [2, 3], [4, 5], [1, 1]]
