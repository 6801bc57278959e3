"""The rule's owner, ``isolate.py``, on its own: which items are settled, which are
handed back, and how many transactions a poison item costs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from flowyard import isolate
from flowyard.errors import StorageUnavailable


class Store:
    """A stand-in for a transaction: ``run`` commits a batch unless it holds a poison item
    (or the storage is down)."""

    def __init__(self, poison: set[int], *, down_after: int | None = None) -> None:
        self.poison = poison
        self.down_after = down_after
        self.committed: list[int] = []
        self.refused: list[tuple[int, str]] = []
        self.runs = 0

    async def run(self, batch: Sequence[int]) -> None:
        self.runs += 1
        if self.down_after is not None and self.runs > self.down_after:
            raise StorageUnavailable()
        if self.poison & set(batch):
            raise ValueError(f"cannot store {sorted(self.poison & set(batch))}")
        self.committed += batch

    async def on_poison(self, item: int, exc: BaseException) -> None:
        self.refused.append((item, isolate.reason(exc)))


async def test_poison_items_fail_alone_and_the_rest_commits() -> None:
    store = Store({3, 40})
    left = await isolate.bisect(list(range(64)), store.run, store.on_poison)
    assert left.items == [] and left.error is None
    assert sorted(store.committed) == [i for i in range(64) if i not in (3, 40)]
    assert store.refused == [(3, "ValueError: cannot store [3]"), (40, "ValueError: cannot store [40]")]


async def test_a_batch_without_poison_is_one_transaction() -> None:
    store = Store(set())
    await isolate.bisect(list(range(256)), store.run, store.on_poison)
    assert store.runs == 1 and len(store.committed) == 256


async def test_one_poison_costs_about_two_log2_n_transactions() -> None:
    store = Store({100})
    await isolate.bisect(list(range(256)), store.run, store.on_poison)
    assert store.runs <= 2 * 8 + 1
    assert len(store.committed) == 255


async def test_a_transient_failure_is_not_bisected_and_nothing_is_made_poison() -> None:
    store = Store(set(), down_after=0)
    left = await isolate.bisect(list(range(8)), store.run, store.on_poison)
    assert store.runs == 1 and store.refused == [] and store.committed == []
    assert left.items == list(range(8)) and isinstance(left.error, StorageUnavailable)


async def test_what_a_transient_failure_interrupts_is_handed_back_in_order() -> None:
    store = Store({0}, down_after=3)  # [0..7] fails, [0..3] fails, [0, 1] fails, then down
    left = await isolate.bisect(list(range(8)), store.run, store.on_poison)
    assert store.committed == [] and store.refused == []
    assert left.items == list(range(8))


async def test_when_settling_a_poison_fails_it_and_the_rest_are_handed_back() -> None:
    store = Store({5})

    async def on_poison(item: int, exc: BaseException) -> None:
        raise StorageUnavailable()

    left = await isolate.bisect(list(range(8)), store.run, on_poison)
    assert sorted(store.committed) == [0, 1, 2, 3, 4], "what came before is committed"
    assert left.items == [5, 6, 7]


def test_each_leaves_out_the_items_whose_work_raises() -> None:
    refused: list[str] = []
    done = isolate.each(["1", "x", "3"], int, lambda item, exc: refused.append(item))
    assert done == [("1", 1), ("3", 3)] and refused == ["x"]


def test_the_reason_never_carries_a_statement_or_its_parameters() -> None:
    import sqlalchemy as sa

    exc = sa.exc.StatementError(
        "boom", "UPDATE executions SET result=?", {"secret": "s3cr3t"}, TypeError("bad")
    )
    assert isolate.reason(exc) == "TypeError: bad"


def test_postgres_deadlocks_and_serialization_failures_are_transient() -> None:
    import sqlalchemy as sa

    class DriverError(Exception):
        def __init__(self, sqlstate: str) -> None:
            super().__init__(sqlstate)
            self.sqlstate = sqlstate

    def error(state: str) -> sa.exc.DBAPIError:
        return sa.exc.DBAPIError("UPDATE ...", {}, DriverError(state))

    assert isolate.is_transient(error("40P01")) and isolate.is_transient(error("40001"))
    assert isolate.is_transient(error("57014")) and isolate.is_transient(error("08006"))
    assert not isolate.is_transient(error("P0001")), "a raised exception is the row's"
    assert not isolate.is_transient(error("22P02")), "invalid text representation is the row's"
    assert not isolate.is_transient(TypeError("Recursion limit reached"))


async def test_write_alone_tries_as_it_is_then_uncounted_and_lets_transient_failures_through() -> None:
    tried: list[bool] = []

    def writer(fails: set[bool], exc: Exception | None = None) -> Any:
        async def write(count: bool) -> None:
            tried.append(count)
            if count in fails:
                raise exc or ValueError("bad")

        return write

    assert await isolate.write_alone(writer(set())) is True and tried == [True]
    tried.clear()
    assert await isolate.write_alone(writer({True})) is False and tried == [True, False]
    tried.clear()
    assert await isolate.write_alone(writer({True, False})) is None and tried == [True, False]
    tried.clear()
    with pytest.raises(StorageUnavailable):
        await isolate.write_alone(writer({True}, StorageUnavailable()))
    assert tried == [True], "a transient failure is not retried uncounted"
