"""The read stage: input specs in, batches of documents out, bad lines refused or quarantined.

The modules follow the data:

* ``inputs.py``: specs (paths, folders, globs, URLs, ``hf-dataset:``) to a sorted file list,
  with ``saved_dataset.py`` (``save_to_disk`` folders) and ``hub.py`` (Hub datasets);
  ``formats.py`` says what a file name means (format, compression).
* ``spans.py``: byte spans of a large jsonl file, so several tasks can share it;
  ``columnar.py`` does the same with row-group ranges.
* ``streams.py``: a jsonl file opened as lines, a compressed one verified first.
* ``jsonl.py`` and ``columnar.py``: the two readers, filling ``batches.py``'s ``DocBatch``;
  ``columnar_integrity.py`` judges what a Parquet/Arrow file's own checks say of its values.
* ``bad_lines.py``: why a refused line is bad; ``rejects.py``: the ``--on-bad-line`` policy
  and the ``rejected.jsonl`` quarantine.
"""

from __future__ import annotations

from packcli.read.batches import DocBatch, ReadOptions, ReadStats
from packcli.read.columnar import check_columns, group_ranges, iter_columnar, split_groups
from packcli.read.formats import file_format, splittable, suffix_format
from packcli.read.hub import parse_hub_spec
from packcli.read.inputs import resolve_inputs
from packcli.read.jsonl import iter_batches
from packcli.read.rejects import BadLineError, RejectSink, shift_reject_lines
from packcli.read.spans import count_newlines, split_spans

__all__ = [
    "BadLineError",
    "DocBatch",
    "ReadOptions",
    "ReadStats",
    "RejectSink",
    "check_columns",
    "count_newlines",
    "file_format",
    "group_ranges",
    "iter_batches",
    "iter_columnar",
    "parse_hub_spec",
    "resolve_inputs",
    "shift_reject_lines",
    "split_groups",
    "split_spans",
    "splittable",
    "suffix_format",
]
