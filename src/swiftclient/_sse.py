"""A sans-IO decoder for Server-Sent Events: bytes in, events out, no I/O.

It follows the WHATWG event-stream rules: lines end in LF, CR or CRLF (a CR at the end of
one chunk and an LF at the start of the next count as one line end); lines starting with
``:`` are comments; ``data`` lines of one event are joined with LF; ``event``, ``id`` and
``retry`` fields are kept; a leading UTF-8 byte-order mark is dropped. Work is linear in
the input: each byte is scanned once however the stream is split into chunks.

Memory is bounded: with ``max_event_bytes`` set, a line or event that grows past it (a
server sending ``data: `` and then megabytes with no newline) raises :class:`EventTooLarge`
as soon as the held bytes pass the limit, instead of buffering without end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EventTooLarge", "SSEDecoder", "ServerSentEvent"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class EventTooLarge(ValueError):
    """An SSE line or event exceeded the decoder's ``max_event_bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an SSE event exceeds the limit of {limit} bytes")
        self.limit = limit


@dataclass(slots=True)
class ServerSentEvent:
    """One dispatched event. ``data`` stays bytes so JSON parsers can take it directly.

    Not frozen, though nothing changes an event once made: a frozen dataclass's
    ``__init__`` costs twice as much, and one is made per streamed chunk."""

    data: bytes
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental SSE decoder; call :meth:`feed` with each chunk and :meth:`close` at EOF.

    ``max_event_bytes`` (None: unbounded) caps one event's data plus the line being read.
    """

    __slots__ = (
        "_buf",
        "_data",
        "_data_size",
        "_event",
        "_last_id",
        "_limit",
        "_retry",
        "_scan",
        "_skip_lf",
        "_started",
        "comments",
    )

    def __init__(self, *, max_event_bytes: int | None = None) -> None:
        if max_event_bytes is not None and max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self._limit = max_event_bytes
        self._data_size = 0
        self._buf = bytearray()
        self._scan = 0
        self._skip_lf = False
        self._started = False
        self._data: list[bytes] = []
        self._event = b""
        self._last_id: str | None = None
        self._retry: int | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode ``chunk`` and return the events it completes."""
        if not chunk:
            return []
        if not self._started:
            # Only a byte-order mark's prefix is ever held back before the stream starts.
            head = bytes(self._buf) + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._buf[:] = head
                return []
            self._started = True
            self._buf.clear()
            chunk = head[3:] if head[:3] == _BOM else head
            if not chunk:
                return []
        if not self._skip_lf and b"\r" not in chunk:
            return self._feed_lf(chunk)
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        events: list[ServerSentEvent] = []
        start = 0
        pos = self._scan
        search = _LINE_END.search
        while True:
            match = search(buf, pos)
            if match is None:
                break
            end = match.start()
            if match.end() == len(buf) and buf[end] == 0x0D:
                # A CR at the very end may be the first half of a CRLF split across chunks.
                self._skip_lf = True
            event = self._line(bytes(buf[start:end]))
            if event is not None:
                events.append(event)
            start = pos = match.end()
        if start:
            del buf[:start]
        self._scan = len(buf)
        self._check_size()
        return events

    def _check_size(self) -> None:
        """Raise :class:`EventTooLarge` when the held line and event data pass the limit."""
        limit = self._limit
        if limit is not None and len(self._buf) + self._data_size > limit:
            raise EventTooLarge(limit)

    def _feed_lf(self, chunk: bytes) -> list[ServerSentEvent]:
        """Fast path for chunks without CR (the common case): split on LF only.

        The leftover in the buffer never holds a line end, so only the new chunk is searched
        for one, and each byte is still handled a bounded number of times.
        """
        buf = self._buf
        if not buf and not self._data and not self._event:
            # The commonest chunk of all: exactly one event of one ``data: `` line.
            end = chunk.find(b"\n")
            if end == len(chunk) - 2 and chunk[-1] == 0x0A and chunk[:6] == b"data: ":
                if self._limit is not None and end - 6 > self._limit:
                    raise EventTooLarge(self._limit)
                return [ServerSentEvent(chunk[6:end], "message", self._last_id, self._retry)]
        if b"\n" not in chunk:
            buf += chunk
            self._scan = len(buf)
            self._check_size()
            return []
        if buf:
            buf += chunk
            lines = bytes(buf).split(b"\n")
        else:
            lines = chunk.split(b"\n")
        rest = lines.pop()
        buf.clear()
        buf += rest
        self._scan = len(buf)
        events: list[ServerSentEvent] = []
        data = self._data
        for line in lines:
            if line[:6] == b"data: ":
                data.append(line[6:])
                self._data_size += len(line) - 5
            elif not line:
                if data:
                    # Dispatch inline for the usual event: data lines, with or without a
                    # type (``event: `` lines, as the Messages and Responses wires send).
                    if self._limit is not None and self._data_size > self._limit:
                        raise EventTooLarge(self._limit)
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    kind = self._event
                    if kind:
                        self._event = b""
                        name = kind.decode("utf-8", "replace")
                    else:
                        name = "message"
                    events.append(ServerSentEvent(payload, name, self._last_id, self._retry))
                    data = self._data = []
                    self._data_size = 0
                else:
                    self._event = b""  # an event without data is not dispatched
            elif line[:7] == b"event: ":
                self._event = line[7:]
            else:
                event = self._line(line)
                if event is not None:
                    events.append(event)
                data = self._data
        self._check_size()
        return events

    def close(self) -> list[ServerSentEvent]:
        """Finish the stream. An unterminated last event is discarded, as the spec says."""
        self._buf.clear()
        self._scan = 0
        self._data = []
        self._data_size = 0
        self._event = b""
        return []

    def _line(self, line: bytes) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == 0x3A:  # ":" comment
            self.comments += 1
            return None
        colon = line.find(b":")
        if colon == -1:
            field, value = line, b""
        else:
            field = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._data_size += len(value) + 1
        elif field == b"event":
            self._event = value
        elif field == b"id":
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif field == b"retry":
            if value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data = self._data
        event_type = self._event
        self._event = b""
        if not data:
            return None
        if self._limit is not None and self._data_size > self._limit:
            raise EventTooLarge(self._limit)
        self._data = []
        self._data_size = 0
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        return ServerSentEvent(
            data=payload,
            event=event_type.decode("utf-8", "replace") if event_type else "message",
            id=self._last_id,
            retry=self._retry,
        )
