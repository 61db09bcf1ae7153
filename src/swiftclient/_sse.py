"""A sans-IO decoder for Server-Sent Events: bytes in, events out, no I/O.

It follows the WHATWG event-stream rules: lines end in LF, CR or CRLF (a CR at the end of
one chunk and an LF at the start of the next count as one line end); lines starting with
``:`` are comments; ``data`` lines of one event are joined with LF; ``event``, ``id`` and
``retry`` fields are kept; a leading UTF-8 byte-order mark is dropped. Work is linear in
the input: each byte is scanned once however the stream is split into chunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSEDecoder", "ServerSentEvent"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event. ``data`` stays bytes so JSON parsers can take it directly."""

    data: bytes
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental SSE decoder; call :meth:`feed` with each chunk and :meth:`close` at EOF."""

    __slots__ = (
        "_buf",
        "_data",
        "_event",
        "_last_id",
        "_retry",
        "_scan",
        "_skip_lf",
        "_started",
        "comments",
    )

    def __init__(self) -> None:
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
        return events

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
                return [ServerSentEvent(chunk[6:end], "message", self._last_id, self._retry)]
        if b"\n" not in chunk:
            buf += chunk
            self._scan = len(buf)
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
            elif not line:
                if data and not self._event:
                    # Dispatch inline for the usual event: data lines and no event type.
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    events.append(ServerSentEvent(payload, "message", self._last_id, self._retry))
                    data = self._data = []
                    continue
                event = self._dispatch()
                if event is not None:
                    events.append(event)
                data = self._data
            else:
                event = self._line(line)
                if event is not None:
                    events.append(event)
                data = self._data
        return events

    def close(self) -> list[ServerSentEvent]:
        """Finish the stream. An unterminated last event is discarded, as the spec says."""
        self._buf.clear()
        self._scan = 0
        self._data = []
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
        self._data = []
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        return ServerSentEvent(
            data=payload,
            event=event_type.decode("utf-8", "replace") if event_type else "message",
            id=self._last_id,
            retry=self._retry,
        )
