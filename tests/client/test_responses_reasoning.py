"""Reasoning across turns on the Responses wire: encrypted reasoning items asked for,
surfaced on the message and sent back unchanged (stateless), or server-side state with
``store`` and ``previous_response_id``; checked against the fake provider's Responses
route and the official ``openai`` SDK's types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pydantic
import pytest

from swiftclient import AsyncClient, BadRequestError, NotFoundError, ResponsesBackend
from swiftclient.backends.responses import responses_body
from swiftclient.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio

KEY = "sk-responses-test-key"
ENCRYPTED = "reasoning.encrypted_content"


def client_on(fake: FakeProvider, **backend: Any) -> AsyncClient:
    responses = ResponsesBackend(fake.base_url, api_key=KEY, name="r", **backend)
    return AsyncClient(backends={"r": responses}, model="r/gpt-5", retry=None)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_reasoning_items_come_back_unchanged_on_the_next_turn(stream: bool) -> None:
    async with FakeProvider(api_key=KEY) as fake, client_on(fake) as client:
        fake.script(Reply(text="42.", thinking="6 times 7."), Reply(text="You're welcome."))
        first = await client.chat("6 x 7?", reasoning_effort="low", stream=stream)
        sent = fake.requests[-1].body
        assert sent["store"] is False and sent["include"] == [ENCRYPTED]
        reply = first.choices[0].message
        assert reply.content == "42." and reply.reasoning_content == "6 times 7."
        items = reply.reasoning_items
        assert items is not None and len(items) == 1
        (item,) = items
        assert item["type"] == "reasoning" and item["id"] == "rs_fake_1"
        assert item["summary"] == [{"type": "summary_text", "text": "6 times 7."}]
        assert item["encrypted_content"].startswith("fake-enc-")
        frozen = json.dumps(item)

        history: list[Any] = [{"role": "user", "content": "6 x 7?"}, reply]
        history.append({"role": "user", "content": "ty"})
        second = await client.chat(history, stream=stream)
        assert second.text == "You're welcome."
        body = fake.requests[-1].body
        # the item leads the turn it belongs to, exactly as received; still unstored, and
        # the encrypted reasoning is asked for again (the conversation reasons)
        assert body["input"][1:3] == [item, {"role": "assistant", "content": "42."}]
        assert json.dumps(body["input"][1]) == frozen
        assert body["store"] is False and body["include"] == [ENCRYPTED]


async def test_a_changed_or_unencrypted_reasoning_item_is_refused_as_openai_does() -> None:
    async with FakeProvider(api_key=KEY) as fake, client_on(fake) as client:
        fake.script(Reply(text="42.", thinking="6 times 7."))
        reply = (await client.chat("6 x 7?", reasoning_effort="low")).choices[0].message
        assert reply.reasoning_items is not None
        (item,) = reply.reasoning_items
        changed = {**item, "summary": [{"type": "summary_text", "text": "6 times 8."}]}
        unencrypted = {k: v for k, v in item.items() if k != "encrypted_content"}
        for bad, error in ((changed, BadRequestError), (unencrypted, NotFoundError)):
            turn = {"role": "assistant", "content": "42.", "reasoning_items": [bad]}
            with pytest.raises(error):
                await client.chat([{"role": "user", "content": "6 x 7?"}, turn])


async def test_tool_calls_after_reasoning_keep_the_item_before_the_calls() -> None:
    async with FakeProvider(api_key=KEY) as fake, client_on(fake) as client:
        for stream in (False, True):
            fake.script(
                Reply(thinking="Need the weather.", tool_calls=[("weather", {"city": "Oslo"})]),
                Reply(text="Sunny."),
            )
            first = await client.chat("Weather in Oslo?", reasoning_effort="low", stream=stream)
            reply = first.choices[0].message
            assert reply.tool_calls is not None and reply.reasoning_items is not None
            (call,) = reply.tool_calls
            result = {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
            await client.chat([{"role": "user", "content": "Weather?"}, reply, result])
            kinds = [item.get("type", "message") for item in fake.requests[-1].body["input"]]
            assert kinds == ["message", "reasoning", "function_call", "function_call_output"]


def test_encrypted_reasoning_is_asked_for_only_when_unstored_and_reasoning() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert "include" not in responses_body(plain)
    reasoning = {**plain, "reasoning_effort": "high"}
    assert responses_body(reasoning)["include"] == [ENCRYPTED]
    assert "include" not in responses_body(reasoning, store=True)
    both = responses_body({**reasoning, "logprobs": True})
    assert both["include"] == ["message.output_text.logprobs", ENCRYPTED]
    given = responses_body({**plain, "reasoning": {"effort": "low"}, "include": [ENCRYPTED]})
    assert given["include"] == [ENCRYPTED]


async def test_server_side_state_with_store_and_previous_response_id() -> None:
    async with FakeProvider(api_key=KEY) as fake, client_on(fake, store=True) as client:
        fake.script(Reply(text="42.", thinking="6 times 7."), Reply(text="Yes."))
        first = await client.chat("6 x 7?", reasoning_effort="low")
        sent = fake.requests[-1].body
        assert sent["store"] is True and "include" not in sent
        assert first.id.startswith("resp_")
        follow = await client.chat(
            "Sure?", reasoning_effort="low", extra_body={"previous_response_id": first.id}
        )
        assert follow.text == "Yes."
        body = fake.requests[-1].body
        assert body["previous_response_id"] == first.id and body["store"] is True
        assert body["input"] == [{"role": "user", "content": "Sure?"}]


async def test_the_official_sdk_types_validate_what_is_sent_and_received() -> None:
    openai = pytest.importorskip("openai")
    from openai.types.responses import Response, ResponseStreamEvent
    from openai.types.responses.response_create_params import ResponseCreateParamsStreaming

    params = pydantic.TypeAdapter(ResponseCreateParamsStreaming)
    events = pydantic.TypeAdapter(ResponseStreamEvent)
    async with FakeProvider(api_key=KEY) as fake, client_on(fake) as client:
        fake.script(Reply(text="42.", thinking="6 times 7."), Reply(text="Welcome."))
        reply = (await client.chat("6 x 7?", reasoning_effort="low")).choices[0].message
        await client.chat([{"role": "user", "content": "6 x 7?"}, reply], stream=True)
        for recorded in fake.requests:
            params.validate_python(recorded.body)  # what swiftclient sends

        # the fake's bytes, validated strictly (the SDK itself builds its models leniently)
        request = {
            "model": "gpt-5",
            "input": "6 x 7?",
            "reasoning": {"effort": "low"},
            "store": False,
            "include": [ENCRYPTED],
        }
        headers = {"authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=fake.base_url, headers=headers) as http:
            fake.script(Reply(text="42.", thinking="6 times 7."))
            whole = Response.model_validate((await http.post("/responses", json=request)).json())
            fake.script(Reply(text="42.", thinking="6 times 7."))
            answer = await http.post("/responses", json={**request, "stream": True})
            lines = [line for line in answer.text.splitlines() if line.startswith("data: ")]
            kinds = [events.validate_json(line[6:]).type for line in lines]
        reasoning, message = whole.output
        assert reasoning.type == "reasoning" and message.type == "message"
        assert reasoning.encrypted_content is not None and whole.output_text == "42."
        assert kinds[:3] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
        assert "response.reasoning_summary_text.delta" in kinds
        assert kinds[-1] == "response.completed"

        sdk = openai.AsyncOpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0)
        try:
            fake.script(Reply(text="Welcome."))
            again = await sdk.responses.create(
                model="gpt-5",
                input=[
                    {"role": "user", "content": "6 x 7?"},
                    reasoning.model_dump(exclude_none=True),
                    {"role": "assistant", "content": "42."},
                ],
                store=False,
                include=[ENCRYPTED],
            )
            assert again.output_text == "Welcome."

            fake.script(Reply(text="ok", thinking="hmm"))
            async with sdk.responses.stream(
                model="gpt-5", input="q", reasoning={"effort": "low"}, include=[ENCRYPTED]
            ) as stream:
                final = await stream.get_final_response()
            first = final.output[0]
            assert first.type == "reasoning" and first.summary[0].text == "hmm"
            assert first.encrypted_content is not None and final.output_text == "ok"
        finally:
            await sdk.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_reasoning_items_pass_through_the_transport_both_ways(stream: bool) -> None:
    # openai SDK -> swiftclient transport -> ResponsesBackend -> provider, and back: the
    # provider's item reaches the SDK whole, and the SDK's next turn carries it back to the
    # provider unchanged (the fake checks its encrypted content).
    openai = pytest.importorskip("openai")
    import httpx2

    from swiftclient.transports import AsyncTransport

    async with FakeProvider(api_key=KEY) as fake, client_on(fake) as client:
        sdk = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
            max_retries=0,
        )
        try:
            fake.script(Reply(text="42.", thinking="6 times 7."), Reply(text="Welcome."))
            question = {"role": "user", "content": "6 x 7?"}
            if stream:
                async with sdk.responses.stream(
                    model="gpt-5", input=[question], reasoning={"effort": "low"}
                ) as events:
                    first = await events.get_final_response()
            else:
                first = await sdk.responses.create(
                    model="gpt-5", input=[question], reasoning={"effort": "low"}
                )
            reasoning = first.output[0]
            assert reasoning.type == "reasoning" and reasoning.id == "rs_fake_1"
            assert reasoning.encrypted_content is not None
            assert first.output_text == "42."
            item = reasoning.model_dump(mode="json", exclude_none=True)
            history: Any = [question, item, {"role": "assistant", "content": "42."}]
            history.append({"role": "user", "content": "Thanks"})
            again = await sdk.responses.create(model="gpt-5", input=history)
            assert again.output_text == "Welcome."
        finally:
            await sdk.close()
    sent = fake.requests[-1].body["input"]
    assert sent[1] == item and sent[1]["encrypted_content"] == reasoning.encrypted_content
    assert fake.requests[-1].body["include"] == [ENCRYPTED]
