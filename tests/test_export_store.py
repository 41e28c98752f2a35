"""``packcli export`` with the pack, the destination or both on object storage, against the
local S3 server (tests/s3local.py), whose request log (tests/s3count.py) counts what moves:
every exported file must equal a local export of the same pack byte for byte, each source
file be fetched once and each exported file put once, a resumed export move almost nothing,
damage on the store be named by URL, and another's files in the destination be refused."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clirun import invoke, invoke_ok, run_process
from export_cases import chat_pack
from hypothesis import given
from hypothesis import strategies as st
from s3count import Request, RequestLog
from s3local import cfg

from packcli import fs as packfs

FORMATS = ["megatron", "olmo", "megatron-bridge"]
# Written per export, not per part: they name where the files are (paths, URLs) or how
# the export went (and the probe of a writable store), so they differ between a local and
# a remote export of the same pack.
_NOT_DATA = ("packcli-export.json", "paths.json", "data-args.txt", ".packcli-export/", ".packcli/")


@pytest.fixture(scope="module")
def store(s3: dict[str, str]) -> str:
    """One bucket for the module's packs (each test exports under its own prefix)."""
    import s3fs

    name = f"x-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return name


@pytest.fixture(scope="module")
def packs(
    store: str, corpus: Path, toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """The same corpus packed three ways: ``local`` (a folder), ``staged`` (a URL OUT, its
    work folder on this disk) and ``remote`` (OUT and work folder both on the store). Five
    tokenized shards and several Parquet files each, so every export has parts to resume."""
    root = tmp_path_factory.mktemp("packs")
    inputs = [corpus / f"part-{i}.jsonl.zst" for i in range(3)]
    common = ["-t", toy_tokenizer_path, *cfg(corpus)]
    local = root / "local"
    invoke_ok("pack", *inputs, "-o", local, *common)
    staged, remote = f"s3://{store}/staged", f"s3://{store}/remote"
    invoke_ok("pack", *inputs, "-o", staged, "--work-dir", root / "stage", *common)
    invoke_ok("pack", *inputs, "-o", remote, "--work-dir", f"s3://{store}/work", *common)
    return {"local": str(local), "staged": staged, "remote": remote, "stage": str(root / "stage")}


@pytest.fixture(scope="module")
def reference(
    packs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, str]]:
    """Per format, the sha256 of every data file of the local export of the local pack."""
    root = tmp_path_factory.mktemp("reference")
    out = {}
    for to in FORMATS:
        invoke_ok("export", packs["local"], "--to", to, "--dest", root / to, "-q")
        out[to] = local_data(root / to)
    assert len(out["megatron"]) >= 8 and len(out["megatron-bridge"]) >= 4
    return out


def _data(rel: str) -> bool:
    return not any(rel == n or rel.startswith(n) for n in _NOT_DATA)


def local_data(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and _data(p.relative_to(folder).as_posix())
    }


def remote_data(url: str) -> dict[str, str]:
    fs, prefix = packfs.locate(url)
    fs.invalidate_cache()
    return {
        rel: hashlib.sha256(fs.cat_file(f"{prefix}/{rel}")).hexdigest()
        for rel in sorted(packfs.listing(fs, prefix))
        if _data(rel)
    }


def _count(requests: list[Request], op: str, under: str) -> Counter[str]:
    """Requests of one kind (GET: an object's bytes, PUT) per key under ``under``."""
    return Counter(r.key for r in requests if r.op == op and r.key.startswith(under))


def _sources(requests: list[Request], bucket: str) -> Counter[str]:
    """GETs of a pack's bulk files: tokenized shards and Parquet rows."""
    return Counter(
        r.key
        for r in requests
        if r.op == "GET" and r.bucket == bucket and r.key.endswith((".arrow", ".parquet"))
    )


# --------------------------------------------------------------------------- store -> disk


@pytest.mark.parametrize("to", FORMATS)
@pytest.mark.parametrize("which", ["staged", "remote"])
def test_a_pack_on_the_store_exports_to_a_local_folder(
    which: str,
    to: str,
    packs: dict[str, str],
    reference: dict[str, dict[str, str]],
    store: str,
    s3_log: RequestLog,
    tmp_path: Path,
) -> None:
    """Only the files a format needs come down, each once: the rows for megatron-bridge,
    the shards for the document formats when the work folder is on the store (a staged
    pack's are on this disk, in the folder given to pack as --work-dir)."""
    dest = tmp_path / "export"
    args = ["--work-dir", packs["stage"]] if which == "staged" else []
    s3_log.take()
    output = invoke_ok("export", packs[which], "--to", to, "--dest", dest, *args, "-q")
    requests = s3_log.take()
    assert f"to {dest} (" in output
    assert local_data(dest) == reference[to]
    fetched = _sources(requests, store)
    if to == "megatron-bridge":
        marker = json.loads((Path(packs["local"]) / "packcli.json").read_text())
        rows = {f"data/{c}/{f['file']}" for c in ("long", "short") for f in marker["files"][c]}
        assert set(fetched) == {f"{which}/{rel}" for rel in rows}
    elif which == "remote":
        assert fetched and all(k.startswith("work/tokens/files/") for k in fetched)
        assert len(fetched) == len(json.loads((dest / "packcli-export.json").read_text())["parts"])
    else:
        assert not fetched
    assert set(fetched.values()) <= {1}
    assert not [r for r in requests if r.op in ("PUT", "POST", "DELETE")]  # nothing written
    if to != "megatron-bridge":
        lists = (dest / ("data-args.txt" if to == "megatron" else "paths.json")).read_text()
        assert str(dest.resolve()) in lists and "s3://" not in lists
    marker = json.loads((dest / "packcli-export.json").read_text())
    assert marker["source"] == packs[which]


def test_a_staged_pack_without_its_work_folder_says_where_the_shards_are(
    packs: dict[str, str], tmp_path: Path
) -> None:
    code, output = invoke("export", packs["staged"], "--to", "olmo", "--dest", tmp_path, "-q")
    assert code == 1 and "no completed tokenize stage" in output
    assert packs["staged"] in output and "--work-dir given to pack" in output
    code, output = invoke(
        "export", packs["remote"], "--to", "olmo", "--work-dir", tmp_path, "--dest", tmp_path
    )
    assert code == 1 and "names its work folder on the store" in output


# --------------------------------------------------------------------------- disk -> store


@pytest.mark.parametrize("to", FORMATS)
def test_a_local_pack_exports_to_the_store_each_file_put_once(
    to: str,
    packs: dict[str, str],
    reference: dict[str, dict[str, str]],
    store: str,
    s3_log: RequestLog,
) -> None:
    prefix = f"to-store-{to}-{uuid.uuid4().hex[:6]}"
    url = f"s3://{store}/{prefix}"
    s3_log.take()
    output = invoke_ok("export", packs["local"], "--to", to, "--dest", url, "-q")
    requests = s3_log.take()
    assert f"to {url} (" in output
    assert remote_data(url) == reference[to]
    puts = _count(requests, "PUT", f"{prefix}/")
    data_puts = {k: n for k, n in puts.items() if _data(k[len(prefix) + 1 :])}
    assert set(data_puts) == {f"{prefix}/{rel}" for rel in reference[to]}
    assert set(data_puts.values()) == {1}
    assert not _count(requests, "GET", f"{prefix}/")  # nothing read back over the wire
    # The paths lists name the files on the store; the marker lists their store versions.
    fs, _ = packfs.locate(url)
    marker = json.loads(fs.cat_file(f"{store}/{prefix}/packcli-export.json"))
    assert all(f["store_version"] for p in marker["parts"] for f in p["files"])
    if to == "megatron":
        args = fs.cat_file(f"{store}/{prefix}/data-args.txt").decode().split()
        assert args[1::2] == [f"{url}/{p['name']}" for p in marker["parts"]]
    elif to == "olmo":
        paths = json.loads(fs.cat_file(f"{store}/{prefix}/paths.json"))["paths"]
        assert paths == [f"{url}/tokens/{p['name']}.npy" for p in marker["parts"]]
    # A rerun of a complete export moves almost nothing: no data file read or put.
    s3_log.take()
    again = invoke_ok("export", packs["local"], "--to", to, "--dest", url, "-q")
    requests = s3_log.take()
    assert "0 part(s) written" in again
    moved = [r for r in requests if r.op in ("GET", "PUT") and _data(r.key[len(prefix) + 1 :])]
    assert not [r for r in moved if r.key.startswith(f"{prefix}/")]
    assert sum(r.sent + r.received for r in requests) < 20_000


def test_a_chat_pack_exports_its_label_masks_to_the_store(store: str, tmp_path: Path) -> None:
    out, _ = chat_pack(tmp_path)
    for to in ("olmo", "megatron-bridge"):
        invoke_ok("export", out, "--to", to, "--dest", tmp_path / to, "-q")
        url = f"s3://{store}/chat-{uuid.uuid4().hex[:6]}/{to}"
        invoke_ok("export", out, "--to", to, "--dest", url, "-q")
        assert remote_data(url) == local_data(tmp_path / to)
        if to == "olmo":
            assert any(rel.startswith("label_mask/") for rel in remote_data(url))


# --------------------------------------------------------------------------- store -> store


@pytest.mark.parametrize("to", FORMATS)
def test_a_pack_on_the_store_exports_beside_itself(
    to: str,
    packs: dict[str, str],
    reference: dict[str, dict[str, str]],
    store: str,
    s3_log: RequestLog,
) -> None:
    """The default for a URL OUT is OUT/export/TO on the store; the pack is still whole
    (``verify``: its own files are untouched, export/ is not part of it)."""
    s3_log.take()
    invoke_ok("export", packs["remote"], "--to", to, "-q")
    requests = s3_log.take()
    url = f"{packs['remote']}/export/{to}"
    assert remote_data(url) == reference[to]
    fetched = _sources(requests, store)
    assert fetched and set(fetched.values()) == {1}
    puts = _count(requests, "PUT", f"remote/export/{to}/")
    data = {k for k in puts if _data(k[len(f"remote/export/{to}/") :])}
    assert len(data) == len(reference[to]) and all(puts[k] == 1 for k in data)
    # Bytes moved: about the sources' bytes down and the export's bytes up, once each.
    down = sum(r.sent for r in requests if r.op == "GET")
    up = sum(r.received for r in requests if r.op == "PUT")
    source_bytes = sum(r.sent for r in requests if r.key in fetched)
    fs, _ = packfs.locate(url)
    exported = sum(
        int(i["size"]) for i in packfs.listing(fs, f"{store}/remote/export/{to}").values()
    )
    assert source_bytes <= down < source_bytes + 40_000
    assert up <= exported + 10_000
    assert "all invariants hold" in invoke_ok("verify", packs["remote"])


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("to", ["megatron", "megatron-bridge"])
def test_an_export_killed_mid_upload_resumes_putting_each_file_once(
    to: str,
    packs: dict[str, str],
    reference: dict[str, dict[str, str]],
    store: str,
    s3_log: RequestLog,
) -> None:
    """Killed after the third file's upload, inside a part (its record not yet up): the
    rerun skips the complete parts, writes the killed part again, and does not put again
    the file the store already holds as it was put (the upload log says so)."""
    prefix = f"killed-{to}-{uuid.uuid4().hex[:6]}"
    url = f"s3://{store}/{prefix}"
    args = ["export", packs["local"], "--to", to, "--dest", url, "-q"]
    s3_log.take()
    killed = run_process(args, crash="export-put:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    there = {r for r in _count(s3_log.take(), "PUT", f"{prefix}/")}
    assert f"{prefix}/packcli-export.json" not in there  # nothing vouches for it yet
    first = {k for k in there if _data(k[len(prefix) + 1 :])}
    assert len(first) == 3
    again = invoke_ok(*args)
    assert "already complete" in again and "0 already complete" not in again
    second = _count(s3_log.take(), "PUT", f"{prefix}/")
    assert not first & set(second)  # put once in all
    assert remote_data(url) == reference[to]
    assert invoke_ok(*args).count("0 part(s) written") == 1


def test_an_exported_file_replaced_on_the_store_at_its_size_is_put_again(
    packs: dict[str, str], reference: dict[str, dict[str, str]], store: str, s3_log: RequestLog
) -> None:
    """Its size still matches its record, its store version does not: the part is written
    and put again (never judged by size alone)."""
    prefix = f"replaced-{uuid.uuid4().hex[:6]}"
    url = f"s3://{store}/{prefix}"
    args = ["export", packs["local"], "--to", "megatron-bridge", "--dest", url, "-q"]
    invoke_ok(*args)
    fs, _ = packfs.locate(url)
    victim = sorted(r for r in reference["megatron-bridge"] if r.endswith(".idx.parquet"))[0]
    data = bytearray(fs.cat_file(f"{store}/{prefix}/{victim}"))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(f"{store}/{prefix}/{victim}", bytes(data))
    s3_log.take()
    assert "1 part(s) written" in invoke_ok(*args)
    puts = _count(s3_log.take(), "PUT", f"{prefix}/")
    assert [k for k in puts if k.endswith(".idx.parquet")] == [f"{prefix}/{victim}"]
    assert remote_data(url) == reference["megatron-bridge"]


def test_an_export_resumed_on_another_machine_knows_its_files(
    packs: dict[str, str], reference: dict[str, dict[str, str]], store: str, tmp_path: Path
) -> None:
    """No upload log there (another cache folder): the claim put before any file names
    them as the export's, so they are replaced, never refused as another's."""
    url = f"s3://{store}/moved-{uuid.uuid4().hex[:6]}"
    args = ["export", packs["local"], "--to", "olmo", "--dest", url, "-q"]
    killed = run_process(
        args, env={"PACKCLI_CACHE_DIR": str(tmp_path / "machine-a")}, crash="export-put:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    env = {**os.environ, "PACKCLI_CACHE_DIR": str(tmp_path / "machine-b")}
    done = subprocess.run(
        [sys.executable, "-m", "packcli", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert remote_data(url) == reference["olmo"]


# --------------------------------------------------------------------------- damage, refusals


@pytest.fixture
def damaged(store: str) -> Iterator[Callable[[str], None]]:
    """Flip a byte of a file on the store; put the original back afterwards."""
    fs, _ = packfs.locate(f"s3://{store}")
    originals: dict[str, bytes] = {}

    def flip(key: str) -> None:
        data = originals.setdefault(key, bytes(fs.cat_file(key)))
        changed = bytearray(data)
        changed[len(changed) // 2] ^= 0xFF
        fs.pipe_file(key, bytes(changed))
        fs.invalidate_cache()

    yield flip
    for key, data in originals.items():
        fs.pipe_file(key, data)
    fs.invalidate_cache()


def test_a_damaged_file_on_the_store_is_refused_by_its_url(
    packs: dict[str, str], store: str, damaged: Callable[[str], None], tmp_path: Path
) -> None:
    fs, _ = packfs.locate(packs["remote"])
    parquet = sorted(p for p in fs.find(f"{store}/remote/data/long") if p.endswith(".parquet"))
    shard = sorted(p for p in fs.find(f"{store}/work/tokens") if p.endswith(".arrow"))
    damaged(parquet[-1])
    code, output = invoke("export", packs["remote"], "--to", "megatron-bridge", "--dest", tmp_path)
    assert code == 1 and f"s3://{parquet[-1]}: changed since packcli wrote it" in output
    damaged(shard[1])
    code, output = invoke("export", packs["remote"], "--to", "olmo", "--dest", tmp_path / "o")
    assert code == 1 and f"s3://{shard[1]}: tokenized shard changed" in output, output
    assert str(packfs.cache_root()) not in output  # never the local copy's name
    assert not list((packfs.cache_root() / "exports" / "reads").iterdir())  # scratch gone


def test_files_of_others_in_the_destination_are_refused(
    packs: dict[str, str], store: str, tmp_path: Path
) -> None:
    prefix = f"theirs-{uuid.uuid4().hex[:6]}"
    url = f"s3://{store}/{prefix}"
    fs, _ = packfs.locate(url)
    fs.pipe_file(f"{store}/{prefix}/part-00001.idx", b"their index")
    fs.pipe_file(f"{store}/{prefix}/notes.txt", b"not where an export writes")
    code, output = invoke("export", packs["local"], "--to", "megatron", "--dest", url, "-q")
    assert code == 1 and "part-00001.idx" in output and "did not write" in output
    assert "notes.txt" not in output
    fs.invalidate_cache()
    assert sorted(packfs.listing(fs, f"{store}/{prefix}")) == ["notes.txt", "part-00001.idx"]
    # The same rule on a local folder; once moved out, the export goes through.
    local = tmp_path / "dest"
    (local / "tokens").mkdir(parents=True)
    (local / "tokens" / "part-00000.npy").write_bytes(b"theirs")
    code, output = invoke("export", packs["local"], "--to", "olmo", "--dest", local, "-q")
    assert code == 1 and "tokens/part-00000.npy" in output
    assert (local / "tokens" / "part-00000.npy").read_bytes() == b"theirs"
    (local / "tokens" / "part-00000.npy").unlink()
    invoke_ok("export", packs["local"], "--to", "olmo", "--dest", local, "-q")


@given(
    planned=st.sets(st.sampled_from("abcdef")),
    present=st.sets(st.sampled_from("abcdefgh")),
    named=st.lists(st.sets(st.sampled_from("abcdefgh")), max_size=3),
)
def test_foreign_files_are_the_present_planned_files_no_record_names(
    planned: set[str], present: set[str], named: list[set[str]]
) -> None:
    from packcli.export.place import foreign

    records = [{"files": sorted(n)} for n in named]
    owned = set().union(*named) if named else set()
    got = foreign(planned, present, records, {})
    assert set(got) == (planned & present) - owned and got == sorted(got)


def test_a_destination_in_a_missing_bucket_fails_before_any_work(
    packs: dict[str, str], s3: dict[str, str]
) -> None:
    url = f"s3://no-such-{uuid.uuid4().hex[:8]}/x"
    code, output = invoke("export", packs["local"], "--to", "olmo", "--dest", url, "-q")
    assert code == 1 and "is not writable" in output and "nothing was read or written" in output
