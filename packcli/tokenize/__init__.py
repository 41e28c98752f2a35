"""The tokenize stage's parts: loading the tokenizer and its settings (``tokenizer``), the
encoding backends and their self-check (``backends``), encoding batches (``encode``) and the
tokenized shards (``shards``). The stage itself, with resume and tasks, is
``packcli.stages.tokenize``."""
