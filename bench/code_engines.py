"""The maintained Python embeddings of a JavaScript engine, side by side, for the ``code``
component (docs/code-step.md): start-up per step (a fresh isolate/runtime, the program
compiled and ``main`` called once), throughput on a realistic transform, memory per isolate,
and whether a memory cap and a CPU cap stop a hog.

    .venv/bin/pip install mini-racer   # only for this comparison; not a dependency
    .venv/bin/python bench/code_engines.py

Figures on a shared machine are "under load": compare only the two columns of one run.
"""

from __future__ import annotations

import gc
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

SOURCE = """
function main(data, ctx) {
  let total = 0;
  const lines = [];
  for (const item of data.order.items) {
    total += item.price * item.qty;
    lines.push({sku: item.sku.toUpperCase(), amount: Math.round(item.price * item.qty * 100) / 100});
  }
  const m = /^([^@]+)@(.+)$/.exec(data.order.customer.email) || [null, "unknown", "unknown"];
  return {id: data.order.id, user: m[1].toLowerCase(), domain: m[2].toLowerCase(),
          total: Math.round(total * 100) / 100, lines, vip: data.order.customer.tags.includes("vip")};
}
"""
DATA: dict[str, Any] = {
    "order": {
        "id": "A-1",
        "customer": {"name": "Ada Lovelace", "email": "ADA@example.com", "tags": ["vip", "eu"]},
        "items": [{"sku": f"p-{i}", "price": 3.5 + i, "qty": 1 + i % 3} for i in range(20)],
    }
}
DRIVER = "\n;function __run(s){return JSON.stringify(main(JSON.parse(s), {log(){}}))}"
HOG_MEMORY = "function main(){ const a = []; while (true) a.push('x'.repeat(4096) + a.length); }"
HOG_CPU = "function main(){ while (true) {} }"


def quickjs_fresh(source: str, payload: str, memory: int = 64 << 20, cpu: float = 2.0) -> Any:
    import _quickjs

    ctx = _quickjs.Context()
    ctx.set_memory_limit(memory)
    ctx.set_time_limit(cpu)
    ctx.eval(source + DRIVER)
    return ctx.get("__run")(payload)


def racer_fresh(source: str, payload: str, memory: int = 64 << 20, cpu: float = 2.0) -> Any:
    from py_mini_racer import MiniRacer

    mr = MiniRacer()
    try:
        mr.set_hard_memory_limit(memory)
        mr.eval(source + DRIVER)
        return mr.call("__run", payload, timeout_sec=cpu)
    finally:
        mr.close()


def timed(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(median microseconds per call over 5 rounds, process CPU microseconds per call)."""
    rounds = []
    cpu0 = time.process_time()
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(rounds), (time.process_time() - cpu0) / (5 * n) * 1e6


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def per_isolate_kib(make: Callable[[], Any], n: int = 50) -> float:
    gc.collect()
    before = rss_kib()
    kept = [make() for _ in range(n)]
    after = rss_kib()
    del kept
    gc.collect()
    return (after - before) / n


def cap_outcome(fn: Callable[[], Any]) -> str:
    t = time.perf_counter()
    try:
        fn()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"stopped in {time.perf_counter() - t:.2f} s: {type(exc).__name__}: {first[:60]}"
    return "NOT stopped"


def main() -> None:
    payload = json.dumps(DATA)
    engines: dict[str, tuple[Callable[..., Any], Callable[[], Any]]] = {}
    try:
        import _quickjs

        engines["quickjs-ng"] = (quickjs_fresh, _quickjs.Context)
    except ImportError:
        print("quickjs-ng is not installed")
    try:
        from py_mini_racer import MiniRacer

        engines["mini-racer (V8)"] = (racer_fresh, MiniRacer)
    except ImportError:
        print("mini-racer is not installed (pip install mini-racer to compare)")
    print(f"peak RSS before: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB")
    for name, (fresh, make) in engines.items():
        assert json.loads(fresh(SOURCE, payload))["total"] > 0
        start_us, start_cpu = timed(lambda f=fresh: f("function main(d){return d}", "1"), 50)
        step_us, step_cpu = timed(lambda f=fresh: f(SOURCE, payload), 50)
        print(f"\n== {name}")
        print(f"  fresh isolate + trivial main:        {start_us:9.1f} us wall, {start_cpu:9.1f} us CPU")
        print(f"  fresh isolate + realistic transform: {step_us:9.1f} us wall, {step_cpu:9.1f} us CPU")
        print(f"  steps per second (one core):         {1e6 / step_us:9.0f}")
        print(f"  RSS per live isolate:                {per_isolate_kib(make):9.0f} KiB")
        print(
            f"  memory cap 32 MiB on a hog:          {cap_outcome(lambda f=fresh: f(HOG_MEMORY, '1', 32 << 20))}"
        )
        print(
            f"  CPU cap 0.5 s on an endless loop:    {cap_outcome(lambda f=fresh: f(HOG_CPU, '1', cpu=0.5))}"
        )
    # A warm isolate reused (what a fresh runtime per execution forgoes), for scale.
    if "quickjs-ng" in engines:
        import _quickjs

        ctx = _quickjs.Context()
        ctx.eval(SOURCE + DRIVER)
        run = ctx.get("__run")
        warm_us, _ = timed(lambda: run(payload), 200)
        print(
            f"\nquickjs-ng, one warm runtime reused (not done: state would leak): {warm_us:.1f} us per call"
        )


if __name__ == "__main__":
    main()
