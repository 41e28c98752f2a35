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

import hashlib
import json
import logging
import shutil
import sys
import time
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
from packcli.plan import plan_two_tier
from packcli.read import ReadStats, iter_batches, resolve_inputs
from packcli.report import build_report
from packcli.shards import (
    SUCCESS,
    ShardWriter,
    TokenShards,
    atomic_write_bytes,
    atomic_write_json,
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
    if success.is_file():
        try:
            previous = json.loads(success.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            previous = {}
        if previous.get("fingerprint") == fingerprint:
            log.info("reusing tokenized shards in %s", folder)
            return TokenShards(folder), True
    if folder.exists():
        shutil.rmtree(folder)
    stats = ReadStats()
    total_bytes = sum(f["size"] for f in files)
    tokens = 0
    with (
        ShardWriter(folder, cfg.tokenize.shard_tokens) as writer,
        _bar(quiet, total=total_bytes, unit="B", unit_scale=True, desc="tokenize") as bar,
    ):
        encoder = hf_batch_encoder(loaded.tokenizer)
        batches = prefetch(iter_batches(paths, cfg.read.text_field, cfg.read.batch_size, stats))
        done = 0
        for batch, record_batch in tokenize_batches(batches, encoder, bos=bos, eos=eos):
            writer.add(record_batch)
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


def _relative_to_out(path: Path, out: Path) -> str:
    """Record the work folder relative to the output when inside it, so outputs can move."""
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path.resolve())


def _clear_outputs(out: Path) -> None:
    """Un-mark a previous output and remove its data files (ours only) before rewriting."""
    (out / MARKER).unlink(missing_ok=True)
    for name in CONFIG_NAMES:
        folder = out / "data" / name
        if folder.is_dir():
            for f in folder.glob("*.parquet"):
                f.unlink()
            for f in folder.glob(".*.tmp-*"):
                f.unlink()


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
    timings["plan"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _clear_outputs(out)
    source = TokenSource(list(shards.iter_shards()))
    files: dict[str, list[dict[str, Any]]] = {}
    for name in CONFIG_NAMES:
        layout = plan.long if name == "long" else plan.short
        total = int(layout.row_tokens.sum())
        with _bar(quiet, total=total, unit="tok", unit_scale=True, desc=f"write {name}") as bar:
            files[name] = write_config(
                plan, layout, source, out / "data" / name, cfg.write, on_tokens=bar.update
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
    atomic_write_bytes(out / "README.md", render_card(report, run_info, files).encode("utf-8"))
    atomic_write_json(
        out / MARKER,
        {"config": cfg.to_dict(), "run": run_info, "report": report, "files": files},
    )
    return RunResult(report=report, timings=timings, reused_tokens=reused)
