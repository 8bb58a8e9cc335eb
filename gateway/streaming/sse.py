r"""Incremental SSE parsing (WHATWG HTML §9.2.6): raw events out of a byte stream.

>>> p = SSEParser()
>>> p.feed(b"data: a\n\ndata: b")
[b'data: a\n\n']
>>> event_data(b"event: x\ndata: b\n\n"), event_name(b"event: x\ndata: b\n\n")
(b'b', b'x')
"""

from __future__ import annotations


class SSEParser:
    """Incremental splitter of an SSE byte stream into raw events (WHATWG HTML §9.2.6).

    Events end at a blank line; lines end with CRLF, LF or CR. :meth:`feed` returns each
    complete event's bytes exactly as received (terminator included), so the relay forwards
    what the upstream sent and an incomplete tail never reaches the client. A CR that ends a
    chunk could be the first half of a CRLF, so that event waits for the next byte (only
    CR-only streams, not seen in practice, feel it); at the end of the stream :meth:`finish`
    reads that CR as the line end it was.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        events: list[bytes] = []
        start = 0
        if b"\r" not in buf:  # the common case: LF-only framing
            while (i := buf.find(b"\n\n", start)) >= 0:
                events.append(buf[start : i + 2])
                start = i + 2
            self._buf = buf[start:]
            return events
        return self._split(buf, final=False)

    def finish(self) -> list[bytes]:
        r"""The stream ended: a CR left at the very end was a line end, not half of a CRLF.

        Returns the event that completes (a CR-only stream's last one), if any; whatever stays
        in :attr:`pending` afterwards was cut.

        >>> p = SSEParser()
        >>> p.feed(b"data: a\r\rdata: [DONE]\r\r"), p.finish(), p.pending
        ([b'data: a\r\r'], [b'data: [DONE]\r\r'], b'')
        """
        if not self._buf.endswith(b"\r"):
            return []
        return self._split(self._buf, final=True)

    def _split(self, buf: bytes, *, final: bool) -> list[bytes]:
        """Events out of ``buf`` at any line endings; ``final``: no more bytes will come."""
        events: list[bytes] = []
        start = pos = line_start = 0
        n = len(buf)
        while pos < n:
            c = buf[pos]
            if c == 0x0A or c == 0x0D:  # \n or \r
                if c == 0x0D:
                    if pos + 1 >= n:
                        if not final:
                            break  # a CR at the end may be half of a CRLF: wait for more
                        end = n
                    else:
                        end = pos + 2 if buf[pos + 1] == 0x0A else pos + 1
                else:
                    end = pos + 1
                if pos == line_start:  # empty line: the event is complete
                    if line_start > start:
                        events.append(buf[start:end])
                    start = end
                line_start = end
                pos = end
            else:
                pos += 1
        self._buf = buf[start:]
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (non-empty at end of stream means the stream was cut)."""
        return self._buf


def event_data(raw: bytes) -> bytes | None:
    """The ``data`` of one raw event (data lines joined by LF); None for comment-only events."""
    data: list[bytes] = []
    for line in raw.splitlines():
        if line.startswith(b"data"):
            value = line[4:]
            if value[:1] == b":":
                value = value[1:]
                if value[:1] == b" ":
                    value = value[1:]
            elif value:  # a field named e.g. "database": not data
                continue
            data.append(value)
    return b"\n".join(data) if data else None


def event_name(raw: bytes) -> bytes | None:
    """The ``event`` field of one raw event (None when absent: the default "message")."""
    if not raw.startswith(b"event") and b"\nevent" not in raw and b"\revent" not in raw:
        return None
    for line in raw.splitlines():
        if line.startswith(b"event:"):
            value = line[6:]
            return value[1:] if value[:1] == b" " else value
    return None


DONE = b"[DONE]"
