"""The id recipe of SPEC §1: creation order within a process, unguessable, 24 hex."""

from __future__ import annotations

import itertools
import os
import threading

from flowyard import ids


def _parts(value: str) -> tuple[int, int]:
    assert ids.is_valid_id(value), value
    return int(value[:8], 16), int(value[8:], 16)


def test_ids_made_in_one_second_are_increasing_with_random_steps() -> None:
    made = [ids.new_id(now=2_000_000_000.5) for _ in range(5000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    seconds = {_parts(i)[0] for i in made}
    assert seconds == {2_000_000_000}
    counters = [_parts(i)[1] for i in made]
    steps = [b - a for a, b in itertools.pairwise(counters)]
    assert all(1 <= s <= 1 << 32 for s in steps)
    # The steps are random, not a constant increment one could add to the last id.
    assert len(set(steps)) > 4990


def test_a_new_second_starts_a_new_random_counter_below_two_to_the_63() -> None:
    starts = []
    for second in range(2_000_000_100, 2_000_000_200):
        first = ids.new_id(now=second + 0.1)
        later = ids.new_id(now=second + 0.9)
        assert first < later
        s, counter = _parts(first)
        assert s == second and counter < 1 << 63
        starts.append(counter)
    # Each second's start is drawn afresh (100 draws below 2^63 do not collide).
    assert len(set(starts)) == 100
    # And the order still holds across the boundaries: every id of a second sorts after the last.
    made = [ids.new_id(now=t / 10) for t in range(20_000_002_000, 20_000_002_050)]
    assert made == sorted(made)


def test_a_clock_stepped_back_keeps_the_order() -> None:
    late = ids.new_id(now=2_000_001_000)
    early = ids.new_id(now=2_000_000_999)
    assert early > late
    assert _parts(early)[0] == 2_000_001_000


def test_ids_from_threads_are_unique_and_each_threads_own_are_in_order() -> None:
    results: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(ids.new_id() for _ in range(2000))

    threads = [threading.Thread(target=make, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert r == sorted(r)
    assert len({i for r in results for i in r}) == 8000


def test_a_forked_child_does_not_continue_the_parents_sequence() -> None:
    ids.new_id()
    parent_state = ids._sequence
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it got a fresh sequence
        fresh = ids._sequence is not parent_state and ids._sequence.second == -1
        os.write(write, b"1" if fresh else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"


def test_the_real_clock_gives_a_valid_increasing_id() -> None:
    a, b = ids.new_id(), ids.new_id()
    assert ids.is_valid_id(a) and ids.is_valid_id(b) and a < b
