"""The mock's batches (docs/spec.md §24): OpenAI Batches over an uploaded JSONL file and
Anthropic Message Batches, each completing :data:`BATCH_DELAY_S` after it was created with
real per-line results (every line answered by the mock engine), and vector stores over the
backend's files.

A batch is ``in_progress`` until its delay is over; the first look after that runs its lines
and makes its output file (OpenAI: a new file in the backend's files, ``output_file_id``;
Anthropic: ``ended`` and a ``results_url``).
"""

from __future__ import annotations

import time
from typing import Any, Final

import orjson

from gateway.mock.engine import MockReply, reply
from gateway.mock.objects import Files, invalid, missing, new_id, ok, page

#: how long after creation a mock batch completes
BATCH_DELAY_S: Final = 0.3


def _answer(path: str, body: Any) -> tuple[int, Any]:
    """One batch line run by the mock engine: (status, JSON answer)."""
    r = reply("POST", path, orjson.dumps(body))
    return r.status, orjson.loads(r.body) if r.body is not None else None


class Batches:
    """OpenAI ``/batches`` of one mock backend, over its :class:`Files`."""

    def __init__(self, files: Files, delay_s: float = BATCH_DELAY_S) -> None:
        self.files = files
        self.delay_s = delay_s
        self.batches: dict[str, dict[str, Any]] = {}

    def reply(self, method: str, parts: list[str], body: bytes) -> MockReply:
        if len(parts) == 1:
            if method == "GET":
                return page([self._advance(b) for b in reversed(self.batches.values())])
            return self._create(orjson.loads(body or b"{}"))
        batch = self.batches.get(parts[1])
        if batch is None:
            return missing("Batch", parts[1])
        if parts[2:] == ["cancel"] and batch["status"] not in ("completed", "failed"):
            batch.update(status="cancelled", cancelled_at=int(time.time()))
        return ok(self._advance(batch))

    def _create(self, payload: dict[str, Any]) -> MockReply:
        file_id = payload.get("input_file_id")
        if not isinstance(file_id, str) or file_id not in self.files.files:
            return missing("File", str(file_id))
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": payload.get("endpoint", "/v1/chat/completions"),
            "input_file_id": file_id,
            "completion_window": payload.get("completion_window", "24h"),
            "status": "in_progress",
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + 86400,
            "output_file_id": None,
            "error_file_id": None,
            "errors": None,
            "metadata": payload.get("metadata"),
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "_due": time.monotonic() + self.delay_s,
        }
        self.batches[batch["id"]] = batch
        return ok(self._advance(batch))

    def _advance(self, batch: dict[str, Any]) -> dict[str, Any]:
        if batch["status"] == "in_progress" and time.monotonic() >= batch["_due"]:
            lines, failed = [], 0
            data = self.files.files[batch["input_file_id"]].data
            for raw in data.splitlines():
                if not raw.strip():
                    continue
                line = orjson.loads(raw)
                status, answer = _answer(str(line.get("url", "")).removeprefix("/v1"), line["body"])
                failed += status != 200
                lines.append(
                    {
                        "id": new_id("batch_req_"),
                        "custom_id": line.get("custom_id"),
                        "response": {
                            "status_code": status,
                            "request_id": new_id("req_"),
                            "body": answer,
                        },
                        "error": None,
                    }
                )
            out = b"".join(orjson.dumps(x) + b"\n" for x in lines)
            stored = self.files.add(f"{batch['id']}_output.jsonl", "batch_output", out)
            total = len(lines)
            batch.update(
                status="completed",
                output_file_id=stored.id,
                completed_at=int(time.time()),
                request_counts={"total": total, "completed": total - failed, "failed": failed},
            )
        return {k: v for k, v in batch.items() if not k.startswith("_")}


class MessageBatches:
    """Anthropic ``/messages/batches`` of one mock backend."""

    def __init__(self, delay_s: float = BATCH_DELAY_S) -> None:
        self.delay_s = delay_s
        self.batches: dict[str, dict[str, Any]] = {}
        self.results: dict[str, bytes] = {}

    def reply(self, method: str, parts: list[str], body: bytes) -> MockReply:
        if len(parts) == 2:
            if method == "GET":
                return page([self._advance(b) for b in reversed(self.batches.values())])
            return self._create(orjson.loads(body or b"{}"))
        bid = parts[2]
        batch = self.batches.get(bid)
        if batch is None:
            return missing("message batch", bid, anthropic=True)
        rest = parts[3:]
        if method == "DELETE":
            del self.batches[bid]
            self.results.pop(bid, None)
            return ok({"id": bid, "type": "message_batch_deleted"})
        if rest == ["cancel"] and batch["processing_status"] == "in_progress":
            batch.update(processing_status="canceling", cancel_initiated_at=_iso())
        self._advance(batch)
        if rest == ["results"]:
            if bid not in self.results:
                return invalid("the batch has not ended yet")
            return MockReply(200, "application/binary", self.results[bid])
        return ok(self._advance(batch))

    def _create(self, payload: dict[str, Any]) -> MockReply:
        requests = payload.get("requests")
        if not isinstance(requests, list) or not requests:
            return invalid("requests: a non-empty list is required")
        batch: dict[str, Any] = {
            "id": new_id("msgbatch_"),
            "type": "message_batch",
            "processing_status": "in_progress",
            "request_counts": {
                "processing": len(requests),
                "succeeded": 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            },
            "created_at": _iso(),
            "expires_at": _iso(86400),
            "ended_at": None,
            "cancel_initiated_at": None,
            "archived_at": None,
            "results_url": None,
            "_requests": requests,
            "_due": time.monotonic() + self.delay_s,
        }
        self.batches[batch["id"]] = batch
        return ok(self._advance(batch))

    def _advance(self, batch: dict[str, Any]) -> dict[str, Any]:
        status = batch["processing_status"]
        if status != "ended" and (status == "canceling" or time.monotonic() >= batch["_due"]):
            counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
            lines = []
            for request in batch["_requests"]:
                if status == "canceling":
                    result: dict[str, Any] = {"type": "canceled"}
                else:
                    code, answer = _answer("/messages", request.get("params", {}))
                    result = (
                        {"type": "succeeded", "message": answer}
                        if code == 200
                        else {"type": "errored", "error": answer}
                    )
                counts[result["type"]] += 1
                lines.append({"custom_id": request.get("custom_id"), "result": result})
            self.results[batch["id"]] = b"".join(orjson.dumps(x) + b"\n" for x in lines)
            batch.update(
                processing_status="ended",
                ended_at=_iso(),
                request_counts=counts,
                results_url=f"https://api.anthropic.com/v1/messages/batches/{batch['id']}/results",
            )
        return {k: v for k, v in batch.items() if not k.startswith("_")}


def _iso(ahead_s: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ahead_s))


class VectorStores:
    """``/vector_stores`` of one mock backend: stores over its files, a substring search."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.stores: dict[str, dict[str, Any]] = {}
        self.members: dict[str, list[str]] = {}

    def reply(self, method: str, parts: list[str], body: bytes) -> MockReply:
        payload = orjson.loads(body) if body else {}
        if len(parts) == 1:
            if method == "GET":
                return page(list(reversed(self.stores.values())))
            return self._create(payload)
        vid = parts[1]
        store = self.stores.get(vid)
        if store is None:
            return missing("vector store", vid)
        rest = parts[2:]
        if not rest:
            if method == "DELETE":
                del self.stores[vid], self.members[vid]
                return ok({"id": vid, "object": "vector_store.deleted", "deleted": True})
            return ok(store)
        if rest[0] == "search":
            return self._search(vid, payload)
        if rest[0] in ("files", "file_batches") and method == "POST":
            ids = payload.get("file_ids") or [payload.get("file_id")]
            unknown = [i for i in ids if i not in self.files.files]
            if unknown:
                return missing("File", str(unknown[0]))
            self.members[vid].extend(ids)
            self._count(vid)
            if rest[0] == "files":
                return ok(self._file(vid, ids[0]))
            return ok(
                {
                    "id": new_id("vsfb_"),
                    "object": "vector_store.file_batch",
                    "vector_store_id": vid,
                    "status": "completed",
                    "created_at": int(time.time()),
                    "file_counts": store["file_counts"],
                }
            )
        return page([self._file(vid, f) for f in self.members[vid]])

    def _create(self, payload: dict[str, Any]) -> MockReply:
        ids = payload.get("file_ids") or []
        unknown = [i for i in ids if i not in self.files.files]
        if unknown:
            return missing("File", str(unknown[0]))
        store: dict[str, Any] = {
            "id": new_id("vs_"),
            "object": "vector_store",
            "created_at": int(time.time()),
            "name": payload.get("name"),
            "usage_bytes": 0,
            "status": "completed",
            "last_active_at": int(time.time()),
            "metadata": payload.get("metadata"),
            "file_counts": {},
        }
        self.stores[store["id"]] = store
        self.members[store["id"]] = list(ids)
        self._count(store["id"])
        return ok(store)

    def _count(self, vid: str) -> None:
        n = len(self.members[vid])
        self.stores[vid]["file_counts"] = {
            "in_progress": 0,
            "completed": n,
            "failed": 0,
            "cancelled": 0,
            "total": n,
        }

    def _file(self, vid: str, file_id: str) -> dict[str, Any]:
        return {
            "id": file_id,
            "object": "vector_store.file",
            "vector_store_id": vid,
            "status": "completed",
            "created_at": int(time.time()),
            "usage_bytes": 0,
            "last_error": None,
        }

    def _search(self, vid: str, payload: dict[str, Any]) -> MockReply:
        query = str(payload.get("query", ""))
        hits = []
        for file_id in self.members[vid]:
            stored = self.files.files.get(file_id)
            if stored is None:
                continue
            text = stored.data.decode("utf-8", "replace")
            if query.lower() in text.lower():
                hits.append(
                    {
                        "file_id": file_id,
                        "filename": stored.filename,
                        "score": 1.0,
                        "attributes": {},
                        "content": [{"type": "text", "text": text[:500]}],
                    }
                )
        return ok(
            {
                "object": "vector_store.search_results.page",
                "search_query": [query],
                "data": hits,
                "has_more": False,
                "next_page": None,
            }
        )
