"""Public path of the bin packer: it lives in ``packcli/pack/binpack.py`` (the pack stage)."""

from packcli.pack.binpack import pack_lengths

__all__ = ["pack_lengths"]
