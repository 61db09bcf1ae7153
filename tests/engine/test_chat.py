"""Chat templates (against transformers), tool-call parsing, and response building."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.trainers import BpeTrainer
from transformers import AutoTokenizer

from local_engine.chat import (
    ChatFormatter,
    CompletionStream,
    build_completion,
    make_usage,
    response_format_instruction,
    with_response_format,
)
from local_engine.templates import (
    CHATML_TOOLS_TEMPLATE,
    ChatTemplateError,
    render_chat_template,
    select_template,
)
from local_engine.tokenizer import Tokenizer
from local_engine.tool_calls import (
    ToolCallStream,
    detect_tool_format,
    parse_tool_calls,
)
from swiftclient.errors import ConfigurationError
from swiftclient.types import (
    ChatRequest,
    FunctionCall,
    Message,
    ResponseFormat,
    TextContentPart,
    Tool,
    ToolCall,
    ToolChoice,
)

TEMPLATES = Path(__file__).parent / "templates"
HERMES = (TEMPLATES / "hermes_tools.jinja").read_text()
LLAMA = (TEMPLATES / "llama31_tools.jinja").read_text()

_FAMILIES: dict[str, tuple[str, dict[str, str]]] = {
    "hermes": (HERMES, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama31": (
        LLAMA,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    "chatml_default": (CHATML_TOOLS_TEMPLATE, {"eos_token": "<|im_end|>"}),
}
_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|python_tag|>",
    "<|eom_id|>",
]


def _backend() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["tools and templates for chat models"], trainer)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in _SPECIALS])
    tok.add_tokens([AddedToken(t, special=False) for t in ("<tool_call>", "</tool_call>")])
    return tok


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    backend = _backend()
    dirs: dict[str, Path] = {}
    for name, (template, specials) in _FAMILIES.items():
        path = tmp_path_factory.mktemp(name)
        backend.save(str(path / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
        (path / "tokenizer_config.json").write_text(json.dumps({**config, **specials}))
        dirs[name] = path
    return dirs


# --------------------------------------------------------------------------- conversations
# Written in the Hugging Face shape (tool-call arguments as dicts); _openai() derives the
# OpenAI shape (arguments as a JSON string) that swiftclient requests carry.

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city (météo)",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SIMPLE: list[dict[str, Any]] = [{"role": "user", "content": "Hello there — ça va? 你好"}]
WITH_SYSTEM: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one."},
]
TOOL_ROUND: list[dict[str, Any]] = [
    {"role": "system", "content": "Use tools when needed."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"})]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
    {"role": "assistant", "content": "It is 18 °C in Paris."},
    {"role": "user", "content": "Thanks!"},
]
PARALLEL_IN_PROGRESS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Rome, in Fahrenheit?"},
    {
        "role": "assistant",
        "content": "Checking both.",
        "reasoning_content": "Two cities, so two calls.\n",
        "tool_calls": [
            _call("call_a", "get_weather", {"city": "Paris", "unit": "f"}),
            _call("call_b", "get_weather", {"city": "Rome", "unit": "f"}),
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "64F"},
    {"role": "tool", "tool_call_id": "call_b", "content": "70F"},
]
SINGLE_IN_PROGRESS: list[dict[str, Any]] = [
    {"role": "user", "content": "What time is it?"},
    {"role": "assistant", "tool_calls": [_call("call_t", "get_time", {})]},
    {"role": "tool", "tool_call_id": "call_t", "content": "12:30"},
]

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "simple": SIMPLE,
    "with_system": WITH_SYSTEM,
    "tool_round": TOOL_ROUND,
    "parallel": PARALLEL_IN_PROGRESS,
    "single": SINGLE_IN_PROGRESS,
}
# The Llama 3.1-style template takes one call per assistant turn.
_CASES = [
    (family, conversation)
    for family in sorted(_FAMILIES)
    for conversation in sorted(CONVERSATIONS)
    if (family, conversation) != ("llama31", "parallel")
]


def _openai(message: dict[str, Any]) -> Message:
    data = dict(message)
    if "tool_calls" in data:
        data["tool_calls"] = [
            {
                **c,
                "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])},
            }
            for c in data["tool_calls"]
        ]
    return Message.model_validate(data)


def _kwargs(family: str) -> dict[str, Any]:
    return {"date_string": "26 Jul 2024"} if family == "llama31" else {}


@pytest.mark.parametrize(("family", "conversation"), _CASES)
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendering_matches_transformers(
    family_dirs: dict[str, Path],
    family: str,
    conversation: str,
    with_tools: bool,
    add_generation_prompt: bool,
) -> None:
    hf_messages = CONVERSATIONS[conversation]
    hf_tools = [WEATHER_TOOL, TIME_TOOL] if with_tools else None
    hf: Any = AutoTokenizer.from_pretrained(family_dirs[family])
    expected = hf.apply_chat_template(
        hf_messages,
        tools=hf_tools,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **_kwargs(family),
    )
    formatter = ChatFormatter(Tokenizer.from_dir(family_dirs[family]))
    ours = formatter.render(
        [_openai(m) for m in hf_messages],
        tools=[Tool.model_validate(t) for t in hf_tools] if hf_tools else None,
        add_generation_prompt=add_generation_prompt,
        **_kwargs(family),
    )
    assert ours == expected
    # Plain dicts in the Hugging Face shape render the same.
    assert (
        formatter.render(
            hf_messages,
            tools=hf_tools,
            add_generation_prompt=add_generation_prompt,
            **_kwargs(family),
        )
        == expected
    )
    if with_tools and conversation != "simple":
        assert "get_weather" in ours


@pytest.mark.parametrize(
    ("family", "kwargs"),
    [
        ("hermes", {"enable_thinking": False}),
        ("llama31", {"date_string": "1 Jan 2025", "tools_in_user_message": False}),
        ("llama31", {"date_string": "1 Jan 2025", "builtin_tools": ["get_time", "brave_search"]}),
    ],
)
def test_template_kwargs_match_transformers(
    family_dirs: dict[str, Path], family: str, kwargs: dict[str, Any]
) -> None:
    hf: Any = AutoTokenizer.from_pretrained(family_dirs[family])
    expected = hf.apply_chat_template(
        SINGLE_IN_PROGRESS,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )
    ours = ChatFormatter(Tokenizer.from_dir(family_dirs[family])).render(
        [_openai(m) for m in SINGLE_IN_PROGRESS], tools=[WEATHER_TOOL, TIME_TOOL], **kwargs
    )
    assert ours == expected
    marker = {"hermes": "<think>", "llama31": "Jan 2025"}[family]
    assert marker in ours


def test_builtin_tool_call_uses_python_tag(family_dirs: dict[str, Path]) -> None:
    formatter = ChatFormatter(Tokenizer.from_dir(family_dirs["llama31"]))
    text = formatter.render(
        [_openai(m) for m in SINGLE_IN_PROGRESS],
        tools=[TIME_TOOL],
        date_string="x",
        builtin_tools=["get_time"],
    )
    assert "<|python_tag|>get_time.call()<|eom_id|>" in text


# --------------------------------------------------------------------------- environment


def _render(source: str, **kwargs: Any) -> str:
    return render_chat_template(source, [{"role": "user", "content": "hi"}], **kwargs)


def test_tojson_keeps_unicode_and_takes_indent() -> None:
    out = _render("{{ {'a': 'é中'} | tojson }}|{{ [1] | tojson(indent=2) }}")
    assert out == '{"a": "é中"}|[\n  1\n]'


def test_raise_exception_becomes_typed_error() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate") as info:
        _render("{{ raise_exception('roles must alternate') }}")
    assert isinstance(info.value, ValueError)


def test_sandbox_blocks_internals() -> None:
    with pytest.raises(ChatTemplateError):
        _render("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        _render("{% set ns = namespace() %}{% set ns._x = 1 %}")
    with pytest.raises(ChatTemplateError):
        _render("{{ messages.append(1) }}")  # immutable sandbox


def test_loop_controls_generation_tag_and_strftime() -> None:
    source = (
        "{% for i in [1, 2, 3, 4] %}{% if i == 2 %}{% continue %}{% endif %}"
        "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        "{% generation %}[{{ messages[0].content }}]{% endgeneration %}"
        "{{ strftime_now('%Y') }}"
    )
    out = _render(source)
    assert re.fullmatch(r"13\[hi\]\d{4}", out)


def test_trim_and_lstrip_blocks() -> None:
    source = (
        "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    )
    assert _render(source) == "hi\n"


def test_syntax_error_is_typed() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        _render("{% if %}")


def test_messages_are_normalized() -> None:
    source = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.name is defined }}"
        "{% for c in m.tool_calls | default([]) %}:{{ c.function.arguments.x }}{% endfor %};"
        "{% endfor %}"
    )
    messages = [
        Message(role="developer", content="rules"),
        Message(role="user", content=[TextContentPart(text="a"), TextContentPart(text="b")]),
        Message(
            role="assistant",
            content=None,
            tool_calls=[ToolCall(id="c", function=FunctionCall(name="f", arguments='{"x": 5}'))],
        ),
    ]
    out = render_chat_template(source, messages)
    assert out == "system:rules:False;user:a\nb:False;assistant::False:5;"  # parts: a newline


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
        {"type": "image"},
    ],
)
def test_image_parts_are_refused(part: dict[str, Any]) -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}
    with pytest.raises(ConfigurationError, match="text-only"):
        render_chat_template(CHATML_TOOLS_TEMPLATE, [message])
    if part["type"] == "image_url":  # the only image part swiftclient's Message accepts
        with pytest.raises(ValueError, match="text-only"):
            render_chat_template(CHATML_TOOLS_TEMPLATE, [Message.model_validate(message)])


def test_select_template() -> None:
    named = {"default": "D", "tool_use": "T", "rag": "R"}
    assert select_template(named) == "D"
    assert select_template(named, has_tools=True) == "T"
    assert select_template(named, name="rag", has_tools=True) == "R"
    assert select_template("S", has_tools=True) == "S"
    with pytest.raises(ConfigurationError):
        select_template(named, name="missing")
    with pytest.raises(ConfigurationError):
        select_template({"rag": "R"})
    with pytest.raises(ConfigurationError, match="no chat template"):
        select_template(None)


# --------------------------------------------------------------------------- formatter


def test_prepare_request(family_dirs: dict[str, Path]) -> None:
    tok = Tokenizer.from_dir(family_dirs["hermes"])
    formatter = ChatFormatter(tok)
    tools = [Tool.model_validate(WEATHER_TOOL), Tool.model_validate(TIME_TOOL)]
    request = ChatRequest(
        model="m",
        messages=[Message(role="user", content="hi")],
        tools=tools,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    prompt = formatter.prepare(request)
    assert prompt.tool_format == "hermes"
    assert "get_weather" in prompt.text and "get_time" in prompt.text
    assert prompt.text.endswith("<think>\n\n</think>\n\n")
    assert prompt.token_ids == tok.encode(prompt.text)
    assert tok.token_to_id("<|im_start|>") in prompt.token_ids

    named = formatter.prepare(
        request.model_copy(
            update={"tool_choice": ToolChoice.model_validate({"function": {"name": "get_time"}})}
        )
    )
    assert "get_time" in named.text and "get_weather" not in named.text

    hidden = formatter.prepare(request.model_copy(update={"tool_choice": "none"}))
    assert hidden.tool_format == "none" and "get_weather" not in hidden.text

    with pytest.raises(ConfigurationError, match="not in tools"):
        formatter.prepare(
            request.model_copy(
                update={"tool_choice": ToolChoice.model_validate({"function": {"name": "nope"}})}
            )
        )


def test_formatter_overrides(family_dirs: dict[str, Path]) -> None:
    tok = Tokenizer.from_dir(family_dirs["hermes"])
    custom = ChatFormatter(tok, chat_template="{{ messages[0].content }}!", tool_format="llama3")
    assert custom.render([{"role": "user", "content": "x"}]) == "x!"
    assert custom.tool_format() == "llama3"
    assert custom.tool_format(has_tools=False) == "none"
    with pytest.raises(ConfigurationError, match="tool call format"):
        ChatFormatter(tok, tool_format="xml")
    # a misspelt template name was the literal prompt of every request; a broken template
    # failed each request (a 400) rather than the set-up
    with pytest.raises(ConfigurationError, match="'chatml' is no Jinja template"):
        ChatFormatter(tok, chat_template="chatml")
    with pytest.raises(ConfigurationError, match="does not compile"):
        ChatFormatter(tok, chat_template="{% for m in messages %}{{ m.content }")


def test_response_format_instruction() -> None:
    assert response_format_instruction(None) is None
    assert response_format_instruction(ResponseFormat(type="text")) is None
    json_object = ResponseFormat(type="json_object")
    assert "JSON" in (response_format_instruction(json_object) or "")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fmt = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "count", "schema": schema}}
    )
    instruction = response_format_instruction(fmt) or ""
    assert json.dumps(schema, sort_keys=True) in instruction

    added = with_response_format([{"role": "user", "content": "hi"}], json_object)
    assert added[0]["role"] == "system" and "JSON" in added[0]["content"]
    merged = with_response_format(
        [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}], fmt
    )
    assert len(merged) == 2 and merged[0]["content"].startswith("Be nice.\n\n")
    assert "integer" in merged[0]["content"]


# --------------------------------------------------------------------------- tool parsing


def test_detect_tool_format() -> None:
    assert detect_tool_format(HERMES) == "hermes"
    assert detect_tool_format(CHATML_TOOLS_TEMPLATE) == "hermes"
    assert detect_tool_format(LLAMA) == "llama3"
    assert detect_tool_format("{{ messages }}") == "none"
    assert detect_tool_format(None) == "none"


def _calls(text: str, fmt: Any) -> list[tuple[str, dict[str, Any]]]:
    parsed = parse_tool_calls(text, fmt)
    for call in parsed.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    return [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls]


def test_hermes_parsing() -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parsed = parse_tool_calls(one, "hermes")
    assert parsed.content is None
    assert _calls(one, "hermes") == [("get_weather", {"city": "Paris"})]

    two = (
        "Let me check.\n"
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [2]}"}</tool_call>'
    )
    parsed = parse_tool_calls(two, "hermes")
    assert parsed.content == "Let me check.\n"
    assert _calls(two, "hermes") == [("a", {"x": 1}), ("b", {"y": [2]})]

    unclosed = '<tool_call>{"name": "a", "arguments": {}}'
    assert _calls(unclosed, "hermes") == [("a", {})]

    ids = [c.id for c in parse_tool_calls(two, "hermes").tool_calls]
    assert len(set(ids)) == 2


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "a", "arguments": {"x": }</tool_call>',
        "<tool_call>not json at all</tool_call>",
        '<tool_call>{"arguments": {"x": 1}}</tool_call>',
        '<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>',
        '<tool_call>["a"]</tool_call>',
        "<tool_call>",
        "plain text with </tool_call> in it",
        "\n  <tool_call>{broken}</tool_call>\n",
    ],
)
def test_hermes_malformed_is_plain_text(text: str) -> None:
    parsed = parse_tool_calls(text, "hermes")
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_hermes_keeps_malformed_block_next_to_good_one() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{broken}</tool_call>'
    parsed = parse_tool_calls(text, "hermes")
    assert [c.function.name for c in parsed.tool_calls] == ["a"]
    assert parsed.content == "<tool_call>{broken}</tool_call>"


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('Sure. <tool_call>\n{"na', "Sure. ", []),  # the name not whole: markup dropped
        ('<tool_call>{"name": "get_wea', None, []),
        ('<tool_call>{"name": "get_weather"', None, [("get_weather", "")]),
        ('<tool_call>{"name": "get_weather", "argu', None, [("get_weather", "")]),
        ('<tool_call>{"name": "f", "arguments": {"city": "Pa', None, [("f", '{"city": "Pa')]),
        ('<tool_call>{"name": "f", "parameters": {"a": 1}', None, [("f", '{"a": 1}')]),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", '
            '"arguments": {"x": [1',
            None,
            [("a", "{}"), ("b", '{"x": [1')],
        ),
        # what follows the name is not its arguments: not a call (the markup is dropped)
        ('Hm. <tool_call>{"name": "f", "city": "Pa', "Hm. ", []),
    ],
)
def test_a_hermes_call_cut_short_keeps_its_arguments_so_far(
    text: str, content: str | None, calls: list[tuple[str, str]]
) -> None:
    parsed = parse_tool_calls(text, "hermes", cut=True)
    assert (
        parsed.content,
        [(c.function.name, c.function.arguments) for c in parsed.tool_calls],
    ) == (
        content,
        calls,
    )
    assert parsed.partial == bool(calls)
    # not cut short (the model ended there itself): malformed text stays as it was
    if not calls or calls[-1][1] != "{}":
        uncut = parse_tool_calls(text, "hermes")
        assert not uncut.partial and "<tool_call>" in (uncut.content or "")


def test_a_llama3_call_cut_short_needs_its_parameters_named() -> None:
    cut = parse_tool_calls('{"name": "f", "parameters": {"q": "x', "llama3", cut=True)
    assert [(c.function.name, c.function.arguments) for c in cut.tool_calls] == [("f", '{"q": "x')]
    assert cut.content is None and cut.partial
    several = parse_tool_calls(
        '{"name": "f", "parameters": {}}; {"name": "g", "parameters": ', "llama3", cut=True
    )
    assert [(c.function.name, c.function.arguments) for c in several.tool_calls] == [
        ("f", "{}"),
        ("g", ""),
    ]
    # a reply in this format may be plain JSON: cut short, it stays content
    for text in ('{"name": "Bob", "age": 4', '{"answer": 4', '{"name": "Bob"'):
        plain = parse_tool_calls(text, "llama3", cut=True)
        assert plain.content == text and plain.tool_calls == []


def test_a_call_cut_short_keeps_the_reason_it_was_cut() -> None:
    text = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"ci'
    for reason, stop in (("length", None), ("stop", "ty")):
        completion = build_completion(
            text,
            model="m",
            finish_reason=reason,
            prompt_tokens=1,
            completion_tokens=1,
            tool_format="hermes",
            stop_string=stop,
        )
        assert completion.finish_reason == reason  # never "tool_calls" for a broken call
        assert completion.text == "Checking. "
        assert [c.function.arguments for c in completion.tool_calls] == ['{"ci']
        stream = CompletionStream(model="m", tool_format="hermes")
        assert stream.push(text) is not None  # "Checking. " shows at once
        closing = stream.finish(reason, prompt_tokens=1, completion_tokens=1, stop_string=stop)
        deltas = [t for c in closing for t in c.choices[0].delta.tool_calls or []]
        assert [d.function.arguments for d in deltas if d.function] == ['{"ci']
        assert closing[-1].choices[0].finish_reason == reason
    # ended by the model itself (no limit, no stop string): malformed, so content as before
    done = build_completion(
        text,
        model="m",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=1,
        tool_format="hermes",
    )
    assert done.finish_reason == "stop" and done.tool_calls == [] and done.text == text


def test_llama3_parsing() -> None:
    assert _calls('{"name": "f", "parameters": {"q": "x"}}', "llama3") == [("f", {"q": "x"})]
    assert _calls('<|python_tag|>{"name": "f", "parameters": {}}', "llama3") == [("f", {})]
    several = '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {"b": 2}}'
    assert _calls(several, "llama3") == [("f", {"a": 1}), ("g", {"b": 2})]
    listed = '[{"name": "f", "parameters": {}}, {"name": "g", "parameters": {}}]'
    assert _calls(listed, "llama3") == [("f", {}), ("g", {})]
    assert parse_tool_calls(' {"name": "f", "parameters": {}}\n', "llama3").content is None


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        '{"name": "f", "parameters": {"a": }',
        '{"answer": 42}',
        '{"name": "f", "parameters": {}} and then some text',
        "[1, 2, 3]",
        "<|python_tag|>brave_search.call(query='x')",
        "",
    ],
)
def test_llama3_malformed_is_plain_text(text: str) -> None:
    parsed = parse_tool_calls(text, "llama3")
    assert parsed.tool_calls == []
    assert parsed.content == (text or None)


def test_none_format_never_parses() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, "none").content == text
    assert parse_tool_calls(text, "none").tool_calls == []


_STREAM_TEXTS = [
    'Sure.\n<tool_call>\n{"name": "a", "arguments": {"x": "<tool"}}\n</tool_call>',
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"}</tool_call>',
    "No tools here, just a < sign and <tool_c... almost.",
    "<tool_call>{broken</tool_call> trailing",
    '  {"name": "f", "parameters": {"k": [1, 2]}}',
    '<|python_tag|>{"name": "f", "parameters": {}}',
    "{not a call} but text",
    "\n\nplain answer",
]


@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(0, len(_STREAM_TEXTS) - 1),
    fmt=st.sampled_from(["hermes", "llama3", "none"]),
    cuts=st.lists(st.integers(0, 200), max_size=12),
)
def test_stream_parser_agrees_with_whole_text(index: int, fmt: Any, cuts: list[int]) -> None:
    text = _STREAM_TEXTS[index]
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = ToolCallStream(fmt)
    shown = "".join(stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    end = stream.finish()
    whole = parse_tool_calls(text, fmt)
    content = shown + (end.content or "")
    assert ("" if end.tool_calls and not content.strip() else content) == (whole.content or "")
    assert [(c.function.name, c.function.arguments) for c in end.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]
    if whole.tool_calls:
        assert "<tool_call>" not in shown and '"name"' not in shown


def test_stream_shows_content_before_a_call_early() -> None:
    stream = ToolCallStream("hermes")
    assert stream.feed("Let me look") == "Let me look"
    assert stream.feed(" that up. <tool") == " that up. "
    assert stream.feed('_call>{"name": "a", "arguments": {}}') == ""
    assert stream.feed("</tool_call>") == ""
    end = stream.finish()
    assert end.content is None and [c.function.name for c in end.tool_calls] == ["a"]

    held = ToolCallStream("hermes")
    assert held.feed("a <tool") == "a "
    assert held.feed("box") == "<toolbox"


# --------------------------------------------------------------------------- responses


def test_build_completion_with_tool_calls() -> None:
    text = (
        'Checking.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    completion = build_completion(
        text,
        model="local/m",
        finish_reason="stop",
        prompt_tokens=20,
        completion_tokens=9,
        cached_tokens=16,
        tool_format="hermes",
        created=123,
    )
    assert completion.id.startswith("chatcmpl-") and completion.created == 123
    assert completion.model == "local/m"
    assert completion.finish_reason == "tool_calls"
    assert completion.text == "Checking.\n"
    assert completion.tool_calls[0].function.name == "get_weather"
    assert json.loads(completion.tool_calls[0].function.arguments) == {"city": "Oslo"}
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (20, 9)
    assert completion.usage.total_tokens == 29 and completion.usage.cached_tokens == 16


def test_build_completion_plain_and_length() -> None:
    completion = build_completion(
        "hi", model="m", finish_reason="length", prompt_tokens=1, completion_tokens=1
    )
    assert completion.text == "hi" and completion.finish_reason == "length"
    assert completion.tool_calls == []
    truncated = build_completion(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>',
        model="m",
        finish_reason="length",
        prompt_tokens=1,
        completion_tokens=1,
        tool_format="hermes",
    )
    assert truncated.finish_reason == "length"  # only a clean stop becomes "tool_calls"
    # what the server sends (it drops None fields): no cache-write count it never made
    details = make_usage(3, 4).model_dump(exclude_none=True)["prompt_tokens_details"]
    assert details == {"cached_tokens": 0}


def test_completion_stream_chunks() -> None:
    stream = CompletionStream(model="m", tool_format="hermes", created=5)
    first = stream.start()
    assert first.choices[0].delta.role == "assistant" and first.id == stream.id
    deltas = ["Let me ", "check. <tool", '_call>{"name": "f", "arguments": {"a": 1}}</tool_call>']
    chunks = [c for c in (stream.push(d) for d in deltas) if c is not None]
    assert "".join(c.text for c in chunks) == "Let me check. "
    closing = stream.finish("stop", prompt_tokens=5, completion_tokens=7, include_usage=True)
    call_chunk, finish_chunk, usage_chunk = closing
    call = (call_chunk.choices[0].delta.tool_calls or [])[0]
    assert (call.index, call.type) == (0, "function")
    assert call.id is not None and call.id.startswith("call_")
    assert call.function is not None and call.function.name == "f"
    assert json.loads(call.function.arguments or "") == {"a": 1}
    assert finish_chunk.choices[0].finish_reason == "tool_calls"
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.total_tokens == 12
    assert all(c.id == stream.id and c.created == 5 for c in [*chunks, *closing])


def test_completion_stream_plain_text_without_usage() -> None:
    stream = CompletionStream(model="m")
    pieces = [stream.push(d) for d in ["a", "", "b"]]
    assert [p.text if p else None for p in pieces] == ["a", None, "b"]
    closing = stream.finish("stop", prompt_tokens=1, completion_tokens=2)
    assert len(closing) == 1 and closing[0].choices[0].finish_reason == "stop"
    assert closing[0].usage is None
