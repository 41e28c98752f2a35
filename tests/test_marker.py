"""packcli.publish.marker: the one reader of ``packcli.json``, at its three strengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from packcli.errors import VerifyError
from packcli.publish import marker, stats


@pytest.mark.parametrize("body", [None, b"\xff\xfe", b"{not json", b"[1, 2]"])
def test_peek_marker_says_nothing_for_a_missing_or_foreign_file(
    tmp_path: Path, body: bytes | None
) -> None:
    if body is not None:
        (tmp_path / "packcli.json").write_bytes(body)
    assert marker.peek_marker(tmp_path) == {}
    with pytest.raises(VerifyError, match=r"packcli\.json"):
        marker.read_marker(tmp_path)


def test_load_marker_returns_any_json_and_raises_on_no_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        marker.load_marker(tmp_path)
    (tmp_path / "packcli.json").write_text('{"run": {"packcli_version": "x"}}')
    assert marker.load_marker(tmp_path) == marker.peek_marker(tmp_path)
    assert marker.peek_marker(tmp_path)["run"] == {"packcli_version": "x"}


def test_stats_refuses_a_folder_without_packcli_json() -> None:
    with pytest.raises(VerifyError, match=r"no packcli\.json"):
        stats.read_meta(Path("/nonexistent-packcli-output"))
