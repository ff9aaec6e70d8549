"""structlog set-up shared by every kfactory process."""

from __future__ import annotations

import logging
import sys

import structlog

_debug = False


class _TlsCloseNoise(logging.Filter):
    """asyncio warns on every TLS connection nats-py closes; it says nothing about us."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_TlsCloseNoise())


def configure_logging(debug: bool = False, level: int = logging.INFO) -> None:
    """Log to stderr as key=value lines; actors bind campaign, role and instance."""
    global _debug
    _debug = debug
    level = logging.DEBUG if debug else level
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_current_stderr,
        cache_logger_on_first_use=False,
    )


def quiet_logs() -> None:
    """Only warnings and errors (for commands that draw their own progress), unless --debug."""
    if not _debug:
        configure_logging(level=logging.WARNING)


def _current_stderr(*_: object) -> structlog.PrintLogger:
    # Resolved at each use: whoever swapped sys.stderr since (a test runner, a daemon
    # closing its terminal) must not turn a log line into a dead recorder.
    return structlog.PrintLogger(file=sys.stderr)
