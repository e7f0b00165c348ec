#!/usr/bin/env python3
"""kvplan search --estimate against the search it projects: per stage, the estimate's CPU and
wall seconds (at most) beside what the plan's /search/timing recorded, and the totals against
/usr/bin/time of the search. Run by bench/estimate_accuracy.sh, one row per case.
Usage: bench/estimate_accuracy.py EST.json PLAN.h5 TIME_FILE LOAD_BEFORE LOAD_AFTER LABEL
(TIME_FILE: "wall user sys" of the search; needs $KVPLAN_BIN or build/kvplan)"""
import json, os, subprocess, sys

est_path, plan, time_file, load0, load1, label = sys.argv[1:7]
est = json.load(open(est_path))
out = subprocess.run([os.environ.get("KVPLAN_BIN", "build/kvplan"), "inspect", plan, "--json"], check=True,
                     capture_output=True, text=True).stdout
tim = json.loads(out)["groups"]["/search/timing"]
wall, user, sys_ = (float(x) for x in open(time_file).read().split())
# the estimate's stages as the search times them (refine + verify are one stage there)
pairs = [("grid", ["grid"]), ("baselines", ["baselines"]), ("curves", ["curves"]),
         ("refine", ["refine", "verify"]), ("ladder", ["ladder"]), ("heldout", ["heldout"]),
         ("kv_types", ["kv_types"]), ("guard", ["guard"])]
rows = {r["stage"]: r for r in est["stages"]}
print("## %s (load %s -> %s)" % (label, load0, load1))
print("| stage | estimate CPU s: least - most (projected) | recorded CPU s | estimate wall s, projected | recorded wall s |")
print("| --- | --- | --- | --- | --- |")
for name, parts in pairs:
    lo = sum(rows[p]["cpu_seconds"] for p in parts)
    hi = sum(rows[p]["cpu_seconds_max"] for p in parts)
    pj = sum(rows[p]["cpu_seconds_projected"] for p in parts)
    w = sum(rows[p]["seconds_projected"] for p in parts)
    print("| %s | %.1f - %.1f (%.1f) | %.1f | %.1f | %.1f |" % (
        name, lo, hi, pj, tim.get("cpu_" + name, 0), w, tim.get("wall_" + name, 0)))
other_cpu = user + sys_ - sum(v for k, v in tim.items() if k.startswith("cpu_"))
print("| (outside the stages: inputs, writing) | - | %.1f | - | %.1f |" % (
    other_cpu + tim.get("cpu_inputs", 0) + tim.get("cpu_setup", 0),
    wall - sum(v for k, v in tim.items() if k.startswith("wall_")) + tim.get("wall_inputs", 0)
    + tim.get("wall_setup", 0)))
cpu = user + sys_
print("| **total** | %.1f - %.1f (%.1f) | %.1f (user %.1f + sys %.1f) | %.1f (share %.2f) | %.1f |" % (
    est["cpu_seconds"], est["cpu_seconds_max"], est["cpu_seconds_projected"], cpu, user, sys_,
    est["seconds_projected"], est["cpu_share"], wall))
print("\nprojected vs measured: CPU %+.0f %%, wall %+.0f %%" % (
    100 * (est["cpu_seconds_projected"] / cpu - 1), 100 * (est["seconds_projected"] / wall - 1)))
