"""Re-encode a sample of the input and compare it with the output: `verify`'s check that does
not trust the tokenize stage.

The conservation check in ``verify`` compares the output with the tokenized shards, so
anything that went wrong *while* tokenizing (a tokenizer file that truncates or pads, a fast
backend that differs from HF, special-token strings matched where they should not be) is in
the shards too and passes. Here the first documents of the first input file, and the largest
document (each when under ``MAX_DOC_CHARS``), are read again from the input, encoded with HF
``tokenizers`` (the reference, with the run's recorded settings) and compared with their
segments in the long config by the same order-sensitive hash. Cost: reading and encoding
~256 documents (well under a second), plus reading up to the largest document's line.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import PackcliError, VerifyError
from packcli.fs import as_input, input_entry
from packcli.read import ReadStats
from packcli.tokenize.backends import HFEncoder
from packcli.tokenize.encode import assemble

log = logging.getLogger(__name__)

SAMPLE_DOCS = 256
# Documents are encoded again only up to this size: HF took 19 s and 2.8 GB for one of 20 MB
# (the other documents of the sample catch a tokenizer setting or backend at fault).
MAX_DOC_CHARS = 1 << 20


def _unchanged(entry: dict[str, Any]) -> bool:
    """Whether the input still has the identity the run recorded (``fs.input_entry``)."""
    try:
        now = input_entry(entry["path"], fresh=True)
    except (OSError, PackcliError):
        return False
    if "version" in now:  # a URL: the version fields both listings gave must agree
        old = entry.get("version") or {}
        common = old.keys() & now["version"].keys()
        return (
            entry.get("size") == now["size"]
            and bool(common)
            and all(old[k] == now["version"][k] for k in common)
        )
    return all(entry.get(k) == v for k, v in now.items())


def _sample(
    cfg: Any, path: Path | str, largest_line: int | None, fmt: str = "jsonl"
) -> list[tuple[int, int, Any]]:
    """(doc id, line, text or dialogue) of the first documents of ``path`` and of the
    document at ``largest_line`` (which may be further in; a row for Parquet/Arrow)."""
    from packcli.stages.units import read_unit

    picked: list[tuple[int, int, Any]] = []
    # A quick look (``sample``): the run verified this file's compressed stream and it is
    # unchanged since (a damaged one is skipped above), so no need to decompress all of it
    # first.
    unit = {"path": str(path), "span": None, "format": fmt}
    batches = read_unit(cfg, unit, cfg.read.batch_size, ReadStats(), sample=True)
    for batch in batches:
        for k, text in enumerate(batch.texts):
            doc, line = batch.doc_id_start + k, int(batch.position[k])
            if (doc < SAMPLE_DOCS or line == largest_line) and len(text) <= MAX_DOC_CHARS:
                picked.append((doc, line, text))
        if batch.doc_id_start + len(batch.texts) >= SAMPLE_DOCS and (
            largest_line is None or int(batch.position[-1]) >= largest_line
        ):
            break
    return picked


def _fingerprints(loaded: Any) -> set[str]:
    """What a run with this tokenizer may have recorded: today's fingerprint, the file's own
    hash (runs before truncation/padding were turned off), and the hash of the serialization
    that earlier versions recorded, before and after turning them off."""
    from tokenizers import Tokenizer

    found = {loaded.fingerprint, loaded.file_fingerprint}
    found.add(hashlib.sha256(loaded.tokenizer.to_str().encode("utf-8")).hexdigest())
    if loaded.disabled and Path(loaded.source).is_file():
        raw = Tokenizer.from_file(loaded.source).to_str()
        found.add(hashlib.sha256(raw.encode("utf-8")).hexdigest())
    return found


def check_against_input(
    meta: dict[str, Any], long_segments: Any, wanted: frozenset[int] | None = None
) -> dict[str, Any]:
    """Compare re-encoded input documents with the long config's segments (``wanted``: the
    doc ids ``long_segments`` was gathered for, all when None).

    Returns a summary (``checked`` documents, or ``skipped`` with the reason when the input
    or tokenizer is no longer what the run used); raises ``VerifyError`` on a difference.
    """
    from packcli.config import build_config
    from packcli.stages.prepare import resolve_tokenizing

    run = meta["run"]
    inputs = run.get("inputs") or []
    if not inputs:
        return {"skipped": "no input files recorded"}
    if not _unchanged(inputs[0]):
        return {"skipped": f"input {inputs[0]['path']} is missing or changed since the run"}
    recorded = run["tokenizer"]
    values = {k: v for k, v in meta["config"].items() if k not in ("out", "work_dir")}
    values["tokenize"] = {
        **values["tokenize"],
        "tokenizer": recorded["source"],
        # The ids the run resolved (``auto`` is not looked up again).
        "eos": "none" if recorded.get("eos_id") is None else recorded["eos_id"],
        "bos": "none" if recorded.get("bos_id") is None else recorded["bos_id"],
    }
    if "special_in_text" not in recorded:  # made before the option: special strings matched
        values["tokenize"]["special_in_text"] = "special"
    try:
        cfg = build_config(values)
        tok = resolve_tokenizing(cfg)
    except PackcliError as exc:
        return {"skipped": f"cannot load the run's tokenizer or settings: {exc}"}
    if recorded["sha256"] not in _fingerprints(tok.loaded):
        return {"skipped": "the tokenizer file changed since the run"}
    report = meta["report"]
    damaged = {c.get("file") for c in report["input"].get("corrupt_streams") or []}
    if inputs[0]["path"] in damaged:
        return {"skipped": f"input {inputs[0]['path']} had a damaged compressed stream"}
    largest = report.get("largest_document", {})
    fmt = inputs[0].get("format", "jsonl")
    where = "line" if fmt == "jsonl" else "row"
    largest_line = largest.get(where) if largest.get("file") == inputs[0]["path"] else None
    sample = _sample(cfg, as_input(inputs[0]["path"]), largest_line, fmt)
    if not sample:
        return {"checked": 0}
    if wanted is not None and not {s[0] for s in sample} <= wanted:
        return {"skipped": "the sampled documents are not the first ones or the largest"}
    items = [s[2] for s in sample]
    if tok.chat is not None:
        # (Preference pairs: one document each, the same as the verify segments' pair units.)
        encoded = tok.chat(items)
        ids, lengths, failures = encoded.ids, encoded.lengths, encoded.failures
        if failures:  # the run quarantined or stopped on these; nothing to compare
            return {"skipped": f"the chat template rejects document {sample[failures[0][0]][0]}"}
    else:
        ids, lengths = assemble(HFEncoder(tok.loaded.tokenizer)(items), bos=tok.bos, eos=tok.eos)
    ends = np.cumsum(lengths)
    long_len = int(meta["config"]["plan"]["long_len"])
    policy = meta["config"]["plan"]["overlong"]
    from packcli.publish.expected import expected_pieces, segment_hashes

    order = np.argsort(long_segments.doc, kind="stable")
    docs_sorted = long_segments.doc[order]
    for (doc, line, _), end, n in zip(sample, ends, lengths, strict=True):
        want = expected_pieces(ids[int(end - n) : int(end)], long_len, policy)
        lo, hi = np.searchsorted(docs_sorted, [doc, doc + 1])
        got = order[lo:hi]
        # Pieces of a split document sit in any rows: compare (length, hash) as multisets.
        found = sorted(
            zip(long_segments.length[got].tolist(), long_segments.hash[got].tolist(), strict=True)
        )
        expected = sorted((p.size, int(segment_hashes(p, np.array([p.size]))[0])) for p in want)
        if found != expected:
            at = f":{line}" if fmt == "jsonl" else f": row {line}"
            raise VerifyError(
                f"{inputs[0]['path']}{at}: document {doc} encoded again from the input "
                f"({int(n)} tokens) differs from the output ({sum(x[0] for x in found)} tokens "
                "in the long config): the tokenize stage changed it (a tokenizer setting or "
                "backend); run `packcli pack` again"
            )
    return {"checked": len(sample)}
