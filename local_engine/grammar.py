"""The grammars a reply must follow: JSON mode, JSON schemas and forced tool calls (no torch).

A :class:`Grammar` is llguidance's serialized grammar text; :mod:`local_engine.structured`
turns it into per-request matchers and token masks. This module builds grammars from the
OpenAI request fields:

- ``response_format={"type": "json_object"}``: any JSON object;
- ``response_format={"type": "json_schema", ...}``: a value valid under the schema, where an
  object schema that lists ``properties`` and leaves ``additionalProperties`` unset allows no
  other keys (OpenAI's strict mode requires ``additionalProperties: false``; vLLM's guidance
  backend closes such objects the same way with ``disable-additional-properties``), so a
  model cannot invent keys until ``max_tokens``;
- ``tool_choice="required"`` or a named tool, when the chat template's tool-call format is
  known: one or more tool calls in that format (``"hermes"``:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls separated by a
  newline; ``"llama3"``: ``{"name": ..., "parameters": {...}}``, calls separated by ``; ``),
  whose name is one of the offered tools and whose arguments follow that tool's parameter
  schema. ``parallel_tool_calls=False`` allows exactly one call.
- ``tool_choice="auto"`` (or unset) with tools, in the ``"hermes"`` format when the
  tokenizer has ``<tool_call>`` as one added token: the same tool-call grammar, held back
  until the model samples ``<tool_call>`` (its *trigger*, :attr:`Grammar.trigger`). Until then
  the reply is free text, decoded without a mask; once the model opens a call, the call must
  name an offered tool and give arguments valid under its schema; further calls, or free
  text, may follow it. A tool whose schema the grammar compiler refuses keeps its name with
  any object for its arguments instead of failing the request (an ``auto`` request never
  needed a grammar).

JSON is generated without free whitespace, with ``", "`` and ``": "`` separators (what
``json.dumps`` and the chat templates write), so a reply cannot pad itself with blanks.
llguidance is imported only when a grammar is built; without it a request that needs one is
an :class:`~local_engine.errors.EngineConfigError` naming the ``local`` extra.

Part of the engine core, so it imports nothing from swiftclient: requests, tools and response
formats are read through the few attributes it needs (:class:`ChatFields`, :class:`ToolLike`),
which swiftclient's ``ChatRequest``, ``Tool`` and ``ResponseFormat`` have.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from local_engine.errors import EngineConfigError, InvalidRequestError

if TYPE_CHECKING:
    from types import ModuleType

logger = logging.getLogger(__name__)

__all__ = [
    "ChatFields",
    "Grammar",
    "GrammarError",
    "schema_problem",
    "GrammarKind",
    "auto_tool_grammar",
    "closed_objects",
    "json_object_grammar",
    "json_schema_grammar",
    "request_grammar",
    "response_format_grammar",
    "tool_call_grammar",
    "ToolLike",
]

GrammarKind = Literal["json_object", "json_schema", "tool_call", "tool_call_auto"]

_HERMES_OPEN = "<tool_call>"
_JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class GrammarError(InvalidRequestError):
    """A schema or tool definition that cannot be compiled into a grammar (or that fails on
    the text it forces from the start).

    An :class:`~local_engine.errors.InvalidRequestError` (so also a ``ValueError``): the
    local server answers it with a 400.
    """


_COMPILE_PREFIX = re.compile(r"^at \d+\(\d+\): failed to compile JSON schema: ")
_EXPLAINED: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Unknown format: (.+)"),
        "it uses a string format the local engine does not support ({0!r})",
    ),
    (
        re.compile(r"Pointer '([^']*)' does not exist"),
        "a $ref points at '#{0}', which the schema does not define",
    ),
    (
        re.compile(r"Resource '([^']*)' is not present"),
        "a $ref points outside the schema ({0!r}); only references within the schema are followed",
    ),
    (re.compile(r"Invalid type: (.+)"), "{0!r} is not a JSON schema type"),
    (
        re.compile(r"oneOf constraints are not supported"),
        "it uses oneOf with branches a value could match more than one of, which the local "
        "engine cannot enforce (anyOf is supported, and so is oneOf over branches told apart "
        "by a const, as pydantic's discriminated unions are)",
    ),
    (re.compile(r"Unsatisfiable schema: (.+)"), "no JSON value satisfies it ({0})"),
    (re.compile(r"Expected (.+) for '([^']+)', got (.+)"), "{1} must be: {0} (got {2})"),
    (
        re.compile(r"(?:lexer|parser) error: "),
        "it is too large for the local engine's grammar "
        "(a very long pattern or repetition, or a $ref that must recurse, say)",
    ),
)


def schema_problem(error: str) -> str:
    """What a grammar-compiler error says is wrong with a schema, in this library's words.

    llguidance's message (its first line: what follows is its grammar listing and parser
    state, internal) is recognised for the common cases (keywords it does not support, an
    unknown ``format``, a ``pattern`` it cannot compile, a ``$ref`` to nothing, an
    unsatisfiable or too-large schema), with the offending keyword or value kept; any other
    message is passed on, first line only.
    """
    text = _COMPILE_PREFIX.sub("", error.strip())
    first = text.split("\n", 1)[0].strip()
    keys = re.match(r"Unimplemented keys?: \[(.*)\]", first)
    if keys:
        names = re.findall(r'"([^"]*)"', keys.group(1)) or [keys.group(1)]
        which = "JSON schema keywords" if len(names) > 1 else "a JSON schema keyword"
        return f"it uses {which} the local engine does not support ({', '.join(names)})"
    if first.startswith("regex parse error"):
        why = [line.strip()[7:] for line in text.splitlines() if line.strip().startswith("error: ")]
        detail = f" ({why[0]})" if why else ""
        return f"a pattern is not a regular expression the local engine supports{detail}"
    for pattern, explained in _EXPLAINED:
        found = pattern.match(first)
        if found:
            return explained.format(*found.groups())
    if len(first) > 200:
        first = first[:200] + "..."
    return (
        f"the grammar compiler refused it ({first})" if first else "the grammar compiler refused it"
    )


class _Function(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any] | None: ...


class ToolLike(Protocol):
    """A tool offered to the model (swiftclient's ``Tool``): its function's name and
    parameter schema."""

    @property
    def function(self) -> _Function: ...


class _Named(Protocol):
    @property
    def function(self) -> Any: ...


class _SchemaSpec(Protocol):
    @property
    def schema_(self) -> Mapping[str, Any] | bool | None: ...


class _ResponseFormat(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def json_schema(self) -> _SchemaSpec | None: ...


class ChatFields(Protocol):
    """The fields of a chat request (swiftclient's ``ChatRequest``) that decide its grammar."""

    @property
    def tools(self) -> Sequence[ToolLike] | None: ...

    @property
    def tool_choice(self) -> str | _Named | None: ...

    @property
    def parallel_tool_calls(self) -> bool | None: ...

    @property
    def response_format(self) -> _ResponseFormat | None: ...


@dataclass(frozen=True, slots=True)
class Grammar:
    """A grammar in llguidance's serialized form, and what it was built for.

    Equal grammars have equal ``text``; compiled matchers are cached by it. ``trigger``
    (a token id) makes the grammar lazy: it constrains nothing until that token is sampled,
    and its text starts with that token (see :func:`auto_tool_grammar`).
    """

    text: str
    kind: GrammarKind
    trigger: int | None = None

    def __repr__(self) -> str:
        lazy = f", trigger={self.trigger}" if self.trigger is not None else ""
        return f"Grammar(kind={self.kind!r}, {len(self.text)} chars{lazy})"


def llguidance_module() -> ModuleType:
    """Import llguidance, or raise an EngineConfigError that says how to install it."""
    try:
        import llguidance
    except ImportError as exc:
        raise EngineConfigError(
            "constrained decoding (JSON mode, json_schema, forced tool calls) in the local "
            "engine needs llguidance: pip install 'swiftclient-llm[local]'"
        ) from exc
    return llguidance


def _schema_grammar(schema: Mapping[str, Any] | bool, what: str, param: str) -> str:
    llg = llguidance_module()
    try:
        return str(llg.LLMatcher.grammar_from_json_schema(_plain(schema), overrides=_JSON_OPTIONS))
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"{what} cannot be compiled: {schema_problem(str(exc))}", param) from exc


def _plain(schema: Mapping[str, Any] | bool) -> Any:
    """The schema as plain JSON data (a ``Mapping`` that is not a dict is copied)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, Mapping):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    return dict(schema)


def json_object_grammar() -> Grammar:
    """Any JSON object (``response_format={"type": "json_object"}``)."""
    return Grammar(
        _schema_grammar({"type": "object"}, "the JSON object schema", "response_format"),
        "json_object",
    )


def json_schema_grammar(schema: Mapping[str, Any] | bool) -> Grammar:
    """A JSON value valid under ``schema``; GrammarError when it cannot be compiled.

    Whether every keyword is supported shows when the grammar is compiled for a tokenizer
    (:meth:`local_engine.structured.StructuredOutput.compile`), which also raises GrammarError.
    """
    return Grammar(
        _schema_grammar(schema, "the response_format JSON schema", "response_format"),
        "json_schema",
    )


def response_format_grammar(response_format: _ResponseFormat | None) -> Grammar | None:
    """The grammar for a ``response_format``, or None for plain text (a schema's objects
    closed by :func:`closed_objects`)."""
    if response_format is None or response_format.type == "text":
        return None
    spec = response_format.json_schema
    if response_format.type == "json_object" or spec is None or spec.schema_ is None:
        return json_object_grammar()
    return json_schema_grammar(closed_objects(spec.schema_))


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# Keywords beside ``properties`` whose subschemas may add keys of their own: closing the
# object would refuse those keys (``additionalProperties`` sees only its own ``properties``).
# Those whose subschemas are branches that see the object's own keys too.
_BRANCH_KEYS = ("anyOf", "oneOf", "if", "then", "else")
_ADDING_KEYS = (*_BRANCH_KEYS, "allOf", "dependentSchemas", "dependencies", "$ref")


def closed_objects(schema: Any, *, close: bool = True) -> Any:
    """A copy of ``schema`` where every object schema that lists ``properties`` and leaves
    ``additionalProperties`` (and ``patternProperties``, ``unevaluatedProperties``) unset
    gets ``additionalProperties: false``, unless keywords beside it may add keys
    (``anyOf``, ``oneOf``, ``allOf``, ``if``/``then``/``else``, ``dependentSchemas``,
    ``$ref``): closing it would refuse those, and those branches' own tops stay open too (they
    see the object's keys); nor when ``required`` names a key ``properties`` does not list.
    Members of an ``allOf`` of several schemas are left open (closing each would refuse the
    keys the others add)."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    node = dict(schema)
    # The branches of an object that lists properties itself stay open at their top: the
    # object's own keys appear in every branch's view of the value.
    own = isinstance(node.get("properties"), Mapping)
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), Mapping | list):
            node[key] = closed_objects(node[key], close=not (own and key in _BRANCH_KEYS))
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            branch = own and key in _BRANCH_KEYS
            node[key] = [closed_objects(item, close=not branch) for item in node[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), Mapping):
            node[key] = {name: closed_objects(sub) for name, sub in node[key].items()}
    if isinstance(node.get("dependentSchemas"), Mapping):
        node["dependentSchemas"] = {
            name: closed_objects(sub, close=not own)
            for name, sub in node["dependentSchemas"].items()
        }
    members = node.get("allOf")
    if isinstance(members, list):
        several = len(members) > 1
        node["allOf"] = [closed_objects(item, close=not (several or own)) for item in members]
    if close and own:
        listed = node["properties"]
        required = node.get("required")
        # A required key the properties do not list: closing would leave no valid value.
        # (A name that is no string is no key: the schema's compile refuses it.)
        unlisted = isinstance(required, list) and any(
            not isinstance(key, str) or key not in listed for key in required
        )
        if not unlisted and not any(key in node for key in _OPEN_KEYS + _ADDING_KEYS):
            node["additionalProperties"] = False
    return node


def _call_schema(tool: ToolLike, arguments_key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """One tool's call object, its parameter objects closed (:func:`closed_objects`); its
    ``$defs`` move to ``defs`` (the combined schema's root, where its ``#/$defs/...``
    references point once it is nested)."""
    fn = tool.function
    # Closed as response_format's schemas are (see closed_objects): a call cannot invent
    # arguments the tool does not take.
    params: dict[str, Any] = (
        closed_objects(fn.parameters) if fn.parameters is not None else {"type": "object"}
    )
    for key in ("$defs", "definitions"):
        found = params.get(key)
        if not isinstance(found, dict):
            continue
        params = {k: v for k, v in params.items() if k != key}
        for name, definition in found.items():
            if defs.setdefault(key, {}).setdefault(name, definition) != definition:
                raise GrammarError(
                    f"tools define {key}/{name} differently; "
                    "forced tool calls need one meaning per definition name",
                    "tools",
                )
    return {
        "type": "object",
        "properties": {"name": {"const": fn.name}, arguments_key: params},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _literal(text: str, added_tokens: Mapping[str, int]) -> str:
    """A Lark item for ``text``: the token itself when the tokenizer has it as an added token
    (a tokenizer never spells an added token out byte by byte), else the quoted string."""
    token_id = added_tokens.get(text)
    return f"<[{token_id}]>" if token_id is not None else json.dumps(text)


def tool_call_grammar(
    tools: Sequence[ToolLike],
    *,
    tool_format: str,
    parallel: bool = True,
    added_tokens: Mapping[str, int] | None = None,
    tail: bool = False,
) -> Grammar:
    """Tool calls to one of ``tools`` in ``tool_format`` ("hermes" or "llama3").

    ``added_tokens`` (the tokenizer's added tokens, text to id) says which markers, such as
    ``<tool_call>``, are single tokens. Hermes calls are separated by a newline, and with
    ``parallel`` one more newline may end the reply (so a newline is never a promise of
    another call); ``tail`` lets free text follow the last call (``tool_choice="auto"``:
    a remark after the calls, which the parser returns as content). GrammarError when a
    tool's parameter schema cannot be compiled, or when there are no tools;
    EngineConfigError for a format that has no grammar ("none").
    """
    added = added_tokens or {}
    if not tools:
        raise GrammarError("a forced tool call needs at least one tool")
    if tool_format not in ("hermes", "llama3"):
        raise EngineConfigError(f"tool calls in the {tool_format!r} format cannot be forced")
    key = "arguments" if tool_format == "hermes" else "parameters"
    defs: dict[str, Any] = {}
    schemas = [_call_schema(tool, key, defs) for tool in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, **defs}
    # Check the schema on its own first, so an error names the tool schema, not the Lark text.
    _schema_grammar(schema, "the tools' parameter schema", "tools")
    # Inside Lark the JSON options travel in the schema itself.
    body = json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)
    if tool_format == "hermes":
        call = (
            f'{_literal(_HERMES_OPEN, added)} "\\n" %json {body} '
            f'"\\n" {_literal("</tool_call>", added)}'
        )
        sep = '"\\n"'
    else:
        call = f"%json {body}"
        sep = '"; "'
    start = "start: call" if not parallel else f"start: call ({sep} call)*"
    if tail:
        # Text after the calls (llguidance keeps added tokens, <tool_call> among them, out
        # of a text lexeme, so the text cannot open another call in the marker's token).
        start += " TAIL?\nTAIL: /(?s:.+)/"
    elif parallel and tool_format == "hermes":
        start += f" {sep}?"
    lark = f"{start}\ncall: {call}\n"
    return Grammar(str(llguidance_module().LLMatcher.grammar_from_lark(lark)), "tool_call")


@dataclass(frozen=True, slots=True)
class _AnyArgumentsFunction:
    name: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class _AnyArguments:
    """A tool kept by name whose arguments may be any object (its schema would not compile)."""

    function: _AnyArgumentsFunction


def auto_tool_grammar(
    tools: Sequence[ToolLike],
    *,
    tool_format: str,
    parallel: bool = True,
    added_tokens: Mapping[str, int] | None = None,
    check: Callable[[Grammar], object] | None = None,
) -> Grammar | None:
    """The lazy grammar of ``tool_choice="auto"``: :func:`tool_call_grammar`'s calls, held
    back until the model samples ``<tool_call>`` (the grammar's ``trigger``).

    ``check`` (the engine's compile, which raises GrammarError) tries a grammar for the
    tokenizer. A tool whose parameter schema the grammar compiler refuses is kept by name
    with any object for its arguments (logged), so one such tool does not lift the grammar
    from the others. None where it cannot apply, and the reply stays unconstrained as before:
    no tools, a format other than ``"hermes"`` (Llama 3.1's calls open with no marker of
    their own), a tokenizer without ``<tool_call>`` as one added token, tools that cannot
    share one grammar (two ``$defs`` of one name), or no llguidance installed.
    """
    trigger = (added_tokens or {}).get(_HERMES_OPEN)
    if not tools or tool_format != "hermes" or trigger is None:
        return None

    def compiles(chosen: Sequence[ToolLike]) -> Grammar | None:
        """The grammar for ``chosen``, or None when it does not compile."""
        try:
            calls = tool_call_grammar(
                chosen,
                tool_format=tool_format,
                parallel=parallel,
                added_tokens=added_tokens,
                tail=True,
            )
            grammar = Grammar(calls.text, "tool_call_auto", trigger)
            if check is not None:
                check(grammar)
        except ValueError:  # GrammarError is a ValueError
            return None
        return grammar

    try:
        whole = compiles(tools)
    except EngineConfigError:  # no llguidance
        return None
    if whole is not None:
        return whole
    kept: list[ToolLike] = []
    loose: list[str] = []
    for tool in tools:
        if compiles([tool]) is not None:
            kept.append(tool)
        else:
            loose.append(tool.function.name)
            kept.append(_AnyArguments(_AnyArgumentsFunction(tool.function.name)))
    grammar = compiles(kept) if loose else None
    if grammar is not None:
        logger.warning(
            'tool_choice="auto": the grammar cannot enforce the parameter schema of %s; '
            "their calls may carry any JSON object",
            ", ".join(repr(name) for name in loose),
        )
    return grammar


def _forced_tools(
    tools: Sequence[ToolLike] | None, choice: str | _Named | None
) -> list[ToolLike] | None:
    if not tools or choice is None:
        return None
    if not isinstance(choice, str):  # a named tool
        return [t for t in tools if t.function.name == choice.function.name] or None
    return list(tools) if choice == "required" else None


def request_grammar(
    request: ChatFields,
    tool_format: str,
    *,
    added_tokens: Mapping[str, int] | None = None,
    check: Callable[[Grammar], object] | None = None,
    auto: bool = True,
) -> Grammar | None:
    """The grammar a chat request's reply must follow, or None when it is free text.

    A forced tool call (``tool_choice="required"`` or a named tool) wins over
    ``response_format``; with the ``"none"`` tool format it is not enforced. Otherwise a
    ``response_format`` grammar applies; without one, tools offered under
    ``tool_choice="auto"`` (or unset) get :func:`auto_tool_grammar`'s lazy grammar
    (``check`` is passed on to it) unless ``auto`` is False.
    """
    forced = _forced_tools(request.tools, request.tool_choice)
    if forced is not None and tool_format in ("hermes", "llama3"):
        return tool_call_grammar(
            forced,
            tool_format=tool_format,
            parallel=request.parallel_tool_calls is not False,
            added_tokens=added_tokens,
        )
    grammar = response_format_grammar(request.response_format)
    if grammar is None and auto and request.tools and request.tool_choice in (None, "auto"):
        return auto_tool_grammar(
            request.tools,
            tool_format=tool_format,
            parallel=request.parallel_tool_calls is not False,
            added_tokens=added_tokens,
            check=check,
        )
    return grammar
