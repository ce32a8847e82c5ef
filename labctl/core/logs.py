"""Logging for labctl's long-running services (`labctl agent`, `labctl serve`): one place that sets it up.

Records go to stderr, either as JSON, one object per line (what journald, or any log shipper, stores and
parses: `ts` in RFC 3339 UTC, `level`, `logger`, `msg`, then every `extra=` field of the call, and `exc`
with the traceback of an exception), or as text for a person at a terminal. The default is JSON when
stderr is not a terminal (a service under systemd) and text when it is.

labctl's loggers (`labctl.*`) log at the level asked for; other libraries' loggers (aiomqtt, asyncio) at
warning and above only, so `--log-level debug` is labctl's debug, not every library's.

Nothing logged here is filtered: a caller never passes a secret (a broker password, a signing key) as a
message argument or an extra field.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, Literal, TextIO

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "text"]
LEVELS: Final[tuple[LogLevel, ...]] = ("debug", "info", "warning", "error")
FORMATS: Final[tuple[LogFormat, ...]] = ("json", "text")

# The attributes every LogRecord has: anything else on a record came from the call's `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call added with `extra=` (not those of every record), in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def rfc3339(created: float) -> str:
    """A record's time as RFC 3339 in UTC, to the microsecond: 2025-01-31T12:00:00.123456Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts, level, logger, msg, the call's extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry.setdefault(key, value)  # an extra field never hides one of the four above
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a Path, an enum or a datetime in an extra field is written as its text, not an error.
        return json.dumps(entry, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`2025-01-31 12:00:00,123 INFO labctl.agents: msg (key=value ...)`, for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = extra_fields(record)
        if not extra:
            return text
        head, sep, rest = text.partition("\n")  # the fields go on the message's line, before a traceback
        fields = " ".join(f"{k}={v}" for k, v in extra.items())
        return f"{head} ({fields}){sep}{rest}"


class _Handler(logging.StreamHandler[TextIO]):
    """The handler `setup_logging` installs (and replaces when called again)."""


def default_format(stream: TextIO | None = None) -> LogFormat:
    """JSON when `stream` (default stderr) is not a terminal, text when it is."""
    stream = sys.stderr if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or closed
        return "json"


def setup_logging(
    level: LogLevel = "info", fmt: LogFormat | None = None, *, stream: TextIO | None = None
) -> logging.Handler:
    """Log labctl's records from `level` up, and other libraries' from warning up, to `stream` (default
    stderr) as `fmt` (default: `default_format`). Called again, it replaces what it set up before."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    fmt = default_format(stream) if fmt is None else fmt
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    numeric = logging.getLevelName(level.upper())
    root.setLevel(max(numeric, logging.WARNING))
    logging.getLogger("labctl").setLevel(numeric)
    logging.captureWarnings(True)  # a Python warning is a log record too (logger py.warnings)
    captured = logging.getLogger("py.warnings")
    if not any(isinstance(f, _LibraryDeprecations) for f in captured.filters):
        captured.addFilter(_LibraryDeprecations())
    return handler


class _LibraryDeprecations(logging.Filter):
    """Drops a library's deprecation notice from the log (labctl.core.extras.library_deprecation): a captured
    warning's record is `FILE:LINE: CATEGORY: message`, all the filter has to go by."""

    def filter(self, record: logging.LogRecord) -> bool:
        from labctl.core.extras import is_deprecation_name, library_file

        head = record.getMessage().split(": ", 2)
        if len(head) < 3:
            return True
        location, category = head[0], head[1]
        filename = location.rsplit(":", 1)[0]
        return not (is_deprecation_name(category) and library_file(filename))
