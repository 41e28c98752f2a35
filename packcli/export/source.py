"""What an export reads from a finished pack: its marker, its tokenized shards (whole
documents, for the document-level formats) and its packed Parquet rows (for the packed ones).

Nothing is tokenized again. A document-level export holds each document as the pack holds
it: whole (a document ``split`` across rows is one document here, since Megatron and
OLMo-core cut their own training windows), its kept prefix under ``truncate``, absent under
``drop`` or when empty: the rule ``publish.expected.expected_pieces`` writes down for verify,
applied per document as lengths so a shard is never copied token by token.

A pack on object storage (a URL ``OUT``) is read the same way, one file at a time: its
``packcli.json`` is fetched into a scratch folder under packcli's cache, each Parquet file
(``fs.fetch_output_file``) or tokenized shard (its work folder's ``WorkStore.fetch``, when
the work folder is on the store) is fetched whole once, checked against its sha256, used,
and deleted. A URL ``OUT`` made with a local work folder keeps its shards on the machine
that made it (its staging folder, or the ``--work-dir`` it was given). Messages name the
URLs, never the local copies.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from packcli.errors import PackcliError
from packcli.names import CONFIG_NAMES, IGNORE_INDEX, MARKER, TOKENS_DIR
from packcli.publish.marker import (
    Marker,
    read_json_object,
    read_marker,
    recorded_work_dir,
    work_folder,
)
from packcli.records import parse_record
from packcli.stages.write_records import Listing
from packcli.tokenize.records import SUCCESS, ShardError, ShardIndex
from packcli.tokenize.shards import TokenShards, sha256_file


class ExportError(PackcliError):
    """The pack cannot be exported as asked; the message names the file or the option."""


@dataclass(frozen=True)
class Pack:
    """A finished pack as an export sees it: where it is, its marker, and its settings.
    ``out`` holds its ``packcli.json``: the pack itself, or for a URL (``url``) a local copy
    in ``scratch``, where its files are fetched one at a time; ``store``: its work folder on
    the store (``stages.workstore.WorkStore``) whose mirror is ``tokens_dir``'s parent."""

    out: Path
    meta: Marker
    tokens_dir: Path
    url: str | None = None
    store: Any = None
    scratch: Path | None = None
    names: tuple[tuple[str, str], ...] = ()  # local copy -> the URL messages name instead

    @property
    def shown(self) -> str:
        """The pack as messages name it."""
        return self.reword(str(self.out))

    @property
    def source(self) -> str:
        """The pack as the export's marker records it."""
        return self.shown if self.url else str(self.out.resolve())

    def reword(self, text: str) -> str:
        for local, url in self.names:
            text = text.replace(local, url)
        return text

    @property
    def data_format(self) -> str:
        return str(self.meta.run.get("format") or "text")

    @property
    def vocab_size(self) -> int:
        return int(self.meta.run["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int | None:
        eos = self.meta.run["tokenizer"].get("eos_id")
        return None if eos is None else int(eos)

    @property
    def long_len(self) -> int:
        return self.meta.plan_shape().long_len

    @property
    def overlong(self) -> str:
        return self.meta.plan_shape().overlong

    def capacity(self, config: str) -> int:
        plan = self.meta.plan_shape()
        return plan.long_len if config == "long" else plan.short_len

    def shards(self) -> TokenShards:
        """The pack's own tokenized shards; an error naming the folder when they are gone or
        belong to another run (a rerun of ``pack`` with other inputs reuses the folder)."""
        path = self.tokens_dir / SUCCESS
        index = parse_record(ShardIndex, read_json_object(path), path)  # None: another version
        where = self.reword(str(self.tokens_dir))
        if index is None:
            hint = (
                " (a URL OUT made with a local work folder keeps its shards on the machine "
                "that made it: export there, with the --work-dir given to pack, if any)"
                if self.url and self.store is None
                else ""
            )
            raise ExportError(
                f"{where}: no completed tokenize stage, so the whole documents of "
                f"{self.shown} are not there (the work folder was removed or moved{hint}); "
                "rerun the same packcli pack to rebuild it"
            )
        if index.fingerprint != self.meta.run.get("tokens_fingerprint"):
            raise ExportError(
                f"{where}: tokenized shards belong to another run than "
                f"{self.reword(str(self.out / MARKER))}; rerun the same packcli pack"
            )
        return TokenShards(self.tokens_dir, self.store)

    def release_shard(self, shards: TokenShards, index: int) -> None:
        """Delete the local copy of a shard fetched from the store (one at a time)."""
        if self.store is not None:
            (self.tokens_dir / shards.manifests[index].file).unlink(missing_ok=True)

    def parquet_files(self, config: str) -> list[Listing]:
        """The config's Parquet files as ``packcli.json`` lists them."""
        return self.meta.files.of(config)


def open_pack(out: Path) -> Pack:
    """The pack at ``out`` (local): its checked marker and its work folder's token stage."""
    try:
        meta = read_marker(out)
    except PackcliError as exc:
        raise ExportError(str(exc)) from None
    return Pack(out=out, meta=meta, tokens_dir=work_folder(out, meta) / TOKENS_DIR)


@contextmanager
def opened_pack(out: str | Path, work_dir: str | None = None) -> Iterator[Pack]:
    """The pack at ``out``, a local folder or a URL (then read through a scratch folder,
    removed after). ``work_dir``: for a URL ``OUT`` made with a local ``--work-dir``, that
    folder (the shards are in its ``.packcli``), else the cache folder ``pack`` staged in."""
    from packcli.fs import cache_root, is_url, local_path

    if not is_url(str(out)):
        if work_dir is not None:
            raise ExportError(
                "--work-dir is for a URL OUT only: a local pack's packcli.json names its work "
                "folder"
            )
        yield open_pack(Path(local_path(str(out))))
        return
    root = cache_root() / "exports" / "reads"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="pack-", dir=root))
    try:
        yield _open_remote(str(out).rstrip("/"), work_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _open_remote(url: str, work_dir: str | None, scratch: Path) -> Pack:
    """A URL ``OUT``: its ``packcli.json`` fetched (one GET) and checked, and where its
    tokenized shards are: on the store (the work folder it names; only the stage's index is
    fetched now) or on this disk."""
    from packcli.fs import fetch_output_file, info, is_url, redact, staging_root

    shown = redact(url)
    local = scratch / "pack"
    try:
        info(f"{url}/{MARKER}", fresh=True)  # "not found" apart from a failed read
        fetch_output_file(url, MARKER, local)
    except PackcliError as exc:
        raise ExportError(
            f"{shown}: no {MARKER} to read, so the pack is missing or incomplete ({exc})"
        ) from None
    except Exception as exc:  # a backend error that is not an OSError (credentials)
        raise ExportError(f"{shown}/{MARKER}: cannot be read ({type(exc).__name__})") from exc
    names: tuple[tuple[str, str], ...] = ((str(local), shown),)
    try:
        meta = read_marker(local)
    except PackcliError as exc:
        raise ExportError(str(exc).replace(str(local), shown)) from None
    recorded = recorded_work_dir(meta)
    if not is_url(recorded):
        folder = Path(recorded)
        if not folder.is_absolute():
            folder = staging_root(url, work_dir or "") / folder
        return Pack(local, meta, folder / TOKENS_DIR, url=url, scratch=scratch, names=names)
    if work_dir is not None:
        raise ExportError(
            f"--work-dir: {shown}/{MARKER} names its work folder on the store "
            f"({redact(recorded)}); leave --work-dir out"
        )
    from packcli.stages.workstore import WorkStore

    mirror = scratch / "work"
    store = WorkStore(recorded, mirror, url, scratch / "mirror-out")
    store.pull(f"{TOKENS_DIR}/{SUCCESS}")  # the stage's index; the shards come one at a time
    names = ((str(mirror), redact(recorded).rstrip("/")), *names)
    return Pack(
        local, meta, mirror / TOKENS_DIR, url=url, store=store, scratch=scratch, names=names
    )


def kept_lengths(lengths: np.ndarray, long_len: int, policy: str) -> np.ndarray:
    """Tokens of each document the pack holds, in order (0: not in the pack): the overlong
    policy of ``expected_pieces`` on lengths alone (``split`` keeps the whole document)."""
    lengths = lengths.astype(np.int64)
    over = lengths > long_len
    if policy == "drop":
        return np.where(over, 0, lengths)
    if policy == "truncate":
        kept: np.ndarray = np.minimum(lengths, long_len)
        return kept
    return lengths


@dataclass(frozen=True)
class ShardDocuments:
    """The documents of one tokenized shard as an export writes them, back to back."""

    tokens: npt.NDArray[np.int32]  # every kept token in document order
    lengths: npt.NDArray[np.int64]  # per kept document
    doc_ids: npt.NDArray[np.int64]  # the pack's global document ids (``doc_ids`` column)
    labels: npt.NDArray[np.int32] | None  # aligned with ``tokens`` (chat), -100 = no loss

    @property
    def starts(self) -> np.ndarray:
        """Each document's first token offset in ``tokens``."""
        starts: np.ndarray = np.cumsum(self.lengths) - self.lengths
        return starts


def shard_documents(pack: Pack, shards: TokenShards, index: int) -> ShardDocuments:
    """Shard ``index``'s documents as the pack holds them, after checking its bytes against
    the sha256 its manifest recorded (an error names the shard)."""
    try:
        shards.check_content(index)
        shard = shards.shard(index)
    except ShardError as exc:
        raise ExportError(pack.reword(str(exc))) from None
    offsets = shard.offsets
    lengths = np.diff(offsets)
    keep = kept_lengths(lengths, pack.long_len, pack.overlong)
    base = int(offsets[0])
    values = shard.values[base : int(offsets[-1])]
    labels = None if shard.labels is None else shard.labels[base : int(offsets[-1])]
    if not np.array_equal(keep, lengths):  # cut prefixes out; one mask over the shard
        pos = np.arange(values.size, dtype=np.int64) - np.repeat(offsets[:-1] - base, lengths)
        mask = pos < np.repeat(keep, lengths)
        values = values[mask]
        labels = None if labels is None else labels[mask]
    ids = np.arange(shard.first_doc_id, shard.first_doc_id + lengths.size, dtype=np.int64)
    kept = keep > 0
    return ShardDocuments(tokens=values, lengths=keep[kept], doc_ids=ids[kept], labels=labels)


def trained(labels: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per token, whether it is a trained target: its label is set, and it does not open its
    document (packcli's rule in the packed rows, so no loss crosses a boundary)."""
    out: np.ndarray = labels != IGNORE_INDEX
    out[starts] = False
    return out


def check_parquet(pack: Pack, config: str, entry: Listing) -> Path:
    """A listed Parquet file of the pack, checked against the sha256 ``packcli.json``
    records for it (one read; an edited file would otherwise be exported as truth)."""
    path: Path = pack.out / "data" / config / entry.file
    if not path.is_file():
        raise ExportError(f"{path}: missing, but {pack.out / 'packcli.json'} lists it")
    _check_sha(path, str(path), entry)
    return path


def _check_sha(path: Path, shown: str, entry: Listing) -> None:
    if sha256_file(path) != entry.sha256:
        raise ExportError(
            f"{shown}: changed since packcli wrote it (its sha256 differs from packcli.json); "
            "rerun packcli write/finalize or the same packcli pack"
        )


@contextmanager
def parquet_file(pack: Pack, config: str, entry: Listing) -> Iterator[Path]:
    """A listed Parquet file, checked (``check_parquet``); of a URL pack, fetched whole
    once into the scratch folder and deleted after."""
    if pack.url is None:
        yield check_parquet(pack, config, entry)
        return
    from packcli.fs import fetch_output_file

    assert pack.scratch is not None
    rel = f"data/{config}/{entry.file}"
    try:
        path = fetch_output_file(pack.url, rel, pack.scratch / "rows")
    except PackcliError as exc:
        raise ExportError(str(exc)) from None
    except Exception as exc:  # a backend error that is not an OSError (credentials)
        raise ExportError(f"{pack.shown}/{rel}: cannot be read ({type(exc).__name__})") from exc
    try:
        _check_sha(path, f"{pack.shown}/{rel}", entry)
        yield path
    finally:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class RowBatch:
    """Packed rows of one Parquet row group: flat tokens and per-segment lengths."""

    tokens: npt.NDArray[np.int32]  # every token of the batch's rows back to back
    row_offsets: npt.NDArray[np.int64]  # len rows + 1, into ``tokens``
    seg_lengths: npt.NDArray[np.int64]  # every segment of the batch's rows in order
    seg_offsets: npt.NDArray[np.int64]  # len rows + 1, into ``seg_lengths``
    labels: npt.NDArray[np.int32] | None  # aligned with ``tokens`` (chat)


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values)[offsets[0] : offsets[-1]]
    return values, offsets - offsets[0]


def iter_rows(path: Path) -> Iterator[RowBatch]:
    """Row group by row group (the writer sizes them, ~16M tokens), so memory stays at one
    row group whatever the file's size."""
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    columns = ["input_ids", "seq_lengths"] + (["labels"] if "labels" in names else [])
    for g in range(pf.num_row_groups):
        table = pf.read_row_group(g, columns=columns)
        tokens, row_offsets = _flat(table.column("input_ids"))
        seg_lengths, seg_offsets = _flat(table.column("seq_lengths"))
        labels = _flat(table.column("labels"))[0] if "labels" in columns else None
        yield RowBatch(
            tokens=tokens.astype(np.int32, copy=False),
            row_offsets=row_offsets,
            seg_lengths=seg_lengths.astype(np.int64),
            seg_offsets=seg_offsets,
            labels=None if labels is None else labels.astype(np.int32, copy=False),
        )


def configs_of(pick: str) -> tuple[str, ...]:
    """``--config``: long, short or both (both: each its own dataset)."""
    if pick == "both":
        return CONFIG_NAMES
    if pick not in CONFIG_NAMES:
        raise ExportError(f"--config must be long, short or both, got {pick!r}")
    return (pick,)
