"""Reading ``packcli.json``, the marker of a complete output: one reader for every command.

Three strengths, for three kinds of caller:

* ``read_marker``: for what computes with the contents (verify, stats, inspect, push through
  verify). Every field those read is checked, so a damaged, truncated or foreign file fails
  with one line naming it (``VerifyError``) instead of a traceback halfway.
* ``load_marker``: the parsed file, unchecked, for callers that check the part they use and
  word their own error (``upload_files``), or read a marker packcli has just written or
  verified (``refresh_card``, ``output_files``).
* ``peek_marker`` (``read_json_object`` for any other record of packcli): never raises;
  ``{}`` when there is no readable JSON object, for questions such as "is this folder a
  packcli output?".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from packcli.errors import VerifyError
from packcli.names import CONFIG_NAMES, MARKER, WORK_DIR


def load_marker(out: Path) -> Any:
    """``OUT/packcli.json`` parsed, unchecked (any JSON value). Raises ``OSError`` when it is
    missing or unreadable, ``ValueError`` when it is not UTF-8 JSON."""
    return json.loads((out / MARKER).read_text(encoding="utf-8"))


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON record of packcli (this marker, a work folder's records) as a dict, or ``{}``
    when it is missing, unreadable or not a JSON object: for callers to whom such a file
    means "not there"."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return {}
    return data if isinstance(data, dict) else {}


def peek_marker(out: Path) -> dict[str, Any]:
    """``OUT/packcli.json`` as a dict, or ``{}`` when missing, unreadable or not a JSON object."""
    return read_json_object(out / MARKER)


# What verify (and push, through it) reads from packcli.json: (path, type).
_MARKER_FIELDS: list[tuple[tuple[str, ...], type]] = [
    (("config", "plan", "short_len"), int),
    (("config", "plan", "long_len"), int),
    (("config", "plan", "overlong"), str),
    (("run", "tokenizer", "vocab_size"), int),
    (("run",), dict),
    (("report", "input", "tokens"), int),
    (("report", "policy", "truncated_tokens"), int),
    (("report", "policy", "dropped_tokens"), int),
] + [
    (path, int)
    for name in CONFIG_NAMES
    for path in (("report", "tiers", name, "rows"), ("report", "tiers", name, "tokens"))
]
_FILE_FIELDS = {"file": str, "sha256": str, "rows": int}


def read_marker(out: Path) -> dict[str, Any]:
    """``packcli.json`` of ``out`` after checking every field verify reads, so a damaged,
    truncated or foreign file fails with one line naming it, not with a traceback."""
    marker = out / MARKER
    if not marker.is_file():
        raise VerifyError(f"{out}: no packcli.json, so the output is missing or incomplete")
    fix = "rewrite it with `packcli finalize -o OUT` (needs the work folder) or rerun packcli pack"
    try:
        meta = load_marker(out)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise VerifyError(f"{marker}: unreadable or not JSON ({exc}); {fix}") from exc

    def bad(what: str) -> VerifyError:
        return VerifyError(f"{marker}: damaged or not written by packcli ({what}); {fix}")

    for path, kind in _MARKER_FIELDS:
        value: Any = meta
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(f"{'.'.join(path)} missing or not {kind.__name__}")
    files = meta.get("files")
    for name in CONFIG_NAMES:
        entries = files.get(name) if isinstance(files, dict) else None
        if not isinstance(entries, list):
            raise bad(f"files.{name} missing or not a list")
        for entry in entries:
            for key, kind in _FILE_FIELDS.items():
                if not isinstance(entry, dict) or not isinstance(entry.get(key), kind):
                    raise bad(f"an entry of files.{name} has no valid {key!r}")
            if Path(entry["file"]).name != entry["file"] or entry["file"] in ("", ".", ".."):
                raise bad(f"files.{name} names {entry['file']!r}, not a file of data/{name}/")
    return cast(dict[str, Any], meta)  # an object: the field checks above looked inside it


def work_folder(out: Path, meta: dict[str, Any]) -> Path:
    """The local work folder a marker records: ``run.work_dir`` (relative to ``out`` unless
    absolute), else the default inside ``out``."""
    recorded = Path(recorded_work_dir(meta))
    return recorded if recorded.is_absolute() else out / recorded


def recorded_work_dir(meta: dict[str, Any]) -> str:
    """``run.work_dir`` as the marker records it (a path or a URL), else the default."""
    return str(meta["run"].get("work_dir") or WORK_DIR)
