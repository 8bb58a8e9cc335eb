"""The in-memory index of the key store (docs/spec.md §28): what each request is identified
by, with no store round trip.

Records replace each other only by a higher version (the store's counter orders every write),
so a late or repeated copy of a record never undoes a newer one; a deleted record stays as a
tombstone for the same reason. :attr:`KeyIndex.by_digest` maps the sha256 of each live secret
(the current one, and a rotated one until its grace ends) to its key record;
:attr:`KeyIndex.generation` moves with every change (what the auth hop's cache of built
entries is checked against).
"""

from __future__ import annotations

import math

from gateway.keys.records import Record, field_of

#: the digest's slot: (key record, the time its secret stops working: inf for the current one)
Slot = tuple[Record, float]


class KeyIndex:
    __slots__ = ("by_digest", "epoch", "generation", "records", "seen")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (the store lost its data: a Redis restarted without AOF)."""
        #: "k:<id>" / "t:<name>" -> the newest record seen (tombstones included)
        self.records: dict[str, Record] = {}
        self.by_digest: dict[bytes, Slot] = {}
        #: the highest version applied
        self.seen = 0
        #: the store's epoch the records were read from (None: not read yet)
        self.epoch: str | None = None
        self.generation = getattr(self, "generation", 0) + 1

    def apply(self, record: Record, read: bool = False) -> bool:
        """Take ``record`` if it is newer than the one held; whether it was. ``read``: it came
        from a read of everything since :attr:`seen` (only such a read may move it)."""
        name = field_of(record)
        version = int(record["version"])
        if read:
            self.seen = max(self.seen, version)
        held = self.records.get(name)
        if held is not None and int(held["version"]) >= version:
            return False
        self.records[name] = record
        if record["kind"] == "key":
            self._digests(held, record)
        self.generation += 1
        return True

    def _digests(self, held: Record | None, record: Record) -> None:
        if held is not None:
            for digest in _digests(held):
                self.by_digest.pop(digest, None)
        if record.get("deleted"):
            return
        self.by_digest[bytes.fromhex(record["digest"])] = (record, math.inf)
        for old, until in record.get("old", ()):
            self.by_digest[bytes.fromhex(old)] = (record, float(until))

    def key_records(self) -> list[Record]:
        return [r for r in self.records.values() if r["kind"] == "key" and not r.get("deleted")]

    def tenant_records(self) -> list[Record]:
        return [r for r in self.records.values() if r["kind"] == "tenant" and not r.get("deleted")]

    def get(self, name: str) -> Record | None:
        record = self.records.get(name)
        return None if record is None or record.get("deleted") else record


def _digests(record: Record) -> list[bytes]:
    found = [] if record.get("deleted") else [bytes.fromhex(record["digest"])]
    return found + [bytes.fromhex(old) for old, _ in record.get("old", ())]


__all__ = ["KeyIndex", "Slot"]
