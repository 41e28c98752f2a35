"""``packcli export``: one finished pack -> the files another training stack reads.

Why a command after ``pack`` and not a ``pack --output-format``: every format is a view of
what a pack already holds (whole documents in its tokenized shards, packed rows in its
Parquet files), so one pack feeds every stack without tokenizing or planning again, an
export can be made, deleted and made again at any time, and ``pack`` keeps one output.

Each part (one tokenized shard, or one packed Parquet file) is read, checked against its
recorded sha256, written under temp names and renamed, read back and compared, then recorded
(``record.py``); memory is one part at a time (a shard is ``tokenize.shard_tokens`` tokens,
64M by default; a Parquet file is read one row group at a time). A rerun skips parts whose
record and files are intact; ``packcli-export.json`` is written last.

Either end may be on object storage: a URL pack is read one file at a time (``source.py``),
a URL destination is made part by part in a staging folder and put (``place.py``), so the
bytes moved are about the parts' bytes once each way. The path lists written for the
frameworks name the files where they are: local paths, or the URLs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from packcli.atomic import atomic_write_bytes
from packcli.export import bridge, megatron, olmo
from packcli.export.place import Dest, LocalDest, StoreDest, destination
from packcli.export.record import (
    ExportedFile,
    ExportMarker,
    PartRecord,
    fingerprint,
)
from packcli.export.source import (
    ExportError,
    Pack,
    ShardDocuments,
    configs_of,
    opened_pack,
    parquet_file,
    shard_documents,
    trained,
)

log = logging.getLogger(__name__)

FORMATS: tuple[str, ...] = ("megatron", "olmo", "megatron-bridge")


@dataclass(frozen=True)
class ExportResult:
    """Where the export is (a folder, or a URL), its marker, and how many parts were
    written or kept."""

    dest: str
    marker: dict[str, Any]
    written: int
    reused: int


def export_pack(
    out: str | Path,
    to: str,
    dest: str | Path | None = None,
    *,
    config: str = "both",
    work_dir: str | None = None,
    quiet: bool = False,
) -> ExportResult:
    """Export the pack at ``out`` (a folder or a URL) as ``to`` into ``dest`` [OUT/export/TO,
    on the store for a URL OUT]. ``work_dir``: for a URL OUT made with a local
    ``--work-dir``, that folder (``source.opened_pack``)."""
    if to not in FORMATS:
        raise ExportError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    with opened_pack(out, work_dir) as pack:
        if pack.data_format == "preference":
            raise ExportError(
                f"{pack.shown} is a preference pack: none of megatron, olmo or megatron-bridge "
                "reads chosen/rejected pairs; export a text or chat pack"
            )
        if to == "megatron" and pack.data_format == "chat":
            raise ExportError(
                f"{pack.shown} is a chat pack and Megatron's .bin/.idx has no loss mask "
                "(GPTDataset would train on every token): use --to megatron-bridge (packed "
                "rows, loss on assistant tokens) or --to olmo (label mask)"
            )
        place = _destination(pack, to, dest)
        settings: dict[str, Any] = {
            "format": to,
            "pack_fingerprint": pack.meta.run.get("fingerprint"),
            "tokens_fingerprint": pack.meta.run.get("tokens_fingerprint"),
        }
        if to == "megatron-bridge":
            return _export_rows(pack, place, settings, configs_of(config), quiet)
        return _export_documents(pack, place, settings, to, quiet)


def _destination(pack: Pack, to: str, dest: str | Path | None) -> Dest:
    """``--dest``, else ``OUT/export/TO`` beside the pack (on the store for a URL pack)."""
    if dest is not None:
        return destination(str(dest))
    if pack.url is not None:
        return StoreDest(f"{pack.url}/export/{to}")
    return LocalDest(pack.out / "export" / to)


def _document_files(to: str, name: str, chat: bool) -> list[str]:
    """The files one part of a document-level export is (relative to the export)."""
    if to == "megatron":
        return [f"{name}.bin", f"{name}.idx"]
    return [f"{olmo.TOKENS}/{name}.npy", f"{olmo.TOKENS}/{name}.csv.gz"] + (
        [f"label_mask/{name}.npy"] if chat else []
    )


def _export_documents(
    pack: Pack, place: Dest, settings: dict[str, Any], to: str, quiet: bool
) -> ExportResult:
    shards = pack.shards()
    if to == "megatron":
        dtype = megatron.megatron_dtype(pack.vocab_size)
    else:
        dtype = olmo.olmo_dtype(pack.vocab_size)
    chat = pack.data_format == "chat"
    settings = {
        **settings,
        "dtype": dtype.name,
        "overlong": pack.overlong,
        "long_len": pack.long_len,
        "label_mask": chat,
    }
    names = [f"part-{i:05d}" for i in range(len(shards.manifests))]
    list_name = "data-args.txt" if to == "megatron" else olmo.PATH_LISTS
    place.begin({list_name, *(f for n in names for f in _document_files(to, n, chat))})
    parts: list[PartRecord] = []
    written = reused = 0
    total = sum(m.num_tokens for m in shards.manifests)
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"export {to}", disable=quiet) as bar:
        for i, (name, manifest) in enumerate(zip(names, shards.manifests, strict=True)):
            fp = fingerprint({**settings, "part": name, "source": manifest.sha256})
            record = place.done_part(name, fp)
            if record is None:
                docs = shard_documents(pack, shards, i)
                if to == "megatron":
                    files = _megatron_part(place.folder, name, docs, dtype)
                else:
                    files = _olmo_part(place.folder, name, docs, dtype, chat)
                stats = {"shard": i}
                if chat and docs.labels is not None:
                    stats["trained"] = int(trained(docs.labels, docs.starts).sum())
                record = PartRecord(
                    name=name,
                    fingerprint=fp,
                    files=tuple(ExportedFile.of(place.folder, p) for p in files),
                    documents=int(docs.lengths.size),
                    tokens=int(docs.tokens.size),
                    stats=stats,
                )
                del docs
                pack.release_shard(shards, i)
                record = place.finish_part(record)
                written += 1
            else:
                reused += 1
            parts.append(record)
            bar.update(manifest.num_tokens)
    extra = [_list_file(place, to, parts)]
    return _finish(pack, place, to, settings, parts, extra, written, reused)


def _finish(
    pack: Pack,
    place: Dest,
    to: str,
    settings: dict[str, Any],
    parts: list[PartRecord],
    extra: list[str],
    written: int,
    reused: int,
) -> ExportResult:
    """The export's marker, written last (every file's sha256), and what the CLI prints."""
    marker = ExportMarker(
        format=to,
        fingerprint=fingerprint(settings),
        source=pack.source,
        pack_fingerprint=str(settings["pack_fingerprint"]),
        settings=settings,
        parts=tuple(parts),
        extra_files=tuple(place.finish_file(rel) for rel in extra),
    )
    place.finish(marker)
    return ExportResult(place.where, marker.to_json(), written, reused)


def _megatron_part(dest: Path, name: str, docs: ShardDocuments, dtype: np.dtype) -> list[Path]:
    prefix = dest / name
    megatron.write_indexed(prefix, docs.tokens, docs.lengths, dtype)
    tokens, lengths, doc_index = megatron.read_indexed(prefix)
    if not (
        np.array_equal(tokens, docs.tokens)
        and np.array_equal(lengths, docs.lengths)
        and doc_index.size == lengths.size + 1
    ):
        raise ExportError(f"{prefix}.bin/.idx: read back different from what was written")
    return [prefix.with_suffix(".bin"), prefix.with_suffix(".idx")]


def _olmo_part(
    dest: Path, name: str, docs: ShardDocuments, dtype: np.dtype, chat: bool
) -> list[Path]:
    (dest / olmo.TOKENS).mkdir(exist_ok=True)
    ids = dest / olmo.TOKENS / f"{name}.npy"
    bounds = dest / olmo.TOKENS / f"{name}.csv.gz"
    olmo.write_tokens(ids, docs.tokens, dtype)
    olmo.write_boundaries(bounds, docs.lengths)
    files = [ids, bounds]
    if chat:
        (dest / "label_mask").mkdir(exist_ok=True)
        mask_path = dest / "label_mask" / f"{name}.npy"
        assert docs.labels is not None
        mask = trained(docs.labels, docs.starts)
        olmo.write_label_mask(mask_path, mask)
        if not np.array_equal(np.fromfile(mask_path, dtype=np.bool_), mask):
            raise ExportError(f"{mask_path}: read back different from what was written")
        files.append(mask_path)
    ends = np.cumsum(docs.lengths)
    back = olmo.read_boundaries(bounds)
    if not (
        np.array_equal(np.fromfile(ids, dtype=dtype), docs.tokens)
        and np.array_equal(back[:, 1], ends)
        and np.array_equal(back[:, 0], ends - docs.lengths)
    ):
        raise ExportError(f"{ids}: read back different from what was written")
    return files


def _list_file(place: Dest, to: str, parts: list[PartRecord]) -> str:
    """What the framework's config takes, ready to paste: Megatron's ``--data-args-path``
    file (``weight prefix ...``, weights = tokens, so sampling matches one concatenated
    corpus), or OLMo-core's path lists; each file where the export is (a path, a URL)."""
    if to == "megatron":
        rel = "data-args.txt"
        text = " ".join(f"{p.tokens} {place.shown(p.name)}" for p in parts if p.tokens)
        atomic_write_bytes(place.folder / rel, (text + "\n").encode())
        return rel
    masks = None
    if any(f.path.startswith("label_mask/") for p in parts for f in p.files):
        masks = [place.shown(f"label_mask/{p.name}.npy") for p in parts]
    listing = olmo.PathLists([place.shown(f"{olmo.TOKENS}/{p.name}.npy") for p in parts], masks)
    atomic_write_bytes(place.folder / olmo.PATH_LISTS, listing.to_bytes())
    return olmo.PATH_LISTS


def _export_rows(
    pack: Pack, place: Dest, settings: dict[str, Any], configs: tuple[str, ...], quiet: bool
) -> ExportResult:
    settings = {**settings, "configs": list(configs)}
    parts: list[PartRecord] = []
    extra: list[str] = []
    written = reused = 0
    planned = {f"{c}/metadata.jsonl" for c in configs}
    planned |= {f"{c}/{bridge.bridge_name(e.file)}" for c in configs for e in pack.parquet_files(c)}
    place.begin(planned)
    total = sum(f.tokens for c in configs for f in pack.parquet_files(c))
    with tqdm(
        total=total, unit="tok", unit_scale=True, desc="export megatron-bridge", disable=quiet
    ) as bar:
        for config in configs:
            (place.folder / config).mkdir(exist_ok=True)
            ours: list[PartRecord] = []
            for entry in pack.parquet_files(config):
                name = f"{config}-{entry.file.removesuffix('.parquet')}"
                fp = fingerprint({**settings, "part": name, "source": entry.sha256})
                record = place.done_part(name, fp)
                if record is None:
                    final = place.folder / config / bridge.bridge_name(entry.file)
                    with parquet_file(pack, config, entry) as src:
                        stats = bridge.write_bridge_file(src, final)
                    record = PartRecord(
                        name=name,
                        fingerprint=fp,
                        files=(ExportedFile.of(place.folder, final),),
                        documents=stats.segments,
                        tokens=stats.tokens,
                        stats=stats.as_dict(),
                    )
                    record = place.finish_part(record)
                    written += 1
                else:
                    reused += 1
                ours.append(record)
                bar.update(entry.tokens)
            merged = _merge([r.stats for r in ours])
            meta_rel = f"{config}/metadata.jsonl"
            rows = [r.to_json() for r in bridge.metadata(merged, pack.capacity(config))]
            atomic_write_bytes(
                place.folder / meta_rel, (json.dumps(rows, indent=2) + "\n").encode()
            )
            extra.append(meta_rel)
            parts += ours
    return _finish(pack, place, "megatron-bridge", settings, parts, extra, written, reused)


def _merge(stats: list[dict[str, int]]) -> bridge.BridgeStats:
    """A config's figures from its files' records (so a resumed export has them too)."""
    out = bridge.BridgeStats()
    for s in map(bridge.BridgeStats.of_record, stats):
        out.rows += s.rows
        out.tokens += s.tokens
        out.segments += s.segments
        out.trained += s.trained
        out.max_segments = max(out.max_segments, s.max_segments)
        out.max_seqlen = max(out.max_seqlen, s.max_seqlen)
        if s.rows:
            low = s.min_packed
            out.min_packed = low if out.min_packed < 0 else min(out.min_packed, low)
    return out
