"""Exports of a finished pack for other training stacks (Megatron .bin/.idx, OLMo-core
numpy memmaps, Megatron-Bridge packed Parquet), written from its shards and rows without
tokenizing again; ``run.py`` orchestrates, one module per format writes."""

from packcli.export.run import FORMATS, ExportResult, export_pack
from packcli.export.source import ExportError

__all__ = ["FORMATS", "ExportError", "ExportResult", "export_pack"]
