"""A file upload's ``purpose``, read from the head of its multipart body without holding the
body (docs/spec.md §24): the SDKs send the form fields before the file, so the first few KiB
tell; the chunks read are sent on first, then the rest as it arrives."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Final

#: how much of the body is looked at for the purpose field
PEEK_LIMIT: Final = 64 * 1024
_PURPOSE = re.compile(
    rb'name="?purpose"?\r\n(?:[^\r\n]+\r\n)*\r\n([^\r\n]{1,64})\r\n', re.IGNORECASE
)


def find_purpose(head: bytes) -> str | None:
    """The ``purpose`` part's value in a multipart head, or None.

    >>> body = b'--b\\r\\nContent-Disposition: form-data; name="purpose"\\r\\n\\r\\nbatch\\r\\n--b'
    >>> find_purpose(body), find_purpose(b"--b\\r\\n")
    ('batch', None)
    """
    match = _PURPOSE.search(head)
    return match.group(1).decode("latin-1") if match is not None else None


async def peek_purpose(
    chunks: AsyncIterator[bytes] | None, limit: int = PEEK_LIMIT
) -> tuple[str | None, AsyncIterator[bytes] | None]:
    """(the purpose, the whole body again as an iterator): at most ``limit`` bytes are held."""
    if chunks is None:
        return None, None
    held: list[bytes] = []
    size = 0
    purpose = None
    ended = False
    while size < limit:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            ended = True
            break
        held.append(chunk)
        size += len(chunk)
        purpose = find_purpose(b"".join(held))
        if purpose is not None:
            break

    async def again() -> AsyncIterator[bytes]:
        for chunk in held:
            yield chunk
        if not ended:
            async for chunk in chunks:
                yield chunk

    return purpose, again()


__all__ = ["PEEK_LIMIT", "find_purpose", "peek_purpose"]
