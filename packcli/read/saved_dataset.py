"""``datasets`` ``save_to_disk`` folders: told apart from corpus folders, and listed as their
Arrow files in the dataset's row order (read as ``arrow`` by ``packcli/read/columnar.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from packcli.errors import InputError


def is_saved_dataset(folder: Path) -> bool:
    """A ``datasets`` ``save_to_disk`` folder (a Dataset, or a DatasetDict to refuse): by its
    ``state.json`` (``_data_files``) or ``dataset_dict.json`` (``splits``), so a corpus
    folder that merely holds a file of either name is searched as usual."""
    for name, key in (("state.json", "_data_files"), ("dataset_dict.json", "splits")):
        try:
            if key in json.loads((folder / name).read_text(encoding="utf-8")):
                return True
        except (OSError, ValueError, TypeError):
            continue
    return False


def hf_disk_files(folder: Path) -> list[Path]:
    """The data files of a ``datasets`` ``save_to_disk`` folder, in the order its
    ``state.json`` lists them (the dataset's row order)."""
    state_path = folder / "state.json"
    if not state_path.is_file():
        splits = _dataset_dict_splits(folder)
        if splits is not None:
            first = splits[0] if splits else "train"
            raise InputError(
                f"{folder} is a saved DatasetDict (splits: {', '.join(splits) or 'none'}): "
                f"give one split's folder, e.g. {folder / first}"
            )
        raise InputError(f"{folder} is not a datasets save_to_disk folder (no state.json)")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{state_path}: not a datasets state.json ({exc})") from exc
    files = [folder / name for name in names]
    for f in files:
        if not f.is_file():
            raise InputError(f"{state_path} lists {f.name}, which is missing")
    if not files:
        raise InputError(f"{folder}: the saved dataset has no data files")
    return files


def _dataset_dict_splits(folder: Path) -> list[str] | None:
    path = folder / "dataset_dict.json"
    if not path.is_file():
        return None
    try:
        return [str(s) for s in json.loads(path.read_text(encoding="utf-8"))["splits"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
