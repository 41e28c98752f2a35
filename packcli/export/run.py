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
from packcli.export.record import (
    EXPORT_MARKER,
    ExportedFile,
    ExportMarker,
    PartRecord,
    done_part,
    fingerprint,
    write_part,
)
from packcli.export.source import (
    ExportError,
    Pack,
    ShardDocuments,
    check_parquet,
    configs_of,
    open_pack,
    shard_documents,
    trained,
)

log = logging.getLogger(__name__)

FORMATS: tuple[str, ...] = ("megatron", "olmo", "megatron-bridge")


@dataclass(frozen=True)
class ExportResult:
    """Where the export is, its marker, and how many parts were written or kept."""

    dest: Path
    marker: dict[str, Any]
    written: int
    reused: int


def export_pack(
    out: str | Path,
    to: str,
    dest: str | Path | None = None,
    *,
    config: str = "both",
    quiet: bool = False,
) -> ExportResult:
    """Export the pack at ``out`` as ``to`` into ``dest`` [OUT/export/TO]."""
    from packcli.fs import is_url

    if to not in FORMATS:
        raise ExportError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    for where in (out, dest):
        if where is not None and is_url(str(where)):
            raise ExportError(
                f"{where}: export reads and writes local folders only (for now); run it where "
                "the pack and its work folder are, then copy the export folder to the store"
            )
    pack = open_pack(Path(out))
    if pack.data_format == "preference":
        raise ExportError(
            f"{pack.out} is a preference pack: none of megatron, olmo or megatron-bridge reads "
            "chosen/rejected pairs; export a text or chat pack"
        )
    if to == "megatron" and pack.data_format == "chat":
        raise ExportError(
            f"{pack.out} is a chat pack and Megatron's .bin/.idx has no loss mask (GPTDataset "
            "would train on every token): use --to megatron-bridge (packed rows, loss on "
            "assistant tokens) or --to olmo (label mask)"
        )
    target = Path(dest) if dest is not None else pack.out / "export" / to
    target.mkdir(parents=True, exist_ok=True)
    (target / EXPORT_MARKER).unlink(missing_ok=True)  # complete again only when all is
    settings: dict[str, Any] = {
        "format": to,
        "pack_fingerprint": pack.meta["run"].get("fingerprint"),
        "tokens_fingerprint": pack.meta["run"].get("tokens_fingerprint"),
    }
    if to == "megatron-bridge":
        return _export_rows(pack, target, settings, configs_of(config), quiet)
    return _export_documents(pack, target, settings, to, quiet)


def _export_documents(
    pack: Pack, dest: Path, settings: dict[str, Any], to: str, quiet: bool
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
    parts: list[PartRecord] = []
    written = reused = 0
    total = sum(int(m["num_tokens"]) for m in shards.manifests)
    with tqdm(total=total, unit="tok", unit_scale=True, desc=f"export {to}", disable=quiet) as bar:
        for i, manifest in enumerate(shards.manifests):
            name = f"part-{i:05d}"
            fp = fingerprint({**settings, "part": name, "source": manifest.get("sha256")})
            record = done_part(dest, name, fp)
            if record is None:
                docs = shard_documents(pack, shards, i)
                if to == "megatron":
                    files = _megatron_part(dest, name, docs, dtype)
                else:
                    files = _olmo_part(dest, name, docs, dtype, chat)
                stats = {"shard": i}
                if chat and docs.labels is not None:
                    stats["trained"] = int(trained(docs.labels, docs.starts).sum())
                record = PartRecord(
                    name=name,
                    fingerprint=fp,
                    files=tuple(ExportedFile.of(dest, p) for p in files),
                    documents=int(docs.lengths.size),
                    tokens=int(docs.tokens.size),
                    stats=stats,
                )
                write_part(dest, record)
                written += 1
            else:
                reused += 1
            parts.append(record)
            bar.update(int(manifest["num_tokens"]))
    extra = [_list_file(dest, to, parts)]
    return _finish(pack, dest, to, settings, parts, extra, written, reused)


def _finish(
    pack: Pack,
    dest: Path,
    to: str,
    settings: dict[str, Any],
    parts: list[PartRecord],
    extra: list[Path],
    written: int,
    reused: int,
) -> ExportResult:
    """The export's marker, written last (every file's sha256), and what the CLI prints."""
    marker = ExportMarker(
        format=to,
        fingerprint=fingerprint(settings),
        source=str(pack.out.resolve()),
        pack_fingerprint=str(settings["pack_fingerprint"]),
        settings=settings,
        parts=tuple(parts),
        extra_files=tuple(ExportedFile.of(dest, p) for p in extra),
    )
    marker.write(dest)
    return ExportResult(dest, marker.to_json(), written, reused)


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
    (dest / "tokens").mkdir(exist_ok=True)
    ids = dest / "tokens" / f"{name}.npy"
    bounds = dest / "tokens" / f"{name}.csv.gz"
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


def _list_file(dest: Path, to: str, parts: list[PartRecord]) -> Path:
    """What the framework's config takes, ready to paste: Megatron's ``--data-args-path``
    file (``weight prefix ...``, weights = tokens, so sampling matches one concatenated
    corpus), or OLMo-core's path lists."""
    if to == "megatron":
        path = dest / "data-args.txt"
        text = " ".join(f"{p.tokens} {(dest / p.name).resolve()}" for p in parts if p.tokens)
        atomic_write_bytes(path, (text + "\n").encode())
        return path
    path = dest / "paths.json"
    listing: dict[str, list[str]] = {
        "paths": [str((dest / "tokens" / f"{p.name}.npy").resolve()) for p in parts]
    }
    if any(f.path.startswith("label_mask/") for p in parts for f in p.files):
        listing["label_mask_paths"] = [
            str((dest / "label_mask" / f"{p.name}.npy").resolve()) for p in parts
        ]
    atomic_write_bytes(path, (json.dumps(listing, indent=2) + "\n").encode())
    return path


def _export_rows(
    pack: Pack, dest: Path, settings: dict[str, Any], configs: tuple[str, ...], quiet: bool
) -> ExportResult:
    settings = {**settings, "configs": list(configs)}
    parts: list[PartRecord] = []
    extra: list[Path] = []
    written = reused = 0
    total = sum(int(f.get("tokens", 0)) for c in configs for f in pack.parquet_files(c))
    with tqdm(
        total=total, unit="tok", unit_scale=True, desc="export megatron-bridge", disable=quiet
    ) as bar:
        for config in configs:
            (dest / config).mkdir(exist_ok=True)
            ours: list[PartRecord] = []
            for entry in pack.parquet_files(config):
                name = f"{config}-{entry['file'].removesuffix('.parquet')}"
                fp = fingerprint({**settings, "part": name, "source": entry["sha256"]})
                record = done_part(dest, name, fp)
                if record is None:
                    src = check_parquet(pack, config, entry)
                    final = dest / config / bridge.bridge_name(entry["file"])
                    stats = bridge.write_bridge_file(src, final)
                    record = PartRecord(
                        name=name,
                        fingerprint=fp,
                        files=(ExportedFile.of(dest, final),),
                        documents=stats.segments,
                        tokens=stats.tokens,
                        stats=stats.as_dict(),
                    )
                    write_part(dest, record)
                    written += 1
                else:
                    reused += 1
                ours.append(record)
                bar.update(int(entry.get("tokens", record.tokens)))
            merged = _merge([r.stats for r in ours])
            meta_path = dest / config / "metadata.jsonl"
            rows = bridge.metadata(merged, pack.capacity(config))
            atomic_write_bytes(meta_path, (json.dumps(rows, indent=2) + "\n").encode())
            extra.append(meta_path)
            parts += ours
    return _finish(pack, dest, "megatron-bridge", settings, parts, extra, written, reused)


def _merge(stats: list[dict[str, int]]) -> bridge.BridgeStats:
    """A config's figures from its files' records (so a resumed export has them too)."""
    out = bridge.BridgeStats()
    for s in stats:
        out.rows += s["rows"]
        out.tokens += s["tokens"]
        out.segments += s["segments"]
        out.trained += s["trained"]
        out.max_segments = max(out.max_segments, s["max_segments"])
        out.max_seqlen = max(out.max_seqlen, s["max_seqlen"])
        if s["rows"]:
            low = s["min_packed"]
            out.min_packed = low if out.min_packed < 0 else min(out.min_packed, low)
    return out
