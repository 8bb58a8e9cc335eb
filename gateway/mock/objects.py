"""The mock's stored objects (docs/spec.md §24): files, uploads, conversations and vector
stores, kept in memory per mock backend — so a call that reaches the wrong backend gets the
404 a real provider would give.

Shapes follow what the official SDKs parse: OpenAI's ``file``, ``upload``, ``conversation``,
``vector_store`` objects, and Anthropic's Files API (beta) metadata when the request carries
``anthropic-version`` (or ``anthropic-beta: files-api-…``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.mock.engine import MockReply

_JSON = "application/json"
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?')
_DISPOSITION = re.compile(rb'name="([^"]*)"(?:; filename="([^"]*)")?')


def new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def ok(obj: Any, status: int = 200) -> MockReply:
    return MockReply(status, _JSON, orjson.dumps(obj))


def missing(kind: str, object_id: str, anthropic: bool = False) -> MockReply:
    """The 404 of an id this backend does not hold, in the API's error shape."""
    message = f"No such {kind} object: {object_id}"
    if anthropic:
        body: Any = {"type": "error", "error": {"type": "not_found_error", "message": message}}
    else:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return MockReply(404, _JSON, orjson.dumps(body))


def invalid(message: str) -> MockReply:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return MockReply(400, _JSON, orjson.dumps(body))


def page(data: list[dict[str, Any]]) -> MockReply:
    return ok(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }
    )


def form_parts(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body: name -> (filename, value)."""
    found = _BOUNDARY.search(content_type)
    if found is None:
        return {}
    parts: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + found.group(1).encode())[1:]:
        head, sep, value = part.partition(b"\r\n\r\n")
        disposition = _DISPOSITION.search(head)
        if not sep or disposition is None:
            continue
        filename = disposition.group(2)
        parts[disposition.group(1).decode()] = (
            filename.decode() if filename is not None else None,
            value.removesuffix(b"\r\n"),
        )
    return parts


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }

    def anthropic(self) -> dict[str, Any]:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at))
        return {
            "id": self.id,
            "type": "file",
            "filename": self.filename,
            "mime_type": "application/octet-stream",
            "size_bytes": len(self.data),
            "created_at": when,
            "downloadable": True,
        }


class Files:
    """``/files`` and ``/uploads`` of one mock backend."""

    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}
        self.uploads: dict[str, dict[str, Any]] = {}
        self.parts: dict[str, bytes] = {}

    def add(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile(new_id("file-"), filename, purpose, data)
        self.files[stored.id] = stored
        return stored

    def reply(
        self, method: str, parts: list[str], content_type: str, body: bytes, anthropic: bool
    ) -> MockReply:
        shape = StoredFile.anthropic if anthropic else StoredFile.openai
        if len(parts) == 1:
            if method == "GET":
                return page([shape(f) for f in reversed(self.files.values())])
            form = form_parts(content_type, body)
            if "file" not in form:
                return invalid("a multipart form with a 'file' part is required")
            filename, data = form["file"]
            purpose = form.get("purpose", (None, b"user_data"))[1].decode()
            return ok(shape(self.add(filename or "upload", purpose, data)))
        stored = self.files.get(parts[1])
        if stored is None:
            return missing("File", parts[1], anthropic)
        if parts[2:] == ["content"]:
            return MockReply(200, "application/octet-stream", stored.data)
        if method == "DELETE":
            del self.files[stored.id]
            kind = "file_deleted" if anthropic else "file"
            return ok({"id": stored.id, "object": kind, "type": kind, "deleted": True})
        return ok(shape(stored))

    def upload(self, method: str, parts: list[str], content_type: str, body: bytes) -> MockReply:
        if len(parts) == 1:
            payload = orjson.loads(body or b"{}")
            created: dict[str, Any] = {
                "id": new_id("upload_"),
                "object": "upload",
                "bytes": payload.get("bytes", 0),
                "created_at": int(time.time()),
                "expires_at": int(time.time()) + 3600,
                "filename": payload.get("filename", "upload"),
                "purpose": payload.get("purpose", "user_data"),
                "status": "pending",
                "file": None,
            }
            self.uploads[created["id"]] = created
            return ok(created)
        upload = self.uploads.get(parts[1])
        if upload is None:
            return missing("Upload", parts[1])
        action = parts[2] if len(parts) > 2 else ""
        if action == "parts":
            part_id = new_id("part_")
            self.parts[part_id] = form_parts(content_type, body).get("data", (None, b""))[1]
            return ok(
                {
                    "id": part_id,
                    "object": "upload.part",
                    "created_at": int(time.time()),
                    "upload_id": upload["id"],
                }
            )
        if action == "complete":
            ids = orjson.loads(body or b"{}").get("part_ids", [])
            data = b"".join(self.parts.pop(i, b"") for i in ids)
            stored = self.add(upload["filename"], upload["purpose"], data)
            upload.update(status="completed", file=stored.openai())
        elif action == "cancel":
            upload["status"] = "cancelled"
        return ok(upload)


class Conversations:
    """``/conversations`` and their items, of one mock backend."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.meta: dict[str, dict[str, Any]] = {}

    def has(self, conversation_id: str) -> bool:
        return conversation_id in self.meta

    def add_items(self, conversation_id: str, items: Any) -> list[dict[str, Any]]:
        added = []
        for item in items if isinstance(items, list) else [{"role": "user", "content": items}]:
            if not isinstance(item, dict):
                continue
            if item.get("type", "message") != "message":  # tool calls, outputs: kept as sent
                added.append({**item, "id": item.get("id") or new_id("item_")})
                continue
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            added.append(
                {
                    "id": new_id("msg_"),
                    "type": "message",
                    "role": item.get("role", "user"),
                    "status": "completed",
                    "content": content,
                }
            )
        self.items[conversation_id].extend(added)
        return added

    def reply(self, method: str, parts: list[str], body: bytes) -> MockReply:
        payload = orjson.loads(body) if body else {}
        if len(parts) == 1:
            new: dict[str, Any] = {
                "id": new_id("conv_"),
                "object": "conversation",
                "created_at": int(time.time()),
                "metadata": payload.get("metadata") or {},
            }
            self.meta[new["id"]] = new
            self.items[new["id"]] = []
            self.add_items(new["id"], payload.get("items") or [])
            return ok(new)
        cid = parts[1]
        conv = self.meta.get(cid)
        if conv is None:
            return missing("Conversation", cid)
        if parts[2:] == ["items"]:
            if method == "POST":
                added = self.add_items(cid, payload.get("items") or [])
                return ok(
                    {
                        "object": "list",
                        "data": added,
                        "has_more": False,
                        "first_id": None,
                        "last_id": None,
                    }
                )
            return page(self.items[cid])
        if method == "DELETE":
            del self.meta[cid], self.items[cid]
            return ok({"id": cid, "object": "conversation.deleted", "deleted": True})
        if method == "POST" and isinstance(payload.get("metadata"), dict):
            conv["metadata"] = payload["metadata"]
        return ok(conv)
