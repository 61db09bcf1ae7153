"""The sans-IO SSE decoder: framing rules, any chunking, linear work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftclient._sse import ServerSentEvent, SSEDecoder


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events


def test_basic_events_and_done() -> None:
    events = decode(b'data: {"a":1}\n\ndata: [DONE]\n\n')
    assert [e.data for e in events] == [b'{"a":1}', b"[DONE]"]
    assert events[0].event == "message"


def test_line_endings_lf_cr_crlf_are_equivalent() -> None:
    for sep in (b"\n", b"\r", b"\r\n"):
        events = decode(b"data: x" + sep + b"data: y" + sep + sep + b"data: z" + sep + sep)
        assert [e.data for e in events] == [b"x\ny", b"z"], sep


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    events = decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")
    assert [e.data for e in events] == [b"a\nb"]


def test_comments_fields_and_retry() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(
        b": keep-alive\n\nevent: error\nid: 7\nretry: 1500\ndata: boom\n\n"
        b"retry: x\ndata:no-space\n\n"
    )
    assert decoder.comments == 1
    assert events[0] == ServerSentEvent(data=b"boom", event="error", id="7", retry=1500)
    assert events[1].data == b"no-space"
    assert events[1].event == "message"
    assert events[1].id == "7"  # the last event id persists
    assert events[1].retry == 1500  # an invalid retry value is ignored


def test_empty_data_and_unterminated_event_are_not_dispatched() -> None:
    assert decode(b"event: x\n\n") == []
    assert decode(b"data: partial") == []


def test_bom_is_dropped_even_when_split() -> None:
    assert [e.data for e in decode(b"\xef", b"\xbb\xbfdata: a\n\n")] == [b"a"]


def test_field_without_colon_and_unknown_fields() -> None:
    assert [e.data for e in decode(b"data\nfoo: bar\n\n")] == [b""]


STREAM = (
    b": hello\r\n"
    b'data: {"id":"1","choices":[{"delta":{"content":"h\\u00e9"}}]}\n\n'
    b"event: ping\rdata: a\rdata: b\r\r"
    b"id: 42\r\ndata: multi\r\ndata: line\r\n\r\n"
    b"retry: 10\ndata: [DONE]\n\n"
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_every_chunking_yields_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(*chunks) == decode(STREAM)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.binary(max_size=30).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=5
    ),
    st.integers(min_value=1, max_value=7),
)
def test_arbitrary_payloads_roundtrip_in_any_chunk_size(payloads: list[bytes], size: int) -> None:
    body = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    assert [e.data for e in decode(*chunks)] == payloads


LINES = st.sampled_from(
    [
        b"event: content_block_delta",
        b"event: ping",
        b"event:no-space",
        b"event: ",
        b"event: \xff\xfe",
        b"event",
        b'data: {"type":"ping"}',
        b"data: a",
        b"data:",
        b"data",
        b"id: 3",
        b": comment",
        b"retry: 5",
        b"",
        b"",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=30))
def test_typed_events_decode_alike_on_the_lf_path_and_the_general_path(lines: list[bytes]) -> None:
    """LF-only input takes the LF fast path (typed events dispatched inline); the same
    lines ending in CRLF take the general path: both give the same events."""
    lf = b"".join(line + b"\n" for line in lines)
    crlf = b"".join(line + b"\r\n" for line in lines)
    assert decode(lf) == decode(crlf)
    assert decode(*(line + b"\n" for line in lines)) == decode(crlf)


def test_huge_single_event_fed_in_small_chunks() -> None:
    payload = b"x" * (32 * 1024 * 1024)
    body = b"data: " + payload + b"\n\n"
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    step = 64 * 1024
    for i in range(0, len(body), step):
        events.extend(decoder.feed(body[i : i + step]))
    assert len(events) == 1
    assert len(events[0].data) == len(payload)


def test_a_line_without_end_past_the_limit_raises() -> None:
    from swiftclient._sse import EventTooLarge

    decoder = SSEDecoder(max_event_bytes=1000)
    decoder.feed(b"data: ")
    with pytest.raises(EventTooLarge):
        for _ in range(100):
            decoder.feed(b"x" * 100)


def test_many_data_lines_of_one_event_past_the_limit_raise() -> None:
    from swiftclient._sse import EventTooLarge

    decoder = SSEDecoder(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(200):
            decoder.feed(b"data: 0123456789\n")  # never a blank line: one growing event
    decoder = SSEDecoder(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(2000):
            decoder.feed(b"data:\r\n")  # empty data lines still count, CR path too


def test_an_event_over_the_limit_in_one_chunk_raises() -> None:
    from swiftclient._sse import EventTooLarge

    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=100).feed(b"data: " + b"y" * 200 + b"\n\n")


def test_events_under_the_limit_pass_however_many() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    events = []
    for i in range(1000):
        events.extend(decoder.feed(b"data: " + str(i).encode() * 3 + b"\n\n"))
    assert len(events) == 1000
    assert events[-1].data == b"999999999"
