"""Look inside one packed row: its segments, their documents and the text at each boundary.

Why: the segment columns are the whole point of a packcli dataset, and the quickest way to
trust them (or to debug a training run) is to see one row the way the trainer will: where
each document starts and ends, which document it came from, which tokens carry no loss, and
that the text on either side of a boundary really belongs to two different documents (each
ending with the separator packcli appended).

The row is located through the per-file ``rows`` counts in ``packcli.json`` and the row
group sizes in the Parquet footer, so only one row group of one file is read (the token
columns of at most ``write.row_group_tokens`` tokens), whatever the size of the dataset.
Text is decoded with the tokenizer recorded in ``packcli.json`` (``--tokenizer`` overrides
it), only around the boundaries. numpy and pyarrow are imported inside the functions, so
the CLI's import of this module keeps ``packcli --help`` fast. The module is not called ``inspect``:
that name would shadow the standard library.
"""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packcli.errors import ConfigError, PackcliError, require_one_of
from packcli.names import CONFIG_NAMES, IGNORE_INDEX, PREVIEW_CHARS, TOKENS_DIR
from packcli.publish.marker import Marker, read_marker, work_folder
from packcli.publish.stats import capacities, read_meta, require_extra

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

_COLUMNS = ("input_ids", "seq_lengths", "doc_ids", "num_tokens")
# Not in every output: chat/preference columns, the piece columns (older outputs) and cost.
_OPTIONAL = ("labels", "seq_roles", "seq_pieces", "seq_last", "cost")
ROLE_NAMES = {0: "document", 1: "chosen", 2: "rejected"}  # seq_roles, as packcli.write writes them
_READABLE = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) as an escape: ``\\n``, ``\\t``,
    ``\\r`` by name, the others as ``\\x1b``.

    Why: documents hold terminal escapes (``ESC[31m``), and a preview cut at a token boundary
    can end mid-sequence; printed raw, they recolour or garble the terminal."""
    if text.isprintable():
        return text
    return "".join(
        _READABLE.get(ch) or (f"\\x{ord(ch):02x}" if unicodedata.category(ch) == "Cc" else ch)
        for ch in text
    )


def locate_row(meta: Marker, config: str, row: int) -> tuple[str, int]:
    """(file name, row within the file) of row ``row`` of ``config``."""
    require_one_of("--config", config, CONFIG_NAMES)
    files = meta.files.of(config)
    total = sum(f.rows for f in files)
    if not 0 <= row < total:
        span = f"0..{total - 1}" if total else "none"
        raise ConfigError(f"row {row} does not exist: config {config} has {total:,} rows ({span})")
    for f in files:
        if row < f.rows:
            return f.file, row
        row -= f.rows
    raise AssertionError("unreachable: row counted above")


def read_row(path: Path, row_in_file: int) -> dict[str, Any]:
    """One row as numpy arrays, reading only the row group that holds it."""
    import numpy as np
    import pyarrow.parquet as pq

    if not path.is_file():
        raise PackcliError(f"{path} is missing; the output is damaged (see packcli verify)")
    with pq.ParquetFile(path) as pf:
        columns = [*_COLUMNS, *(c for c in _OPTIONAL if c in pf.schema_arrow.names)]
        first = 0
        for g in range(pf.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if row_in_file < first + n:
                table = pf.read_row_group(g, columns=columns).slice(row_in_file - first, 1)
                break
            first += n
        else:
            raise PackcliError(
                f"{path}: has {first} rows, packcli.json says more (see packcli verify)"
            )
    row: dict[str, Any] = {
        c: np.asarray(table.column(c)[0].values) for c in columns if c not in ("num_tokens", "cost")
    }
    for c in ("num_tokens", "cost"):  # per-row scalars
        if c in columns:
            row[c] = table.column(c)[0].as_py()
    return row


def masked_spans(labels: np.ndarray, start: int = 0) -> list[tuple[int, int]]:
    """Runs of ``IGNORE_INDEX`` in ``labels`` as half-open ``(start, end)`` token offsets."""
    import numpy as np

    m = np.concatenate([[False], labels == IGNORE_INDEX, [False]])
    edges = np.flatnonzero(np.diff(m.astype(np.int8)))
    return [(start + int(a), start + int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _recorded_source(out: Path, meta: Marker) -> str:
    """The recorded tokenizer, found also when it was given relative to pack's directory.

    ``run.tokenizer.source`` is recorded as given, so a relative path only resolves from the
    directory pack ran in. That directory is recoverable when ``--out`` was relative too:
    it is the resolved output folder minus the ``--out`` path.
    """
    source: str = meta.run["tokenizer"]["source"]
    given = Path(meta.config.get("out") or "")
    if Path(source).exists() or Path(source).is_absolute() or given.is_absolute():
        return source
    parts = [p for p in given.parts if p != "."]
    resolved = out.resolve().parts
    if not parts or ".." in parts or list(resolved[-len(parts) :]) != parts:
        return source
    candidate = Path(*resolved[: -len(parts)]) / source
    return str(candidate) if candidate.exists() else source


def load_decoder(out: Path, meta: Marker, override: str | None) -> tuple[Tokenizer, str]:
    """The tokenizer to decode with, and where it came from; warns if it is not the recorded one."""
    from packcli.tokenize.tokenizer import load_tokenizer

    recorded = meta.run["tokenizer"]
    spec = override or _recorded_source(out, meta)
    try:
        loaded = load_tokenizer(spec)
    except ConfigError as exc:
        hint = "" if override else " (pass --tokenizer PATH to the tokenizer.json used by pack)"
        raise ConfigError(f"{exc}{hint}") from exc
    if loaded.fingerprint != recorded.get("sha256"):
        log.warning(
            "tokenizer %s differs from the one recorded in packcli.json; text may be wrong", spec
        )
    return loaded.tokenizer, loaded.source


# A multi-byte character cut at a token boundary decodes to up to 3 replacement characters at
# the cut; decoding this many characters more than shown keeps them out of the preview.
_CUT_MARGIN = 4


def _head(tokenizer: Tokenizer, ids: np.ndarray, chars: int) -> str:
    """First ``chars`` characters of the decoded ``ids``, decoding only as much as needed."""
    n = min(ids.size, chars + 8)
    while True:
        text = tokenizer.decode(ids[:n].tolist(), skip_special_tokens=False)
        if len(text) >= chars + _CUT_MARGIN or n >= ids.size:
            return text[:chars]
        n = min(ids.size, 2 * n)


def _tail(tokenizer: Tokenizer, ids: np.ndarray, chars: int) -> str:
    """Last ``chars`` characters of the decoded ``ids``, decoding only as much as needed."""
    if chars == 0:
        return ""
    n = min(ids.size, chars + 8)
    while True:
        text = tokenizer.decode(ids[ids.size - n :].tolist(), skip_special_tokens=False)
        if len(text) >= chars + _CUT_MARGIN or n >= ids.size:
            return text[-chars:]
        n = min(ids.size, 2 * n)


def inspect_row(
    out: Path,
    config: str,
    row: int,
    *,
    tokenizer: str | None = None,
    chars: int = PREVIEW_CHARS,
    decode: bool = True,
) -> dict[str, Any]:
    """The segments of one row with doc ids, offsets, loss-masked spans and text previews."""
    import numpy as np

    meta = read_meta(out)
    file, row_in_file = locate_row(meta, config, row)
    data = read_row(out / "data" / config / file, row_in_file)
    tok, source = load_decoder(out, meta, tokenizer) if decode else (None, None)
    ids, lens, docs = data["input_ids"], data["seq_lengths"], data["doc_ids"]
    labels = data.get("labels")
    roles = data.get("seq_roles")
    pieces, last = data.get("seq_pieces"), data.get("seq_last")
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    segments = []
    for i, (s, n, d) in enumerate(zip(starts.tolist(), lens.tolist(), docs.tolist(), strict=True)):
        seg: dict[str, Any] = {"index": i + 1, "doc_id": d, "length": n, "start": s, "end": s + n}
        if roles is not None:
            seg["role"] = ROLE_NAMES.get(int(roles[i]), str(int(roles[i])))
        if pieces is not None and last is not None:
            seg["piece"], seg["last"] = int(pieces[i]), bool(last[i])
        if labels is not None:
            seg["masked_spans"] = [list(p) for p in masked_spans(labels[s : s + n], s)]
        if tok is not None:
            seg["head"] = _head(tok, ids[s : s + n], chars)
            seg["tail"] = _tail(tok, ids[s : s + n], chars)
        segments.append(seg)
    return {
        "config": config,
        "row": row,
        "file": f"data/{config}/{file}",
        "row_in_file": row_in_file,
        "num_tokens": data["num_tokens"],
        "capacity": capacities(meta)[config],
        "has_labels": labels is not None,
        "has_roles": roles is not None,
        "has_pieces": pieces is not None and last is not None,
        "cost": data.get("cost"),
        "tokenizer": source,
        "segments": segments,
    }


def _spans(spans: list[list[int]] | None) -> str:
    if spans is None:
        return "-"
    return ", ".join(f"{a}-{b}" for a, b in spans) or "none"


def render_row(view: dict[str, Any]) -> list[Any]:
    """rich renderables: a segment table and the text at each boundary."""
    require_extra("rich", "packcli inspect tables (or pass --json)")
    from rich.table import Table
    from rich.text import Text

    segs = view["segments"]
    title = (
        f"{view['config']} row {view['row']:,} ({view['file']}, row {view['row_in_file']:,}): "
        f"{view['num_tokens']:,} / {view['capacity']:,} tokens, {len(segs)} segments"
    )
    if view.get("cost") is not None:
        title += f", cost {view['cost']:.4g}"
    t = Table()
    for col in ("segment", "doc id", "length", "tokens [start, end)"):
        t.add_column(col, justify="right")
    if view.get("has_pieces"):
        t.add_column("piece (seq_pieces)", justify="right")
    if view.get("has_roles"):
        t.add_column("seq_roles")
    if view["has_labels"]:
        t.add_column("no-loss spans (label -100)")
    for s in segs:
        cells = [str(s["index"]), f"{s['doc_id']:,}", f"{s['length']:,}"]
        cells.append(f"{s['start']:,} - {s['end']:,}")
        if view.get("has_pieces"):
            cells.append(f"{s['piece']}" + ("" if s["last"] else ", continues"))
        if view.get("has_roles"):
            cells.append(s["role"])
        if view["has_labels"]:
            cells.append(_spans(s.get("masked_spans")))
        t.add_row(*cells)
    out: list[Any] = [Text(title, style="bold"), t]
    if segs and "head" in segs[0]:
        b = Table(title=f"Text at the boundaries (decoded with {view['tokenizer']})")
        b.add_column("at token", justify="right")
        b.add_column("end of previous segment", justify="right", overflow="fold")
        b.add_column("|", justify="center")
        b.add_column("start of next segment", overflow="fold")
        edges = [(None, segs[0]), *zip(segs, [*segs[1:], None], strict=True)]
        for prev, nxt in edges:
            at = nxt["start"] if nxt else prev["end"]
            left = _visible(prev["tail"]) if prev else Text("(row start)", style="dim")
            right = _visible(nxt["head"]) if nxt else Text("(row end)", style="dim")
            b.add_row(f"{at:,}", left, "|", right)
        out.append(b)
    return out


def _visible(text: str) -> Any:
    """Text with control characters shown as escapes, never interpreted as rich markup."""
    from rich.text import Text

    return Text(escape_controls(text))


def locate_doc(out: Path, doc_id: int) -> dict[str, Any]:
    """Where document ``doc_id`` came from: ``{"doc_id", "file", "line"}`` (a jsonl line,
    1-based) or ``{"doc_id", "file", "row"}`` (a Parquet/Arrow row, 0-based), read from the
    tokenized shards' ``file_index``/``line`` columns (only those columns of one shard)."""
    from packcli.tokenize.shards import TokenShards

    tokens = work_folder(out, read_marker(out)) / TOKENS_DIR
    try:
        shards = TokenShards(tokens)
    except FileNotFoundError as exc:
        raise PackcliError(
            f"doc {doc_id}: no tokenized shards in {tokens} (the run's work folder), which map "
            "doc ids to file:line; they are gone if the work folder was deleted"
        ) from exc
    if not 0 <= doc_id < shards.num_docs:
        raise ConfigError(
            f"doc {doc_id} does not exist: the run has {shards.num_docs:,} documents "
            f"(0..{shards.num_docs - 1})"
        )
    entry = shards.success.files[shards.value("file_index", doc_id)]
    where = "row" if "format" in entry else "line"
    return {"doc_id": doc_id, "file": entry["path"], where: int(shards.value("line", doc_id))}
