"""The runner: the four stages (tokenize -> plan -> write -> finalize), one file each, with
resume, tasks and locks; the logic they call lives in ``packcli.read``, ``packcli.tokenize``,
``packcli.chat``, ``packcli.pack``, ``packcli.write`` and ``packcli.publish`` (README "Layout";
its "Output layout" and docs/scale.md say what each stage leaves on disk and how it resumes).

The work folder (``OUT/.packcli/``, ``--work-dir`` moves it)::

    tokens/stage.json               tokenize settings, input files, tokenizer
    tokens/backend.json             the encoding backend chosen, and why
    tokens/files/<key>/             one unit's shards, their manifests, fingerprint.json
                                    and _SUCCESS.json
    tokens/_SUCCESS.json            index of all shards (global doc ids)
    plan/group-<g>.{npz,tail.npz,json}  a group's plan, the pieces it released, its record
    plan/tail.npz, plan.json        the tail's plan; the parts and their files' rows
    write/<config>-<i>.json         one record per finished Parquet file
    write/tail-group-<g>.{arrow,json}  a group's released pieces' tokens (for the tail)
    write/config.json               the write settings, as run
    owned/<hash>.json               data files an earlier packcli.json listed
    packcli-work.json               marks the folder as packcli's (and names its output)
    lock, locks/                    the locks, a line per holder

Every one of these records is a frozen dataclass with one reader and one writer
(``packcli.records``; ``tokenize/records.py``, ``plan_records.py``, ``write_records.py``,
``work.py``'s ``OwnedFiles``, ``lock.py``'s ``LockHolder``, ``packcli.fs``'s ``WorkMarker``):
one of another ``version`` is redone, never read field by field; one without a version field
(its bytes a contract) is redone, or taken for not packcli's, when it does not read as one.

The files, in the order data flows through them:

    work.py       the work and output folders: fingerprints, records, ownership, markers
    units.py      units of work of the tokenize stage, and reading one unit's documents
    prepare.py    the tokenizer, its settings and the encoding backend, resolved up front
    tokenize.py   tokenize tasks: a unit's documents -> shards, with resume
    index.py      every unit done? documents numbered globally (tokens/_SUCCESS.json)
    plan.py       the plan over all lengths, group by group of shards, then the tail
    plan_records.py  plan.json and each group's record
    write.py      write tasks: whole groups' rows -> Parquet files, with a record each,
                  and the tail's files from the groups' tail shards
    write_records.py  the write stage's records (per file a claim, then the finished file; the
                  tail shards'; the write settings)
    finalize.py   report, card, packcli.json last (and the upload of a remote output)
    run.py        ``packcli pack``: all stages, tasks on an executor, under locks
    tasks.py, executors.py, lock.py, workstore.py: splitting stages into tasks, running them
                  here or on Ray, locking folders, and the work folder on object storage
"""
