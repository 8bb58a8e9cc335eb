"""``tracing.exporter = "console"``: each span as one JSON line on stdout."""

from __future__ import annotations

import json
import sys
from typing import IO

from gateway.telemetry.export.settings import EncodedBatch


class ConsoleExporter:
    """Prints each exported span as one JSON line (decoded by the official proto classes)."""

    endpoint = "console"
    protocol = "console"

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out or sys.stdout

    def export(self, batch: EncodedBatch) -> bool:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        req = ExportTraceServiceRequest.FromString(batch.data)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self._out.write(json.dumps(MessageToDict(s)) + "\n")
        self._out.flush()
        return True

    def shutdown(self) -> None:
        return None
