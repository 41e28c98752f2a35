"""The dataset card (``README.md`` of the output): Hub YAML front matter plus a summary.

The YAML ``configs`` section is what makes ``datasets.load_dataset(out, "long")`` and
``load_dataset(out, "short")`` find the right Parquet files, locally and on the Hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from packcli import __version__
from packcli.atomic import atomic_write_bytes

# Re-exported: the output's names live in packcli.names (fs/output.py needs them without the card).
from packcli.names import CONFIG_NAMES as CONFIG_NAMES
from packcli.names import MARKER as MARKER
from packcli.names import STATS_DIR as STATS_DIR
from packcli.publish.marker import (
    Marker,
    MarkerFiles,
    ReportShape,
    TierCounts,
    Tiers,
    TierSummary,
    load_marker,
)

if TYPE_CHECKING:
    import pyarrow as pa

PLOT_DOC_LENGTHS = "doc_lengths.png"
PLOT_ROW_FILL = "row_fill.png"
PLOT_SEGMENTS = "segments_per_row.png"
PLOT_ATTENTION = "attention_cost.png"
PLOT_FILES = (PLOT_DOC_LENGTHS, PLOT_ROW_FILL, PLOT_SEGMENTS, PLOT_ATTENTION)
_PLOT_TITLES = {
    PLOT_DOC_LENGTHS: "Document lengths",
    PLOT_ROW_FILL: "Row fill per config",
    PLOT_SEGMENTS: "Documents (segments) per row",
    PLOT_ATTENTION: "Attention cost per long row",
}


# The list columns with one entry per token; every other list column has one per segment.
_PER_TOKEN = frozenset({"input_ids", "segment_ids", "labels"})


def _arrow_bytes(
    tier: TierCounts,
    chat: bool,
    preference: bool = False,
    pad_tokens: int | None = None,
    *,
    mixture: bool = False,
    cost: bool = False,
) -> int:
    """In-memory Arrow size of a config (what ``datasets`` calls ``num_bytes``), from its
    schema (``_schema``): per list column one offset per row plus one value per token or
    per segment, per scalar column one value per row; ``pad_tokens``: its context-parallel
    padding, when padded (the padding's tokens are stored too)."""
    rows, segments = tier.rows, tier.segments
    tokens = tier.tokens + (pad_tokens or 0)
    total = 0
    for field in _schema(chat, preference, pad_tokens is not None, mixture, cost):
        t = field.type
        if hasattr(t, "value_type"):  # a list column: offsets, then its values
            per = tokens if field.name in _PER_TOKEN else segments
            total += 4 * (rows + 1) + t.value_type.bit_width // 8 * per
        else:
            total += t.bit_width // 8 * rows
    return total


def _schema(chat: bool, preference: bool, padded: bool, mixture: bool, cost: bool) -> pa.Schema:
    from packcli.write import schema_for

    return schema_for(labels=chat, pairs=preference, mixture=mixture, padded=padded, cost=cost)


def features_yaml(schema: pa.Schema) -> list[dict[str, str]]:
    """The ``features`` entry of ``dataset_info`` for a schema of integers and lists of
    integers, as ``datasets`` writes it (``Features.from_arrow_schema(schema)`` and
    ``DatasetInfo._to_yaml_dict``; a test checks both schemas against it).

    Written here because importing ``datasets`` costs ~1.3 s, a quarter of a small pack; the
    row schemas use nothing else, and anything else is refused rather than guessed.
    """
    import pyarrow as pa  # not at module level: the CLI imports this module for every command

    features = []
    for field in schema:
        t = field.type
        if pa.types.is_integer(t) or pa.types.is_float64(t):
            features.append({"name": field.name, "dtype": str(t).replace("double", "float64")})
        elif pa.types.is_list(t) and pa.types.is_integer(t.value_type):
            features.append({"name": field.name, "list": str(t.value_type)})
        else:
            raise ValueError(f"no card feature for column {field.name!r} of type {t}")
    return features


def dataset_info(
    report: dict[str, Any],
    files: MarkerFiles,
    chat: bool = False,
    preference: bool = False,
    cost: bool = False,
) -> list[dict[str, Any]]:
    """``dataset_info`` YAML: features, split sizes and byte counts per config (``cost``:
    the rows have the ``cost`` column).

    Besides documenting the data for the Hub, these numbers feed ``datasets``' cache key for
    local folders, so repacking into the same folder never serves a stale cached copy, and
    ``load_dataset`` checks the row counts against them.
    """
    cp = report.get("cp_padding")
    mixture = report.get("mixture") is not None
    chat = chat or preference
    schema = _schema(chat, preference, bool(cp), mixture, cost)
    tiers = Tiers.from_json(report.get("tiers"), MARKER, prefix="report.tiers.")
    infos = []
    for name in CONFIG_NAMES:
        tier = tiers.of(name)
        pad = cp[name]["pad_tokens"] if cp else None
        num_bytes = _arrow_bytes(tier, chat, preference, pad, mixture=mixture, cost=cost)
        infos.append(
            {
                "config_name": name,
                # A fresh list per config: YAML would write a shared one as an anchor/alias.
                "features": features_yaml(schema),
                "splits": [{"name": "train", "num_bytes": num_bytes, "num_examples": tier.rows}],
                "download_size": sum(f.bytes for f in files.of(name)),
                "dataset_size": num_bytes,
            }
        )
    return infos


def card_front_matter(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's YAML: ``infos`` (``dataset_info``), the two configs' files and tags."""
    return {
        "dataset_info": infos,
        "configs": [
            {
                "config_name": name,
                "data_files": [{"split": "train", "path": f"data/{name}/train-*.parquet"}],
                **({"default": True} if name == "long" else {}),
            }
            for name in CONFIG_NAMES
        ],
        "tags": ["packcli", "packed", "tokenized"],
    }


# Long as one Markdown template: split, the card's text would no longer read top to bottom.
def render_card(
    report: dict[str, Any],
    run: dict[str, Any],
    files: MarkerFiles,
    out: Path | None = None,
) -> str:
    """The card's markdown; ``out`` (when given) lets it embed plots from ``packcli stats``."""
    preference = run.get("format") == "preference"
    chat = run.get("format") == "chat" or preference
    cost_model = run.get("cost_model")
    infos = dataset_info(report, files, chat, preference, cost=cost_model is not None)
    front = yaml.safe_dump(card_front_matter(infos), sort_keys=False)
    cp = report.get("cp_padding")
    labels_row = (
        "| `labels` | list<int32> | token id where loss is taken, -100 elsewhere (unshifted; "
        "-100 at every segment start) |\n"
        if chat or cp
        else ""
    )
    cp_text = ""
    if cp:
        labels_row += (
            "| `seq_pad` | list<int32> | per segment: how many of its `seq_lengths` tokens are "
            "context-parallel padding, at its end (label -100) |\n"
        )
        cp_text = (
            f"\nContext-parallel padding (`--cp-size {cp['cp_size']}`): every segment is padded "
            f"to a multiple of {cp['multiple']} tokens with id {cp['pad_id']} (label -100), as "
            "Transformer Engine's THD layout with context parallelism needs; real tokens never "
            "attend to the padding (it follows them in their own segment). Padding: short "
            f"{cp['short']['pad_tokens']:,} tokens ({cp['short']['share']:.3%}), long "
            f"{cp['long']['pad_tokens']:,} ({cp['long']['share']:.3%}); the tokens and "
            "efficiency above count real tokens. `PackedCollator` emits `cu_seqlens` and "
            "`cu_seqlens_padded` for it.\n"
        )
    if preference:
        labels_row += (
            "| `seq_roles` | list<int8> | per segment: 0 a document, 1 a pair's prompt+chosen, "
            "2 its prompt+rejected (right after its 1, same `doc_ids` entry) |\n"
        )
    mixture = ""
    if (mix := report.get("mixture")) is not None:
        from packcli.publish.report import format_mixture

        labels_row += (
            "| `source_ids` | list<int16> | per segment: its source (the Mixture table's order) |\n"
            "| `doc_repeats` | list<int32> | per segment: which copy of its document (0 first) |\n"
        )
        mixture = (
            "\n## Mixture\n\nSources, their epoch multipliers and the realised mix (share of "
            "each config's tokens; largest deviation over windows of "
            f"{mix['window_tokens']:,} tokens, one step):\n\n```\n{format_mixture(mix)}\n```\n"
        )
    if cost_model is not None:
        labels_row += (
            "| `cost` | float64 | the row's training compute by the cost model "
            f"`{cost_model['spec']}`: {cost_model['per_token']:.6g} per token + "
            f"{cost_model['per_square']:.6g} per squared `seq_lengths` entry "
            "(`PackedDistributedSampler` balances it) |\n"
        )
    plots = render_plots_section(out) if out is not None else ""
    pad = run["tokenizer"].get("eos_id")
    training = training_snippet(pad_token_id=pad if pad is not None else 0, preference=preference)
    shape = ReportShape.from_json(report, MARKER, prefix="report.")
    pol = shape.policy
    # In the report's order of configs (a fresh report's, or packcli.json's sorted one).
    tiers = {
        name: TierSummary.from_json(t, MARKER, prefix=f"report.tiers.{name}.")
        for name, t in report["tiers"].items()
    }
    rows = "\n".join(
        f"| `{name}` | {t.capacity:,} | {t.rows:,} | {t.tokens:,} | "
        f"{t.efficiency:.4%} | {t.rows_over_bound:.5f} |"
        for name, t in tiers.items()
    )
    tok = run["tokenizer"]
    return f"""---
{front}---

# Packed dataset (packcli {__version__})

Tokenized with `{tok["source"]}` (vocabulary {tok["vocab_size"]:,}) and bin-packed in two tiers
by packcli: documents up to {tiers["short"].capacity:,}
tokens are packed into short packs (config `short`); longer documents and the short packs,
kept whole, are packed into rows of {tiers["long"].capacity:,} tokens (config `long`, the
complete dataset). Document boundaries are stored per row, so training can attend within
documents only.

| config | capacity | rows | tokens | efficiency | rows / lower bound |
|---|---|---|---|---|---|
{rows}

Input: {shape.input.documents:,} documents, {shape.input.tokens:,} tokens.
Split: {pol.split_docs:,} documents ({pol.split_pieces:,} pieces, all tokens kept).
Truncated: {pol.truncated_docs:,} documents ({pol.truncated_tokens:,} tokens removed).
Dropped: {pol.dropped_docs:,} documents ({pol.dropped_tokens:,} tokens);
{pol.empty_docs:,} empty documents.
{mixture}{cp_text}
## Columns

| column | type | meaning |
|---|---|---|
| `input_ids` | list<int32> | the row's tokens, unpadded |
| `segment_ids` | list<int32> | per token: 1-based index of its segment (document) within the row |
| `seq_lengths` | list<int32> | length of each segment, in order (sums to `num_tokens`) |
| `doc_ids` | list<int64> | global id of each segment's document (a split document repeats its id) |
| `seq_pieces` | list<int32> | per segment: which piece of its document (0-based; whole: 0) |
| `seq_last` | list<int8> | per segment: 1 if its document ends here, 0 if a later piece follows |
| `num_tokens` | int32 | `len(input_ids)` |
{labels_row}
## Loading

```python
import datasets
ds = datasets.load_dataset("path/or/repo", "long", split="train")
```

{training}
{plots}
## Provenance

Made with packcli {run["packcli_version"]}: `{run["command"]}`
"""


# -- card extension --------------------------------------------------------------------------


def render_plots_section(out: Path) -> str:
    """Markdown embedding the plots in ``OUT/stats/`` by relative path; "" when there are none."""
    present = [name for name in PLOT_FILES if (out / STATS_DIR / name).is_file()]
    if not present:
        return ""
    images = "\n\n".join(f"![{_PLOT_TITLES[n]}]({STATS_DIR}/{n})" for n in present)
    return f"## Statistics\n\nMade with `packcli stats`.\n\n{images}\n"


# Long as one Markdown template (code blocks a test compiles and runs).
def training_snippet(
    dataset: str = "path/or/repo",
    config: str = "long",
    pad_token_id: int = 0,
    preference: bool = False,
) -> str:
    """Markdown: how to train on the output with HF ``Trainer`` and ``PackedCollator``, with
    TRL's ``SFTTrainer`` (the one config that keeps packcli rows intact), and for preference
    outputs a DPO loss from ``segment_logps``."""
    batch = 1 if config == "long" else 8
    text = f"""## Training with it

```python
import datasets
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from packcli.collate import PackedCollator

ds = datasets.load_dataset("{dataset}", "{config}", split="train")
model = AutoModelForCausalLM.from_pretrained("your/model", attn_implementation="sdpa")
model.config.use_cache = False  # with a cache, position_ids do not separate documents
args = TrainingArguments(
    "run",
    per_device_train_batch_size={batch},
    remove_unused_columns=False,  # the collator needs seq_lengths, which forward() lacks
)
collator = PackedCollator(mode="position_ids", pad_token_id={pad_token_id})
Trainer(model=model, args=args, train_dataset=ds, data_collator=collator).train()
```

`PackedCollator` restarts `position_ids` at every document and sets the label of each
document's first token to -100, so no attention and no loss crosses a document boundary.
With flash-attention use `mode="flash"` (varlen `cu_seq_lens`).

With TRL (1.16) use the same collator and turn TRL's own off: the default `max_length=1024`
cuts longer rows (not their `seq_lengths`), `padding_free=False` without a collator ignores
the boundaries, `packing=True` packs each row again as one document, TRL refuses a collator
with `padding_free=True`, and its padding-free path on sdpa attends over one
`total x total` mask; `check_sft_config` raises on each (and warns on the slow one).

```python
from trl import SFTConfig, SFTTrainer

from packcli.collate import check_sft_config

args = SFTConfig("run", padding_free=False, max_length=None, remove_unused_columns=False)
check_sft_config(args, collator, attn_implementation=model.config._attn_implementation)
SFTTrainer(model=model, args=args, train_dataset=ds, data_collator=collator).train()
```
"""
    if preference:
        text += """
Preference pairs: `seq_roles` marks each segment 0 (document), 1 (chosen) or 2 (rejected,
right after its chosen). `segment_logps` gives each segment's summed log-probability,
computed as if alone; `preference_pairs` pairs them up:

```python
import torch
import torch.nn.functional as F

from packcli.collate import model_inputs, preference_pairs, segment_logps

batch = PackedCollator(mode="position_ids")([ds[0], ds[1]])
chosen, rejected = preference_pairs(batch)
logps = segment_logps(model(**model_inputs(batch), use_cache=False).logits, batch)
with torch.no_grad():  # reference: a frozen copy of the starting model
    ref = segment_logps(reference(**model_inputs(batch), use_cache=False).logits, batch)
margin = (logps[chosen] - ref[chosen]) - (logps[rejected] - ref[rejected])
loss = -F.logsigmoid(0.1 * margin).mean()  # DPO
```
"""
    return text


def refresh_card(out: Path) -> None:
    """Re-render ``OUT/README.md`` from ``packcli.json`` (e.g. after ``packcli stats`` made
    plots), atomically."""
    marker = Marker.from_json(load_marker(out), out / MARKER)
    text = render_card(marker.report, marker.run, marker.files, out)
    atomic_write_bytes(out / "README.md", text.encode("utf-8"))
