"""The collector's error details, read from the protobuf by hand (no generated classes): a
``google.rpc.Status`` body's message and a ``google.rpc.RetryInfo`` delay."""

from __future__ import annotations


def _varints(data: bytes) -> dict[int, int | bytes]:
    """The top-level fields of a protobuf message: varints and length-delimited bytes."""
    fields: dict[int, int | bytes] = {}
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise ValueError("truncated varint")

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number] = varint()
        elif wire == 2:
            length = varint()
            fields[number] = data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return fields


def _rpc_status_message(body: bytes) -> str:
    """The ``message`` of a ``google.rpc.Status`` error body (field 2), if there is one."""
    try:
        message = _varints(body).get(2)
    except (ValueError, IndexError):
        return ""
    if isinstance(message, bytes) and message:
        return ": " + message[:200].decode("utf-8", "replace")
    return ""


def _retry_info_delay(raw: bytes) -> float | None:
    """``google.rpc.RetryInfo{Duration retry_delay = 1}``, ``Duration{seconds = 1, nanos = 2}``."""
    try:
        duration = _varints(raw).get(1)
        if not isinstance(duration, bytes):
            return None
        parts = _varints(duration)
    except (ValueError, IndexError):
        return None
    seconds, nanos = parts.get(1, 0), parts.get(2, 0)
    if not isinstance(seconds, int) or not isinstance(nanos, int):
        return None
    return max(0.0, seconds + nanos / 1e9)
