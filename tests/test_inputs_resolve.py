"""How input specs resolve to documents: one rule for a folder, a glob of it and a URL of it
(links, loops, hidden entries, odd names), every form terminating; ``save_to_disk`` folders
read only through their ``state.json``; names that are not UTF-8; a run whose every record
was rejected."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from clirun import invoke, invoke_ok

from packcli import fs as packfs
from packcli.errors import InputError
from packcli.read import resolve_inputs
from packcli.read.inputs import reached, split_glob
from packcli.stages.units import _file_key
from packcli.tokenize.shards import sha256_file

ARGS = ["--short-len", "64", "--long-len", "1024", "-q"]


@contextlib.contextmanager
def hang_guard(seconds: int = 120) -> Iterator[None]:
    """Not a time limit: a form that never ends (a loop followed forever) fails the test
    instead of hanging the suite."""
    import signal

    def fire(*_: Any) -> None:
        raise TimeoutError(f"still resolving after {seconds} s: it does not terminate")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def write_rows(path: Path, texts: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")


def texts_of(paths: Sequence[Path | str]) -> list[str]:
    """Every document's text, file after file (jsonl lines, Arrow stream rows)."""
    texts: list[str] = []
    for p in paths:
        with packfs.open_binary(p) as fh:
            data = fh.read()
        if str(p).endswith(".arrow"):
            texts += pa.ipc.open_stream(data).read_all().column("text").to_pylist()
        else:
            texts += [json.loads(line)["text"] for line in data.splitlines()]
    return texts


def saved_dataset(folder: Path, n: int = 9, shards: int = 3) -> Path:
    """A save_to_disk folder, with the cache file a later ``map()`` leaves in it."""
    import datasets

    rows = {"text": [f"{folder.name} {i}" for i in range(n)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(folder), num_shards=shards)
    datasets.load_from_disk(str(folder)).map(lambda r: {"text": r["text"].upper()})
    assert any(p.name.startswith("cache-") for p in folder.iterdir())
    return folder


PLAIN = [
    "a.jsonl",
    "br[ack]et.jsonl",
    "h#sh?q.jsonl",
    "sp ace é.jsonl",
    "sub/b.jsonl",
    "sub/deep/c.jsonl",
    "z[1]/d.jsonl",
]
# Shown under its smallest name (sub/ is also reached as link_dir/, b.jsonl as link_file.jsonl).
EXPECTED_NAMES = [
    "a.jsonl",
    "br[ack]et.jsonl",
    "h#sh?q.jsonl",
    "link_dir/b.jsonl",
    "link_dir/deep/c.jsonl",
    "saved/data-00000-of-00003.arrow",
    "saved/data-00001-of-00003.arrow",
    "saved/data-00002-of-00003.arrow",
    "sp ace é.jsonl",
    "z[1]/d.jsonl",
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """One tree with everything the rule speaks of: odd names, hidden entries, a linked file
    and folder, a link back to the top (a loop), a saved dataset with a map() cache."""
    root = tmp_path / "tree"
    for rel in PLAIN:
        write_rows(root / rel, [f"{rel} 0", f"{rel} 1"])
    for rel in (".hidden.jsonl", ".git/x.jsonl", "sub/.cache/y.jsonl"):
        write_rows(root / rel, ["hidden: never an input"])
    (root / "notes.txt").write_text("not an input")
    os.symlink("sub/b.jsonl", root / "link_file.jsonl")
    os.symlink("sub", root / "link_dir")
    os.symlink("../..", root / "sub" / "deep" / "loop")
    saved_dataset(root / "saved")
    return root


def expected_texts() -> list[str]:
    by_name = {
        "link_dir/b.jsonl": "sub/b.jsonl",
        "link_dir/deep/c.jsonl": "sub/deep/c.jsonl",
    }
    texts: list[str] = []
    for name in EXPECTED_NAMES:
        if name.startswith("saved/"):
            if name.endswith("00000-of-00003.arrow"):
                texts += [f"saved {i}" for i in range(9)]
            continue
        rel = by_name.get(name, name)
        texts += [f"{rel} 0", f"{rel} 1"]
    return texts


def names_under(paths: Sequence[Path | str], root: str) -> list[str]:
    return [str(p)[len(root.rstrip("/")) + 1 :] for p in paths]


def local_forms(root: Path) -> list[list[str]]:
    quoted = urllib.parse.quote(str(root))
    return [
        [str(root)],
        [f"{root}/"],
        [f"{root}/*"],
        [f"{root}/**"],
        [f"{root}/**/*"],
        [f"{root}/**/*.jsonl", f"{root}/**/*.arrow"],
        [f"file://{root}"],
        [f"file://{quoted}/"],
        [f"file://{root}/**"],
        [f"{root}/sub", str(root)],  # a folder and a folder inside it: each file once
    ]


def test_every_local_form_of_a_folder_gives_the_same_documents(tree: Path) -> None:
    for specs in local_forms(tree):
        with hang_guard():
            got = resolve_inputs(specs)
        assert names_under(got, str(tree)) == EXPECTED_NAMES, specs
        assert texts_of(got) == expected_texts(), specs


def test_every_s3_form_of_a_folder_gives_the_same_documents(tree: Path, bucket: str) -> None:
    fs, prefix = packfs.locate(f"s3://{bucket}/t")
    # The tree as a store holds it: no links (each file at the name the local rule shows),
    # the saved dataset's every file, and the hidden files to skip.
    names = [*EXPECTED_NAMES, ".hidden.jsonl", "sub/.cache/y.jsonl"]
    names += [
        f"saved/{p.name}" for p in (tree / "saved").iterdir() if f"saved/{p.name}" not in names
    ]
    for name in names:
        local = tree / name.replace("link_dir/", "sub/")
        fs.put_file(str(local), f"{prefix}/{name}")
    fs.invalidate_cache()
    base = f"s3://{bucket}/t"
    forms = [[base], [f"{base}/"], [f"{base}/*"], [f"{base}/**"]]
    forms += [[f"{base}/**/*.jsonl", f"{base}/**/*.arrow"], [f"{base}/link_dir", base]]
    for specs in forms:
        got = resolve_inputs(specs)
        assert names_under(got, base) == EXPECTED_NAMES, specs
        assert texts_of(got) == expected_texts(), specs
    # A folder named with glob characters is the folder, as locally.
    assert names_under(resolve_inputs([f"{base}/z[1]"]), base) == ["z[1]/d.jsonl"]
    # The saved dataset's state.json damaged on the store: refused, not read as a folder.
    fs.pipe_file(f"{prefix}/saved/state.json", b'{"_data_files": [{"filen')
    fs.invalidate_cache()
    for specs in ([base], [f"{base}/saved"], [f"{base}/**/*.arrow"]):
        with pytest.raises(InputError, match=r"saved/state\.json: not a datasets state\.json"):
            resolve_inputs(specs)


def test_glob_rules() -> None:
    assert split_glob(["", "a", "b", "**", "*.jsonl"]) == (["", "a", "b"], ["**", "*.jsonl"])
    assert reached("x/y/z.jsonl", ["**", "*.jsonl"]) and reached("z.jsonl", ["**", "*.jsonl"])
    assert reached("x/y/z.jsonl", ["x"]) and not reached("x/y/z.jsonl", ["y"])
    assert reached("a[1]/b.jsonl", ["a[[]1]"]) and not reached("a[1]/b.jsonl", ["a[1]"])


def test_a_glob_over_a_loop_terminates_as_the_folder_does(
    tree: Path, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """The CLI in a subprocess: its timeout is a hang guard (before, the glob never ended)."""
    glob_out, folder_out = tmp_path / "glob_out", tmp_path / "folder_out"
    command = [sys.executable, "-m", "packcli", "pack", f"{tree}/**/*.jsonl"]
    command += ["-t", str(toy_tokenizer_path), "-o", str(glob_out), *ARGS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    invoke_ok(
        "pack", tree, "-t", toy_tokenizer_path, "-o", folder_out, "--input-format", "jsonl", *ARGS
    )
    hashes = [
        {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*.parquet"))}
        for out in (glob_out, folder_out)
    ]
    assert hashes[0] and hashes[0] == hashes[1]
    report = json.loads((glob_out / "packcli.json").read_text())["report"]
    assert report["input"]["documents"] == 2 * len(PLAIN)


def test_a_glob_lists_only_the_folders_it_can_reach(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed: list[str] = []
    scandir = os.scandir

    def spy(path: Any) -> Any:
        listed.append(os.path.relpath(path, tree))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    assert names_under(resolve_inputs([f"{tree}/*.jsonl"]), str(tree))[0] == "a.jsonl"
    assert listed == ["."]
    listed.clear()
    assert names_under(resolve_inputs([f"{tree}/s*/*/*.jsonl"]), str(tree)) == ["sub/deep/c.jsonl"]
    assert sorted(listed) == [".", "saved", "sub", "sub/deep"]


@pytest.mark.parametrize("form", ["folder", "glob", "file"])
def test_a_link_that_cannot_be_followed_is_named(tree: Path, form: str) -> None:
    os.symlink("gone.jsonl", tree / "sub" / "dangling.jsonl")
    spec = {
        "folder": str(tree),
        "glob": f"{tree}/**/*.jsonl",
        "file": str(tree / "sub" / "dangling.jsonl"),
    }[form]
    with (
        hang_guard(),
        pytest.raises(InputError, match=r"(sub|link_dir)/dangling\.jsonl.* link that cannot"),
    ):
        resolve_inputs([spec])
    # A glob that does not reach it is not bothered by it.
    assert len(resolve_inputs([f"{tree}/a*.jsonl"])) == 1


@pytest.mark.parametrize("spec", ["{d}", "{d}/*", "{d}/fifo.jsonl"])
def test_an_entry_that_is_not_a_file_is_named_not_read(tmp_path: Path, spec: str) -> None:
    folder = tmp_path / "d"
    write_rows(folder / "a.jsonl", ["x"])
    os.mkfifo(folder / "fifo.jsonl")  # reading it would wait for a writer forever
    with hang_guard(), pytest.raises(InputError, match=r"fifo\.jsonl.*not a"):
        resolve_inputs([spec.format(d=folder)])


def test_file_urls_take_hash_and_question_marks_as_name_characters(tmp_path: Path) -> None:
    folder = tmp_path / "we#ird?dir é"
    write_rows(folder / "a b.jsonl", ["x"])
    want = resolve_inputs([str(folder)])
    assert resolve_inputs([f"file://{folder}"]) == want
    assert resolve_inputs([f"file://{urllib.parse.quote(str(folder))}/"]) == want
    assert resolve_inputs([f"file://localhost{folder}/*.jsonl"]) == want


def test_a_file_reached_twice_is_read_once_with_a_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.link(tree / "a.jsonl", tree / "sub" / "hard.jsonl")  # one file, two names
    with caplog.at_level(logging.WARNING, logger="packcli.read"):
        got = resolve_inputs([str(tree / "a.jsonl"), str(tree / "a.jsonl"), f"{tree}/sub"])
    assert names_under(got, str(tree)) == ["a.jsonl", "sub/b.jsonl", "sub/deep/c.jsonl"]
    assert "2 file(s) reached more than once, read once each" in caplog.text
    assert f"{tree / 'a.jsonl'}, by two inputs" in caplog.text


# --------------------------------------------------------------------------- save_to_disk


def _truncate(folder: Path) -> None:
    state = folder / "state.json"
    state.write_bytes(state.read_bytes()[:40])  # a save killed mid-write


def _drop_state(folder: Path) -> None:
    (folder / "state.json").unlink()


def _list_absent(folder: Path) -> None:
    (folder / "data-00001-of-00003.arrow").unlink()


def _list_outside(folder: Path) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"][0]["filename"] = "../elsewhere.arrow"
    (folder / "state.json").write_text(json.dumps(state))


def _list_twice(folder: Path) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"][1] = state["_data_files"][0]
    (folder / "state.json").write_text(json.dumps(state))


def _no_records(folder: Path) -> None:
    for name in ("state.json", "dataset_info.json"):  # killed before save_to_disk wrote them
        (folder / name).unlink()


DAMAGES = {
    "no_records": (_no_records, r"saved looks like a datasets save_to_disk folder \(cache-"),
    "truncated": (_truncate, r"saved/state\.json: not a datasets state\.json"),
    "missing": (_drop_state, r"saved looks like a datasets save_to_disk folder .*no state\.json"),
    "absent_file": (
        _list_absent,
        r"state\.json lists data-00001-of-00003\.arrow, which is missing",
    ),
    "outside": (_list_outside, r"state\.json lists '\.\./elsewhere\.arrow', which is not a file"),
    "twice": (_list_twice, r"state\.json lists data-00000-of-00003\.arrow twice"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_saved_dataset_is_refused_in_every_form(tmp_path: Path, damage: str) -> None:
    parent = tmp_path / "corpus"
    write_rows(parent / "a.jsonl", ["plain"])
    saved = saved_dataset(parent / "saved")
    damage_it, message = DAMAGES[damage]
    damage_it(saved)
    for specs in ([saved], [parent], [f"{parent}/**/*.arrow"], [f"{saved}/*"], [f"file://{saved}"]):
        with pytest.raises(InputError, match=message):
            resolve_inputs([str(s) for s in specs])
    # --input-format jsonl never reads Arrow files: the saved dataset is not its business.
    assert len(resolve_inputs([str(parent)], input_format="jsonl")) == 1


def test_a_saved_dataset_inside_a_folder_is_read_through_its_state_json(tmp_path: Path) -> None:
    parent = tmp_path / "corpus"
    write_rows(parent / "a.jsonl", ["plain"])
    saved_dataset(parent / "nested" / "saved")
    want = ["plain", *[f"saved {i}" for i in range(9)]]
    for specs in ([parent], [f"{parent}/**"], [f"{parent}/**/*.arrow", f"{parent}/*.jsonl"]):
        assert texts_of(resolve_inputs([str(s) for s in specs])) == want
    assert texts_of(resolve_inputs([str(parent)], input_format="arrow")) == want[1:]
    # A glob reaching only some of its files: which rows were meant is unclear.
    with pytest.raises(InputError, match=r"some files of the saved dataset .*saved but not"):
        resolve_inputs([f"{parent}/nested/saved/data-00000*"])


def test_a_saved_dataset_dict_inside_a_folder_is_refused(tmp_path: Path) -> None:
    import datasets

    parent = tmp_path / "corpus"
    write_rows(parent / "a.jsonl", ["plain"])
    splits = {
        "train": datasets.Dataset.from_dict({"text": ["a"]}),
        "test": datasets.Dataset.from_dict({"text": ["b"]}),
    }
    datasets.DatasetDict(splits).save_to_disk(str(parent / "dd"))
    for spec in (parent, parent / "dd", f"{parent}/**/*.arrow"):
        with pytest.raises(InputError, match=r"dd is a saved DatasetDict \(splits: train, test\)"):
            resolve_inputs([str(spec)])
    got = resolve_inputs([str(parent / "dd" / "train")])
    assert texts_of(got) == ["a"]


def test_pack_reads_a_mapped_saved_dataset_once(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    """900 rows saved, then map()ed (a cache file beside them): 900 documents, not 1,800; the
    same folder with its state.json cut short is refused."""
    parent = tmp_path / "corpus"
    saved = saved_dataset(parent / "saved", n=900)
    out = tmp_path / "out"
    invoke_ok("pack", parent, "-t", toy_tokenizer_path, "-o", out, *ARGS)
    assert json.loads((out / "packcli.json").read_text())["report"]["input"]["documents"] == 900
    _truncate(saved)
    code, output = invoke("pack", parent, "-t", toy_tokenizer_path, "-o", tmp_path / "o2", *ARGS)
    assert code == 1
    assert "saved/state.json: not a datasets state.json" in output


def test_a_saved_dataset_in_a_hub_repo_is_fetched_with_its_state_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub
    from corpora import hub_cache

    saved = saved_dataset(tmp_path / "saved")
    files = {f"ds/{p.name}": p.read_bytes() for p in saved.iterdir()}
    commit = hub_cache(tmp_path / "hub", "datasets", "packcli/saved", files)
    snapshot = tmp_path / "hub" / "datasets--packcli--saved" / "snapshots" / commit
    asked: list[str] = []

    def download(repo_id: str, **kwargs: Any) -> str:
        asked.extend(kwargs["allow_patterns"])
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    got = resolve_inputs(["hf-dataset:packcli/saved/ds"])
    assert texts_of(got) == [f"saved {i}" for i in range(9)]  # not the map() cache's rows
    assert "ds/*state.json" in asked


# --------------------------------------------------------------------------- names


def test_a_name_that_is_not_utf8_is_refused_naming_it(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    write_rows(folder / "good.jsonl", ["fine"])
    bad = os.fsdecode(os.fsencode(str(folder)) + b"/bad\xff.jsonl")
    write_rows(Path(bad), ["named in latin-1"])
    (Path(os.fsdecode(os.fsencode(str(folder)) + b"/notes\xff.txt"))).write_text("not input")
    for spec in (folder, f"{folder}/*.jsonl", bad):
        code, output = invoke("pack", spec, "-t", toy_tokenizer_path, "-o", tmp_path / "out", *ARGS)
        assert code == 1, output
        assert f"{folder}/bad\\xff.jsonl: the file name is not valid UTF-8" in output
        assert "Traceback" not in output
    # A unit key of such a name (a library caller, past resolve_inputs) is still a key.
    assert len(_file_key(bad)) == 16


# --------------------------------------------------------------------------- no documents


def test_every_record_rejected_says_so_and_keeps_the_quarantine(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(f"{{not json {i}\n" for i in range(50)) + "\n")
    out = tmp_path / "out"
    args = ["-t", toy_tokenizer_path, "-o", out, "--on-bad-line", "skip", *ARGS]
    code, output = invoke("pack", src, *args)
    assert code == 1
    assert "all 50 record(s) were rejected (invalid_json: 50; 1 blank lines)" in output
    assert f"see {out / 'rejected.jsonl'}" in output
    records = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, 51))
    assert {r["reason"] for r in records} == {"invalid_json"} and records[0]["file"] == str(src)
    # Nothing rejected and nothing read: the plain message, no quarantine.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, output = invoke("pack", empty, "-t", toy_tokenizer_path, "-o", tmp_path / "o2", *ARGS)
    assert code == 1 and "no documents in 1 input file(s) (2 blank lines)" in output
    assert not (tmp_path / "o2" / "rejected.jsonl").exists()
