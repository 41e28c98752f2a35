"""Build a real-text benchmark corpus from text already on this machine (no download).

Generated text hides per-document costs: its documents are long and uniform, while real
corpora have a median document of ~100 characters and a few huge ones. This script gathers
real text in the shape of a web/code mix, as jsonl:

* translated messages from the system's gettext catalogs (``/usr/share/locale/**/*.mo``,
  read with the standard library's ``gettext``): short documents in ~190 languages and every
  script (Latin, Cyrillic, Greek, Arabic, Hebrew, CJK, Indic, Thai...);
* man pages (``/usr/share/man``, groff source, one document per page or per paragraph run);
* package documentation and changelogs (``/usr/share/doc``);
* source code (Python files of the interpreter's standard library and site-packages);
* a few huge documents (whole large changelogs and sources concatenated), 1-20 MB.

Shorter documents are grouped the way real pages are: a catalog's messages are emitted one per
document most of the time and in runs of a few sometimes, so the length distribution has a
median near 100 characters and a long tail. The output is deterministic for a given machine
(sorted file lists, seeded choices); sizes and medians are printed.

    python scripts/make_real_corpus.py --out /tmp/real150.jsonl --size-mb 150
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import random
import statistics
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import orjson


def _catalog_messages(path: Path) -> list[str]:
    try:
        with path.open("rb") as fh:
            cat = gettext.GNUTranslations(fh)
    except Exception:  # a catalog in an encoding or format gettext rejects: skip it
        return []
    out = []
    for key, value in cat._catalog.items():
        text = value if isinstance(value, str) else ""
        if text and key and text != key:
            out.append(text.strip())
    return [t for t in out if t]


def _read_text(path: Path, limit: int = 8 << 20) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as fh:
                raw = fh.read(limit)
        else:
            raw = path.read_bytes()[:limit]
    except (OSError, EOFError):
        return ""
    return raw.decode("utf-8", errors="replace").replace("\ufffd", "")


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def sources(rng: random.Random) -> Iterator[tuple[str, str]]:
    """(kind, document) from each source, interleaved so any prefix is a mix."""
    mo = sorted(Path("/usr/share/locale").rglob("*.mo")) + sorted(
        Path("/usr/share").glob("*/*/lang/*/LC_MESSAGES/*.mo")
    )
    man = sorted(p for p in Path("/usr/share/man").rglob("*") if p.is_file())
    doc = sorted(p for p in Path("/usr/share/doc").rglob("*") if p.is_file())
    py_roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    code = sorted(p for root in py_roots for p in Path(root).rglob("*.py"))
    rng.shuffle(mo)
    rng.shuffle(man)
    rng.shuffle(doc)
    rng.shuffle(code)
    streams = {
        "gettext": _gettext_docs(mo, rng),
        "man": _file_docs(man, rng),
        "doc": _file_docs(doc, rng),
        "code": _code_docs(code, rng),
    }
    weights = {"gettext": 10, "man": 3, "doc": 3, "code": 1}
    while streams:
        kinds = list(streams)
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        item = next(streams[kind], None)
        if item is None:
            del streams[kind]
            continue
        yield kind, item


def _gettext_docs(files: list[Path], rng: random.Random) -> Iterator[str]:
    for path in files:
        messages = _catalog_messages(path)
        i = 0
        while i < len(messages):
            run = 1 if rng.random() < 0.6 else rng.randint(2, 12)
            yield "\n".join(messages[i : i + run])
            i += run


def _file_docs(files: list[Path], rng: random.Random) -> Iterator[str]:
    for path in files:
        text = _read_text(path)
        if not text.strip():
            continue
        if rng.random() < 0.15:
            yield text  # a whole page
            continue
        paras = _paragraphs(text)
        i = 0
        while i < len(paras):
            run = rng.choice([1, 1, 1, 2, 3, 5])
            yield "\n\n".join(paras[i : i + run])
            i += run


def _code_docs(files: list[Path], rng: random.Random) -> Iterator[str]:
    for path in files:
        text = _read_text(path)
        if text.strip():
            yield text


def huge_documents(rng: random.Random, n: int) -> list[str]:
    """Big changelogs and sources glued together, 1-20 MB each."""
    pool = sorted(
        (p for p in Path("/usr/share/doc").rglob("changelog*") if p.is_file()),
        key=lambda p: p.stat().st_size,
        reverse=True,
    )[:200]
    out = []
    for _ in range(n):
        target = rng.choice([1, 2, 5, 20]) << 20
        parts, size = [], 0
        while size < target and pool:
            text = _read_text(rng.choice(pool))
            parts.append(text)
            size += len(text.encode("utf-8"))
        out.append("\n\n".join(parts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size-mb", type=float, default=150)
    ap.add_argument("--huge", type=int, default=4, help="documents of 1-20 MB")
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    budget = int(args.size_mb * (1 << 20))
    lengths: list[int] = []
    kinds: dict[str, int] = {}
    written = 0
    huge = huge_documents(rng, args.huge)
    budget -= sum(len(h.encode("utf-8")) for h in huge)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("wb") as fh:
        for kind, text in sources(rng):
            line = orjson.dumps({"text": text}) + b"\n"
            fh.write(line)
            written += len(line)
            lengths.append(len(text))
            kinds[kind] = kinds.get(kind, 0) + 1
            if huge and rng.random() < 1e-4:
                h = huge.pop()
                fh.write(orjson.dumps({"text": h}) + b"\n")
                lengths.append(len(h))
            if written >= budget:
                break
        for h in huge:
            fh.write(orjson.dumps({"text": h}) + b"\n")
            lengths.append(len(h))
    tmp.replace(args.out)
    size = args.out.stat().st_size
    print(
        f"{args.out}: {size / 1e6:.1f} MB, {len(lengths):,} documents, median "
        f"{statistics.median(lengths):.0f} chars, mean {statistics.fmean(lengths):.0f}, "
        f"max {max(lengths):,}; by source {kinds}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
