"""The card's ``dataset_info`` is what ``datasets`` writes, without importing ``datasets``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pyarrow as pa
import pytest
import yaml

from packcli.publish.card import CONFIG_NAMES, _arrow_bytes, dataset_info, features_yaml
from packcli.publish.marker import MarkerFiles, TierCounts
from packcli.stages.write_records import Listing
from packcli.write import CHAT_ROW_SCHEMA, PREFERENCE_ROW_SCHEMA, ROW_SCHEMA

REPORT = {
    "tiers": {
        "long": {"rows": 129, "tokens": 16_858_022, "segments": 14_822, "capacity": 131072},
        "short": {"rows": 2585, "tokens": 10_584_302, "segments": 14_171, "capacity": 4096},
    }
}
FILES = MarkerFiles(
    long=[Listing("a", 1, 1, 27_285_755, ""), Listing("b", 1, 1, 12, "")],
    short=[Listing("c", 1, 1, 17_266_203, "")],
)


def datasets_dataset_info(report: dict[str, Any], files: MarkerFiles, chat: bool) -> list:
    """``dataset_info`` as ``datasets`` makes it (what card.py called until it stopped
    importing ``datasets``)."""
    import datasets

    features = datasets.Features.from_arrow_schema(CHAT_ROW_SCHEMA if chat else ROW_SCHEMA)
    infos = []
    for name in CONFIG_NAMES:
        tier = report["tiers"][name]
        num_bytes = _arrow_bytes(TierCounts(tier["rows"], tier["tokens"], tier["segments"]), chat)
        info = datasets.DatasetInfo(
            features=features,
            config_name=name,
            splits=datasets.SplitDict(
                {"train": datasets.SplitInfo("train", num_bytes, tier["rows"])}
            ),
            download_size=sum(f.bytes for f in files.of(name)),
            dataset_size=num_bytes,
        )
        infos.append({"config_name": name, **info._to_yaml_dict()})
    return infos


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_dataset_info_is_what_datasets_writes(chat: bool) -> None:
    ours = yaml.safe_dump(dataset_info(REPORT, FILES, chat), sort_keys=False)
    theirs = yaml.safe_dump(datasets_dataset_info(REPORT, FILES, chat), sort_keys=False)
    assert ours == theirs  # the card's bytes, key order included


@pytest.mark.parametrize(
    "schema",
    [ROW_SCHEMA, CHAT_ROW_SCHEMA, PREFERENCE_ROW_SCHEMA],
    ids=["text", "chat", "preference"],
)
def test_features_are_what_datasets_writes(schema: pa.Schema) -> None:
    import datasets

    expected = datasets.DatasetInfo(
        features=datasets.Features.from_arrow_schema(schema)
    )._to_yaml_dict()["features"]
    assert features_yaml(schema) == expected


def test_other_column_types_are_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="'x'"):
        features_yaml(pa.schema([pa.field("x", pa.string())]))


def test_rendering_the_card_does_not_import_datasets() -> None:
    code = """
        import sys
        from packcli.publish.card import card_front_matter, dataset_info
        from packcli.publish.marker import MarkerFiles
        report = {"tiers": {n: {"rows": 1, "tokens": 1, "segments": 1} for n in ("long", "short")}}
        card_front_matter(dataset_info(report, MarkerFiles([], [])))
        print("datasets" in sys.modules)
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_importing_the_card_does_not_import_pyarrow() -> None:
    """Every CLI command imports the card module (``publish`` does); ``--help`` should not
    pay for pyarrow (~0.3 s)."""
    code = "import sys, packcli.publish.card; print('pyarrow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
