"""The key store: API keys and tenants made at runtime through the admin API, kept in Redis or
a SQLite file, served by every replica from memory (docs/spec.md §28).

:mod:`.records` (what a key and a tenant hold, the secrets), :mod:`.sqlite` and :mod:`.redis`
(the two stores, one interface: :class:`.records.RecordStore`), :mod:`.index` (the in-memory
index every request is identified by) and :mod:`.service` (the store, the index and the loop
that keeps the index current: pub/sub plus a version counter).
"""

from gateway.keys.index import KeyIndex
from gateway.keys.records import Conflict, StoreDown, new_secret, prefix_of
from gateway.keys.service import KeyService, build_key_service, store_enabled

__all__ = [
    "Conflict",
    "KeyIndex",
    "KeyService",
    "StoreDown",
    "build_key_service",
    "new_secret",
    "prefix_of",
    "store_enabled",
]
