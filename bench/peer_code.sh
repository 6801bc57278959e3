#!/usr/bin/env bash
# The peer bench's flowyard run (../shared/peers-bench/run_flowyard.sh, async variant) with a
# `code` step in place of the JSONata mapper (issue 20): webhook -> code (the same mapping in
# JavaScript) -> log. Compare with `nodered:fn` (Node-RED's function node, JavaScript too) and
# `flowyard:async` (the mapper) from one invocation of the peer bench, back to back:
#
#   CONFIGS="nodered:fn flowyard:async" RUNS=1 ../shared/peers-bench/bench_all.sh; bench/peer_code.sh
#
# It runs a copy of the shared script with the flow swapped (the shared script is not ours to
# change); everything else (wrk load, drain, counting, CPU and host busy share) is the same.
set -euo pipefail
ROOT="$(git rev-parse --show-toplevel)"
PB="${PEERS_BENCH:-$ROOT/../shared/peers-bench}"
COPY="$(mktemp /tmp/run_flowyard_code.XXXXXX.sh)"
trap 'rm -f "$COPY"' EXIT
python3 - "$PB/run_flowyard.sh" "$COPY" "$PB" <<'PY'
import sys
src, dst, pb = sys.argv[1:]
s = open(src).read()
def swap(old, new):
    global s
    assert old in s, old
    s = s.replace(old, new, 1)
swap('source "$(dirname "$0")/common.sh"', f'source "{pb}/common.sh"')
swap('FLOW=$(curl -s "$BASE/flows" -H "$AUTH" -H \'Content-Type: application/json\' -d "{', 'CODE=\'function main(d) { return {id: d.orderId, count: d.items.length, email: d.customer.email}; }\'\nFLOW=$(curl -s "$BASE/flows" -H "$AUTH" -H \'Content-Type: application/json\' -d "{')
swap('\\"graph\\": {\\"nodes\\": [{\\"id\\": \\"in\\", \\"componentId\\": \\"webhook\\"}, $LAST],\n            \\"edges\\": [{\\"source\\": \\"in\\", \\"target\\": \\"out\\", \\"config\\": {\\"mapper\\": $MAPPER}}]}}"',
     '\\"graph\\": {\\"nodes\\": [{\\"id\\": \\"in\\", \\"componentId\\": \\"webhook\\"}, {\\"id\\": \\"calc\\", \\"componentId\\": \\"code\\", \\"fields\\": {\\"source\\": \\"$CODE\\"}}, $LAST],\n            \\"edges\\": [{\\"source\\": \\"in\\", \\"target\\": \\"calc\\"}, {\\"source\\": \\"calc\\", \\"target\\": \\"out\\"}]}}"')
swap('variant=$VARIANT rps=', 'variant=code rps=')
open(dst, "w").write(s)
PY
cd "$ROOT" && bash "$COPY" async
