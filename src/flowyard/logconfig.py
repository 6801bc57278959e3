"""Log records as text or as one JSON object per line, with the context they happened in.

``FLOWYARD_LOG_FORMAT``: ``json`` (one object per line: time, level, logger, message,
request id and, where known, flow id, execution id and tenant) or ``text``; default
``text`` when stderr is a terminal, else ``json``. uvicorn's error and access loggers
use the same handler and formatter (``uvicorn_log_config``).

The context lives in context variables: the request middleware sets the request id,
the webhook path the flow id, the worker the flow, execution and tenant around each
execution it runs. Tasks inherit the variables of the code that created them.
"""

from __future__ import annotations

import contextvars
import logging
import logging.config
import sys
import time
from typing import Any

import orjson

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("flowyard_request_id", default=None)
flow_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("flowyard_flow_id", default=None)
execution_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "flowyard_execution_id", default=None
)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("flowyard_tenant", default=None)

_CONTEXT = (("requestId", request_id), ("flowId", flow_id), ("executionId", execution_id), ("tenant", tenant))


def set_execution(flow: str | None, execution: str | None, tenant_id: str | None) -> None:
    """Called by the worker inside the task that runs one execution."""
    flow_id.set(flow)
    execution_id.set(execution)
    tenant.set(tenant_id)


def _message(record: logging.LogRecord) -> str:
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        # client, method, path with query, HTTP version, status. The query string is left out:
        # it is the caller's text, and some callers put credentials there.
        client, method, path, _version, status = record.args
        return f'{client} "{method} {str(path).split("?", 1)[0]}" {status}'
    return record.getMessage()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message(record),
        }
        for key, var in _CONTEXT:
            value = var.get()
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _message(record)
        line = super().formatMessage(record)
        rid = request_id.get()
        eid = execution_id.get()
        if rid:
            line += f" [request {rid}]"
        if eid:
            line += f" [execution {eid}]"
        return line


def resolve_format(value: str | None) -> str:
    if value in ("json", "text"):
        return value
    return "text" if sys.stderr.isatty() else "json"


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def _dict_config(fmt: str, level: str) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "flowyard": {"()": f"{__name__}.{'JsonFormatter' if fmt == 'json' else 'TextFormatter'}"}
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "flowyard",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            # uvicorn's loggers propagate to the root's handler: the same format.
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
        },
    }


def setup(fmt: str | None, level: str) -> str:
    """Configure the process's logging; returns the format used."""
    resolved = resolve_format(fmt)
    logging.config.dictConfig(_dict_config(resolved, level))
    return resolved


def uvicorn_log_config(fmt: str | None, level: str) -> dict[str, Any]:
    """``uvicorn.Config(log_config=...)``: uvicorn applies it at start, so it must describe
    the same handler and formatter as ``setup``."""
    return _dict_config(resolve_format(fmt), level)
