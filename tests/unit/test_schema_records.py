"""The Python record classes mirror the `.avsc` files field for field: names, order, types, defaults."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from cacheroute.schemas import codec
from cacheroute.schemas.records import (
    Destination,
    KeyRate,
    PlanChunk,
    PlanHeader,
    PlanParams,
    RequestBatch,
    RequestEvent,
    RequestSummary,
)

CLASSES = {
    "RequestEvent": RequestEvent,
    "KeyRate": KeyRate,
    "PlanHeader": PlanHeader,
    "PlanParams": PlanParams,
    "Destination": Destination,
    "PlanChunk": PlanChunk,
    "RequestBatch": RequestBatch,
    "RequestSummary": RequestSummary,
}
PRIMITIVES = {"string": str, "int": int, "long": int, "double": float, "float": float}


def _named_records(schema: Any) -> list[dict[str, Any]]:
    """Every record schema defined inside `schema`, outermost first."""
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "record":
            found.append(schema)
            for f in schema["fields"]:
                found.extend(_named_records(f["type"]))
        elif schema.get("type") == "array":
            found.extend(_named_records(schema["items"]))
    elif isinstance(schema, list):
        for branch in schema:
            found.extend(_named_records(branch))
    return found


def _expected_python_type(avro: Any) -> Any:
    if isinstance(avro, str):
        return PRIMITIVES.get(avro) or CLASSES[avro]
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        assert len(branches) == 1, "only optional unions ['null', X] are used"
        return _expected_python_type(branches[0]) | None
    if avro["type"] == "record":
        return CLASSES[avro["name"]]
    if avro["type"] == "array":
        return list[_expected_python_type(avro["items"])]  # type: ignore[misc]
    return PRIMITIVES[avro["type"]]


def _all_schema_records() -> list[dict[str, Any]]:
    out = []
    for filename in codec.SCHEMA_FILES.values():
        out.extend(_named_records(codec.load_schema(filename)))
    return out


def test_every_record_class_is_defined_by_a_schema() -> None:
    names = [r["name"] for r in _all_schema_records()]
    assert sorted(names) == sorted(CLASSES)


@pytest.mark.parametrize("record", _all_schema_records(), ids=lambda r: r["name"])
def test_fields_match_schema(record: dict[str, Any]) -> None:
    cls = CLASSES[record["name"]]
    hints = typing.get_type_hints(cls)
    py_fields = dataclasses.fields(cls)
    assert [f.name for f in py_fields] == [f["name"] for f in record["fields"]]
    for pyf, avf in zip(py_fields, record["fields"], strict=True):
        expected = _expected_python_type(avf["type"])
        actual = hints[pyf.name]
        if isinstance(expected, types.UnionType) or isinstance(actual, types.UnionType):
            assert set(typing.get_args(actual)) == set(typing.get_args(expected)), pyf.name
        else:
            assert actual == expected, pyf.name
        if "default" in avf:
            if pyf.default is not dataclasses.MISSING:
                assert pyf.default == avf["default"], pyf.name
            else:
                assert pyf.default_factory is not dataclasses.MISSING, pyf.name
                assert pyf.default_factory() == avf["default"], pyf.name
        else:
            assert pyf.default is dataclasses.MISSING, f"{pyf.name} has no default in the schema"
            assert pyf.default_factory is dataclasses.MISSING, pyf.name


def test_records_are_frozen() -> None:
    event = RequestEvent(key="k", event_time_ms=1, gateway_id="g", prompt_tokens=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.key = "other"  # type: ignore[misc]
