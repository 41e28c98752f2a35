"""packcli.records, the one reader and writer of records: nested parts read back as
written, every wrong leaf named by its dotted place in the file, versions refused."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packcli.records import Fields, OldRecordError, Record, RecordError, parse_record


@dataclass(frozen=True)
class Leaf(Fields):
    count: int
    share: float
    pair: tuple[int, int]


@dataclass(frozen=True)
class Tree(Record):
    name: str
    leaves: tuple[Leaf, ...]
    by_name: dict[str, Leaf]
    note: str | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True)
class Contract(Record):
    VERSION: ClassVar[int | None] = None

    name: str


ints = st.integers(-(2**53), 2**53)
leaves = st.builds(
    Leaf, count=ints, share=st.floats(allow_nan=False) | ints, pair=st.tuples(ints, ints)
)
trees = st.builds(
    Tree,
    name=st.text(max_size=8),
    leaves=st.lists(leaves, max_size=4).map(tuple),
    by_name=st.dictionaries(st.text(max_size=4), leaves, max_size=3),
    note=st.none() | st.text(max_size=4),
)


@given(trees)
def test_a_record_with_nested_parts_reads_back_as_written(tree: Tree) -> None:
    data = json.loads(json.dumps(tree.to_json()))
    assert data["version"] == 1
    assert ("note" in data) == (tree.note is not None)
    assert Tree.from_json(data, "t.json") == tree


@given(trees.filter(lambda t: len(t.leaves) > 0))
def test_a_wrong_leaf_is_named_by_its_place(tree: Tree) -> None:
    data = json.loads(json.dumps(tree.to_json()))
    last = len(tree.leaves) - 1
    data["leaves"][last]["pair"] = [1, True]  # JSON true is not a count
    with pytest.raises(RecordError, match=rf"^t.json: field 'leaves\[{last}\].pair\[1\]' is bool"):
        Tree.from_json(data, "t.json")
    data["leaves"][last]["pair"] = [1, 2, 3]
    with pytest.raises(RecordError, match=rf"'leaves\[{last}\].pair' is list, not tuple"):
        Tree.from_json(data, "t.json")
    del data["leaves"][last]["count"]
    with pytest.raises(RecordError, match=rf"^t.json: field 'leaves\[{last}\].count' missing"):
        Tree.from_json(data, "t.json")
    assert parse_record(Tree, data, "t.json") is None


def test_a_nested_part_that_is_not_an_object_is_named() -> None:
    data = {"version": 1, "name": "x", "leaves": [], "by_name": {"a": 3}}
    with pytest.raises(RecordError, match=r"field 'by_name.a' is int, not object"):
        Tree.from_json(data, "t.json")


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_a_record_of_another_version_is_refused(version: object) -> None:
    data: dict[str, object] = {"name": "x", "leaves": [], "by_name": {}}
    if version is not None:
        data["version"] = version
    with pytest.raises(OldRecordError, match="record version"):
        Tree.from_json(data, "t.json")
    assert parse_record(Tree, data, "t.json") is None


def test_a_record_without_a_version_writes_none_and_reads_any() -> None:
    """Files whose bytes are a contract (packcli.json): no version field either way."""
    assert Contract("x").to_json() == {"name": "x"}
    assert Contract.from_json({"name": "x", "other": 1}, "c.json") == Contract("x")
    with pytest.raises(RecordError, match=r"^c.json: not a JSON object"):
        Contract.from_json([1], "c.json")
