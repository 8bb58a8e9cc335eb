"""A WebSocket message from its frames, for both ends of a realtime session.

websockets' sans-I/O protocols (``ServerProtocol`` on the client's hop, ``ClientProtocol`` on
the upstream's) hand over frames, not messages: a message may come fragmented (a first TEXT or
BINARY frame without FIN, CONT frames, the last with FIN). Nearly every message is one frame,
and that case costs one comparison here.
"""

from __future__ import annotations

from websockets.frames import Frame, Opcode

TEXT, BINARY, CONT, PONG = Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.PONG


class Reassembly:
    """The fragments of the message being read on one connection."""

    __slots__ = ("_parts", "_text")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._text = False

    def add(self, frame: Frame) -> tuple[bytes, bool] | None:
        """A data frame (TEXT, BINARY or CONT): the whole message and whether it is text once
        its last frame is in, else None. (A parsed frame's payload is bytes: no deflate on
        either hop.)"""
        opcode = frame.opcode
        if opcode is CONT:
            self._parts.append(frame.data)  # type: ignore[arg-type]
            if not frame.fin:
                return None
            parts, self._parts = self._parts, []
            return b"".join(parts), self._text
        text = opcode is TEXT
        if frame.fin:
            return frame.data, text  # type: ignore[return-value]
        self._parts = [frame.data]  # type: ignore[list-item]
        self._text = text
        return None


__all__ = ["BINARY", "CONT", "PONG", "TEXT", "Reassembly"]
