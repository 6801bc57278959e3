"""jsonata-python (pure Python port) against jsonatapy (Rust core): do they agree
on the expressions integration flows use, and how fast is each?

    .venv/bin/python bench/jsonata_compare.py
"""

from __future__ import annotations

import statistics
import timeit
from typing import Any

import jsonata
import jsonatapy

DATA: dict[str, Any] = {
    "order": {
        "id": "A-1",
        "customer": {"name": "Ada Lovelace", "email": "ADA@example.com", "tags": ["vip", "eu"]},
        "items": [
            {"sku": "p-1", "name": "pen", "price": 3.5, "qty": 2},
            {"sku": "p-2", "name": "ink", "price": 4, "qty": 1},
            {"sku": "p-3", "name": "paper", "price": 12.25, "qty": 5},
        ],
        "status": "paid",
        "created": "2026-11-22T10:15:30.123Z",
    },
    "amount": 250,
    "flags": {"test": False},
    "empty": [],
}

EXPRESSIONS = [
    "order.id",
    "order.customer.name",
    "$sum(order.items.(price * qty))",
    "$count(order.items)",
    "amount > 100",
    "amount > 100 and order.status = 'paid'",
    "order.items[price > 4].sku",
    "order.items[0].name",
    "order.items[-1].name",
    "$uppercase(order.customer.name)",
    "$lowercase(order.customer.email)",
    "$substring(order.customer.name, 0, 3)",
    "$split(order.customer.name, ' ')",
    "$join(order.items.name, ', ')",
    "$contains(order.customer.email, '@')",
    "$string(amount)",
    "$number('42') + 1",
    "$round(order.items[2].price, 1)",
    "$max(order.items.price)",
    "$average(order.items.qty)",
    "$exists(order.missing)",
    "$not(flags.test)",
    "$map(order.items, function($i) { $i.sku })",
    "$filter(order.items, function($i) { $i.qty > 1 }).name",
    "$reduce(order.items.qty, function($a, $b) { $a + $b })",
    "order.items.{'sku': sku, 'total': price * qty}",
    "{'id': order.id, 'n': $count(order.items), 'vip': 'vip' in order.customer.tags}",
    "$merge([order.customer, {'seen': true}])",
    "order.status = 'paid' ? 'ship' : 'hold'",
    "$keys(order.customer)",
    "$sort(order.items.price)",
    "$reverse(order.items.sku)",
    "$distinct([1, 1, 2, 3, 3])",
    "$append(order.customer.tags, ['new'])",
    "$boolean(empty)",
    "$type(order.items)",
    "[1..5]",
    "$replace(order.customer.email, 'example', 'test')",
    "$match(order.customer.email, /[a-z]+/i).match",
    "$trim('  x  ')",
    "order.items^(>price).name",
    "$toMillis(order.created)",
    "$fromMillis(0)",
    "missing.field",
    "$ ~> |order|{'status': 'done'}|",
    "$sum(order.items.price) > 10 ? 'big' : 'small'",
    "$each(order.customer, function($v, $k) { $k })",
    "$lookup(order.customer, 'name')",
    "$spread(order.customer)[0]",
    "$zip([1, 2], [3, 4])",
]


def _run(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as exc:
        return "error", type(exc).__name__


def _normalise(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def main() -> None:
    agree = 0
    py_times: list[float] = []
    rs_times: list[float] = []
    rows = []
    for text in EXPRESSIONS:
        kind_py, py_expr = _run(lambda t=text: jsonata.Jsonata(t))
        kind_rs, rs_expr = _run(lambda t=text: jsonatapy.compile(t))
        res_py = _run(lambda e=py_expr: e.evaluate(DATA)) if kind_py == "ok" else ("error", "compile")
        res_rs = _run(lambda e=rs_expr: e.evaluate(DATA)) if kind_rs == "ok" else ("error", "compile")
        same = _normalise(res_py) == _normalise(res_rs) or (res_py[0] == res_rs[0] == "error")
        agree += same
        t_py = t_rs = float("nan")
        if res_py[0] == "ok":
            t_py = timeit.timeit(lambda e=py_expr: e.evaluate(DATA), number=300) / 300 * 1e6
            py_times.append(t_py)
        if res_rs[0] == "ok":
            t_rs = timeit.timeit(lambda e=rs_expr: e.evaluate(DATA), number=300) / 300 * 1e6
            rs_times.append(t_rs)
        rows.append((text, same, res_py, res_rs, t_py, t_rs))
    print(f"{'expression':55} {'agree':5} {'python us':>9} {'rust us':>8}")
    for text, same, res_py, res_rs, t_py, t_rs in rows:
        print(f"{text[:55]:55} {'yes' if same else 'NO':5} {t_py:9.1f} {t_rs:8.1f}")
        if not same:
            print(f"    jsonata-python: {res_py!r}\n    jsonatapy:      {res_rs!r}")
    print(f"\nagree on {agree} of {len(EXPRESSIONS)} expressions")
    print(
        f"median evaluation: jsonata-python {statistics.median(py_times):.1f} us, "
        f"jsonatapy {statistics.median(rs_times):.1f} us "
        f"({statistics.median(py_times) / statistics.median(rs_times):.0f}x)"
    )


if __name__ == "__main__":
    main()
