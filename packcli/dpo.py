"""packcli preference rows for TRL's ``DPOTrainer`` (TRL 1.16): one pair per example again.

Why: ``DPOTrainer`` reads one pair per example, as text (``prompt``/``chosen``/``rejected``),
and tokenizes it itself; handed packcli rows it fails in ``extract_prompt`` with ``KeyError:
'chosen'``. Re-tokenizing decoded text would not give packcli's tokens back (tokens merge
across the prompt's end, TRL appends EOS), so ``unpack_pairs`` gives TRL's own tokenized
columns (``prompt_ids``, ``chosen_ids``, ``rejected_ids``, what its
``DataCollatorForPreference`` collates), cut from the stored tokens, and ``PackedDPOMixin``
makes ``DPOTrainer`` take them as they are instead of tokenizing text it does not have.

The split: a pair is two adjacent segments, prompt+chosen (role 1) then prompt+rejected
(role 2), with labels -100 on the prompt and template tokens. The prompt is the leading run of
-100 labels of the chosen segment (the rejected one must start with the same tokens); the
completion is the rest up to its last trained token. Trailing untrained template tokens are
dropped: under causal attention they change no trained token's log-probability, and TRL
would train them (it trains every completion token). A completion with an untrained token
inside is refused, since TRL cannot leave it out. Ordinary documents (role 0) are skipped.
Cost: one pass over the rows in Python, a few microseconds a pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from packcli.collate import ROLE_CHOSEN, ROLE_REJECTED, cu_seqlens_from_lengths
from packcli.names import IGNORE_INDEX

PAIR_COLUMNS: tuple[str, ...] = ("prompt_ids", "chosen_ids", "rejected_ids")
_PACKED_HINT = (
    "these are packcli preference rows (seq_roles, packed pairs), not TRL's prompt/chosen/"
    "rejected: turn them into one pair per example with packcli.dpo.unpack_pairs(rows) and "
    "train with class Trainer(PackedDPOMixin, DPOTrainer) (docs/training.md)"
)


def _completion(ids: np.ndarray, labels: np.ndarray, prompt_len: int, where: str) -> list[int]:
    trained = np.flatnonzero(labels[prompt_len:] != IGNORE_INDEX)
    if trained.size == 0:
        raise ValueError(f"{where}: the response has no trained token")
    end = prompt_len + int(trained[-1]) + 1
    if (labels[prompt_len:end] == IGNORE_INDEX).any():
        raise ValueError(
            f"{where}: the response has untrained tokens inside it, which TRL's DPOTrainer "
            "would train (it trains every completion token); use segment_logps instead"
        )
    response: list[int] = ids[prompt_len:end].tolist()
    return response


def unpack_pairs(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[list[int]]]:
    """TRL's tokenized pair columns from packcli preference rows, in row order.

    Returns ``{"prompt_ids": [...], "chosen_ids": [...], "rejected_ids": [...]}``, one entry
    per pair; ``datasets.Dataset.from_dict`` makes it a training set for
    ``PackedDPOMixin``. Raises naming the row when a pair is not laid out as packcli writes it.
    """
    out: dict[str, list[list[int]]] = {name: [] for name in PAIR_COLUMNS}
    for r, row in enumerate(rows):
        if row.get("seq_roles") is None or row.get("labels") is None:
            raise ValueError(
                f"row {r} has no seq_roles/labels column: unpack_pairs reads the output of "
                "packcli pack --format preference"
            )
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        labels = np.asarray(row["labels"], dtype=np.int64)
        roles = np.asarray(row["seq_roles"], dtype=np.int64)
        cu = cu_seqlens_from_lengths(row["seq_lengths"]).tolist()
        if len(roles) != len(cu) - 1:
            raise ValueError(f"row {r}: {len(roles)} seq_roles for {len(cu) - 1} segments")
        for s in np.flatnonzero(roles == ROLE_CHOSEN).tolist():
            where = f"row {r}, segment {s}"
            if s + 1 >= len(roles) or roles[s + 1] != ROLE_REJECTED:
                raise ValueError(f"{where}: a chosen segment not followed by its rejected one")
            (a, b), (c, d) = (cu[s], cu[s + 1]), (cu[s + 1], cu[s + 2])
            chosen_ids, chosen_labels = ids[a:b], labels[a:b]
            trained = np.flatnonzero(chosen_labels != IGNORE_INDEX)
            prompt_len = int(trained[0]) if trained.size else b - a
            prompt = chosen_ids[:prompt_len]
            if d - c <= prompt_len or not np.array_equal(ids[c : c + prompt_len], prompt):
                raise ValueError(f"{where}: the rejected segment does not start with the prompt")
            if (labels[c : c + prompt_len] != IGNORE_INDEX).any():
                raise ValueError(f"{where}: the rejected segment trains prompt tokens")
            out["prompt_ids"].append(prompt.tolist())
            out["chosen_ids"].append(_completion(chosen_ids, chosen_labels, prompt_len, where))
            out["rejected_ids"].append(_completion(ids[c:d], labels[c:d], prompt_len, where))
    return out


def check_dpo_dataset(dataset: Any) -> None:
    """Raise with what to do when ``dataset`` is packcli's packed preference rows, which
    ``DPOTrainer`` would meet with ``KeyError: 'chosen'``."""
    names = set(getattr(dataset, "column_names", None) or [])
    if "seq_roles" in names and not {"prompt", "chosen"} <= names:
        raise ValueError(_PACKED_HINT)


class PackedDPOMixin:
    """Put before TRL's ``DPOTrainer``: ``class Trainer(PackedDPOMixin, DPOTrainer)``.

    A dataset with ``prompt_ids``/``chosen_ids``/``rejected_ids`` (``unpack_pairs``) is used as
    it is: TRL 1.16 would otherwise look for text to tokenize and fail. Packed rows are
    refused with what to do; any other dataset goes to ``DPOTrainer`` unchanged.
    """

    def _prepare_dataset(
        self, dataset: Any, processing_class: Any, args: Any, dataset_name: str
    ) -> Any:
        check_dpo_dataset(dataset)
        if set(PAIR_COLUMNS) <= set(getattr(dataset, "column_names", None) or []):
            if args.max_length is not None and args.truncation_mode == "keep_start":
                # As TRL does after tokenizing: a prompt alone filling max_length trains nothing.
                dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
            return dataset
        trainer: Any = super()  # a mixin: the next class is TRL's DPOTrainer
        return trainer._prepare_dataset(dataset, processing_class, args, dataset_name)
