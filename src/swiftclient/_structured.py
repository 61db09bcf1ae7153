"""``response_model=``: which types a call accepts, the schema it sends, how a reply is read.

Any type pydantic can validate and describe is accepted when its JSON schema is an object or
an array: pydantic models, TypedDicts, dataclasses, ``dict[str, Model]``, ``list[Model]``...
Each type's :class:`pydantic.TypeAdapter` and response format are built once and cached.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pydantic

from . import errors
from .types import ChatCompletion, JSONSchemaFormat, ResponseFormat

__all__ = ["StructuredOutput", "structured_output", "validation_summary"]

T = TypeVar("T")

_CACHE_SIZE = 256
_SUMMARY_LIMIT = 10
_NAME = re.compile(r"[^A-Za-z0-9_-]")
# A reply that is one fenced Markdown code block, with or without a language tag.
_FENCED = re.compile(r"\A\s*```[\w+.-]*[ \t]*\r?\n(.*?)\s*```\s*\Z", re.DOTALL)
_ACCEPTED = "a pydantic model, TypedDict or dataclass, or a list or dict of them"


# The tags pydantic puts in an error's location for the branch of a union it tried
# (``str``, ``list[tagged-union[...]]``, ``function-after[...]``, a model's class name):
# no field of a request is named so.
_BRANCH = re.compile(r"\A(?:str|int|float|bool|bytes|list|dict|none|[\w-]+\[.*\]|[A-Z]\w*)\Z")


def field_path(loc: Sequence[Any]) -> tuple[Any, ...]:
    """An error's location without the union branches pydantic tried
    (``messages.0.content.str`` is ``messages.0.content``)."""
    return tuple(part for part in loc if not (isinstance(part, str) and _BRANCH.match(part)))


def validation_summary(exc: pydantic.ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    """``where: what`` for each field at fault (the first few), without the input values;
    the branches of a union tried at one field are one entry (``content: Input should be a
    valid string, or a valid list``). With ``prefix``, only the errors under that
    location, the prefix cut off."""
    fields: dict[tuple[Any, ...], list[str]] = {}
    for error in exc.errors(include_url=False, include_input=False):
        if tuple(error["loc"][: len(prefix)]) != prefix:
            continue
        said = fields.setdefault(field_path(error["loc"][len(prefix) :]), [])
        message = error["msg"].removeprefix("Value error, ")
        if message not in said:
            said.append(message)
    parts = []
    for loc, said in list(fields.items())[:_SUMMARY_LIMIT]:
        where = ".".join(str(part) for part in loc)
        message = said[0] + "".join(f", or {m.removeprefix('Input should be ')}" for m in said[1:])
        parts.append(f"{where}: {message}" if where else message)
    if len(fields) > _SUMMARY_LIMIT:
        parts.append(f"and {len(fields) - _SUMMARY_LIMIT} more")
    return "; ".join(parts)


def _type_name(tp: Any) -> str:
    """``tp`` as its code spells it, for messages: ``Weather``, ``list[Weather]``."""
    origin = typing.get_origin(tp)
    if origin is None:
        if tp is Ellipsis:
            return "..."
        return "None" if tp is type(None) else str(getattr(tp, "__name__", tp))
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    return f"{_type_name(origin)}[{', '.join(_type_name(arg) for arg in args)}]"


def _schema_name(tp: Any) -> str:
    """A JSON-schema name for ``tp``: ``Weather``, ``list_Weather``, ``dict_str_Weather``."""
    origin = typing.get_origin(tp)
    if origin is None:
        return str(getattr(tp, "__name__", "response"))
    if origin is typing.Annotated:
        return _schema_name(typing.get_args(tp)[0])
    names = [_schema_name(origin)]
    names += [_schema_name(arg) for arg in typing.get_args(tp) if hasattr(arg, "__name__")]
    return "_".join(names)


def _root(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema's root definition (recursive models put it under ``$defs``)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if isinstance(found, dict):
            return found
    return schema


_DATA_KEYS = frozenset({"required", "enum", "const", "default", "examples"})


def _strict_schema(schema: Any, root: Any = None, expanding: frozenset[str] = frozenset()) -> Any:
    """``schema`` as OpenAI's strict mode wants it (every object closed with
    ``additionalProperties: false``, every property required), or None when it cannot be
    (a ``dict[str, ...]`` type allows any key). The reply still validates: a field with a
    default is then always sent, never left out. As the ``openai`` SDK does, a ``null``
    default is dropped (the field is nullable anyway) and a ``$ref`` with keys beside it (a
    described nested model) is written out in place, since the API refuses such a
    reference; ``root`` holds the definitions it refers to."""
    if root is None:
        root = schema
    if isinstance(schema, list):
        items = [_strict_schema(item, root, expanding) for item in schema]
        lost = any(new is None and old is not None for new, old in zip(items, schema, strict=True))
        return None if lost else items
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and len(schema) > 1:
        target = _resolve_ref(root, ref)
        if target is not None:
            if ref in expanding:  # a model inside itself: the bare reference
                return {"$ref": ref}
            siblings = {key: value for key, value in schema.items() if key != "$ref"}
            return _strict_schema({**target, **siblings}, root, expanding | {ref})
    node: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            mapped = {name: _strict_schema(sub, root, expanding) for name, sub in value.items()}
            if any(sub is None for sub in mapped.values()):
                return None
            node[key] = mapped
        elif key == "default" and value is None:
            continue
        elif isinstance(value, dict | list) and key not in _DATA_KEYS:
            mapped_value = _strict_schema(value, root, expanding)
            if mapped_value is None:
                return None
            node[key] = mapped_value
        else:
            node[key] = value
    if node.get("type") == "object" or "properties" in node:
        extra = node.get("additionalProperties")
        if extra not in (None, False) or "patternProperties" in node or "properties" not in node:
            return None  # a mapping type: any key may come
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties", {}))
    return node


def _resolve_ref(root: Any, ref: str) -> dict[str, Any] | None:
    """The definition a local ``$ref`` (``#/$defs/Name``) names in ``root``, if any."""
    if not ref.startswith("#/"):
        return None
    found: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(found, dict):
            return None
        found = found.get(part.replace("~1", "/").replace("~0", "~"))
    return found if isinstance(found, dict) else None


@dataclass(frozen=True, slots=True)
class StructuredOutput(Generic[T]):
    """One ``response_model`` type: its adapter, name and the response format to send."""

    adapter: pydantic.TypeAdapter[T]
    name: str
    response_format: ResponseFormat
    title: str = ""
    """The type as its code spells it (``list[Person]``; the schema's name is
    ``list_Person``), for messages; ``name`` when not given."""

    def parse(self, completion: ChatCompletion) -> T:
        """Validate the completion's text (a reply fenced in a Markdown code block too).

        StructuredOutputError when it does not validate; for a reply cut off by the token
        limit (``finish_reason == "length"``), or one that is a tool call and no text, the
        error says so and what to do.
        """
        raw = completion.text
        fenced = _FENCED.match(raw)
        try:
            return self.adapter.validate_json(fenced.group(1) if fenced else raw)
        except pydantic.ValidationError as exc:
            summary = validation_summary(exc)
            calls = completion.tool_calls
            if calls and not raw.strip():
                names = ", ".join(call.function.name for call in calls)
                message = (
                    f"the model called a tool ({names}) instead of writing a "
                    f"{self.title or self.name}: run the call and ask again with its result, "
                    "or leave tools out of a call with response_model="
                )
            elif completion.finish_reason == "length":
                message = (
                    f"the reply was cut off {_where(completion)} (finish_reason 'length') "
                    f"before a whole {self.title or self.name} was written: raise max_tokens "
                    f"to give it room ({summary})"
                )
            else:
                message = f"the reply does not validate as {self.title or self.name}: {summary}"
            raise errors.StructuredOutputError(message, raw=raw, completion=completion) from exc


def _where(completion: ChatCompletion) -> str:
    """Where a reply cut off by its token limit ended: at how many tokens, when known."""
    usage = completion.usage
    tokens = usage.completion_tokens if usage is not None else 0
    return f"at {tokens} tokens" if tokens else "at its token limit"


def _build(tp: Any) -> StructuredOutput[Any]:
    if not isinstance(tp, type) and typing.get_origin(tp) is None:
        raise errors.ConfigurationError(f"response_model must be a type ({_ACCEPTED}), got {tp!r}")
    try:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(tp)
        schema = adapter.json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticUndefinedAnnotation, TypeError) as exc:
        raise errors.ConfigurationError(
            f"response_model {tp!r} cannot be validated and described as a JSON schema "
            f"({_ACCEPTED}): {str(exc).splitlines()[0]}"
        ) from exc
    kind = _root(schema).get("type")
    if kind not in ("object", "array"):
        raise errors.ConfigurationError(
            f"response_model {tp!r} describes a JSON {kind or 'value'}; structured output needs "
            f"an object or an array ({_ACCEPTED})"
        )
    name = _NAME.sub("_", _schema_name(tp))[:64]
    strict = _strict_schema(schema)
    spec = JSONSchemaFormat(name=name, schema=strict or schema, strict=True if strict else None)
    response_format = ResponseFormat(type="json_schema", json_schema=spec)
    return StructuredOutput(adapter, name, response_format, _type_name(tp))


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached(tp: Any) -> StructuredOutput[Any]:
    return _build(tp)


def structured_output(tp: type[T]) -> StructuredOutput[T]:
    """The (cached) :class:`StructuredOutput` for ``tp``; ConfigurationError when it cannot be
    one."""
    key: Any = tp
    try:
        hash(key)
    except TypeError:  # an Annotated type with unhashable metadata: build it every time
        return _build(key)
    return _cached(key)
