"""Placement and blame (``flowyard.runtime.placement``) under random interleavings.

A model pool drives the real placement rules: executions of several tenants arrive, some of
them bombs (a CPU burner, or a memory bomb that kills its runner whichever execution its
slot happens to name), runners come up, executions finish, runners die of the bombs aboard,
time passes. Whatever the order:

- an execution that is not a bomb never fails (neither as a culprit nor as "died N times");
- a runner never holds executions of two tenants at once, and a runner holding an
  execution that must run alone holds nothing else;
- played to the end, every innocent execution finishes and every bomb fails;
- CPU shares: while two or more tenants not charged with a runner death have work, each
  holds at most one runner at the base priority (the others are demoted); a tenant charged
  with a death lately holds none at the base priority while another has work; with one
  tenant nothing is demoted; a demoted runner is never offered again once empty (it is
  replaced), whatever runners turn hot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from flowyard.runtime.placement import Placement, Plan

GROUPS = ["t:a", "t:b", "t:c", "u:d"]


@dataclass
class Model:
    placement: Placement
    now: float = 0.0
    bombs: dict[int, str] = field(default_factory=dict)  # seq -> "cpu" | "memory"
    groups: dict[int, str] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    pending: list[tuple[bool, str | None]] = field(default_factory=list)  # starting: (surge, reserved for)
    next_seq: int = 1
    next_rid: int = 1

    def up(self, surge: bool, reserved_for: str | None = None) -> None:
        self.placement.runner_up(self.next_rid, surge=surge, now=self.now, reserved_for=reserved_for)
        self.next_rid += 1

    def apply(self, plan: Plan) -> None:
        for seq, rid in plan.place:
            seat = self.placement.seats[rid]
            assert seq in seat.jobs
        self.pending += [(True, None)] * plan.start_surge
        self.pending += [(False, None)] * plan.start_base  # base runners started on demand
        self.pending += [(False, None)] * len(plan.recycle)  # the pool replaces a demoted base runner
        for rid in plan.retire:
            assert rid not in self.placement.seats, "a retired runner is still offered"
        base_up = sum(not s.surge for s in self.placement.seats.values())
        base_pending = sum(not surge for surge, _ in self.pending)
        assert base_up + base_pending <= self.placement.base, "more base runners than FLOWYARD_RUNNERS"
        assert self.placement.base_starting == base_pending, "placement miscounts runners on their way"
        groups_with_work = {t.group for t in self.placement.tickets.values()}
        if len(groups_with_work) < 2:
            assert not plan.demote, "demoted with one tenant at work"
        else:
            penalised = set(self.placement.penalty)
            contended = len(groups_with_work - penalised) >= 2
            first: dict[str, int] = {}
            for seat in self.placement.seats.values():
                if seat.jobs and not seat.demoted and not seat.condemned and seat.group is not None:
                    others_hold = any(o.jobs and o.group != seat.group for o in self.placement.seats.values())
                    assert seat.group not in penalised or not others_hold, (
                        f"{seat.group} was charged and runs undemoted beside another tenant"
                    )
                    if contended:
                        assert seat.group not in first, f"{seat.group} holds two runners at the base priority"
                    first[seat.group] = seat.rid
        for rid in plan.demote:
            assert self.placement.seats[rid].demoted
        self.check()

    def check(self) -> None:
        tickets = self.placement.tickets
        for seat in self.placement.seats.values():
            groups = {self.groups[s] for s in seat.jobs}
            assert len(groups) <= 1, f"runner {seat.rid} holds tenants {groups}"
            if seat.jobs:
                assert seat.group in groups
            if seat.alone:
                assert len(seat.jobs) <= 1, "an execution run alone has company"
            for s in seat.jobs:
                assert tickets[s].rid == seat.rid
            if not seat.jobs and seat.demoted:
                assert seat.group in self.placement.penalty, "an empty demoted runner is still offered"
        assert not (self.failed - set(self.bombs)), "an innocent execution failed"

    def step(self) -> None:
        self.apply(self.placement.plan(self.now))

    def submit(self, group: str, bomb: str | None) -> None:
        seq = self.next_seq
        self.next_seq += 1
        self.groups[seq] = group
        if bomb:
            self.bombs[seq] = bomb
        self.placement.submit(seq, group, self.now)

    def complete(self, pick: int) -> None:
        placed = sorted(
            s for s, t in self.placement.tickets.items() if t.rid is not None and s not in self.bombs
        )
        if placed:
            seq = placed[pick % len(placed)]
            self.placement.finish(seq, self.now)
            self.finished.add(seq)

    def die(self, pick: int, named_pick: int, crash: bool) -> None:
        deadly = sorted(
            rid for rid, seat in self.placement.seats.items() if any(s in self.bombs for s in seat.jobs)
        )
        if not deadly:
            return
        rid = deadly[pick % len(deadly)]
        seat = self.placement.seats[rid]
        aboard = sorted(seat.jobs)
        bomb = next(s for s in aboard if s in self.bombs)
        if self.bombs[bomb] == "cpu":
            named: int | None = bomb  # a CPU kill names the execution on the CPU: the burner
            kind = "cpu"
        else:
            # Memory is per runner: whoever is on the CPU, or nobody, may be named
            # (named_pick < 0: an innocent one if any is aboard, the worst case).
            options: list[int | None] = [*aboard, None]
            innocent = [s for s in aboard if s not in self.bombs]
            named = innocent[0] if named_pick < 0 and innocent else options[named_pick % len(options)]
            kind = "crash" if crash and named is not None else "memory"
        death = self.placement.died(rid, named, kind, self.now)
        for seq in [death.culprit, *death.lost]:
            if seq is not None:
                self.failed.add(seq)
        if not seat.surge:  # the pool replaces a base runner (demoted for a charged tenant)
            self.pending.append((False, self.placement.reserve_replacement(death)))
        self.check()

    def heat(self, pick: int, hot: bool) -> None:
        rids = sorted(self.placement.seats)
        if rids:
            self.placement.heat(rids[pick % len(rids)], hot)

    def bring_up(self) -> None:
        if self.pending:
            surge, reserved_for = self.pending.pop(0)
            self.up(surge, reserved_for)


submits = st.tuples(
    st.just("submit"), st.sampled_from(GROUPS), st.sampled_from([None, None, None, "cpu", "memory"])
)
ops = st.lists(
    st.one_of(
        submits,
        submits,
        submits,
        st.tuples(st.just("complete"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("die"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("crash"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("up"), st.just(0), st.just(0)),
        st.tuples(st.just("heat"), st.integers(0, 50), st.booleans()),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 3.0, 12.0, 40.0]), st.just(0)),
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=ops,
    base=st.integers(1, 3),
    capacity=st.integers(1, 4),
    surge=st.integers(0, 2),
    quarantine=st.sampled_from([0.0, 10.0]),
    warm=st.integers(1, 3),
)
def test_placement_never_blames_an_innocent_nor_mixes_tenants(
    ops: list[tuple[str, object, object]], base: int, capacity: int, surge: int, quarantine: float, warm: int
) -> None:
    warm = min(warm, base)
    m = Model(
        Placement(
            base=base,
            capacity=capacity,
            surge=surge,
            surge_idle_seconds=30,
            quarantine_seconds=quarantine,
            warm=warm,
        )
    )
    m.pending = [(False, None)] * warm
    m.bring_up()
    for op, a, b in ops:
        if op == "submit":
            m.submit(str(a), b if isinstance(b, str) else None)
        elif op == "complete":
            m.complete(int(a))  # type: ignore[call-overload]
        elif op in ("die", "crash"):
            m.die(int(a), int(b), crash=op == "crash")  # type: ignore[call-overload]
        elif op == "up":
            m.bring_up()
        elif op == "heat":
            m.heat(int(a), bool(b))  # type: ignore[call-overload]
        else:
            m.now += float(a)  # type: ignore[arg-type]
        m.step()
    # Play it out: runners come up, innocents finish, bombs kill their runners.
    for _ in range(5000):
        if not m.placement.tickets:
            break
        m.bring_up()
        for rid in list(m.placement.seats):  # steps end: loops are free again
            m.placement.heat(rid, False)
        m.die(0, -1, crash=False)
        m.complete(0)
        m.now += 1.0
        m.step()
    assert not m.placement.tickets, "executions left unplaced forever"
    innocents = set(m.groups) - set(m.bombs)
    assert m.finished == innocents
    assert m.failed == set(m.bombs)


def test_a_cpu_kill_blames_the_burner_and_spares_the_rest() -> None:
    p = Placement(base=1, capacity=8, surge=0)
    p.runner_up(1, surge=False, now=0)
    for seq in (1, 2, 3):
        p.submit(seq, "t:a", 0)
    assert sorted(p.plan(0).place) == [(1, 1), (2, 1), (3, 1)]
    death = p.died(1, 2, "cpu", 1)
    assert (death.culprit, death.rerun, death.suspects) == (2, [1, 3], [])


def test_a_memory_death_with_company_makes_suspects_who_run_alone() -> None:
    p = Placement(base=2, capacity=8, surge=0, quarantine_seconds=10)
    p.runner_up(1, surge=False, now=0)
    p.runner_up(2, surge=False, now=0)
    for seq in (1, 2):
        p.submit(seq, "t:a", 0)
    p.submit(3, "t:b", 0)
    placed = dict(p.plan(0).place)
    assert placed[1] == placed[2] != placed[3], "tenants apart, one tenant together"
    death = p.died(placed[1], 1, "memory", 1)
    assert (death.culprit, death.suspects, death.quarantined) == (None, [1, 2], "t:a")
    assert p.plan(1).place == [], "a suspect waits for an empty runner"
    p.runner_up(3, surge=False, now=1)
    assert p.plan(1).place == [(1, 3)], "alone, in the fresh replacement"
    p.submit(4, "t:a", 2)
    assert p.plan(2).place == [], "nothing beside a suspect; quarantined, so 4 waits to run alone"
    death = p.died(3, None, "memory", 2)
    assert death.culprit == 1, "alone, it is the culprit"
    p.runner_up(4, surge=False, now=3)
    assert p.plan(3).place == [(2, 4)]
    p.finish(2, 4)
    assert p.plan(4).place == [(4, 4)]
    assert p.seats[4].alone, "quarantined: run alone"
    p.finish(4, 20)
    p.submit(5, "t:a", 20)
    p.submit(6, "t:a", 20)
    assert sorted(p.plan(20).place) == [(5, 4), (6, 4)], "quarantine over: together again"


def test_a_tenant_without_a_runner_gets_a_surge_runner_then_a_drained_one() -> None:
    p = Placement(base=1, capacity=8, surge=1, surge_idle_seconds=5)
    p.runner_up(1, surge=False, now=0)
    p.submit(1, "t:a", 0)
    assert p.plan(0).place == [(1, 1)]
    p.submit(2, "t:b", 0)
    plan = p.plan(0)
    assert (plan.place, plan.start_surge) == ([], 1)
    p.runner_up(2, surge=True, now=0)
    assert p.plan(0).place == [(2, 2)]
    p.finish(2, 1)
    assert p.plan(5).retire == [], "idle for 4 s only"
    assert p.plan(6).retire == [2]
    p.submit(3, "t:b", 7)
    plan = p.plan(7)
    assert (plan.place, plan.start_surge) == ([], 1)
    p.runner_start_failed(surge=True)
    p.surge = 0
    p.submit(4, "t:a", 7)
    assert p.plan(7).place == [(4, 1)]
    assert p.seats[1].draining, "runner 1 drains for t:b"
    p.submit(5, "t:a", 7.5)
    assert p.plan(7.5).place == [], "a draining runner takes no more"
    p.finish(1, 8)
    p.finish(4, 8)
    assert p.plan(8).place[0] == (3, 1), "the drained runner goes to the tenant without one"


def test_a_tenants_extra_runners_are_demoted_while_another_tenant_has_work() -> None:
    p = Placement(base=3, capacity=1, surge=0)
    for rid in (1, 2, 3):
        p.runner_up(rid, surge=False, now=0)
    p.submit(1, "t:a", 0)
    p.submit(2, "t:a", 1)
    plan = p.plan(1)
    assert sorted(plan.place) == [(1, 1), (2, 2)] and plan.demote == [], "one tenant: nothing demoted"
    p.submit(3, "t:b", 2)
    plan = p.plan(2)
    assert plan.place == [(3, 3)]
    assert plan.demote == [2], "A's second runner, not its first, not B's only one"
    # A's demoted runner empties: it is replaced, never offered again.
    p.finish(2, 3)
    plan = p.plan(3)
    assert plan.recycle == [2] and 2 not in p.seats


def test_a_hot_runner_sends_the_next_execution_elsewhere_and_a_short_tenant_gets_a_surge() -> None:
    p = Placement(base=2, capacity=8, surge=2)
    p.runner_up(1, surge=False, now=0)
    p.runner_up(2, surge=False, now=0)
    p.submit(1, "t:b", 0)
    assert p.plan(0).place == [(1, 1)]
    p.heat(1, True)  # B's step holds its runner's loop
    p.submit(2, "t:b", 1)
    assert p.plan(1).place == [(2, 2)], "not queued behind the busy loop: the free runner"
    # A takes nothing (no free runner); B, holding 2 of its share of 2, queues in its own.
    p.heat(2, True)
    p.submit(3, "t:a", 2)
    plan = p.plan(2)
    assert plan.place == [] and plan.start_surge == 1, "A holds no runner: a surge one"
    p.runner_up(3, surge=True, now=3)
    assert p.plan(3).place == [(3, 3)]
    p.submit(4, "t:b", 4)
    plan = p.plan(4)
    assert plan.place == [(4, 1)] and plan.start_surge == 0, "B holds its share: it waits in its own"


def test_with_two_tenants_at_work_a_hot_first_runner_is_waited_for() -> None:
    """A second runner would be demoted while another tenant has work: B's next execution
    queues behind B's busy first runner (at the base priority) rather than run demoted."""
    p = Placement(base=2, capacity=8, surge=2)
    p.runner_up(1, surge=False, now=0)
    p.runner_up(2, surge=False, now=0)
    p.submit(1, "t:a", 0)
    p.submit(2, "t:b", 0)
    p.plan(0)
    p.heat(1, True)
    p.heat(2, True)
    p.submit(3, "t:b", 1)
    plan = p.plan(1)
    assert plan.place == [(3, 2)] and plan.start_surge == 0 and plan.demote == []


def test_a_tenant_left_with_only_a_demoted_runner_gets_a_fresh_one() -> None:
    """B's first runner emptied and went to A; B's next execution does not join B's demoted
    runner (it would run at the lower priority for as long as B keeps it busy) but waits for a
    fresh one: the surge runner on its way, while A's runner is drained for the tenant left
    without a runner at the base priority."""
    p = Placement(base=2, capacity=8, surge=1)
    p.runner_up(1, surge=False, now=0)
    p.runner_up(2, surge=False, now=0)
    p.submit(1, "t:b", 0)
    assert p.plan(0).place == [(1, 1)]
    p.heat(1, True)
    p.submit(2, "t:b", 1)
    assert p.plan(1).place == [(2, 2)], "B alone: the next execution takes the free runner"
    p.submit(3, "t:a", 2)
    plan = p.plan(2)
    assert plan.place == [] and plan.start_surge == 1 and plan.demote == [2]
    p.heat(1, False)
    p.finish(1, 3)  # B's first runner empties and goes to A, which waited for one
    assert p.plan(3).place == [(3, 1)]
    p.submit(4, "t:b", 4)
    plan = p.plan(4)
    assert plan.place == [], "not onto B's demoted runner"
    assert p.seats[1].draining, "A's runner is drained for B (the surge runner is on its way too)"
    p.runner_up(3, surge=True, now=5)
    assert p.plan(5).place == [(4, 3)], "a fresh runner for B"


def test_a_tenant_that_kills_runners_runs_demoted_and_the_other_spreads() -> None:
    """A's burner kills its runner: A is charged. While B has work, every runner A holds is
    demoted (its first too) and A runs on one runner at a time; B, the only tenant not charged, spreads
    over the free runners at the base priority as it would alone. A's demoted runner that
    empties stays A's (no runner start per execution) until B waits for a runner or the
    penalty ends."""
    p = Placement(base=3, capacity=8, surge=0, penalty_seconds=30)
    for rid in (1, 2, 3):
        p.runner_up(rid, surge=False, now=0)
    p.submit(1, "t:a", 0)
    assert p.plan(0).place == [(1, 1)]
    death = p.died(1, 1, "cpu", 1)
    assert death.culprit == 1 and "t:a" in p.penalty
    p.runner_up(4, surge=False, now=1)  # the replacement
    p.submit(2, "t:a", 2)
    p.submit(3, "t:b", 2)
    plan = p.plan(2)
    placed = dict(plan.place)
    a_seat, b_first = placed[2], placed[3]
    assert a_seat != b_first and plan.demote == [a_seat], "A's only runner is demoted: A was charged"
    p.heat(b_first, True)  # B's step holds its runner's loop
    p.submit(4, "t:b", 3)
    plan = p.plan(3)
    (b_second,) = set(p.seats) - {a_seat, b_first}
    assert plan.place == [(4, b_second)] and plan.demote == [], (
        "B, the only tenant not charged, takes the free runner at the base priority"
    )
    p.submit(5, "t:a", 4)
    plan = p.plan(4)
    assert plan.place == [(5, a_seat)] and plan.start_surge == 0, "A waits in its own demoted runner"
    p.finish(2, 5)
    p.finish(5, 5)
    plan = p.plan(5)
    assert plan.recycle == [] and a_seat in p.seats, "reserved for A: no runner start per execution"
    p.submit(6, "t:a", 6)
    assert p.plan(6).place == [(6, a_seat)]
    p.finish(6, 7)
    # B needs a third runner (both of its own are hot) and none is free: A's reserved one goes.
    p.heat(b_second, True)
    p.submit(7, "t:b", 8)
    plan = p.plan(8)
    assert plan.place == [] and plan.recycle == [a_seat] and a_seat not in p.seats
    p.runner_up(5, surge=False, now=9)
    assert p.plan(9).place == [(7, 5)], "the fresh runner in its place goes to B"
    # The penalty ends: A is like anybody else again, and B's extra runners are demoted.
    p.submit(8, "t:a", 40)
    plan = p.plan(40)
    assert "t:a" not in p.penalty
    assert sorted(plan.demote) == sorted({b_second, 5}), plan


def test_a_runner_lingers_for_its_tenant_and_a_charged_tenant_cannot_take_it() -> None:
    """B's runner empties between two of B's executions: A, charged with a runner death, does not
    take it (A waits in its own), and B's next execution finds it. A tenant without a runner that
    was not charged takes a lingering runner at once; once the linger is over anybody may."""
    p = Placement(base=2, capacity=8, surge=0, penalty_seconds=30, linger_seconds=1)
    p.runner_up(1, surge=False, now=0)
    p.runner_up(2, surge=False, now=0)
    p.submit(1, "t:b", 0)
    p.submit(2, "t:a", 0)
    assert sorted(p.plan(0).place) == [(1, 1), (2, 2)]
    death = p.died(2, 2, "cpu", 0.5)
    assert death.culprit == 2 and death.charged == "t:a"
    reserved = p.reserve_replacement(death)
    assert reserved == "t:a", "B holds a runner: A's replacement starts demoted, kept for A"
    p.runner_up(3, surge=False, now=0.6, reserved_for=reserved)
    p.finish(1, 0.7)  # B's runner empties: it lingers for B
    assert p.seats[1].group == "t:b" and not p.seats[1].jobs
    p.submit(3, "t:a", 0.8)
    p.submit(4, "t:a", 0.9)
    assert p.plan(0.9).place == [(3, 3), (4, 3)], "A does not take B's lingering runner"
    p.submit(5, "t:b", 1.0)
    assert p.plan(1.0).place == [(5, 1)], "B's next execution finds its runner"
    p.finish(5, 1.2)
    p.submit(6, "t:c", 1.3)
    assert p.plan(1.3).place == [(6, 1)], "C, without a runner and not charged, takes it at once"
    p.finish(6, 1.5)
    p.plan(2.0)
    assert p.seats[1].group == "t:c", "still lingering for C"
    p.plan(2.6)
    assert p.seats[1].group is None, "the linger is over: free for any tenant"
    p.submit(7, "t:a", 2.7)
    assert p.plan(2.7).place == [(7, 3)], "A still runs on its one runner while penalised"


def test_base_runners_beyond_the_warm_ones_start_on_demand_and_stop_when_idle() -> None:
    p = Placement(base=2, capacity=8, surge=2, surge_idle_seconds=30, warm=1, linger_seconds=1)
    assert p.base_starting == 1, "only the warm runner is started with the pool"
    p.runner_up(1, surge=False, now=0)
    for seq in (1, 2, 3):
        p.submit(seq, "t:a", 0)
    plan = p.plan(0)
    assert sorted(plan.place) == [(1, 1), (2, 1), (3, 1)]
    assert (plan.start_base, plan.start_surge) == (0, 0), "one tenant, a cool runner: nothing started"
    p.submit(4, "t:b", 1)
    plan = p.plan(1)
    assert (plan.place, plan.start_base, plan.start_surge) == ([], 1, 0), "a base runner before a surge one"
    assert p.plan(1.5).start_base == 0, "asked for once while it starts"
    p.runner_up(2, surge=False, now=2)
    assert p.plan(2).place == [(4, 2)]
    for seq in (1, 2, 3):
        p.finish(seq, 3)
    p.finish(4, 4)
    assert p.plan(30).retire == [], "idle, but not for long enough"
    plan = p.plan(34)
    assert plan.retire == [1], "one runner stops after its idle time (the one idle longest)"
    assert p.plan(100).retire == [], "the warm one is kept"
    p.submit(5, "t:a", 101)
    p.submit(6, "t:b", 101)
    plan = p.plan(101)
    assert plan.place == [(5, 2)] and plan.start_base == 1, "started again when needed"


def test_cpu_bound_work_of_one_tenant_starts_the_next_base_runner() -> None:
    p = Placement(base=2, capacity=8, surge=0, warm=1)
    p.runner_up(1, surge=False, now=0)
    p.submit(1, "t:a", 0)
    assert p.plan(0).place == [(1, 1)]
    assert p.heat(1, True)
    p.submit(2, "t:a", 1)
    plan = p.plan(1)
    assert (plan.place, plan.start_base) == ([], 1), "its runner is hot: a second one is started"
    p.runner_up(2, surge=False, now=2)
    assert p.plan(2).place == [(2, 2)]


def test_a_dead_runner_is_replaced_even_when_it_was_started_on_demand() -> None:
    p = Placement(base=2, capacity=8, surge=0, warm=1, quarantine_seconds=0, penalty_seconds=0)
    p.runner_up(1, surge=False, now=0)
    p.submit(1, "t:a", 0)
    p.submit(2, "t:b", 0)
    plan = p.plan(0)
    assert plan.place == [(1, 1)] and plan.start_base == 1
    p.runner_up(2, surge=False, now=1)
    assert p.plan(1).place == [(2, 2)]
    death = p.died(2, 2, "cpu", 2)
    assert death.culprit == 2
    assert p.base_starting == 1, "the pool replaces it: counted on its way"
    p.submit(3, "t:b", 3)
    assert p.plan(3).start_base == 0, "no second start beside the replacement"


def test_a_demoted_runner_above_the_warm_ones_stops_instead_of_being_replaced() -> None:
    p = Placement(base=2, capacity=8, surge=1, warm=1)
    p.runner_up(1, surge=False, now=0)
    p.submit(1, "t:a", 0)
    assert p.plan(0).place == [(1, 1)]
    p.heat(1, True)
    p.submit(2, "t:a", 1)
    assert p.plan(1).start_base == 1
    p.runner_up(2, surge=False, now=2)
    assert p.plan(2).place == [(2, 2)]
    p.submit(3, "t:b", 3)
    plan = p.plan(3)
    assert plan.start_surge == 1 and plan.demote == [2], "a's second runner is demoted while b has work"
    p.finish(2, 4)
    plan = p.plan(4)
    assert (plan.retire, plan.recycle) == ([2], []), "one runner (the warm one) stays: no fresh one"
    assert p.base_starting == 0
    p.finish(1, 5)
    p.finish(3, 5)
    p.runner_up(3, surge=True, now=5)
    p.submit(4, "t:a", 6)
    p.submit(5, "t:b", 6)
    plan = p.plan(6)
    assert len(plan.place) == 2 and plan.start_base == 0, "the warm and the surge runner take them"
