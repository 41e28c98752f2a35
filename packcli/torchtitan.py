"""torchtitan 0.3: train on a packcli pack, document-masked, without tokenizing again.

Why: torchtitan 0.3 has no pre-tokenized data path; its dataloaders tokenize a Hub dataset on
the fly and pack it greedily. ``PackedTitanDataset`` reads the packed Parquet rows of one
config of a pack (``OUT/data/long/`` or ``OUT/data/short/``) and yields what torchtitan's
training loop takes from its own ``HuggingFaceTextDataset``: ``({"input": tokens,
"positions": positions}, labels)``, int64, each ``[seq_len]``. torchtitan derives the
document mask from ``positions`` alone (read in 0.3.0: ``Trainer.post_dataloading_process``
calls ``Decoder.get_attention_masks(positions)``; a document starts wherever a position is 0,
in ``create_varlen_metadata_for_document`` for varlen attention and ``get_document_mask_mod``
for flex "block_causal"), so:

* ``input`` is the row's tokens, every one of them, then padding up to ``seq_len`` (the pack's
  EOS id);
* ``positions`` restart at 0 in every segment (``seq_lengths``, context-parallel padding
  included, so the boundaries torchtitan derives are exactly the stored ones) and once more
  for the row's trailing padding, a block of its own that no real token attends to;
* ``labels`` are already shifted, as torchtitan's own datasets shift them (its loss compares
  ``labels[t]`` with the logits at ``t``): ``labels[t]`` is the target of token ``t + 1`` of
  the same segment (the stored ``labels`` column when the row has one: chat loss masks,
  ``--cp-size`` padding; else the token), and torchtitan's ``IGNORE_INDEX`` (-100) at each
  segment's last token, on padding and wherever the stored label is -100.

Unlike torchtitan's text dataset, which drops each document's last token from the inputs, no
token is lost: a document's last token is an input with no target (under causal attention it
changes no other token). Preference packs are refused (their rows need a pairwise loss).

Sharding: the config's rows, in file order, are cut into ``dp_world_size`` contiguous ranges
of equal size (±1 row), and each range into one part per dataloader worker. Every row is read
by one worker of one rank, once an epoch, and a worker reads only the row groups of its part,
so the workers together read the files once (dealt strided, rank r taking rows r, r + W, ...,
every worker would decode every row group). A contiguous range is as good a sample: packcli
shuffles the rows, and deals a mixture's rows so that every window holds each source near its
share. torchtitan's ``StatefulDataLoader`` interleaves the workers' batches. ``state_dict``
holds the epoch and the rows of its part a worker has yielded, checked on resume against the
part, which changes with the number of ranks or workers (an error then, not a skipped or
repeated row).

``PackedDataLoader`` (needs torchtitan) is the ``Trainer.Config.dataloader`` to use:
``PackedDataLoader.Config(dataset_path="out/", pack_config="long")``, with
``training.seq_len`` the config's capacity. Cost, one worker on one core of the loaded 2-core
development machine, Parquet read included (one row group, at most ~16M tokens, in memory at
a time): 0.24 ms a 4096-token row, 0.57 ms a 16384-token row (every row of a 20,000-document
pack, best of 3), far below a training step's time for the same tokens. tests/test_torchtitan.py
checks all of it with torchtitan's own loader, mask builders and model on real packs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packcli.collate import cu_seqlens_from_lengths, position_ids_from_lengths
from packcli.errors import PackcliError
from packcli.names import CONFIG_NAMES, IGNORE_INDEX
from packcli.publish.marker import read_marker

TESTED_TORCHTITAN = "0.3.0"
Sample = tuple[dict[str, torch.Tensor], torch.Tensor]


class TitanDataError(PackcliError):
    """The pack cannot feed torchtitan as asked; the message names the file or the setting."""


def shifted_sample(
    input_ids: Any,
    seq_lengths: Any,
    seq_len: int,
    *,
    labels: Any = None,
    seq_pad: Any = None,
    pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One packcli row as torchtitan's ``(input, positions, labels)``, int64 ``[seq_len]``.

    ``labels`` (the stored column, unshifted: the token's id where loss is taken, else -100)
    defaults to the tokens; ``seq_pad`` counts each segment's trailing context-parallel
    padding, whose targets are ignored too.

    >>> [a.tolist() for a in shifted_sample([5, 6, 7, 8, 9], [3, 2], 6)]
    [[5, 6, 7, 8, 9, 0], [0, 1, 2, 0, 1, 0], [6, 7, -100, 9, -100, -100]]
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    lengths = np.asarray(seq_lengths, dtype=np.int64)
    n = ids.size
    if lengths.ndim != 1 or lengths.size == 0 or lengths.min() < 1 or int(lengths.sum()) != n:
        raise TitanDataError(
            f"seq_lengths {lengths.tolist()} must be positive and sum to the row's {n} tokens"
        )
    if n > seq_len:
        raise TitanDataError(
            f"a row of {n} tokens does not fit seq_len {seq_len}: set training.seq_len to the "
            "config's capacity (packcli.json: config.plan.long_len or short_len)"
        )
    target = ids.copy() if labels is None else np.array(labels, dtype=np.int64)
    if target.shape != ids.shape:
        raise TitanDataError(f"labels has {target.size} entries but the row has {n} tokens")
    ends = cu_seqlens_from_lengths(lengths)[1:].astype(np.int64)
    if seq_pad is not None:
        pad = np.asarray(seq_pad, dtype=np.int64)
        if pad.shape != lengths.shape or (pad < 0).any() or (pad >= lengths).any():
            raise TitanDataError(
                f"seq_pad {pad.tolist()} must hold one count per segment, each under its "
                f"seq_lengths entry {lengths.tolist()}"
            )
        in_pad = np.arange(n) >= np.repeat(ends - pad, lengths)
        target[in_pad] = IGNORE_INDEX
    tokens = np.full(seq_len, pad_id, dtype=np.int64)
    tokens[:n] = ids
    positions = np.arange(seq_len, dtype=np.int64) - n  # the trailing padding: 0, 1, ...
    positions[:n] = position_ids_from_lengths(lengths)
    shifted = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    shifted[: n - 1] = target[1:]
    shifted[ends - 1] = IGNORE_INDEX  # a segment's last token has no target in its segment
    return tokens, positions, shifted


def shard_bounds(n_rows: int, part: int, parts: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``part`` of ``parts`` contiguous ranges of ``n_rows`` rows,
    as equal as can be (the first ``n_rows % parts`` ranges one row longer).

    >>> [shard_bounds(10, p, 3) for p in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    if not 0 <= part < parts:
        raise ValueError(f"part must be in [0, {parts}), got {part}")
    base, extra = divmod(n_rows, parts)
    start = part * base + min(part, extra)
    return start, start + base + (1 if part < extra else 0)


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and offsets (from 0) as numpy, without a copy per row."""
    arr = column.combine_chunks()
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    return np.asarray(arr.values)[offsets[0] : offsets[-1]], offsets - offsets[0]


class PackedTitanDataset(IterableDataset[tuple[dict[str, torch.Tensor], torch.Tensor]]):
    """The rows of config ``config`` of the pack at ``pack_dir`` for data-parallel rank
    ``dp_rank`` of ``dp_world_size``, as torchtitan samples (see the module docstring).

    ``seq_len`` (torchtitan's ``training.seq_len``) must be at least the config's capacity.
    ``infinite`` starts the range again after its last row (torchtitan's default for
    training; the order is the same every epoch). Each worker of a ``DataLoader`` takes its
    own part of the rank's range.
    """

    def __init__(
        self,
        pack_dir: str | Path,
        *,
        config: str = "long",
        seq_len: int | None = None,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        infinite: bool = False,
        pad_id: int | None = None,
    ) -> None:
        if config not in CONFIG_NAMES:
            raise TitanDataError(f"config must be one of {', '.join(CONFIG_NAMES)}, got {config!r}")
        if not 0 <= dp_rank < dp_world_size:
            raise TitanDataError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        self.pack_dir = Path(pack_dir)
        meta = read_marker(self.pack_dir)
        run = meta.run
        if (run.get("format") or "text") == "preference":
            raise TitanDataError(
                f"{self.pack_dir} holds preference pairs, which need a pairwise loss (DPO) that "
                "torchtitan's next-token training does not have; see packcli.collate for DPO"
            )
        plan = meta.plan_shape()
        capacity = plan.long_len if config == "long" else plan.short_len
        self.seq_len = capacity if seq_len is None else int(seq_len)
        if self.seq_len < capacity:
            raise TitanDataError(
                f"seq_len {self.seq_len} is shorter than the {config} rows of {self.pack_dir} "
                f"(up to {capacity} tokens): set training.seq_len = {capacity}"
            )
        eos = run["tokenizer"].get("eos_id")
        self.pad_id = int(pad_id if pad_id is not None else (eos if eos is not None else 0))
        self.vocab_size = int(run["tokenizer"]["vocab_size"])
        self.config = config
        self.files = [
            (self.pack_dir / "data" / config / entry.file, entry.rows)
            for entry in meta.files.of(config)
        ]
        self.num_rows = sum(rows for _, rows in self.files)
        if self.num_rows < dp_world_size:
            raise TitanDataError(
                f"the {config} config of {self.pack_dir} has {self.num_rows} rows, fewer than the "
                f"{dp_world_size} data-parallel ranks: some would get none"
            )
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.infinite = infinite
        self._epoch = 0
        self._yielded = 0  # rows of this worker's range yielded this epoch

    def rank_bounds(self) -> tuple[int, int]:
        """This rank's rows ``[start, stop)`` in the config's file order."""
        return shard_bounds(self.num_rows, self.dp_rank, self.dp_world_size)

    def worker_bounds(self) -> tuple[int, int]:
        """This dataloader worker's part of the rank's rows (all of them without workers)."""
        start, stop = self.rank_bounds()
        info = get_worker_info()
        if info is None:
            return start, stop
        a, b = shard_bounds(stop - start, info.id, info.num_workers)
        return start + a, start + b

    def state_dict(self) -> dict[str, Any]:
        start, stop = self.worker_bounds()
        return {"epoch": self._epoch, "rows_yielded": self._yielded, "bounds": [start, stop]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        start, stop = self.worker_bounds()
        if list(state["bounds"]) != [start, stop]:
            raise TitanDataError(
                f"the checkpoint's dataloader state is for rows {state['bounds']} but this "
                f"worker reads rows [{start}, {stop}) of {self.pack_dir} ({self.config}): resume "
                "with the same data-parallel size and num_workers"
            )
        self._epoch = int(state["epoch"])
        self._yielded = int(state["rows_yielded"])

    def __iter__(self) -> Iterator[Sample]:
        start, stop = self.worker_bounds()
        if stop > start and start + self._yielded >= stop:  # a finished pass: the next epoch
            self._epoch += 1
            self._yielded = 0
        while True:
            for tokens, positions, labels in self._samples(start + self._yielded, stop):
                self._yielded += 1  # before the yield: a state taken after it counts this row
                yield {"input": tokens, "positions": positions}, labels
            if not self.infinite or stop == start:
                return
            self._epoch += 1
            self._yielded = 0

    def _samples(self, start: int, stop: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """Rows ``[start, stop)``, reading only the row groups that hold them."""
        first = 0
        for path, rows in self.files:
            if first >= stop:
                return
            if first + rows > start:
                yield from self._file_samples(path, rows, start - first, stop - first)
            first += rows

    def _file_samples(
        self, path: Path, rows: int, start: int, stop: int
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        if not path.is_file():
            raise TitanDataError(f"{path}: missing, but {self.pack_dir / 'packcli.json'} lists it")
        pf = pq.ParquetFile(path)
        if pf.metadata.num_rows != rows:
            raise TitanDataError(
                f"{path}: {pf.metadata.num_rows} rows, but packcli.json lists {rows}; the file "
                "was replaced (packcli verify names what changed)"
            )
        names = pf.schema_arrow.names
        columns = ["input_ids", "seq_lengths"] + [c for c in ("labels", "seq_pad") if c in names]
        first = 0
        for g in range(pf.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            lo, hi = max(start - first, 0), min(stop - first, n)
            if lo < hi:
                table = pf.read_row_group(g, columns=columns).slice(lo, hi - lo)
                flat = {c: _flat(table.column(c)) for c in columns}
                for r in range(hi - lo):
                    row = {c: v[o[r] : o[r + 1]] for c, (v, o) in flat.items()}
                    arrays = shifted_sample(
                        row["input_ids"],
                        row["seq_lengths"],
                        self.seq_len,
                        labels=row.get("labels"),
                        seq_pad=row.get("seq_pad"),
                        pad_id=self.pad_id,
                    )
                    yield tuple(torch.from_numpy(a) for a in arrays)
            first += n
            if first >= stop:
                return


def _define_loader() -> type:
    """``PackedDataLoader``, made on first use so that this module imports without torchtitan
    (the dataset needs only torch)."""
    from dataclasses import dataclass

    try:
        from torchtitan.components.dataloader import ParallelAwareDataloader
    except ImportError as exc:
        raise ImportError(
            f"packcli.torchtitan.PackedDataLoader needs torchtitan (tested with "
            f"{TESTED_TORCHTITAN}: pip install 'torchtitan=={TESTED_TORCHTITAN}'): {exc}"
        ) from exc

    class PackedDataLoader(ParallelAwareDataloader):
        """torchtitan's ``Trainer.Config.dataloader`` for a packcli pack: rank ``dp_rank``'s
        share of one config's rows, ``local_batch_size`` samples of ``seq_len`` a batch."""

        @dataclass(kw_only=True, slots=True)
        class Config(ParallelAwareDataloader.Config):
            pack_config: str = "long"
            """Which config of the pack: "long" or "short" (training.seq_len: its capacity)."""

            infinite: bool = True
            """Start again after the last row (a finite run can end on ranks at different
            steps: ranks differ by up to one row)."""

            def __post_init__(self) -> None:
                if not self.dataset_path:
                    raise ValueError("PackedDataLoader.Config needs dataset_path: the pack folder")
                if self.pack_config not in CONFIG_NAMES:
                    raise ValueError(
                        f"pack_config must be one of {', '.join(CONFIG_NAMES)}, "
                        f"got {self.pack_config!r}"
                    )

        def __init__(
            self,
            config: Config,
            *,
            dp_world_size: int,
            dp_rank: int,
            tokenizer: Any = None,
            seq_len: int,
            local_batch_size: int,
            snapshot_every_n_steps: int | None = 1,
            **kwargs: Any,
        ) -> None:
            dataset = PackedTitanDataset(
                config.dataset_path,
                config=config.pack_config,
                seq_len=seq_len,
                dp_rank=dp_rank,
                dp_world_size=dp_world_size,
                infinite=config.infinite,
            )
            vocab = getattr(tokenizer, "get_vocab_size", None)
            if vocab is not None and vocab() < dataset.vocab_size:
                raise TitanDataError(
                    f"the tokenizer has {vocab()} ids but {config.dataset_path} was packed with "
                    f"a vocabulary of {dataset.vocab_size}: point hf_assets_path at the "
                    "tokenizer the pack was made with"
                )
            super().__init__(
                dataset,
                dp_rank=dp_rank,
                dp_world_size=dp_world_size,
                num_workers=config.num_workers,
                persistent_workers=config.persistent_workers,
                pin_memory=config.pin_memory,
                prefetch_factor=config.prefetch_factor,
                snapshot_every_n_steps=snapshot_every_n_steps,
                batch_size=local_batch_size,
            )

    PackedDataLoader.__module__ = __name__
    PackedDataLoader.__qualname__ = "PackedDataLoader"
    PackedDataLoader.Config.__qualname__ = "PackedDataLoader.Config"
    return PackedDataLoader


def __getattr__(name: str) -> Any:
    if name == "PackedDataLoader":
        loader = _define_loader()
        globals()[name] = loader
        return loader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
