"""One ``verify`` task: check some parts of an output, each on its own, and return what the
driver needs to combine them (summed figures and a few arrays of pieces, never the rows).

A *part* is what the plan stage planned on its own (``packcli.json``'s ``parts``): a group of
token shards, whose documents went into the group's own files or were released to the tail,
and the tail, planned from the released pieces. Files never straddle parts and a short pack
sits in a long row of its own part, so each part is checked whole here, against its own
shards only:

* every row of its files (``verify_rows``), each file's sha256 and row count;
* nesting: every short pack intact and contiguous in exactly one long row of the part, and
  every short-sized segment of the part's long rows in one of its short packs;
* conservation, a group: each config's segments, as (doc, length, token hash, piece tag),
  are a sub-multiset of the pieces its shards' documents must make (so nothing duplicated,
  altered or foreign, and every piece numbered as its place in its document says:
  ``seq_pieces`` 0..k-1 in token order, ``seq_last`` on the k-th); what is left over (the
  released pieces) goes back to the driver, which checks that the tails hold exactly the
  groups' leftovers, in any order of parts.

A process holds one part's segments and pieces at a time (a group's share of the corpus),
reads each of its files and shards once, and a file or shard on object storage is fetched
into a temp folder and removed when its part is done, so no disk holds the dataset.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from packcli.arrow_np import to_numpy
from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, TOKENS_DIR
from packcli.pack.mixture import MixSpec, StepSums, copies, copy_key, key_doc, source_of
from packcli.pack.padding import padded_sizes
from packcli.pack.plan import RowTotals
from packcli.pack.schedule import CostModel
from packcli.publish.expected import expected_pieces, segment_hashes
from packcli.publish.figures import ConfigScan, DocFigures, ScannedFile, ShardFigures
from packcli.publish.verify_rows import Padding, Segments, check_rows, concat, fail, piece_tags
from packcli.stages.write_records import Listing
from packcli.tokenize.records import ShardError
from packcli.tokenize.shards import TokenShards, sha256_file

log = logging.getLogger(__name__)

# doc, length, hash and piece tag (``verify_rows.piece_tags``) of each piece
Pieces = tuple[np.ndarray, ...]


def no_pieces() -> Pieces:
    e = np.zeros(0, np.int64)
    return e, e, e.astype(np.uint64), e


def cat_pieces(parts: list[Pieces]) -> Pieces:
    if not parts:
        return no_pieces()
    doc, length, digest, piece = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return doc, length, digest, piece


@dataclass(frozen=True)
class Part:
    """One planned part: its token shards (none: a tail), per config the range
    ``[first, end)`` of its files in ``packcli.json``'s ``files``, and (a grouped
    mixture's group) its documents as ``(shard, first row, end row)`` runs."""

    name: str
    shards: tuple[int, ...]
    files: dict[str, tuple[int, int]]
    slices: tuple[tuple[int, int, int], ...] | None = None

    @property
    def is_tail(self) -> bool:
        return not self.shards

    def runs(self, shard_docs: Callable[[int], int]) -> list[tuple[int, int, int]]:
        """Its documents as runs of shard rows (``shard_docs(s)``: shard ``s``'s rows)."""
        if self.slices is not None:
            return list(self.slices)
        return [(s, 0, shard_docs(s)) for s in self.shards]


def parts_of(meta: dict[str, Any], shard_docs: Sequence[int] | None) -> list[Part]:
    """``packcli.json``'s parts, checked: each config's file ranges tile its files in order,
    and (``shard_docs``, each shard's documents: when the shards are read) every row of
    every shard is in exactly one part. An output of a version without parts is one part
    holding every file and every shard."""
    files = {name: len(meta["files"][name]) for name in CONFIG_NAMES}
    stated = meta.get("parts")
    n_shards = None if shard_docs is None else len(shard_docs)
    if stated is None:
        return [Part("all", tuple(range(n_shards or 0)), {n: (0, k) for n, k in files.items()})]

    def bad(what: str) -> VerifyError:
        return VerifyError(
            f"packcli.json: parts {what} (packcli.json does not describe this output)"
        )

    if not isinstance(stated, list) or not stated:
        raise bad("is not a non-empty list")
    parts = []
    for i, p in enumerate(stated):
        try:
            shards = tuple(int(s) for s in p["shards"])
            ranges = {n: (int(p["files"][n][0]), int(p["files"][n][1])) for n in CONFIG_NAMES}
            runs = p.get("slices")
            slices = None
            if runs is not None:
                slices = tuple((int(s), int(a), int(b)) for s, a, b in runs)
                if sorted({s for s, _, _ in slices}) != sorted(set(shards)):
                    raise ValueError("its slices are not of its shards")
            parts.append(Part(str(p["name"]), shards, ranges, slices))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise bad(f"[{i}] is not a part record ({exc!r})") from None
    for name in CONFIG_NAMES:
        end = 0
        for i, part in enumerate(parts):
            first, stop = part.files[name]
            if first != end or stop < first:
                raise bad(
                    f"[{i}].files.{name} is {[first, stop]}, but the files before end at {end}"
                )
            end = stop
        if end != files[name]:
            raise bad(f"hold {end} files of config {name}; files.{name} lists {files[name]}")
    if shard_docs is not None:
        _check_cover(parts, shard_docs, bad)
    return parts


def _check_cover(
    parts: list[Part], shard_docs: Sequence[int], bad: Callable[[str], VerifyError]
) -> None:
    """Every row of every shard in exactly one part: the runs of each shard, in row order,
    tile ``[0, rows)``."""
    n = len(shard_docs)
    runs = sorted(
        r for part in parts for r in part.runs(lambda s: int(shard_docs[s]) if s < n else -1)
    )
    end = dict.fromkeys(range(n), 0)
    for s, a, b in runs:
        if s not in end or a != end[s] or b < a:
            raise bad(f"do not hold each row of the {n} tokenized shards exactly once")
        end[s] = b
    if any(end[s] != int(shard_docs[s]) for s in range(n)):
        raise bad(f"do not hold each row of the {n} tokenized shards exactly once")


@dataclass(frozen=True)
class VerifyJob:
    """What every verify task is given (picklable, for Ray): the output folder or its URL,
    its ``packcli.json``, its parts, where the tokenized shards are (a local ``tokens``
    folder, or with ``store`` the work folder's URL), and the doc ids whose long-config
    units the input re-check wants back."""

    out: str
    meta: dict[str, Any]
    parts: tuple[Part, ...]
    tokens: str | None = None
    store: str | None = None
    wanted: tuple[int, ...] = ()


@dataclass(frozen=True)
class PartResult:
    """One part's checks, reduced: per config its files' figures and row totals, the long
    config's per-document figures of its units and (shards read) of its shards' lengths,
    the pieces it leaves to others (a group: its shards' pieces in none of its files; a
    tail: the units it holds), the units of the wanted doc ids, and how many pieces its
    shards make."""

    name: str
    tail: bool
    scans: dict[str, ConfigScan]
    docs: DocFigures | None  # from its units, when the output is this one part
    shard_docs: DocFigures | None
    shard_figures: ShardFigures | None
    left: dict[str, Pieces] | None
    wanted: Pieces
    expected: dict[str, int]


def verify_task(
    job: VerifyJob, *, task_index: int = 0, num_tasks: int = 1, quiet: bool = True
) -> list[PartResult]:
    """Check parts ``task_index``, ``task_index + num_tasks``, ... of ``job``, one at a time."""
    from packcli.stages.progress import progress_bar

    mine = range(task_index, len(job.parts), num_tasks)
    results = []
    with (
        _sources(job) as (files, shards),
        progress_bar(quiet, total=len(mine), desc="verify") as bar,
    ):
        for k in mine:
            results.append(check_part(job, job.parts[k], files, shards))
            bar.update(1)
    return results


class OutputFiles:
    """The output's files for reading: in its folder, or (``copies``: a temp folder) each
    fetched from its URL when asked for and removed once read."""

    def __init__(self, out: str, copies: Path | None = None) -> None:
        self.out, self.copies = out, copies

    def path(self, rel: str) -> Path:
        if self.copies is None:
            return Path(self.out) / rel
        from packcli.fs import fetch_output_file

        return fetch_output_file(self.out, rel, self.copies)

    def release(self, path: Path) -> None:
        if self.copies is not None:
            path.unlink(missing_ok=True)


@contextmanager
def _sources(job: VerifyJob) -> Iterator[tuple[OutputFiles, TokenShards | None]]:
    """``job``'s output files and tokenized shards; on object storage through a temp folder
    (messages about its copies are reworded to name the URLs)."""
    from packcli.fs import is_url

    remote = is_url(job.out)
    if not remote and job.store is None:
        yield OutputFiles(job.out), TokenShards(Path(job.tokens)) if job.tokens else None
        return
    with tempfile.TemporaryDirectory(prefix="packcli-verify-") as tmp:
        names: dict[Path, str] = {}
        shards = TokenShards(Path(job.tokens)) if job.tokens else None
        if job.store is not None:
            from packcli.stages.workstore import WorkStore

            work = Path(tmp) / "work"
            store = WorkStore(job.store, work, job.out, Path(tmp) / "mirror-out")
            store.pull_records(TOKENS_DIR)
            shards = TokenShards(work / TOKENS_DIR, store)
            names[work] = job.store
        copies = None
        if remote:
            copies = Path(tmp) / "out"
            names[copies] = job.out
        try:
            yield OutputFiles(job.out, copies), shards
        except VerifyError as exc:
            raise VerifyError(reworded(str(exc), names)) from None


def reworded(text: str, names: dict[Path, str]) -> str:
    from packcli.fs import reword

    for local, url in names.items():
        text = reword(text, local, url)
    return text


def check_part(
    job: VerifyJob, part: Part, files: OutputFiles, shards: TokenShards | None
) -> PartResult:
    meta = job.meta
    plan = meta["config"]["plan"]
    short_len, long_len = int(plan["short_len"]), int(plan["long_len"])
    vocab = int(meta["run"]["tokenizer"]["vocab_size"])
    caps = {"short": short_len, "long": long_len}
    padding = padding_of(meta)
    cost = cost_model_of(meta)
    segments: dict[str, Segments] = {}
    scans: dict[str, ConfigScan] = {}
    for name in CONFIG_NAMES:
        first_row = sum(f["rows"] for f in meta["files"][name][: part.files[name][0]])
        segments[name], scans[name] = _scan_files(
            meta, name, part, first_row, caps[name], short_len, vocab, files, padding, cost
        )
    where = f" ({part.name})" if meta.get("parts") else ""
    check_nesting(segments["short"], segments["long"], short_len, where)
    long = segments["long"]
    wanted = np.isin(long.doc, np.asarray(job.wanted, dtype=np.int64))
    result = PartResult(
        name=part.name,
        tail=part.is_tail,
        scans=scans,
        # Per document from the units only where one part holds every piece of them.
        docs=DocFigures.of_units(long.doc, long.length, short_len, long_len)
        if len(job.parts) == 1
        else None,
        shard_docs=None,
        shard_figures=None,
        left=None,
        wanted=(long.doc[wanted], long.length[wanted], long.hash[wanted], long.piece[wanted]),
        expected=dict.fromkeys(CONFIG_NAMES, 0),
    )
    if shards is None:
        return result
    found: dict[str, Pieces] = {n: (s.doc, s.length, s.hash, s.piece) for n, s in segments.items()}
    if part.is_tail:  # its pieces are the groups' leftovers: the driver compares them
        return replace(result, left=found)
    exp, docs, figures = _expected(
        shards, part, short_len, long_len, plan["overlong"], meta["report"].get("mixture")
    )
    small = exp[1] <= short_len
    wants = {"long": exp, "short": tuple(e[small] for e in exp)}
    left = {}
    for name in CONFIG_NAMES:
        extra, left[name] = difference(found[name], wants[name])
        if extra is not None:
            misnumbered(name + where, found[name], wants[name])
            differs(name + where, extra, found[name][0].size, wants[name][0].size)
    return replace(
        result,
        shard_docs=docs,
        shard_figures=figures,
        left=left,
        expected={n: int(w[0].size) for n, w in wants.items()},
    )


def padding_of(meta: dict[str, Any]) -> Padding | None:
    """The context-parallel padding ``packcli.json`` says the rows have (None: none)."""
    from packcli.write import pad_token_id

    cp = int(meta["config"]["plan"].get("cp_size", 1))
    return Padding(2 * cp, pad_token_id(meta["run"]["tokenizer"])) if cp > 1 else None


def cost_model_of(meta: dict[str, Any]) -> CostModel | None:
    """The cost model ``packcli.json`` says the ``cost`` column follows (None: no column)."""
    stated = meta["run"].get("cost_model")
    if stated is None:
        return None
    try:
        return CostModel(float(stated["per_token"]), float(stated["per_square"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise VerifyError(f"packcli.json: run.cost_model is not a cost model ({exc!r})") from None


def _scan_files(
    meta: dict[str, Any],
    name: str,
    part: Part,
    first_row: int,
    capacity: int,
    short_len: int,
    vocab: int,
    files: OutputFiles,
    padding: Padding | None = None,
    cost: CostModel | None = None,
) -> tuple[Segments, ConfigScan]:
    """Every row of the part's files of config ``name`` checked; their units and figures."""
    parts: list[Segments] = []
    scan = ConfigScan(RowTotals(capacity))
    rows_per_batch = max(1, (1 << 21) // capacity)
    row = first_row
    steps: list[StepSums] = []  # a mixture's, batch by batch
    for i in range(*part.files[name]):
        entry = meta["files"][name][i]
        rel = f"data/{name}/{entry['file']}"
        path = files.path(rel)
        try:
            digest = sha256_file(path)
            if digest != entry["sha256"]:
                fail(
                    rel,
                    f"content hash differs from packcli.json's files.{name}[{i}].sha256 (file "
                    "changed or corrupt)",
                )
            file_rows = file_tokens = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=rows_per_batch):
                segs = check_rows(batch, rel, row, capacity, vocab, padding, cost)
                if (mix := meta["report"].get("mixture")) is not None:
                    segs = _mixture_segments(batch, segs, mix, rel)
                    steps.append(_step_sums(mix, name, segs, row, batch.num_rows, padding))
                parts.append(segs)
                offsets = batch.column("seq_lengths").offsets
                scan.segments += int(offsets[-1].as_py() - offsets[0].as_py())
                pad = _pad_tokens(batch) if padding is not None else 0
                scan.pad_tokens += pad
                scan.totals = scan.totals + RowTotals.of_rows(
                    capacity, segs.length, segs.row - row, batch.num_rows, short_len
                )
                row += batch.num_rows
                file_rows += batch.num_rows
                file_tokens += int(segs.length.sum()) + pad  # a file's tokens hold padding
            size = path.stat().st_size
        finally:
            files.release(path)
        if file_rows != entry["rows"]:
            fail(
                rel, f"{file_rows} rows, packcli.json's files.{name}[{i}].rows says {entry['rows']}"
            )
        scan.files.append(
            ScannedFile(i, Listing(entry["file"], file_rows, file_tokens, size, digest))
        )
    if steps:  # one array for the part: what goes back to the verify driver
        scan.steps = (StepSums.combined(steps),)
    return concat(parts), scan


def _mixture_segments(batch: Any, segs: Segments, mix: dict[str, Any], rel: str) -> Segments:
    """A mixture's segments keyed by copy (``doc_id + repeat << 40``, as the plan keys them),
    after checking that each is labelled with the source its doc id belongs to."""
    first = np.array([s["first_doc"] for s in mix["sources"]], np.int64)

    def flat(col: str) -> np.ndarray:
        arr = batch.column(col)
        off = arr.offsets.to_numpy()
        values: np.ndarray = arr.values.to_numpy()[off[0] : off[-1]].astype(np.int64)
        return values

    labels, repeats = flat("source_ids"), flat("doc_repeats")
    if labels.size != segs.doc.size or repeats.size != segs.doc.size:
        fail(rel, "source_ids / doc_repeats do not have one entry per segment")
    if (bad := labels != source_of(segs.doc, first)).any():
        i = int(np.argmax(bad))
        own = int(source_of(segs.doc[i : i + 1], first)[0])
        fail(
            rel,
            f"row {int(segs.row[i])}: document {int(segs.doc[i])} is labelled source "
            f"{int(labels[i])}, its doc id is in source {own}",
        )
    if (repeats < 0).any() or (repeats >= 1 << 11).any():
        fail(rel, "doc_repeats outside 0..2047")
    return replace(segs, doc=copy_key(segs.doc, repeats))


def _step_sums(
    mix: dict[str, Any],
    name: str,
    segs: Segments,
    first_row: int,
    n_rows: int,
    padding: Padding | None = None,
) -> StepSums:
    """Tokens of each source in the output's step windows, of rows ``first_row`` onwards
    (segments already checked to be labelled with their doc id's source), each segment's
    padding counted with it, as the plan counts a piece's room."""
    first = np.array([s["first_doc"] for s in mix["sources"]], np.int64)
    k = first.size
    src = source_of(key_doc(segs.doc), first)
    flat = (segs.row - first_row) * k + src
    sizes = segs.length if padding is None else padded_sizes(segs.length, padding.multiple)
    m = np.bincount(flat, weights=sizes, minlength=n_rows * k).astype(np.int64)
    return StepSums.of_rows(m.reshape(n_rows, k), int(mix["window_rows"][name]), first_row)


def _expected_copies(
    ids: np.ndarray, doc_lens: np.ndarray, mix: dict[str, Any], long_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Under a mixture, per document of a shard: its copies (from the weights, by the rule in
    ``packcli.pack.mixture.copies``), its length after its source's policy (truncate), and
    whether its source drops it as overlong."""
    spec = MixSpec(
        tuple(s["name"] for s in mix["sources"]),
        tuple(float(s["multiplier"]) for s in mix["sources"]),
        tuple(s["overlong"] for s in mix["sources"]),
        int(mix["seed"]),
    )
    first = np.array([s["first_doc"] for s in mix["sources"]], np.int64)
    src = source_of(ids, first)
    n = copies(ids - first[src], src, spec)
    policy = np.asarray(spec.overlong)[src]
    over = doc_lens > long_len
    n[(over & (policy == "drop")) | (doc_lens == 0)] = 0
    return n, policy, over


def _pad_tokens(batch: Any) -> int:
    """The padding tokens of a batch (its ``seq_pad`` entries, checked by ``check_rows``)."""
    col = batch.column("seq_pad")
    o = to_numpy(col.offsets)
    return int(to_numpy(col.values)[o[0] : o[-1]].astype(np.int64).sum())


def _expected(
    shards: TokenShards,
    part: Part,
    short_len: int,
    long_len: int,
    policy: str,
    mix: dict[str, Any] | None = None,
) -> tuple[Pieces, DocFigures, ShardFigures]:
    """(doc, length, hash) of every piece the policy should put in the long config from the
    part's shards (each one's sha256 checked first), and what their lengths say."""
    from packcli.publish.report import LengthStats

    docs, lens, hashes, tags = [], [], [], []
    figures = DocFigures()
    lengths = LengthStats()
    where = ShardFigures(lengths)
    for s, a, b in part.runs(lambda s: shards.manifests[s].num_docs):
        try:
            shards.check_content(s)
            shard = shards.shard(s)
        except ShardError as exc:
            raise VerifyError(str(exc)) from None
        offsets = shard.offsets[a : b + 1]  # the part's rows of the shard
        doc_lens = np.diff(offsets)
        first = shard.first_doc_id + a
        before = lengths.largest
        lengths = lengths + LengthStats.of(doc_lens, short_len, long_len, first)
        if lengths.largest != before:  # looked up while the shard is here
            where = ShardFigures(
                lengths,
                int(shards.value("file_index", lengths.largest)),
                int(shards.value("line", lengths.largest)),
            )
        own = policy  # a mixture's shard is one source's: its policy
        if mix is not None and doc_lens.size:
            own = str(_expected_copies(np.array([first]), doc_lens[:1], mix, long_len)[1][0])
        figures = figures + DocFigures.of_lengths(doc_lens, first, short_len, long_len, own)
        ids = np.arange(first, first + doc_lens.size, dtype=np.int64)
        values = shard.values[int(offsets[0]) : int(offsets[-1])]
        whole_hash = segment_hashes(values, doc_lens)
        fits = (doc_lens <= long_len) & (doc_lens > 0)
        if mix is None:
            n = fits.astype(np.int64)
            policies = np.full(doc_lens.size, policy)
        else:  # every copy is expected, keyed by its repeat
            n, policies, _ = _expected_copies(ids, doc_lens, mix, long_len)
        keep = fits & (n > 0)
        reps = n[keep]
        docs.append(_keys_of(ids[keep], reps))
        lens.append(np.repeat(doc_lens[keep], reps))
        hashes.append(np.repeat(whole_hash[keep], reps))
        tags.append(np.full(int(reps.sum()), piece_tags(0, 1), np.int64))  # whole: 0, last
        for k in np.flatnonzero((doc_lens > long_len) & ((n > 0) | (mix is None))):
            start = int(offsets[k])
            document = shard.values[start : start + int(doc_lens[k])]
            for r in range(int(n[k]) if mix is not None else 1):
                pieces = expected_pieces(document, long_len, str(policies[k]))
                for i, piece in enumerate(pieces):  # in token order: its index, the last
                    docs.append(copy_key(np.array([ids[k]]), np.array([r])))
                    lens.append(np.array([piece.size]))
                    hashes.append(segment_hashes(piece, np.array([piece.size])))
                    tags.append(np.array([piece_tags(i, i == len(pieces) - 1)], np.int64))
        _drop_fetched(shards, s)
    where = ShardFigures(lengths, where.largest_file, where.largest_line)

    def cat(xs: list[np.ndarray], dt: type) -> np.ndarray:
        return np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)

    out = (cat(docs, np.int64), cat(lens, np.int64), cat(hashes, np.uint64), cat(tags, np.int64))
    return out, figures, where


def _keys_of(ids: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Each doc id repeated ``n`` times, as copy keys 0..n-1."""
    first = np.repeat(np.cumsum(n) - n, n)
    return copy_key(np.repeat(ids, n), np.arange(int(n.sum()), dtype=np.int64) - first)


def _drop_fetched(shards: TokenShards, index: int) -> None:
    """A shard fetched from the store into the temp mirror is removed once read."""
    if shards.store is not None:
        (shards.folder / shards.manifests[index].file).unlink(missing_ok=True)


def difference(
    found: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]
) -> tuple[int | None, tuple[np.ndarray, ...]]:
    """Multisets of pieces (doc first, then any further keys: length, hash, piece tag): the
    smallest doc id ``found`` holds more often than ``expected`` (None when found is within
    expected), and ``expected`` minus ``found``. One sort of both by all keys: equal pieces
    are then runs, counted per side."""
    n_exp = expected[0].size
    keys = [np.concatenate([e, f]) for e, f in zip(expected, found, strict=True)]
    order = np.lexsort(keys[::-1])
    keys = [k[order] for k in keys]
    doc = keys[0]
    new = np.zeros(doc.size, dtype=bool)
    new[:1] = True
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    run = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    from_found = order >= n_exp
    got = np.bincount(run, weights=from_found, minlength=starts.size).astype(np.int64)
    want = np.bincount(run, minlength=starts.size) - got
    over = np.flatnonzero(got > want)
    extra = int(doc[starts[over]].min()) if over.size else None
    keep = np.repeat(starts, np.maximum(want - got, 0))
    return extra, tuple(k[keep] for k in keys)


def misnumbered(where: str, found: Pieces, expected: Pieces) -> None:
    """Fails naming the document when ``found``'s tokens fit ``expected`` (doc, length,
    hash) but its piece tags do not: ``seq_pieces`` / ``seq_last`` are wrong, not tokens."""
    extra, _ = difference(found[:3], expected[:3])
    if extra is not None:
        return  # the tokens differ: ``differs`` says so
    bad, _ = difference(found, expected)
    if bad is None:
        return

    def named(p: Pieces) -> str:
        tags = np.sort(p[3][p[0] == bad])
        return ", ".join(f"{t >> 1}{' (last)' if t & 1 else ''}" for t in tags.tolist())

    fail(
        f"config {where}",
        f"document {bad}: seq_pieces / seq_last say pieces [{named(found)}], but its tokens "
        f"are pieces [{named(expected)}] of it in the tokenized shards (each piece once, "
        "numbered 0..k-1 in token order, the last with seq_last 1)",
    )


def differs(where: str, doc: int, found: int, expected: int) -> None:
    fail(
        f"config {where}",
        f"tokens of document {doc} differ from the tokenized shards (missing, duplicated, "
        f"altered or out of order); {found} segments found, {expected} expected",
    )


def check_nesting(short: Segments, long: Segments, short_len: int, where: str = "") -> None:
    """Each short pack sits intact and contiguous in exactly one long row."""
    small = long.length <= short_len
    lk = long.doc[small] * (short_len + 1) + long.length[small]
    order = np.argsort(lk, kind="stable")
    lk_sorted = lk[order]
    if lk_sorted.size != short.doc.size:
        fail(
            "nesting" + where,
            f"long config has {lk_sorted.size} short-sized segments, short config "
            f"has {short.doc.size}",
        )
    if lk_sorted.size and (np.diff(lk_sorted) == 0).any():
        fail("nesting" + where, "a short-sized segment appears twice in the long config")
    sk = short.doc * (short_len + 1) + short.length
    pos = np.searchsorted(lk_sorted, sk)
    pos = np.minimum(pos, max(lk_sorted.size - 1, 0))
    if sk.size and not np.array_equal(lk_sorted[pos], sk):
        bad = int(np.flatnonzero(lk_sorted[pos] != sk)[0])
        fail(
            "nesting" + where,
            f"short row {short.row[bad]}: document {short.doc[bad]} is missing "
            "from the long config",
        )
    match = np.flatnonzero(small)[order[pos]]
    l_row, l_idx, l_hash = long.row[match], long.index[match], long.hash[match]
    if (bad := l_hash != short.hash).any():
        i = int(np.argmax(bad))
        fail(
            "nesting" + where,
            f"short row {short.row[i]}: document {short.doc[i]} has other tokens "
            "in the long config",
        )
    same_row = short.row[1:] == short.row[:-1]
    broken = same_row & ((l_row[1:] != l_row[:-1]) | (l_idx[1:] != l_idx[:-1] + 1))
    if broken.any():
        i = int(np.argmax(broken)) + 1
        fail(
            "nesting" + where,
            f"short row {short.row[i]} is not intact and contiguous in one long row",
        )
