#!/usr/bin/env python3
"""Totals a libtorch profiler trace (Chrome trace JSON, e.g. `train_bench --profile`) per op:
self time is not separated (nested ops count in their callers too), so read the leaf ops
(aten::mm, aten::mul, ...) against the step's wall time.

  trace_summary.py TRACE.json [--top 25]
"""
import argparse
import collections
import json

p = argparse.ArgumentParser()
p.add_argument("trace")
p.add_argument("--top", type=int, default=25)
a = p.parse_args()
events = json.load(open(a.trace))
events = events["traceEvents"] if isinstance(events, dict) else events
total, count = collections.Counter(), collections.Counter()
for e in events:
    if e.get("ph") == "X":
        total[e["name"]] += e.get("dur", 0)
        count[e["name"]] += 1
for name, us in total.most_common(a.top):
    print(f"{us / 1000:10.1f} ms  {count[name]:6d} x  {name}")
