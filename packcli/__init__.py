"""packcli: turn jsonl corpora into packed LLM training datasets with segment columns."""

__version__ = "0.1.0"
