"""The runner: the four stages (tokenize -> plan -> write -> finalize), one file each, with
resume, tasks and locks; the logic they call lives in ``packcli.read``, ``packcli.tokenize``,
``packcli.chat``, ``packcli.pack``, ``packcli.write`` and ``packcli.publish``.

Each stage can run alone (``packcli tokenize|plan|write|finalize``, split into cluster
tasks) or all together (``packcli pack``); both paths run the same code and give
byte-identical Parquet files. Output folder layout::

    OUT/README.md                       dataset card (Hub YAML configs + dataset_info)
    OUT/packcli.json                    resolved config + report + file hashes; written last,
                                        so its presence marks a complete output
    OUT/data/{long,short}/train-*.parquet
    OUT/.packcli/                       work folder (--work-dir moves it):
        tokens/stage.json               tokenize settings, input files, tokenizer
        tokens/files/<key>/             one input file's shards + _SUCCESS.json
        tokens/_SUCCESS.json            index of all shards (global doc ids)
        plan/group-<g>.{npz,tail.npz,json}  a group's plan, the pieces it released, its record
        plan/tail.npz, plan.json        the tail's plan; the parts and their files' rows
        write/<config>-<i>.json         one record per finished Parquet file
        write/tail-group-<g>.{arrow,json}  a group's released pieces' tokens (for the tail)
        write/config.json               the write settings, as run
        packcli-work.json               marks the folder as packcli's (and names its output)

The stage, unit, index, plan, group, write and tail records are frozen dataclasses with one
reader and one writer (``packcli.records``; ``tokenize/records.py``, ``plan_records.py``,
``write_records.py``): one of another ``version`` is redone, never read field by field.

Resume: a stage's unit of work (an input file, a byte span of a big one or a group of small
ones; a tokenized shard; an output file) is skipped when its completion record carries the
current fingerprint, which covers everything the result depends on (input paths, sizes and
mtimes, tokenizer, settings, packcli version). Only the CLI prints; everything below logs.

Other people's folders and finished outputs: a non-empty ``--out`` is written into only when
it holds packcli's marks (``packcli.json``, or the work folder's marker); everything a user
can get wrong is resolved before the first file is touched, and ``packcli.json`` is removed
only just before something it vouches for changes, so a failed or all-reused rerun leaves a
finished output finished. ``pack`` holds locks on the output and work folders
(``packcli/stages/lock.py``).

A URL ``--out`` (``s3://...``) is made in a local staging folder (``RunConfig.out_path``)
exactly as a local output, and ``finalize`` then uploads it file by file, ``packcli.json``
last (``packcli/fs/output.py``); the remote prefix obeys the same ownership rule as a folder.


The files, in the order data flows through them:

    work.py       the work and output folders: fingerprints, records, ownership, markers
    units.py      units of work of the tokenize stage, and reading one unit's documents
    prepare.py    the tokenizer, its settings and the encoding backend, resolved up front
    tokenize.py   tokenize tasks: a unit's documents -> shards, with resume
    index.py      every unit done? documents numbered globally (tokens/_SUCCESS.json)
    plan.py       the plan over all lengths, group by group of shards, then the tail
                  (packcli.pack.groups; packcli.pack.plan decides tiers and rows)
    write.py      write tasks: whole groups' rows -> Parquet files, with a record each,
                  and the tail's files from the groups' tail shards
    finalize.py   report, card, packcli.json last (and the upload of a remote output)
    run.py        ``packcli pack``: all stages, tasks on an executor, under locks
    tasks.py, executors.py, lock.py, workstore.py: splitting stages into tasks, running them
                  here or on Ray, locking folders, and the work folder on object storage
"""
