"""gateway/realtime/frames.py: a message from its frames, as both ends of a session read them."""

from __future__ import annotations

from websockets.frames import Frame, Opcode

from gateway.realtime.frames import Reassembly


def test_one_frame_messages_and_fragmented_ones_interleaved_with_control_frames_elsewhere():
    r = Reassembly()
    assert r.add(Frame(Opcode.TEXT, b'{"a":1}')) == (b'{"a":1}', True)
    assert r.add(Frame(Opcode.BINARY, b"\x00\x01")) == (b"\x00\x01", False)
    assert r.add(Frame(Opcode.TEXT, b"he", fin=False)) is None
    assert r.add(Frame(Opcode.CONT, b"ll", fin=False)) is None
    assert r.add(Frame(Opcode.CONT, b"o", fin=True)) == (b"hello", True)
    assert r.add(Frame(Opcode.BINARY, b"\x01", fin=False)) is None
    assert r.add(Frame(Opcode.CONT, b"\x02")) == (b"\x01\x02", False)
    # nothing of a finished message is kept for the next one
    assert r.add(Frame(Opcode.TEXT, b"x")) == (b"x", True)
