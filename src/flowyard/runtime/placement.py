"""Which runner an execution runs in, and who is blamed when a runner dies.

The one owner of the placement and blame rules of the runner pool (``runtime/pool.py``),
kept free of I/O so it can be property-tested (``tests/engine/test_placement_property.py``):
the pool reports what happens (a runner is up, an execution is handed in, finishes, a
runner dies) and performs the :class:`Plan` this module answers.

Placement:

- A runner holds executions of one *group* only (the queue group of ``queue/store.py``: a
  tenant, or the owner of tenantless flows) while any of them is aboard; an empty runner
  is free and may go to any group. So a runner death only ever touches one group. A runner
  that empties *lingers*: it stays kept for its group for ``linger_seconds`` (other groups
  take it only when they hold no runner at the base priority and were not charged with a
  death), so a group whose work trickles in keeps its runner between two executions.
- A free runner goes to the waiting group holding the fewest runners (ties: the group
  waiting longest). A group that holds none while every runner is taken may start a *surge*
  runner (at most ``runner_surge`` at once, retired after ``runner_surge_idle_seconds``
  idle); past that, the runner of the group holding the most runners is *drained* (takes
  no new executions) so that it frees up for the group without one. Tenants are never
  mixed.
- Base runners start on demand: ``warm`` of the ``base`` runners are started with the pool
  and kept; the others are asked for (``Plan.start_base``) when a group finds no runner it
  may take, before any surge runner or drain, and stop again (``Plan.retire``) after
  ``surge_idle_seconds`` idle while more than ``warm`` are up. So a machine with one tenant
  at work runs one runner (issue 19: memory), and a second tenant, or a first one's CPU-bound
  work, starts the next one.
- An execution that must run *alone* (a suspect, or one of a quarantined group) takes an
  empty runner and nothing else is placed beside it; a suspect takes a *fresh* runner (one
  that has run nothing yet: the replacement of the runner that died, a surge runner) when
  one is free, else any empty one. (Requiring a fresh runner for each suspect
  cost a runner start per suspect: 32 suspects took over a minute on a busy machine.)

CPU shares (issue 17: one tenant's CPU burners must not slow another tenant's steps):

- A runner whose loop a step has held for a watchdog tick or more is *hot* (the pool reports
  it with :meth:`Placement.heat`). While one group has work, its next execution does not join
  its hot runner while a free one exists (under its fair share, (base + surge runners) / groups
  with work, it may start a surge runner); at its share it queues in its own runner. While
  several groups have work, an execution queues behind its group's first runner even when it
  is hot: a second runner would be demoted (below), and a step runs faster behind a busy
  runner at the base priority than on a demoted one (bench/victim.py).
- While two or more groups have work, every runner a group holds beyond its first (the one it
  has held longest) is *demoted*: the pool raises its niceness by ``runner_demote_nice``, so
  the operating system gives each tenant's first runner the CPU before anybody's extra ones. An
  unprivileged process cannot lower a niceness again, so a demoted runner is not reused once
  empty: a base runner is replaced by a fresh one (``Plan.recycle``), a surge runner stops.
- A group charged with a runner death (a culprit, or suspects after a death with company) is
  *penalised* for ``penalty_seconds``, renewed by each death. While another group has work, it
  runs on one runner at a time rather than ask for more, and while another group holds a
  runner, every runner of the penalised group is demoted, its first too (with one runner to go
  round, nothing is demoted and nothing is replaced for it); the groups not penalised then
  share the base priority among themselves as if the penalised one were not there (one such
  group at work spreads over the free runners as it would alone). So a tenant that keeps
  killing runners pays for it at the lower priority, and the tenants it would slow down do not
  queue behind their one runner. A penalised group's demoted runner that empties stays
  *reserved* for it (no runner start per execution) until the penalty ends or a group not
  penalised waits for a runner; so is the replacement of a runner it killed, started demoted
  (its start-up CPU at the lower priority too: :meth:`Placement.reserve_replacement`).

Blame when a runner dies:

- killed for CPU or wall time with the execution named in its slot aboard: that execution
  is the culprit; the others aboard run again (not counted against them);
- one execution aboard: it is the culprit (whatever the limit, or a crash while it was on
  the CPU) — unless the runner died while nobody was on its CPU and no limit was crossed
  (killed from outside): then the death counts as a *loss*, and an execution that
  witnessed ``MAX_LOSSES`` such deaths fails ("its runner process died N times");
- several aboard and no certain culprit (memory, a crash, an unexplained exit): all of
  them are suspects and run again, each alone in a fresh runner, not counted as a failed
  attempt; only the one that kills its runner alone is the culprit. The group is
  quarantined for ``runner_quarantine_seconds``: its next executions run alone too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

MAX_LOSSES = 3  # unexplained deaths an execution may witness alone before it fails
CERTAIN = frozenset({"cpu", "wall"})  # limits charged to the execution named in the slot
LIMITS = frozenset({"cpu", "wall", "memory"})


@dataclass(eq=False)
class Seat:
    """A runner as placement sees it."""

    rid: int
    surge: bool
    fresh: bool = True
    group: str | None = None
    jobs: set[int] = field(default_factory=set)
    alone: bool = False
    draining: bool = False
    condemned: bool = False
    idle_since: float = 0.0
    owned_since: float = 0.0
    hot: bool = False  # a step has held its loop for a watchdog tick or more
    demoted: bool = False  # its niceness was raised: replaced once empty (or reserved)
    linger_until: float = 0.0  # emptied: kept for its group until then (not offered to others)


@dataclass(eq=False)
class Ticket:
    """An execution handed to the pool, until it finishes or fails."""

    seq: int
    group: str
    since: float
    suspect: bool = False
    alone: bool = False
    losses: int = 0
    rid: int | None = None


@dataclass
class Plan:
    place: list[tuple[int, int]] = field(default_factory=list)  # (execution seq, runner id)
    start_surge: int = 0  # surge runners to start
    start_base: int = 0  # base runners to start (on demand, beyond the warm ones)
    retire: list[int] = field(default_factory=list)  # empty runners to stop (surge, or base above warm)
    demote: list[int] = field(default_factory=list)  # runners to run at a lower CPU priority
    recycle: list[int] = field(default_factory=list)  # empty demoted base runners: replace them


@dataclass
class Death:
    culprit: int | None = None  # fails with its limit (or its crash)
    lost: list[int] = field(default_factory=list)  # fail: "its runner process died N times"
    suspects: list[int] = field(default_factory=list)  # run again, each alone
    rerun: list[int] = field(default_factory=list)  # witnesses of a certain death: run again
    quarantined: str | None = None
    charged: str | None = None  # the group penalised for it


class Placement:
    def __init__(
        self,
        *,
        base: int,
        capacity: int,
        surge: int = 2,
        surge_idle_seconds: float = 30.0,
        quarantine_seconds: float = 10.0,
        demote: bool = True,
        penalty_seconds: float = 30.0,
        linger_seconds: float = 1.0,
        warm: int | None = None,
    ) -> None:
        self.base = base
        self.warm = base if warm is None else max(1, min(warm, base))
        # Base runners asked for and not up yet: the warm ones at first, then each replacement
        # (of a runner that died or was recycled) and each started on demand.
        self.base_starting = self.warm
        self.capacity = capacity
        self.surge = surge
        self.surge_idle_seconds = surge_idle_seconds
        self.quarantine_seconds = quarantine_seconds
        self.seats: dict[int, Seat] = {}
        self.tickets: dict[int, Ticket] = {}
        self.quarantine: dict[str, float] = {}
        self.surge_starting = 0
        self.demote = demote
        self.penalty_seconds = penalty_seconds
        self.linger_seconds = linger_seconds
        self.penalty: dict[str, float] = {}  # group -> until when it runs demoted
        # Demoted runners that emptied: to stop, or (True) to replace with a fresh one.
        self._emptied: list[tuple[Seat, bool]] = []

    # -- what happens -------------------------------------------------------------------

    def runner_up(self, rid: int, *, surge: bool, now: float, reserved_for: str | None = None) -> None:
        """A runner is ready; ``reserved_for``: it was started demoted for that penalised group."""
        if surge:
            self.surge_starting = max(0, self.surge_starting - 1)
        else:
            self.base_starting = max(0, self.base_starting - 1)
        seat = Seat(rid, surge, idle_since=now)
        if reserved_for is not None:
            seat.group, seat.demoted = reserved_for, True
        self.seats[rid] = seat
        if reserved_for is not None and self.penalty.get(reserved_for, 0.0) <= now:
            # The penalty ended while the runner started: a demoted runner nobody may be given
            # (the pool replaces it at the next plan, as one that empties after a penalty).
            self._release(seat)

    def reserve_replacement(self, death: Death) -> str | None:
        """The group a dead runner's replacement should be started demoted for: the group the
        death was charged to, while it is penalised and another group holds a runner."""
        if death.charged is not None and self._penalised(death.charged) and self._others_hold(death.charged):
            return death.charged
        return None

    def runner_start_failed(self, *, surge: bool) -> None:
        if surge:
            self.surge_starting = max(0, self.surge_starting - 1)

    def heat(self, rid: int, hot: bool) -> bool:
        """The pool's watchdog saw the runner's loop held by a step (or free again); True if
        that changed something placement may use."""
        seat = self.seats.get(rid)
        if seat is None or seat.hot == hot:
            return False
        seat.hot = hot
        return True

    def condemn(self, rid: int) -> None:
        """The runner is being killed: nothing more is placed on it."""
        if (seat := self.seats.get(rid)) is not None:
            seat.condemned = True

    def submit(self, seq: int, group: str, now: float) -> None:
        self.tickets[seq] = Ticket(seq, group, now)

    def finish(self, seq: int, now: float) -> None:
        """The execution is done (or cancelled, or failed without its runner dying)."""
        t = self.tickets.pop(seq, None)
        if t is None or t.rid is None:
            return
        seat = self.seats.get(t.rid)
        if seat is not None:
            seat.jobs.discard(seq)
            if not seat.jobs:
                self._empty(seat, now)

    def died(self, rid: int, named: int | None, kind: str, now: float) -> Death:
        """The runner died. ``named``: the execution its slot names (on its CPU, or the
        one the watchdog killed it for); ``kind``: "cpu", "wall", "memory", "crash" or ""
        (no limit crossed, nobody on its CPU)."""
        seat = self.seats.pop(rid, None)
        death = Death()
        if seat is None:
            return death
        if not seat.surge:
            self.base_starting += 1  # the pool starts its replacement
        aboard = [self.tickets[s] for s in sorted(seat.jobs) if s in self.tickets]
        for t in aboard:
            t.rid = None
        if not aboard:
            return death
        if kind in CERTAIN and named in seat.jobs:
            death.culprit = named
            death.rerun = [t.seq for t in aboard if t.seq != named]
        elif len(aboard) == 1:
            t = aboard[0]
            if t.seq == named or kind in LIMITS:
                death.culprit = t.seq
            else:
                t.losses += 1
                if t.losses >= MAX_LOSSES:
                    death.lost.append(t.seq)
                else:
                    t.suspect = t.alone = True
                    death.suspects.append(t.seq)
        else:
            for t in aboard:
                t.suspect = t.alone = True
            death.suspects = [t.seq for t in aboard]
            group = aboard[0].group
            if self.quarantine_seconds > 0:
                self.quarantine[group] = now + self.quarantine_seconds
                death.quarantined = group
        charged = death.culprit if death.culprit is not None else next(iter(death.suspects), None)
        if charged is not None and self.penalty_seconds > 0:
            group = next(t.group for t in aboard if t.seq == charged)
            self.penalty[group] = now + self.penalty_seconds
            death.charged = group
        for seq in [death.culprit, *death.lost]:
            if seq is not None:
                self.tickets.pop(seq, None)
        return death

    def gone(self, rid: int) -> None:
        """A runner stopped with nothing aboard (retired, recycled, or never started work)."""
        self.seats.pop(rid, None)

    # -- what to do ---------------------------------------------------------------------

    def waiting(self) -> list[int]:
        return [t.seq for t in self.tickets.values() if t.rid is None]

    def plan(self, now: float) -> Plan:
        plan = Plan()
        for group, until in list(self.quarantine.items()):
            if until <= now:
                del self.quarantine[group]
        for group, until in list(self.penalty.items()):
            if until <= now:
                del self.penalty[group]
        for kept in list(self.seats.values()):
            if self._reserved(kept) and kept.group not in self.penalty:
                self._release(kept)
            elif not kept.jobs and not kept.demoted and kept.group is not None and kept.linger_until <= now:
                kept.group = None  # its linger is over: free for any group
        queues: dict[str, list[Ticket]] = defaultdict(list)
        for t in sorted(self.tickets.values(), key=lambda t: (not t.suspect, t.since, t.seq)):
            if t.rid is None:
                queues[t.group].append(t)
        blocked: set[str] = set()
        while queues:
            held = self._held()
            order = sorted(queues, key=lambda g: (self._penalised(g), held.get(g, 0), queues[g][0].since))
            progressed = False
            for g in order:
                t = queues[g][0]
                alone = t.alone or g in self.quarantine
                seat = self._seat_for(g, alone=alone, fresh=t.suspect)
                if seat is None:
                    blocked.add(g)
                    del queues[g]  # first in, first out within a group
                    continue
                self._board(seat, t, alone, now)
                plan.place.append((t.seq, seat.rid))
                queues[g].pop(0)
                if not queues[g]:
                    del queues[g]
                progressed = True
                break
            if not progressed:
                break
        self._relieve(plan, blocked)
        self._demote(plan)
        for seat, replace in self._emptied:
            # A base runner above the warm ones is not replaced: started again on demand.
            (plan.recycle if replace else plan.retire).append(seat.rid)
        self._emptied.clear()
        base_up = self._base_up()
        for seat in sorted(self.seats.values(), key=lambda s: (s.idle_since, s.rid)):
            if seat.jobs or seat.condemned or now - seat.idle_since < self.surge_idle_seconds:
                continue
            if seat.surge:
                del self.seats[seat.rid]
                plan.retire.append(seat.rid)
            elif base_up > self.warm and not seat.demoted:
                # Started on demand and idle long enough: stopped, to be started again when needed.
                del self.seats[seat.rid]
                plan.retire.append(seat.rid)
                base_up -= 1
        return plan

    # -- rules ----------------------------------------------------------------------------

    def _held(self) -> dict[str, int]:
        held: dict[str, int] = defaultdict(int)
        for seat in self.seats.values():
            if seat.group is not None and seat.jobs:
                held[seat.group] += 1
        return held

    def _usable(self, seat: Seat) -> bool:
        return not seat.condemned

    def _fair_share(self) -> int:
        """Runners each group with work may hold (at least one): the base and surge runners
        shared among the groups with work."""
        groups = {t.group for t in self.tickets.values()}
        return max(1, (self.base + self.surge) // max(1, len(groups)))

    def _joinable(self, group: str) -> list[Seat]:
        """The group's busy runners that can take one more of its executions."""
        return [
            s
            for s in self.seats.values()
            if self._usable(s)
            and s.group == group
            and s.jobs
            and not s.alone
            and not s.draining
            and len(s.jobs) < self.capacity
        ]

    def _reserved(self, seat: Seat) -> bool:
        """Empty, demoted, kept for the penalised group that held it."""
        return seat.demoted and not seat.jobs

    def _release(self, seat: Seat) -> None:
        """Taken out of placement: stopped, or replaced by a fresh one (a base runner, while
        fewer than the warm ones would be left); a replacement counts as on its way at once."""
        if self.seats.pop(seat.rid, None) is None:
            return
        replace = not seat.surge and self._base_up() + self.base_starting < self.warm
        if replace:
            self.base_starting += 1
        self._emptied.append((seat, replace))

    def _seat_for(self, group: str, *, alone: bool, fresh: bool) -> Seat | None:
        # A runner lingering for another group is taken only by a group without a runner at the
        # base priority that was not charged with a runner death lately.
        deprived = group not in self.penalty and not self._firsts().get(group, 0)
        free = [
            s
            for s in self.seats.values()
            if self._usable(s) and not s.jobs and (s.group in (None, group) or (deprived and not s.demoted))
        ]
        penalised = self._penalised(group)
        if penalised:
            # Charged with a runner death while others have work: one runner at a time (demoted),
            # its reserved one first (no start); another free one only while no group that is
            # not penalised waits for a runner.
            if self._held().get(group, 0) >= 1:
                if alone:
                    return None
                own = self._joinable(group)
                return min(own, key=lambda s: (len(s.jobs), s.rid)) if own else None
            mine = [s for s in free if s.demoted]
            if not mine and self._others_wait(group):
                return None
            free = mine or free
        if alone:
            # Fresh runners for suspects first; others take a used one when there is one.
            return min(free, key=lambda s: (s.fresh != fresh, s.surge, s.rid)) if free else None
        if penalised:
            return min(free, key=lambda s: (s.fresh, s.surge, s.rid)) if free else None
        own = self._joinable(group)
        first = [s for s in own if not s.demoted]
        cool_first = [s for s in first if not s.hot]
        if cool_first:
            return min(cool_first, key=lambda s: (len(s.jobs), s.rid))
        if not self._contended():
            # One tenant at work: CPU-bound work spreads over the free runners.
            cool = [s for s in own if not s.hot]
            if cool:
                return min(cool, key=lambda s: (len(s.jobs), s.rid))
            if free:
                return min(free, key=lambda s: (s.fresh, s.surge, s.rid))
            if own and self._held().get(group, 0) >= self._fair_share():
                return min(own, key=lambda s: (len(s.jobs), s.rid))  # at its share: wait in one
            return None
        # Several tenants at work: a second runner would be demoted, and a step runs faster
        # behind its tenant's busy first runner than on a demoted one (measured: bench/victim.py).
        if first:
            return min(first, key=lambda s: (len(s.jobs), s.rid))
        if free:  # it becomes the group's first runner
            return min(free, key=lambda s: (s.fresh, s.surge, s.rid))
        if own:
            # Only demoted runners left to the group (its first emptied and went to another
            # group): a fresh runner is asked for (_relieve) if one can be had; else this one.
            return None if self._relief_possible(group) else min(own, key=lambda s: (len(s.jobs), s.rid))
        return None

    def _contended(self) -> bool:
        """Two or more groups not penalised have work: their extra runners are demoted."""
        groups = {t.group for t in self.tickets.values()}
        return self.demote and len(groups - self.penalty.keys()) >= 2

    def _others_wait(self, group: str) -> bool:
        """A group not penalised has an execution waiting for a runner."""
        return any(
            t.rid is None and t.group != group and not self._penalised(t.group) for t in self.tickets.values()
        )

    def _others_hold(self, group: str) -> bool:
        """Another group holds a runner: there is a CPU to be shared with it."""
        return any(s.jobs and s.group != group for s in self.seats.values())

    def _penalised(self, group: str) -> bool:
        """Charged with a runner death lately, while another group has work."""
        if not self.demote or group not in self.penalty:
            return False
        return any(t.group != group for t in self.tickets.values())

    def _firsts(self) -> dict[str, int]:
        """Runners each group holds at the base priority (not demoted)."""
        held: dict[str, int] = defaultdict(int)
        for seat in self.seats.values():
            if seat.group is not None and seat.jobs and not seat.demoted:
                held[seat.group] += 1
        return held

    def _base_up(self) -> int:
        """Base runners up (not surge ones), as placement holds them."""
        return sum(not s.surge for s in self.seats.values())

    def _unstarted(self) -> int:
        """Base runners neither up nor asked for: they may be started on demand."""
        return self.base - self._base_up() - self.base_starting

    def _relief_possible(self, group: str) -> bool:
        """A runner can be started (a base one on demand, a surge one), or another group holds
        a runner that may be drained."""
        if self._unstarted() > 0 or self.base_starting:
            return True
        if sum(s.surge for s in self.seats.values()) + self.surge_starting < self.surge:
            return True
        return any(s.jobs and s.group != group and not s.condemned for s in self.seats.values())

    def _board(self, seat: Seat, t: Ticket, alone: bool, now: float) -> None:
        if not seat.jobs:
            seat.group = t.group
            seat.owned_since = now
            seat.alone = alone
            seat.draining = False
        seat.fresh = False
        seat.jobs.add(t.seq)
        t.alone = alone
        t.rid = seat.rid

    def _empty(self, seat: Seat, now: float) -> None:
        if seat.demoted:  # cannot be made a first runner again: stop or replace it
            if seat.group in self.penalty and not seat.condemned:
                seat.idle_since = now  # reserved for its penalised group (no start per run)
                return
            self._release(seat)
            return
        # Kept for its group a moment (linger): a tenant whose work comes in a steady trickle
        # does not lose its runner to another tenant between two executions and then wait
        # for a runner start or a drain (measured: bench/victim.py).
        seat.linger_until = now + self.linger_seconds
        if self.linger_seconds <= 0 or seat.alone or seat.draining:  # drained: for another group
            seat.group = None
        seat.alone = False
        seat.draining = False
        seat.idle_since = now

    def _relieve(self, plan: Plan, blocked: set[str]) -> None:
        """Groups that could not be placed and hold fewer runners than their share (none, or
        only hot ones): a surge runner, or a drain of the group holding the most."""
        held = self._held()
        if any(not self._penalised(g) for g in blocked):
            # A group not penalised waits: runners reserved for penalised ones are replaced.
            for seat in [s for s in self.seats.values() if self._reserved(s)]:
                self._release(seat)
        share = self._fair_share()
        firsts = self._firsts()
        short = sorted(blocked, key=lambda g: held.get(g, 0))
        # Short: no runner at the base priority (none at all, or only demoted ones), or fewer
        # runners than the group's share while all of them are hot.
        # A penalised group is short only with no runner at all and nobody else waiting.
        short = [
            g
            for g in short
            if (firsts.get(g, 0) == 0 or held[g] < share)
            and not (self._penalised(g) and (held.get(g, 0) or self._others_wait(g)))
        ]
        unstarted = self._unstarted()
        on_way = self.base_starting + self.surge_starting
        if unstarted > 0 and len(short) > on_way:
            # Base runners first (started on demand), one per short group not already
            # covered by a runner on its way.
            n = min(unstarted, len(short) - on_way)
            plan.start_base += n
            self.base_starting += n
        if self.base_starting or unstarted > 0:
            return  # runners are on their way (start-up, a replacement, on demand)
        surge_up = sum(s.surge for s in self.seats.values())
        drains_needed = 0
        for _ in short:
            if surge_up + self.surge_starting < self.surge:
                self.surge_starting += 1
                plan.start_surge += 1
            else:
                drains_needed += 1
        draining = sum(1 for s in self.seats.values() if s.draining and s.jobs)
        # Take from a group that keeps more than the one helped: any runner for a group
        # without one, else one of a group holding at least two more.
        least = min((firsts.get(g, 0) and held.get(g, 0) for g in short), default=0)
        floor = least + 1 if least else 0
        while draining < drains_needed:
            candidates = [
                s
                for s in self.seats.values()
                if s.jobs
                and not s.draining
                and not s.condemned
                and s.group not in short
                and held.get(s.group or "", 0) > floor
            ]
            if not candidates:
                break
            victim = min(candidates, key=lambda s: (-held.get(s.group or "", 0), s.owned_since, s.rid))
            victim.draining = True
            draining += 1

    def _demote(self, plan: Plan) -> None:
        """While two or more groups (not penalised) have work, each group's runners beyond its
        first run at a lower CPU priority; a penalised group's all do while another has work."""
        contended = self._contended()
        by_group: dict[str, list[Seat]] = defaultdict(list)
        for seat in self.seats.values():
            if seat.group is not None and seat.jobs and not seat.condemned:
                by_group[seat.group].append(seat)
        for group, seats in by_group.items():
            if self._penalised(group) and self._others_hold(group):
                for seat in seats:
                    if not seat.demoted:
                        seat.demoted = True
                        plan.demote.append(seat.rid)
                continue
            if len(seats) < 2 or not contended:
                continue
            first = min(seats, key=lambda s: (s.demoted, s.owned_since, s.rid))
            for seat in seats:
                if seat is not first and not seat.demoted:
                    seat.demoted = True
                    plan.demote.append(seat.rid)
