"""``response_model=`` asks for OpenAI's strict mode: closed objects, every property required
(issue 27.6), except where the type allows any key."""

from __future__ import annotations

from typing import Any

import pydantic

from swiftclient._structured import structured_output


class Part(pydantic.BaseModel):
    name: str


class Order(pydantic.BaseModel):
    city: str
    count: int = 1
    note: str | None = None
    parts: list[Part] = []


def _sent(tp: Any) -> dict[str, Any]:
    return structured_output(tp).response_format.model_dump(by_alias=True, exclude_none=True)


def test_response_model_sends_a_strict_closed_schema() -> None:
    spec = _sent(Order)["json_schema"]
    assert spec["strict"] is True
    schema = spec["schema"]
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["city", "count", "note", "parts"]
    part = schema["$defs"]["Part"]
    assert part["additionalProperties"] is False and part["required"] == ["name"]
    # the reply a strict provider sends (every field present) still validates
    reply = '{"city": "Oslo", "count": 2, "note": null, "parts": [{"name": "x"}]}'
    assert pydantic.TypeAdapter(Order).validate_json(reply).parts == [Part(name="x")]


def test_a_mapping_type_is_not_sent_as_strict() -> None:
    spec = _sent(dict[str, Part])["json_schema"]
    assert "strict" not in spec
    assert spec["schema"] == pydantic.TypeAdapter(dict[str, Part]).json_schema()
    assert _sent(list[Order])["json_schema"]["strict"] is True


class Address(pydantic.BaseModel):
    city: str


class Person(pydantic.BaseModel):
    name: str
    nick: str | None = None
    home: Address = pydantic.Field(description="where they live")
    work: Address | None = None
    past: list[Address] = pydantic.Field(default_factory=list, description="earlier homes")


class Node(pydantic.BaseModel):
    value: int
    parent: Node | None = pydantic.Field(default=None, description="one level up")


class Loop(pydantic.BaseModel):
    value: int
    inner: Loop = pydantic.Field(description="itself, described")


def test_the_strict_schema_is_the_one_the_openai_sdk_sends() -> None:
    # OpenAI's API refuses a ``$ref`` with keys beside it (a described nested model) in
    # strict mode; the SDK writes such a reference out and drops null defaults. Sent
    # as-is, ``home`` above was refused.
    from openai.lib._pydantic import to_strict_json_schema

    for model in (Order, Person, Node):
        assert _sent(model)["json_schema"]["schema"] == to_strict_json_schema(model), model
    home = _sent(Person)["json_schema"]["schema"]["properties"]["home"]
    assert "$ref" not in home and home["description"] == "where they live"
    assert home["additionalProperties"] is False


def test_a_model_described_inside_itself_keeps_a_bare_reference() -> None:
    schema = _sent(Loop)["json_schema"]["schema"]  # the SDK recurses without end here
    assert schema["properties"]["inner"] == {"$ref": "#/$defs/Loop"}
    assert schema["$defs"]["Loop"]["properties"]["inner"] == {"$ref": "#/$defs/Loop"}
