"""Generate a deterministic synthetic jsonl pretraining corpus for exercising packcli.

Each line is ``{"text": ..., "id": ...}``. The corpus is meant to stress the two-tier packer the
way a real pretraining mix does, without shipping or downloading real data:

* **Text.** A fixed synthetic "language" of a few thousand pronounceable words (frequent words are
  short, rare words long, as in natural languages) drawn with a Zipf law, arranged into sentences
  (capitalised first word, commas, hyphens, parentheses, typographic quotes, ``.``/``?``/``!``),
  paragraphs separated by blank lines, occasional markdown-style titles and bullet lists, and
  numbers (years, counts, decimals, percentages). Some words carry accented letters, a few are CJK
  or emoji, so a byte-level BPE tokenizer sees multi-byte UTF-8. The vocabulary is fixed
  (independent of ``--seed``) so a tokenizer trained on one seed fits corpora generated with
  another, like a real language.
* **Lengths.** Real corpora are dominated by short documents (web pages, posts) with a heavy tail
  (books, code dumps, papers). Document lengths are lognormal (median ~300 words, capped at 60k
  words), so a few percent exceed the 4096-token short tier and land in the 128k tier, and a
  handful of very long documents (110k-250k words, i.e. well over 131072 tokens) are spliced in at
  random positions so the splitting path for over-long documents is exercised too.

With the demo tokenizer (``packcli/assets/demo_tokenizer.json``, ~1.6 tokens per word, ~4 bytes
per token on this text) the default 64 MiB corpus is 14,808 documents and ~16.8M tokens; 4.2% of
the documents are over 4096 tokens and 5 are over 131072 tokens.

Determinism: output is byte-identical for the same arguments. All randomness comes from one
``numpy.random.default_rng(seed)`` stream (PCG64 is platform independent); the synthetic language
uses only integer draws, uniform draws and IEEE arithmetic; gzip output has a zero mtime and no
file name. (Document lengths go through numpy's normal/exp, identical on every platform in
practice.) Text is produced in vectorised batches, ~64 MiB in a few seconds.

Example::

    .venv/bin/python scripts/make_sample_corpus.py --out sample/corpus.jsonl --size-mb 64
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

DEFAULT_SEED = 20240917
DEFAULT_OUT = "sample/corpus.jsonl"
DEFAULT_SIZE_MB = 64.0
MIB = 1 << 20

# The synthetic language is fixed: it does not depend on --seed.
LANGUAGE_SEED = 7_654_321
VOCAB_SIZE = 8000
ZIPF_OFFSET = 2.7  # Zipf-Mandelbrot: p(rank) ~ 1 / (rank + ZIPF_OFFSET)

# Lognormal document length in words: median and sigma of the underlying normal, clipped.
MEDIAN_WORDS = 300.0
SIGMA_WORDS = 1.25
MIN_WORDS = 8
MAX_REGULAR_WORDS = 60_000  # stays under 131072 tokens; only the spliced-in documents exceed it
# Very long documents spliced in, per 64 MiB of output, and their length range in words.
HUGE_DOCS_PER_64MB = 5
HUGE_WORDS_RANGE = (110_000, 250_000)
# Documents rendered per vectorised batch.
BATCH_DOCS = 256
# Planning ratio for the printed estimate only: the demo tokenizer measures ~1.59 tokens per word
# on this text (punctuation, digits and rare words add tokens); other tokenizers differ.
ASSUMED_TOKENS_PER_WORD = 1.6

# Syllable parts, repeated to weight them: mostly single letters, like real orthographies.
_SINGLE = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w"]
_CLUSTERS = ["z", "j", "y", "br", "cr", "dr", "fl", "gr", "pl", "pr", "st", "tr", "sh", "ch"]
_CLUSTERS += ["th", "bl", "cl", "sk", "sp", "qu"]
_ONSETS = [""] * 8 + _SINGLE * 3 + _CLUSTERS
_VOWELS = ["a", "e", "i", "o", "u"] * 4 + ["y", "ai", "ea", "ou", "io", "ee", "oa"]
_CODAS = ["n", "r", "s", "l", "t", "m"] * 2 + ["nd", "st", "ng", "ck", "x", "rd", "ll"]
_ACCENTED = ["é", "è", "ê", "á", "à", "ü", "ö", "ä", "ñ", "ç", "ø", "å", "í", "ó", "ú", "ß"]
# A few hundred CJK ideographs plus some kana and hangul, for 3-byte UTF-8.
_CJK = (
    [chr(c) for c in range(0x4E00, 0x4E00 + 160)]
    + [chr(c) for c in range(0x6C00, 0x6C00 + 60)]
    + [chr(c) for c in range(0x3041, 0x3041 + 40)]
    + [chr(c) for c in range(0xAC00, 0xAC00 + 40)]
)
_EMOJI = ["😀", "🙂", "🎉", "🚀", "🔥", "👍", "🌍", "📈", "💡", "✅", "⚠️", "❤️", "🤖", "📚", "☕"]

# Separator written after each word: within a sentence; bracketing pairs (the opener is written
# after the word before the span, the closer after its last word); sentence ends; document ends.
_MID_SEPS = [" ", ", ", "; ", ": ", "-"]
_MID_SEP_CDF = np.array([0.91, 0.98, 0.985, 0.99, 1.0])
_PAIR_SEPS = [" (", ") ", " \u201c", "\u201d "]  # parentheses, typographic double quotes
_END_SEPS = [p + a for p in (".", "?", "!") for a in (" ", "\n\n", "\n")]
_FINAL_SEPS = [".", "?", "!"]
_FIRST_PAIR_SEP = len(_MID_SEPS)
_FIRST_END_SEP = _FIRST_PAIR_SEP + len(_PAIR_SEPS)
_FIRST_FINAL_SEP = _FIRST_END_SEP + len(_END_SEPS)
_SEPS = _MID_SEPS + _PAIR_SEPS + _END_SEPS + _FINAL_SEPS
_END_PUNCT_CDF = np.array([0.90, 0.96, 1.0])  # . ? !
_END_BREAK_CDF = np.array([0.78, 0.96, 1.0])  # same line, new paragraph, new line
_NUMBER_POOL = 8192
_BUCKET_BITS = 18
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x09\x0b-\x1f]')


@dataclass(frozen=True)
class Language:
    """The fixed synthetic vocabulary, its Zipf sampling table and the rendering table.

    ``table[form * len(_SEPS) + sep]`` is a word form followed by a separator, where forms are
    the ``V`` lower-case words, their ``V`` sentence-start forms, then a pool of numbers, so a
    batch of documents renders with one fancy index and one ``str.join``.
    """

    words: list[str]
    cdf: np.ndarray  # float64 cumulative Zipf probabilities over the V ranks
    bucket_base: np.ndarray  # int32, see _draw_words
    numbers: list[str]
    table: np.ndarray  # object array of str
    table_len: np.ndarray  # int64 character length of each table entry

    @property
    def size(self) -> int:
        return len(self.words)


def _make_words(rng: np.random.Generator, n_syllables: np.ndarray) -> list[str]:
    """Assemble pronounceable words from bulk-drawn syllable parts."""
    n, width = len(n_syllables), int(n_syllables.max())
    onset = rng.integers(len(_ONSETS), size=(n, width)).tolist()
    vowel = rng.integers(len(_VOWELS), size=(n, width)).tolist()
    coda = rng.integers(len(_CODAS), size=(n, width)).tolist()
    has_coda = (rng.random((n, width)) < 0.3).tolist()
    words = []
    for i, k in enumerate(n_syllables.tolist()):
        parts = []
        for j in range(k):
            parts.append(_ONSETS[onset[i][j]] + _VOWELS[vowel[i][j]])
            if has_coda[i][j]:
                parts.append(_CODAS[coda[i][j]])
        words.append("".join(parts))
    return words


def _make_numbers(rng: np.random.Generator, n: int) -> list[str]:
    kinds = rng.integers(0, 6, size=n).tolist()
    values = rng.integers(0, 1_000_000, size=n).tolist()
    out: list[str] = []
    for k, v in zip(kinds, values, strict=True):
        if k == 0:
            out.append(str(v % 100))
        elif k == 1:
            out.append(str(1800 + v % 230))  # a year
        elif k == 2:
            out.append(f"{v:,}")
        elif k == 3:
            out.append(f"{v % 1000}.{v % 100:02d}")
        elif k == 4:
            out.append(f"{v % 100}%")
        else:
            out.append(str(v % 10_000))
    return out


def build_language(vocab_size: int = VOCAB_SIZE, seed: int = LANGUAGE_SEED) -> Language:
    """Build the fixed synthetic vocabulary (rank 0 = most frequent word)."""
    rng = np.random.default_rng(seed)
    n_cand = vocab_size * 2
    # Frequent words are short, rare words long (Zipf's law of abbreviation): 1 + four Bernoulli
    # trials whose probability grows with log2(rank), computed exactly via bit_length.
    top_bits = vocab_size.bit_length()
    depth = np.array([min(r.bit_length() / top_bits, 1.0) for r in range(1, n_cand + 1)])
    n_syl = 1 + (rng.random((n_cand, 4)) < 0.5 * depth[:, None] ** 2).sum(axis=1)
    candidates = _make_words(rng, n_syl)
    kind = rng.random(n_cand).tolist()
    accent_pos = rng.random(n_cand).tolist()
    accent = rng.integers(len(_ACCENTED), size=n_cand).tolist()
    cjk = rng.integers(len(_CJK), size=(n_cand, 3)).tolist()
    cjk_len = rng.integers(1, 4, size=n_cand).tolist()

    words: list[str] = []
    seen: set[str] = set()
    emoji_left = list(_EMOJI)
    for word, k, pos, acc, chars, n_chars in zip(
        candidates, kind, accent_pos, accent, cjk, cjk_len, strict=True
    ):
        rank = len(words)
        if rank == vocab_size:
            break
        if rank > 200 and k < 0.012:
            word = "".join(_CJK[c] for c in chars[:n_chars])
        elif rank > 500 and k < 0.016 and emoji_left:
            word = emoji_left.pop(0)
        elif rank > 100 and k < 0.07:
            i = int(pos * len(word))
            word = word[:i] + _ACCENTED[acc] + word[i + 1 :]
        elif rank > 300 and k > 0.95:
            word = word.capitalize()  # proper noun: always capitalised
        if word not in seen:
            seen.add(word)
            words.append(word)
    if len(words) < vocab_size:
        raise RuntimeError("not enough distinct synthetic words; raise n_cand")
    # Only IEEE division and a sequential cumsum: the table is bit-identical on every platform.
    cdf = np.cumsum(1.0 / (np.arange(vocab_size, dtype=np.float64) + ZIPF_OFFSET))
    cdf /= cdf[-1]
    edges = np.arange(1 << _BUCKET_BITS, dtype=np.float64) / (1 << _BUCKET_BITS)
    if np.diff(cdf).min() <= edges[1]:
        raise RuntimeError("Zipf buckets too wide for this vocabulary; raise _BUCKET_BITS")
    bucket_base = np.searchsorted(cdf, edges, side="right").astype(np.int32)
    numbers = _make_numbers(rng, _NUMBER_POOL)
    forms = words + [w[:1].upper() + w[1:] for w in words] + numbers
    entries = [f + sep for f in forms for sep in _SEPS]
    # _dumps relies on generated text never needing a JSON escape other than "\n".
    if _NEEDS_ESCAPE.search("".join(forms + _EMOJI + _SEPS)):
        raise RuntimeError("synthetic alphabet contains characters that need JSON escaping")
    return Language(
        words=words,
        cdf=cdf,
        bucket_base=bucket_base,
        numbers=numbers,
        table=np.array(entries, dtype=object),
        table_len=np.array([len(e) for e in entries], dtype=np.int64),
    )


def _draw(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: index of the first ``cdf`` entry greater than ``u``."""
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


def _draw_words(lang: Language, u: np.ndarray) -> np.ndarray:
    """Same result as ``_draw(lang.cdf, u)``, ~2.5x faster via a bucket table.

    ``u`` falls in bucket ``b = floor(u * 2**K)``; ``lang.bucket_base[b]`` counts the CDF entries
    at or below the bucket's lower edge. Buckets are narrower than the smallest word probability,
    so at most one further entry can lie at or below ``u``: compare with it.
    """
    base = lang.bucket_base[(u * (1 << _BUCKET_BITS)).astype(np.intp)].astype(np.intp)
    return base + (lang.cdf[base] <= u)


def render_batch(rng: np.random.Generator, lang: Language, n_words: Sequence[int]) -> list[str]:
    """Render one document of pseudo-natural text per entry of ``n_words`` (each >= 1).

    The whole batch is drawn as one word stream (vectorised), joined once and sliced.
    """
    counts = np.asarray(n_words, dtype=np.intp)
    total = int(counts.sum())
    doc_last = np.cumsum(counts) - 1
    v = lang.size
    n_seps = len(_SEPS)
    form = _draw_words(lang, rng.random(total))

    # Sentences of 4-26 words; every document ends a sentence.
    sent_len = (
        4 + rng.integers(0, 12, size=total // 8 + 2) + rng.integers(0, 12, size=total // 8 + 2)
    )
    is_end = np.zeros(total, dtype=bool)
    ends = np.cumsum(sent_len) - 1
    is_end[ends[ends < total]] = True
    is_end[doc_last] = True
    ends = np.flatnonzero(is_end)
    form[0] += v
    form[ends[:-1] + 1] += v  # capitalised sentence-start forms

    # Numbers replace ~2.5% of words.
    num_mask = rng.random(total) < 0.025
    form[num_mask] = 2 * v + rng.integers(len(lang.numbers), size=int(num_mask.sum()))

    sep = _draw(_MID_SEP_CDF, rng.random(total))
    punct = _draw(_END_PUNCT_CDF, rng.random(len(ends)))
    brk = _draw(_END_BREAK_CDF, rng.random(len(ends)))
    sep[ends] = _FIRST_END_SEP + 3 * punct + brk
    sep[doc_last] = _FIRST_FINAL_SEP + punct[np.searchsorted(ends, doc_last)]

    # Short parenthesised or quoted spans (words first..last) inside one sentence, not nested.
    first = np.flatnonzero(rng.random(total) < 0.012)
    first = first[first >= 1]
    last = first + rng.integers(0, 5, size=len(first))
    kind = 2 * (rng.random(len(first)) < 0.4)
    n_ends = np.cumsum(is_end)  # sentence ends at or before word i
    next_first = np.append(first[1:], total)
    ok = last + 1 < next_first
    ok[ok] &= n_ends[last[ok]] == n_ends[first[ok] - 1]
    ok[ok] &= ~is_end[first[ok] - 1]
    sep[first[ok] - 1] = _FIRST_PAIR_SEP + kind[ok]
    sep[last[ok]] = _FIRST_PAIR_SEP + 1 + kind[ok]

    pieces = form * n_seps + sep
    text = "".join(lang.table[pieces].tolist())
    bounds = np.cumsum(lang.table_len[pieces])[doc_last].tolist()
    docs = [text[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]

    # Per-document decoration: markdown title, bullet lists, a trailing emoji.
    k = len(docs)
    style = rng.random(k).tolist()
    title_len = rng.integers(2, 8, size=k)
    title_ids = _draw_words(lang, rng.random(int(title_len.sum()))).tolist()
    title_end = np.cumsum(title_len).tolist()
    emoji = rng.integers(-len(_EMOJI) * 32, len(_EMOJI), size=k).tolist()  # ~3% non-negative
    for i in range(k):
        if style[i] < 0.25:
            title = " ".join(
                lang.words[w] for w in title_ids[title_end[i] - title_len[i] : title_end[i]]
            )
            docs[i] = f"# {title[:1].upper()}{title[1:]}\n\n{docs[i]}"
        elif style[i] < 0.33:
            paras = docs[i].split("\n\n")
            for j in range(1, len(paras), 3):
                paras[j] = "- " + paras[j].replace(". ", ".\n- ")
            docs[i] = "\n\n".join(paras)
        if emoji[i] >= 0:
            docs[i] += " " + _EMOJI[emoji[i]]
    return docs


def render_text(rng: np.random.Generator, lang: Language, n_words: int) -> str:
    """Render a single document of ``n_words`` words."""
    return render_batch(rng, lang, [n_words])[0]


def _iter_documents(
    seed: int, size_bytes: int, huge_docs: int | None
) -> Iterator[tuple[dict[str, str], bytes, int]]:
    """Yield ``(record, jsonl_line, n_words)`` until the lines total ``size_bytes``."""
    lang = build_language()
    rng = np.random.default_rng(seed)
    if huge_docs is None:
        huge_docs = round(HUGE_DOCS_PER_64MB * size_bytes / (64 * MIB))
    # Splice the very long documents in at random byte positions of the stream.
    huge_at = (np.sort(rng.uniform(0.05, 0.95, size=huge_docs)) * size_bytes).tolist()
    queue: deque[tuple[str, int]] = deque()
    written = 0
    index = 0
    while written < size_bytes:
        if huge_at and written >= huge_at[0]:
            huge_at.pop(0)
            n_words = int(rng.integers(HUGE_WORDS_RANGE[0], HUGE_WORDS_RANGE[1] + 1))
            text = render_text(rng, lang, n_words)
        else:
            if not queue:
                z = rng.standard_normal(BATCH_DOCS)
                counts = np.clip(
                    (MEDIAN_WORDS * np.exp(SIGMA_WORDS * z)).astype(np.int64),
                    MIN_WORDS,
                    MAX_REGULAR_WORDS,
                ).tolist()
                queue.extend(zip(render_batch(rng, lang, counts), counts, strict=True))
            text, n_words = queue.popleft()
        record = {"text": text, "id": f"synth-{seed}-{index:08d}"}
        line = _dumps(record)
        written += len(line)
        index += 1
        yield record, line, n_words


def generate_documents(
    seed: int = DEFAULT_SEED,
    size_bytes: int = int(DEFAULT_SIZE_MB * MIB),
    huge_docs: int | None = None,
) -> Iterator[dict[str, str]]:
    """Yield ``{"text", "id"}`` records whose jsonl serialisation totals ~``size_bytes``.

    ``huge_docs`` is the number of >131072-token documents to splice in; ``None`` means
    ``HUGE_DOCS_PER_64MB`` per 64 MiB (rounded). The stream only depends on the arguments.
    """
    for record, _, _ in _iter_documents(seed, size_bytes, huge_docs):
        yield record


def _dumps(record: dict[str, str]) -> bytes:
    """Serialise like ``json.dumps(record, ensure_ascii=False)`` plus a newline, as UTF-8.

    The generated text only ever needs ``\\n`` escaped (checked in ``build_language``), which is
    much faster done by hand than with ``json.dumps``.
    """
    escaped = record["text"].replace("\n", "\\n")
    return f'{{"text": "{escaped}", "id": "{record["id"]}"}}\n'.encode()


def _open_output(path: Path, compress: str) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = open(path, "wb")  # noqa: SIM115 - closed by the returned wrapper or the caller
    if compress == "gz":
        # No file name and a zero mtime in the header keep the bytes reproducible.
        return gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
    if compress == "zst":
        import zstandard

        return zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=True)
    return raw


def output_paths(out: Path, num_files: int, compress: str) -> list[Path]:
    """``corpus.jsonl``, or ``corpus-00000.jsonl`` ... for several files (plus ``.gz``/``.zst``)."""
    name = out.name
    for ext in (".gz", ".zst"):
        name = name.removesuffix(ext)
    stem, dot, suffix = name.partition(".")
    suffix = dot + suffix if dot else ".jsonl"
    comp = {"none": "", "gz": ".gz", "zst": ".zst"}[compress]
    if num_files == 1:
        return [out.with_name(f"{stem}{suffix}{comp}")]
    return [out.with_name(f"{stem}-{i:05d}{suffix}{comp}") for i in range(num_files)]


def write_corpus(
    out: Path,
    *,
    seed: int = DEFAULT_SEED,
    size_mb: float = DEFAULT_SIZE_MB,
    num_files: int = 1,
    compress: str = "none",
    huge_docs: int | None = None,
) -> dict[str, Any]:
    """Write the corpus, sharded contiguously by size, and return summary statistics.

    Each file is written under a temporary name and renamed when complete, so readers never see
    a half-written corpus.
    """
    size_bytes = int(size_mb * MIB)
    paths = output_paths(out, num_files, compress)
    tmp_paths = [p.with_name(p.name + ".tmp") for p in paths]
    shard_bytes = size_bytes / num_files
    n_words: list[int] = []
    total = 0
    shard = 0
    fh = _open_output(tmp_paths[0], compress)
    buf = io.BytesIO()
    try:
        for _, line, words in _iter_documents(seed, size_bytes, huge_docs):
            while shard + 1 < num_files and total >= (shard + 1) * shard_bytes:
                fh.write(buf.getvalue())
                buf = io.BytesIO()
                fh.close()
                shard += 1
                fh = _open_output(tmp_paths[shard], compress)
            buf.write(line)
            if buf.tell() >= 8 * MIB:
                fh.write(buf.getvalue())
                buf = io.BytesIO()
            total += len(line)
            n_words.append(words)
        fh.write(buf.getvalue())
    finally:
        fh.close()
    # Shards that received no documents (tiny sizes) still exist, empty.
    for path in tmp_paths[shard + 1 :]:
        _open_output(path, compress).close()
    for tmp, path in zip(tmp_paths, paths, strict=True):
        os.replace(tmp, path)
    return {"paths": paths, "documents": len(n_words), "bytes": total, "words": np.array(n_words)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="document RNG seed")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="output path")
    parser.add_argument(
        "--size-mb", type=float, default=DEFAULT_SIZE_MB, help="uncompressed size in MiB"
    )
    parser.add_argument(
        "--num-files", type=int, default=1, help="shards; >1 writes NAME-00000.jsonl, ..."
    )
    parser.add_argument("--compress", choices=["none", "gz", "zst"], default="none")
    parser.add_argument(
        "--huge-docs",
        type=int,
        default=None,
        help=f">131072-token documents to include (default {HUGE_DOCS_PER_64MB} per 64 MiB)",
    )
    args = parser.parse_args(argv)
    if args.num_files < 1 or args.size_mb <= 0 or (args.huge_docs or 0) < 0:
        parser.error("--num-files must be >= 1, --size-mb > 0 and --huge-docs >= 0")

    t0 = time.perf_counter()
    stats = write_corpus(
        args.out,
        seed=args.seed,
        size_mb=args.size_mb,
        num_files=args.num_files,
        compress=args.compress,
        huge_docs=args.huge_docs,
    )
    elapsed = time.perf_counter() - t0
    words: np.ndarray = stats["words"]
    short_limit = int(4096 / ASSUMED_TOKENS_PER_WORD)
    long_limit = int(131072 / ASSUMED_TOKENS_PER_WORD)
    qs = [0.1, 0.5, 0.9, 0.99, 0.999]
    quant = np.quantile(words, qs)
    paths = stats["paths"]
    more = f" ... ({len(paths)} files)" if len(paths) > 2 else ""
    print(f"wrote {', '.join(map(str, paths[:2]))}{more}")
    print(
        f"documents: {stats['documents']:,}  bytes (uncompressed): {stats['bytes']:,}  "
        f"words: {int(words.sum()):,}  time: {elapsed:.2f}s"
    )
    print(
        "words per document: "
        + "  ".join(f"p{q * 100:g}={v:,.0f}" for q, v in zip(qs, quant, strict=True))
        + f"  max={int(words.max()):,}"
    )
    print(
        f"note: assuming ~{ASSUMED_TOKENS_PER_WORD} tokens/word (demo tokenizer; measure with "
        f"yours): {int((words > short_limit).sum()):,} documents "
        f"({(words > short_limit).mean() * 100:.1f}%) over {short_limit:,} words (~4096 tokens), "
        f"{int((words > long_limit).sum())} over {long_limit:,} words (~131072 tokens)"
    )


if __name__ == "__main__":
    main()
