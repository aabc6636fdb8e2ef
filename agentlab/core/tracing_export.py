"""An exporter that fails is one warning, never a flood and never the run's end (imported only when tracing is on).

An OTLP exporter whose endpoint does not answer retries each batch of spans with backoff and logs every
retry and every batch it gives up on, from its background thread, for as long as the process lives.
:class:`WarnOnce` wraps the exporter the SDK's autoconfiguration built: the first failure becomes one warning
of the kit's (a Python ``RuntimeWarning``, shown whether or not the application configured logging, naming the
exporter and its reason), the exporter's own warnings and errors are dropped from the log, and the run is never
told (it goes on; the events table keeps the record).

Source: OpenTelemetry Python SDK ``SpanExporter``, ``BatchSpanProcessor``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

EXPORT_FAILED = ("OpenTelemetry: the %s could not export the run's spans (%s); the run goes on, the events table "
                 "keeps the record, and further export failures are not reported")


class _Quiet(logging.Filter):
    """Keeps the exporter's own warnings and errors for the one warning (the first reason), drops them from the log."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if self.reason is None:
            message = record.getMessage()
            self.reason = message if len(message) <= 240 else message[:240] + "..."
        return False


class WarnOnce(SpanExporter):
    """``exporter``, reporting its first failed export as one warning and none after it."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.warned = False
        self.quiet = _Quiet()
        self.loggers = {logging.getLogger(cls.__module__) for cls in type(exporter).__mro__
                        if cls.__module__.startswith("opentelemetry.exporter")}
        for logger in self.loggers:
            logger.addFilter(self.quiet)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception as exc:  # noqa: BLE001 (an exporter's bug must not reach the SDK's worker thread either)
            result, self.quiet.reason = SpanExportResult.FAILURE, self.quiet.reason or f"{type(exc).__name__}: {exc}"
        if result is not SpanExportResult.SUCCESS and not self.warned:
            self.warned = True
            warnings.warn(EXPORT_FAILED % (type(self.exporter).__name__, self.quiet.reason or "no reason given"),
                          RuntimeWarning, stacklevel=1)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)
