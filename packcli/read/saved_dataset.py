"""``datasets`` ``save_to_disk`` folders: told apart from corpus folders, and listed as their
Arrow files in the dataset's row order (read as ``arrow`` by ``packcli/read/columnar.py``).

A folder that is one, or looks like one (``state.json``, ``dataset_info.json``,
``dataset_dict.json``, or Arrow files named as ``datasets`` names them: ``data-00000-of-00003``,
``cache-<fingerprint>``), is read only through its ``state.json``: reading its ``.arrow``
files as a plain folder would take the ``cache-*.arrow`` files ``map()`` leaves there too
and duplicate every document. A damaged ``state.json`` (a save killed mid-write) is refused.
The rules are over names and the ``state.json`` text only, so local and remote folders
(``packcli/read/inputs.py``) obey the same ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from pathlib import Path

from packcli.errors import InputError

STATE = "state.json"
DICT = "dataset_dict.json"
SAVED_DATASET_RECORDS = (STATE, "dataset_info.json", DICT)
"""The JSON files ``save_to_disk`` writes beside its Arrow files."""
# The Arrow file names datasets writes: save_to_disk's shards (a save killed before its
# state.json leaves only these) and map()/filter()'s caches (one per process with num_proc).
_ARROW_NAMES = re.compile(r"^(data-\d{5}-of-\d{5}|cache-[0-9a-f]{8,}(_\d{5}_of_\d{5})?)\.arrow$")


def saved_dataset_marks(names: Collection[str], read: Callable[[str], str]) -> list[str]:
    """What makes a folder (its entries' ``names``; ``read``: a file's text by name) look like
    a ``save_to_disk`` folder, for messages; empty: a plain folder. A ``state.json`` or
    ``dataset_dict.json`` of ``datasets``' own shape, Arrow files named as ``datasets`` names
    them, or one of its record files next to ``.arrow`` files: a corpus folder that merely
    holds a ``state.json`` (a checkpoint's) is searched as usual."""
    marks = sorted(n for n in names if _ARROW_NAMES.match(n))
    has_arrow = any(n.endswith(".arrow") for n in names)
    for name, key in ((STATE, "_data_files"), (DICT, "splits")):
        if name in names and (has_arrow or _has_key(read, name, key)):
            marks.insert(0, name)
    if has_arrow and "dataset_info.json" in names:
        marks.insert(0, "dataset_info.json")
    return marks


def _has_key(read: Callable[[str], str], name: str, key: str) -> bool:
    try:
        data = json.loads(read(name))
    except (OSError, ValueError):  # unreadable or not JSON: not datasets' file
        return False
    return isinstance(data, dict) and key in data


def saved_dataset_members(
    folder: str, present: Collection[str], read: Callable[[str], str]
) -> list[str]:
    """The data files of the saved dataset ``folder`` (shown as given) in the order its
    ``state.json`` lists them, as names inside it. ``present``: the names of its entries;
    ``read``: a file's text by name (raises ``OSError``). Raises ``InputError`` naming the
    folder when it is a saved DatasetDict, has no usable ``state.json``, or its
    ``state.json`` lists a file that is absent, outside the folder or named twice."""
    state_path = f"{folder.rstrip('/')}/{STATE}"
    if STATE not in present:
        if DICT in present:
            splits = _dict_splits(read)
            first = splits[0] if splits else "train"
            raise InputError(
                f"{folder} is a saved DatasetDict (splits: {', '.join(splits) or 'none'}): "
                f"give one split's folder, e.g. {folder.rstrip('/')}/{first}"
            )
        marks = ", ".join(saved_dataset_marks(present, read)[:3]) or "no state.json"
        raise InputError(
            f"{folder} looks like a datasets save_to_disk folder ({marks}) but has no "
            f"{STATE}, so which of its .arrow files hold the dataset is unknown (cache-*.arrow "
            "files would duplicate documents): save it again, or name its data files one by one"
        )
    try:
        state = json.loads(read(STATE))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{state_path}: not a datasets state.json ({type(exc).__name__}: {exc}; a save "
            "killed mid-write?): save the dataset again, or name its data files one by one"
        ) from exc
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
            raise InputError(f"{state_path} lists {name!r}, which is not a file in {folder}")
        if name in seen:
            raise InputError(f"{state_path} lists {name} twice")
        if name not in present:
            raise InputError(f"{state_path} lists {name}, which is missing")
        seen.add(name)
    if not names:
        raise InputError(f"{folder}: the saved dataset has no data files")
    return names


def hf_disk_files(folder: Path) -> list[Path]:
    """The data files of a local ``save_to_disk`` folder, in the order its ``state.json``
    lists them (the dataset's row order)."""
    if not (folder / STATE).is_file() and not (folder / DICT).is_file():
        raise InputError(f"{folder} is not a datasets save_to_disk folder (no state.json)")
    present = {p.name for p in folder.iterdir() if p.is_file()}
    names = saved_dataset_members(
        str(folder), present, lambda n: (folder / n).read_text(encoding="utf-8")
    )
    return [folder / name for name in names]


def _dict_splits(read: Callable[[str], str]) -> list[str]:
    try:
        return [str(s) for s in json.loads(read(DICT))["splits"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
