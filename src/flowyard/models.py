"""The complete metadata: importing this registers every domain's tables (above them all:
the migrations and the tests start here; ``db/`` keeps engines, sessions, dialect and ``Base``)."""

from __future__ import annotations

from typing import Any

from flowyard.db.base import Base
from flowyard.flows import models as _flows  # noqa: F401
from flowyard.iam import models as _iam  # noqa: F401
from flowyard.logs import models as _logs  # noqa: F401
from flowyard.queue import heartbeat as _heartbeat  # noqa: F401
from flowyard.queue import models as _executions  # noqa: F401
from flowyard.queue import rate_buckets as _rate_buckets  # noqa: F401
from flowyard.queue import trigger_lease as _engine  # noqa: F401
from flowyard.secrets import models as _secrets  # noqa: F401
from flowyard.templates import models as _templates  # noqa: F401

metadata = Base.metadata

# Search indexes that SQLAlchemy's metadata cannot describe (migrations 0008 and 0023): the FTS5
# tables on SQLite (each with its shadow tables ``<name>_data``, ``_idx``, ``_content``,
# ``_docsize``, ``_config``, its key table ``<name>_keys`` and its triggers) and the ``pg_trgm``
# GIN indexes on PostgreSQL. Alembic's comparison with the models leaves them out; nothing else
# may create or drop them.
SEARCH_TABLES = ("flows_search", "templates_search")
SEARCH_INDEXES = frozenset(
    {
        "ix_flows_name_lc_trgm",
        "ix_flows_description_lc_trgm",
        "ix_templates_name_lc_trgm",
        "ix_templates_description_lc_trgm",
    }
)


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic ``include_object``: everything except the search objects above."""
    if type_ == "table" and name and any(name == t or name.startswith(t + "_") for t in SEARCH_TABLES):
        return False
    return not (type_ == "index" and name in SEARCH_INDEXES)
