"""What a finished output is and how it leaves: the report (``report``, ``steps``), the dataset
card (``card``), ``packcli.json`` (``marker``), the invariant checker (``verify``, with
``recheck`` and ``expected``), the inspection tools (``stats``, ``rowview``) and the Hub push
(``push``). No typer here: the commands are in ``packcli.cli``."""
