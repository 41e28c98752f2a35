"""Where data lives: fsspec URLs (``s3://``, ``gs://``, ``hf://``, ...) next to local paths.

One package knows about URLs, so the readers, the pipeline and the tools keep working on
plain paths and call in here only where a URL can reach them. Each job has its module:

* ``urls``: a URL's filesystem (``locate``), listings (``list_tree``, ``listing``) and the
  version fields that say which bytes a remote file holds; ``redact``; the cache folders.
* ``reading``: inputs that may be URLs (``open_binary``, ``open_arrow``, ``spool``) and
  their identity for resume (``input_entry``).
* ``output``: a remote ``--out``: which files are packcli's (``foreign_files``), the
  upload (``upload_output``, ``packcli.json`` last) and the download (``download_output``).

The work folder on object storage (a URL ``--work-dir``) is ``packcli/stages/workstore.py``.
Everything is importable from ``packcli.fs``.
"""

from packcli.fs.output import (
    REMOTE_MARKER,
    UPLOAD_LOG,
    Placed,
    Uploaded,
    WorkMarker,
    begin_changes,
    check_remote_output,
    check_writable,
    download_output,
    fetch_output_file,
    foreign_files,
    marker_files,
    output_files,
    put_output_file,
    refuse_foreign,
    remote_marker_files,
    reword,
    upload_output,
    uploaded_files,
    work_marker_of,
    writes_at,
)
from packcli.fs.reading import (
    REMOTE_BLOCK,
    ReadFailed,
    as_input,
    input_entry,
    input_size,
    open_arrow,
    open_binary,
    opened_size,
    read_text,
    spool,
)
from packcli.fs.urls import (
    EXTRAS,
    cache_root,
    content_version,
    info,
    is_url,
    json_object,
    list_tree,
    listing,
    local_path,
    locate,
    mirror_root,
    normalize,
    redact,
    redact_text,
    remote_version,
    same_version,
    staging_root,
    store_call,
    stored_version,
    url_folder,
)

__all__ = [
    "EXTRAS",
    "REMOTE_BLOCK",
    "REMOTE_MARKER",
    "UPLOAD_LOG",
    "Placed",
    "ReadFailed",
    "Uploaded",
    "WorkMarker",
    "as_input",
    "begin_changes",
    "cache_root",
    "check_remote_output",
    "check_writable",
    "content_version",
    "download_output",
    "fetch_output_file",
    "foreign_files",
    "info",
    "input_entry",
    "input_size",
    "is_url",
    "json_object",
    "list_tree",
    "listing",
    "local_path",
    "locate",
    "marker_files",
    "mirror_root",
    "normalize",
    "open_arrow",
    "open_binary",
    "opened_size",
    "output_files",
    "put_output_file",
    "read_text",
    "redact",
    "redact_text",
    "refuse_foreign",
    "remote_marker_files",
    "remote_version",
    "reword",
    "same_version",
    "spool",
    "staging_root",
    "store_call",
    "stored_version",
    "upload_output",
    "uploaded_files",
    "url_folder",
    "work_marker_of",
    "writes_at",
]
