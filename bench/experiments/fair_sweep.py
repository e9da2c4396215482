# ruff: noqa
"""Experiment (branch fair-page, issue 44): policy_sweep's mixes of one staging through
policy_sim_fair.py, a copy of policy_sim with a start-time fair queue among holders.

    RANKS=sfq TIE=0 GRACE=0.005 python3 bench/experiments/fair_sweep.py 200 60 all OUT.json

RANKS: "" (as policy_sim), "tick"/"step" (strict order by the agent's charge, each 0.25 s
or each step), "sfq" (virtual time per weight, no credit for idle); TIE: virtual seconds
within which both run; GRACE: GPU seconds a held client's queued work still runs; EVERY:
how often the held set is decided (s)."""

import json, sys, random

sys.path.insert(0, "bench/experiments")
sys.path.insert(1, "bench")
from policy_sweep import random_mix, judged
from policy_sim_fair import simulate, PREFETCH_BYTES_PER_S as PF, FAULT_BYTES_PER_S as FT
from nvshare_agent.settings import AntiThrash, Settings

n = int(sys.argv[1])
secs = float(sys.argv[2])
want = sys.argv[3].split(",")
out = sys.argv[4]
settings = Settings(time_quantum_s=30, anti_thrash=AntiThrash.AUTO)
rng = random.Random(1)
vs = []
for i in range(n):
    specs, gib, staging = random_mix(rng)
    if staging not in want:
        continue
    r = simulate(specs, secs, settings, gib, prefetch_bytes_per_s=PF, fault_bytes_per_s=FT)
    v = judged(specs, staging, r, gib, PF)
    v["index"] = i
    vs.append(v)
json.dump(vs, open(out, "w"))
