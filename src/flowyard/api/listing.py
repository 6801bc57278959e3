"""List parameters: ``page[size]``, ``page[number]``, ``sort``, ``search``, ``filter[...]``.

Parsed from the raw query string so bracketed names work and unknown
``filter[...]`` keys are refused instead of silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import sqlalchemy as sa
from fastapi import Query, Request
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from flowyard.errors import InvalidInput, Problem

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 10
_INTEGER = re.compile(r"-?[0-9]{1,20}")


@dataclass(frozen=True)
class ListQuery:
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE
    sort: str | None = None
    search: str | None = None
    filters: dict[str, str] = field(default_factory=dict)

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.size


def _int_param(
    raw: str | None, name: str, default: int, lo: int, hi: int | None
) -> tuple[int, Problem | None]:
    if raw is None:
        return default, None
    # int() would also take " 2", "1_000" and non-ASCII (e.g. fullwidth) digits.
    if not _INTEGER.fullmatch(raw):
        return default, Problem(f"{name} must be an integer.", name)
    value = int(raw)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        return default, Problem(f"{name} must be {bound}.", name)
    return value, None


def parse_list_query(
    request: Request,
    *,
    filters: frozenset[str] = frozenset(),
    sorts: frozenset[str] = frozenset(),
    paged: bool = True,
    searchable: bool = False,
) -> ListQuery:
    params = request.query_params
    problems: list[Problem] = []
    # PostgreSQL cannot compare text with U+0000 in it; refuse it on both databases alike.
    for key, value in params.multi_items():
        if "\x00" in key or "\x00" in value:
            problems.append(
                Problem("Query parameters must not contain NUL characters.", key.replace("\x00", ""))
            )
    # Given twice, one of the values would be silently ignored (as for filter[...] below).
    for key in ("page[size]", "page[number]", "sort", "search"):
        if len(params.getlist(key)) > 1:
            problems.append(Problem(f"{key} given more than once.", key))
    page = size = 0
    if paged:
        # Pages past 10**9 cannot exist and would overflow OFFSET on some databases.
        page, p1 = _int_param(params.get("page[number]"), "page[number]", 1, 1, 10**9)
        size, p2 = _int_param(params.get("page[size]"), "page[size]", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        problems += [p for p in (p1, p2) if p]
    sort = params.get("sort")
    if sort is not None and sorts and sort.removeprefix("-") not in sorts:
        allowed = ", ".join(sorted(sorts))
        problems.append(Problem(f"sort must be one of {allowed}, optionally prefixed with '-'.", "sort"))
        sort = None
    search = params.get("search") if searchable else None
    if search is not None and len(search) > 500:
        problems.append(Problem("search must be at most 500 characters.", "search"))
    found: dict[str, str] = {}
    for key, value in params.multi_items():
        if key.startswith("filter[") or key.startswith("filter%5B"):
            name = key[7:-1] if key.endswith("]") else None
            if name is None or name not in filters:
                allowed = ", ".join(f"filter[{f}]" for f in sorted(filters)) or "none"
                problems.append(Problem(f"Unknown filter {key}. Allowed: {allowed}.", key))
            elif name in found:
                problems.append(Problem(f"{key} given more than once.", key))
            else:
                found[name] = value
        elif key.startswith("page[") and key not in ("page[size]", "page[number]"):
            problems.append(Problem(f"Unknown paging parameter {key}.", key))
    if problems:
        raise InvalidInput(problems)
    return ListQuery(
        page=page or 1, size=size or DEFAULT_PAGE_SIZE, sort=sort, search=search or None, filters=found
    )


def like_pattern(text: str) -> str:
    """A LIKE pattern matching ``text`` literally anywhere (``\\`` is the escape)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


Sortable = sa.ColumnElement[Any] | InstrumentedAttribute[Any]

# Trigram indexes (FTS5 ``trigram`` on SQLite, ``pg_trgm`` on PostgreSQL) cannot answer a
# search shorter than one trigram: those are served by the plain scan.
MIN_INDEXED_SEARCH = 3


def search_clause(
    dialect: str,
    search: str,
    *,
    id_col: Sortable,
    name_lc: Sortable,
    description_lc: Sortable,
    fts_table: str,
) -> sa.ColumnElement[bool]:
    """SPEC §1 ``search``: a literal, case-insensitive substring of the name or the description.

    The one rule, the same on both databases: ``search.lower()`` (Python's full Unicode
    lower-casing) is a substring of ``name.lower()`` or ``description.lower()``, which the
    ``*_lc`` columns hold. The escaped ``LIKE`` below *is* that rule; an index only narrows the
    rows it is checked on, so the answer is the same with or without it:

    - PostgreSQL: GIN ``gin_trgm_ops`` indexes on ``name_lc`` and ``description_lc`` (migration
      0008) serve this very ``LIKE`` (bitmap scan, then the ``LIKE`` re-checked on each row).
    - SQLite: the ``fts_table`` FTS5 table (``trigram``, case-sensitive, over the already
      lower-cased copies, kept in step by triggers) gives the candidates of a phrase query;
      the ``LIKE`` then confirms them on the copies it holds.
    """
    text = search.lower()
    pattern = like_pattern(text)

    def exact(name: Sortable, description: Sortable) -> sa.ColumnElement[bool]:
        return sa.or_(name.like(pattern, escape="\\"), description.like(pattern, escape="\\"))

    if len(text) < MIN_INDEXED_SEARCH and dialect == "postgresql":
        # No trigram to look up: a GIN scan would read the whole index (a member's "sh" took
        # 600 ms against 120 ms for the scan at 100,000 flows, bench/search.py), so the
        # columns are wrapped in an expression no index covers; the result is the same.
        unindexed: sa.ColumnElement[str] = sa.literal_column("''")
        return exact(name_lc.concat(unindexed), description_lc.concat(unindexed))
    if len(text) < MIN_INDEXED_SEARCH or dialect != "sqlite":
        return exact(name_lc, description_lc)
    matching = search_ids(dialect, search, fts_table=fts_table)
    assert matching is not None
    return id_col.in_(matching)


def _search_tables(fts_table: str) -> tuple[sa.TableClause, sa.TableClause]:
    fts = sa.table(fts_table, sa.column("rowid"))
    keys = sa.table(f"{fts_table}_keys", sa.column("key"), sa.column("id"))
    return fts, keys


def _phrase(text: str) -> str:
    # An FTS5 string (phrase) matches its text literally; only '"' needs doubling. With the
    # trigram tokenizer a phrase of three characters or more is a run of consecutive trigrams,
    # that is, exactly a substring of one column: no LIKE re-check reads the text again.
    return '"' + text.replace('"', '""') + '"'


def _phrase_match(fts_table: str, phrase: Any) -> sa.ColumnElement[bool]:
    return sa.literal_column(fts_table).op("MATCH")(phrase)


def search_ids(dialect: str, search: str, *, fts_table: str) -> sa.Select[Any] | None:
    """On SQLite, for a query of a trigram or more: the ids of every row ``search`` matches,
    under the same rule as ``search_clause``, from the search index alone (the FTS5 table's
    rowids, each the key of one narrow ``<fts_table>_keys`` row; migration 0023); None where
    there is no such index (PostgreSQL, short queries). Never reads the (large) rows."""
    text = search.lower()
    if dialect != "sqlite" or len(text) < MIN_INDEXED_SEARCH:
        return None
    fts, keys = _search_tables(fts_table)
    return (
        sa.select(keys.c.id)
        .select_from(fts.join(keys, keys.c.key == fts.c.rowid))
        .where(_phrase_match(fts_table, _phrase(text)))
    )


def keyed_search(dialect: str, search: str) -> bool:
    """Whether ``keyed_search_page`` can answer ``search`` (SQLite, a trigram or more)."""
    return dialect == "sqlite" and len(search.lower()) >= MIN_INDEXED_SEARCH


# Migration 0023: a search key is its id's creation second times 2^31 plus a rank within the
# second, so key order is id order second by second.
SEARCH_KEY_SPAN = 1 << 31


def keyed_search_page(
    fts_table: str, where_id: Callable[[sa.ColumnElement[Any]], sa.ColumnElement[bool]] | None
) -> tuple[sa.Select[Any], sa.ScalarSelect[int]]:
    """The statements of a search on SQLite (``keyed_search``) whose page is in id order: the
    page's ids (in id order) and how many matches were read, up to ``bounded_rows``, which
    ``bounded_count`` turns into the total; both of what the search index and ``where_id``
    keep. Built once per shape, with bind parameters (``keyed_search_params``, and those of
    ``where_id``): building it per request cost more CPU than running it.

    The search index gives its candidates in key order, which is id order second by second
    (migration 0023), so the walk stops after ``bounded_rows`` matches whatever the
    catalogue's size; the rest of the last second it reached is added (its ids may sort before
    ones read), and the page is cut from that in id order. Only the page's rows leave SQLite:
    handing ~1,000 rows to Python cost more than the walk (with 16 searches at once, each
    row's step through the sqlite3 module's GIL handover: 22 against 9 ms of CPU)."""
    fts, keys = _search_tables(fts_table)
    walk = (
        sa.select(keys.c.key, keys.c.id)
        .select_from(fts.join(keys, keys.c.key == fts.c.rowid))
        .where(_phrase_match(fts_table, sa.bindparam("search_phrase", type_=sa.String)))
    )
    if where_id is not None:
        walk = walk.where(where_id(keys.c.id))
    rows = sa.bindparam("search_rows", type_=sa.Integer)
    read = walk.order_by(fts.c.rowid).limit(rows).cte("walked").prefix_with("MATERIALIZED")
    count = sa.select(sa.func.count()).select_from(read).scalar_subquery()
    top = sa.select(sa.func.max(read.c.key)).scalar_subquery()
    rest = walk.where(fts.c.rowid > top, fts.c.rowid < top - top % SEARCH_KEY_SPAN + SEARCH_KEY_SPAN)
    found = sa.union_all(sa.select(read.c.id), rest.with_only_columns(keys.c.id)).subquery("found")
    limit = sa.bindparam("page_limit", type_=sa.Integer)
    offset = sa.bindparam("page_offset", type_=sa.Integer)
    return sa.select(found.c.id).order_by(found.c.id).limit(limit).offset(offset), count


def keyed_search_candidates(fts_table: str) -> sa.Select[Any]:
    """How many rows the search index has for ``search_phrase``, counted up to
    ``candidate_rows`` (from the index alone; what a walk would check, before any filter)."""
    fts, _keys = _search_tables(fts_table)
    limit = sa.bindparam("candidate_rows", type_=sa.Integer)
    phrase = _phrase_match(fts_table, sa.bindparam("search_phrase", type_=sa.String))
    found = sa.select(fts.c.rowid).where(phrase).limit(limit).subquery("candidates")
    return sa.select(sa.func.count().label("candidates")).select_from(found)


def keyed_search_params(search: str, *, offset: int, size: int) -> dict[str, Any]:
    """The values of ``keyed_search_page``'s own parameters."""
    return {
        "search_phrase": _phrase(search.lower()),
        "search_rows": bounded_rows(offset, size),
        "page_limit": size,
        "page_offset": offset,
    }


def order_by(
    sort: str | None, columns: Mapping[str, Sortable], id_col: Sortable
) -> list[sa.UnaryExpression[Any]]:
    """The ORDER BY for ``sort``; ties broken by id ascending (default: id ascending)."""
    if not sort:
        return [id_col.asc()]
    col = columns[sort.lstrip("-")]
    return [col.desc() if sort.startswith("-") else col.asc(), id_col.asc()]


# Documentation-only parameters: declared so OpenAPI shows the bracketed names.
PageSize = Annotated[
    int | None,
    Query(alias="page[size]", ge=1, le=MAX_PAGE_SIZE, description="Objects per page (1..1000), default 10."),
]
PageNumber = Annotated[
    int | None, Query(alias="page[number]", ge=1, le=10**9, description="1-based page number, default 1.")
]
Search = Annotated[
    str | None,
    Query(
        alias="search",
        max_length=500,
        description="Case-insensitive literal substring of the name or description.",
    ),
]


Row = TypeVar("Row")

# The lists over the history (executions, logs), and the flow lists with ``search`` or
# ``filter[user]``, count ``meta.total`` up to this many rows past the start of the page, never
# everything that matches (docs/api.md "Totals of the lists").
TOTAL_BOUND = 1_000


def bounded_rows(offset: int, size: int) -> int:
    """How many rows of what matches, in the list's order, a page and its bounded total need:
    one past the bound (or past the page, were a page longer than the bound)."""
    return max(offset + TOTAL_BOUND, offset + size) + 1


def bounded_count(read: int, *, offset: int, size: int) -> tuple[int, bool]:
    """``meta.total`` and ``meta.totalExact`` from how many rows of what matches were read, up
    to ``bounded_rows(offset, size)``: exact only if every match was read and they are at most
    ``offset + TOTAL_BOUND``; else that bound."""
    cap = offset + TOTAL_BOUND
    exact = read < bounded_rows(offset, size) and read <= cap
    return (read if exact else cap), exact


@dataclass(frozen=True)
class Total:
    """``meta.total`` of a history list: ``count``, whether it is ``exact``, and which of the
    counted arms may hold rows (``used``: those that had some, or were not reached)."""

    count: int
    exact: bool
    used: tuple[int, ...]


async def bounded_total(session: AsyncSession, arms: Sequence[sa.Select[Any]], *, offset: int) -> Total:
    """How many rows the disjoint ``arms`` select, counted up to ``offset + TOTAL_BOUND``:
    exact when that is all of them, else ``offset + TOTAL_BOUND`` and not exact. Each arm is
    read through ``LIMIT`` (from its index: the arms select indexed columns only), so the
    cost is bounded however long the history."""
    cap = offset + TOTAL_BOUND
    counted = 0
    used: list[int] = []
    for i, arm in enumerate(arms):
        if counted > cap:
            used.append(i)
            continue
        limited = arm.limit(cap + 1 - counted).subquery()
        n = await session.scalar(sa.select(sa.func.count()).select_from(limited)) or 0
        counted += n
        if n:
            used.append(i)
    if counted > cap:
        return Total(cap, False, tuple(used))
    return Total(counted, True, tuple(used))


async def id_page(
    session: AsyncSession, model: type[Row], *where: Any, limit: int, offset: int
) -> tuple[Sequence[Row], int]:
    """One page of ``model`` rows matching ``where`` in id order, and how many match in all."""
    total = await session.scalar(sa.select(sa.func.count()).select_from(model).where(*where)) or 0
    if total == 0 or offset >= total:
        return [], total
    rows = await session.scalars(
        sa.select(model).where(*where).order_by(model.id).offset(offset).limit(limit)  # type: ignore[attr-defined]
    )
    return rows.all(), total
