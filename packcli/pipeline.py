"""The orchestrator: wires read -> tokenize -> shards -> plan -> write, with progress and resume.

Output folder layout::

    OUT/README.md                       dataset card (Hub YAML configs)
    OUT/packcli.json                    resolved config + report + file hashes; written last,
                                        so its presence marks a complete output
    OUT/data/{long,short}/train-*.parquet
    OUT/.packcli/tokens/                tokenized shards (work folder; --work-dir moves it)

Resume: the tokenize stage is skipped when its ``_SUCCESS.json`` carries the same
fingerprint (input files' paths, sizes and mtimes, tokenizer, separators, text field), so a
rerun after a crash in planning or writing re-tokenizes nothing. Only this module and the CLI
print; everything below logs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from packcli import __version__
from packcli.card import CONFIG_NAMES, render_card
from packcli.config import RunConfig
from packcli.encode import prefetch, tokenize_batches
from packcli.errors import ConfigError, InputError, PackcliError
from packcli.faults import crash_point
from packcli.plan import plan_two_tier
from packcli.read import DocBatch, ReadStats, iter_batches, resolve_inputs
from packcli.report import build_report
from packcli.shards import (
    SUCCESS,
    ShardWriter,
    TokenShards,
    atomic_write_bytes,
    atomic_write_json,
    manifest_name,
)
from packcli.tokenizer import (
    LoadedTokenizer,
    hf_batch_encoder,
    load_tokenizer,
    resolve_special,
)
from packcli.write import TokenSource, write_config

log = logging.getLogger(__name__)

MARKER = "packcli.json"


@dataclass
class RunResult:
    report: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    reused_tokens: bool = False


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def check_output_folder(out: Path, overwrite: bool) -> None:
    """Refuse to write into a non-empty folder that is not a packcli output."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if not out.exists() or not any(out.iterdir()):
        return
    ours = (out / MARKER).exists() or (out / ".packcli").exists() or (out / "data").is_dir()
    if not ours and not overwrite:
        raise ConfigError(
            f"output folder {out} is not empty and is not a packcli output; "
            "choose another --out or pass --overwrite"
        )


def _bar(quiet: bool, **kwargs: Any) -> tqdm:
    return tqdm(disable=quiet, file=sys.stderr, dynamic_ncols=True, **kwargs)


def tokenize_stage(
    cfg: RunConfig,
    paths: list[Path],
    loaded: LoadedTokenizer,
    eos: int | None,
    bos: int | None,
    quiet: bool,
) -> tuple[TokenShards, bool]:
    folder = cfg.work_path / "tokens"
    files = [
        {"path": str(p.resolve()), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
        for p in paths
    ]
    fingerprint = _fingerprint(
        {
            "files": files,
            "text_field": cfg.read.text_field,
            "tokenizer": loaded.fingerprint,
            "eos": eos,
            "bos": bos,
            "shard_tokens": cfg.tokenize.shard_tokens,
            "packcli": __version__,
        }
    )
    success = folder / SUCCESS
    if _read_json(success).get("fingerprint") == fingerprint:
        log.info("reusing tokenized shards in %s", folder)
        return TokenShards(folder), True
    done_shards = _resumable_shards(folder, fingerprint)
    resume_doc = done_shards[-1]["last_doc_id"] + 1 if done_shards else 0
    if done_shards:
        log.info("resuming tokenization after %d completed shard(s)", len(done_shards))
    stats = ReadStats()
    total_bytes = sum(f["size"] for f in files)
    tokens = sum(m["num_tokens"] for m in done_shards)
    with (
        ShardWriter(folder, cfg.tokenize.shard_tokens, done_shards) as writer,
        _bar(quiet, total=total_bytes, unit="B", unit_scale=True, desc="tokenize") as bar,
    ):
        encoder = hf_batch_encoder(loaded.tokenizer)
        batches = prefetch(
            _skip_documents(
                iter_batches(paths, cfg.read.text_field, cfg.read.batch_size, stats), resume_doc
            )
        )
        done = 0
        for batch, record_batch in tokenize_batches(batches, encoder, bos=bos, eos=eos):
            shards_before = len(writer.manifests)
            writer.add(record_batch)
            if len(writer.manifests) > shards_before:
                crash_point(f"tokenize:{len(writer.manifests)}")
            tokens += int(record_batch.column("length").to_numpy().sum())
            bar.update(batch.progress_bytes - done)
            done = batch.progress_bytes
            elapsed = max(bar.format_dict["elapsed"], 1e-9)
            bar.set_postfix_str(f"{tokens:,} tokens, {tokens / elapsed:,.0f} tok/s", refresh=False)
    atomic_write_json(
        success,
        {
            "fingerprint": fingerprint,
            "files": files,
            "shards": writer.manifests,
            "read_stats": {
                "files": stats.files,
                "documents": stats.documents,
                "blank_lines": stats.blank_lines,
                "bytes_read": stats.bytes_read,
            },
            "tokens": tokens,
        },
    )
    return TokenShards(folder), False


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _resumable_shards(folder: Path, fingerprint: str) -> list[dict[str, Any]]:
    """Completed shards of an interrupted run with the same fingerprint; clears the rest.

    A shard counts as complete when its manifest exists: the shard is renamed into place
    first, its manifest second, both atomically. Anything else (temp files, a shard without a
    manifest, shards of another fingerprint) is removed.
    """
    stamp = folder / "fingerprint.json"
    if _read_json(stamp).get("fingerprint") != fingerprint:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        atomic_write_json(stamp, {"fingerprint": fingerprint})
        return []
    manifests = []
    while (m := _read_json(folder / manifest_name(len(manifests)))) and (
        folder / m.get("file", "-")
    ).is_file():
        manifests.append(m)
    keep = {stamp.name} | {m["file"] for m in manifests}
    keep |= {manifest_name(i) for i in range(len(manifests))}
    for f in folder.iterdir():
        if f.name not in keep:
            f.unlink()
    return manifests


def _skip_documents(batches: Iterator[DocBatch], start: int) -> Iterator[DocBatch]:
    """Drop documents before ``start`` (already tokenized by an interrupted run). Reading and
    parsing them again is ~100x cheaper than tokenizing, and keeps doc ids and stats exact."""
    for batch in batches:
        n = len(batch.texts)
        if batch.doc_id_start + n <= start:
            continue
        cut = max(0, start - batch.doc_id_start)
        if cut:
            batch = DocBatch(
                texts=batch.texts[cut:],
                doc_id_start=batch.doc_id_start + cut,
                file_index=batch.file_index[cut:],
                line=batch.line[cut:],
                progress_bytes=batch.progress_bytes,
            )
        yield batch


def _relative_to_out(path: Path, out: Path) -> str:
    """Record the work folder relative to the output when inside it, so outputs can move."""
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path.resolve())


def _prepare_write_stage(cfg: RunConfig, out: Path, tokens_fingerprint: str) -> bool:
    """Un-mark a previous output; keep its Parquet files only if they come from the same
    tokens, plan and write settings (an interrupted identical run), else remove them (ours
    only). Returns whether existing complete files may be kept."""
    (out / MARKER).unlink(missing_ok=True)
    fingerprint = _fingerprint(
        {
            "tokens": tokens_fingerprint,
            "plan": dataclasses.asdict(cfg.plan),
            "write": dataclasses.asdict(cfg.write),
            "packcli": __version__,
        }
    )
    stamp = cfg.work_path / "write.json"
    resume = _read_json(stamp).get("fingerprint") == fingerprint
    for name in CONFIG_NAMES:
        folder = out / "data" / name
        if folder.is_dir():
            for f in folder.glob(".*.tmp-*"):
                f.unlink()
            if not resume:
                for f in folder.glob("*.parquet"):
                    f.unlink()
    if not resume:
        atomic_write_json(stamp, {"fingerprint": fingerprint})
    return resume


def run_pack(
    cfg: RunConfig, *, quiet: bool = False, overwrite: bool = False, command: str = ""
) -> RunResult:
    out = cfg.out_path
    if not cfg.out:
        raise ConfigError("no output folder given: pass --out OUT")
    timings: dict[str, float] = {}
    check_output_folder(out, overwrite)
    paths = resolve_inputs(cfg.read.inputs)
    loaded = load_tokenizer(cfg.tokenize.tokenizer)
    eos = resolve_special(loaded, cfg.tokenize.eos, "eos")
    bos = resolve_special(loaded, cfg.tokenize.bos, "bos")
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    shards, reused = tokenize_stage(cfg, paths, loaded, eos, bos, quiet)
    timings["tokenize"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    lengths = shards.column("length").astype(np.int64)
    if lengths.size == 0:
        raise InputError(
            f"no documents in {len(paths)} input file(s) "
            f"({shards.success['read_stats']['blank_lines']} blank lines); nothing to pack"
        )
    doc_ids = shards.column("doc_id")
    if not np.array_equal(doc_ids, np.arange(lengths.size)):
        raise PackcliError(f"tokenized shards in {shards.folder} are inconsistent; delete them")
    with _bar(quiet, total=1, desc="plan") as bar:
        plan = plan_two_tier(lengths, cfg.plan)
        bar.update(1)
    crash_point("plan")
    timings["plan"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    resume = _prepare_write_stage(cfg, out, shards.success["fingerprint"])
    source = TokenSource(list(shards.iter_shards()))
    files: dict[str, list[dict[str, Any]]] = {}
    for name in CONFIG_NAMES:
        layout = plan.long if name == "long" else plan.short
        total = int(layout.row_tokens.sum())
        with _bar(quiet, total=total, unit="tok", unit_scale=True, desc=f"write {name}") as bar:
            files[name] = write_config(
                plan,
                layout,
                source,
                out / "data" / name,
                cfg.write,
                on_tokens=bar.update,
                keep_existing=resume,
                on_file=lambda i, name=name: crash_point(f"write:{name}:{i}"),
            )
    timings["write"] = time.perf_counter() - t0

    largest = int(lengths.argmax()) if lengths.size else -1
    provenance = None
    if largest >= 0:
        file_index = int(shards.column("file_index")[largest])
        provenance = {
            "file": shards.success["files"][file_index]["path"],
            "line": int(shards.column("line")[largest]),
        }
    report = build_report(
        plan,
        lengths,
        short_len=cfg.plan.short_len,
        long_len=cfg.plan.long_len,
        input_stats={
            "files": len(paths),
            "blank_lines": shards.success["read_stats"]["blank_lines"],
            "bytes": sum(f["size"] for f in shards.success["files"]),
        },
        largest_provenance=provenance,
    )
    run_info = {
        "packcli_version": __version__,
        "command": command,
        "tokenizer": {
            "source": loaded.source,
            "sha256": loaded.fingerprint,
            "vocab_size": loaded.vocab_size,
            "eos_id": eos,
            "bos_id": bos,
        },
        "inputs": shards.success["files"],
        "tokens_fingerprint": shards.success["fingerprint"],
        "work_dir": _relative_to_out(cfg.work_path, out),
    }
    crash_point("finalize")
    atomic_write_bytes(out / "README.md", render_card(report, run_info, files).encode("utf-8"))
    atomic_write_json(
        out / MARKER,
        {"config": cfg.to_dict(), "run": run_info, "report": report, "files": files},
    )
    return RunResult(report=report, timings=timings, reused_tokens=reused)
