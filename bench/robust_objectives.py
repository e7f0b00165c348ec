#!/usr/bin/env python3
"""Which --text-objective generalises better (issue 24), from plans' /search/texts records:
for each objective (mean, worst, both) pick, among the guard's candidates not worse than uniform
on any text's *calibration* chunks, the best by that objective computed on the calibration
chunks alone; then report that candidate's per-text ratio to uniform on the *held-out* chunks
(which the pick did not look at). Also the search's own plan (source 0, lambda 1) and the two
knapsacks at lambda 1 for reference.
Usage: bench/robust_objectives.py PLAN.h5 ...   (needs build/kvplan)"""
import json, math, subprocess, sys

def load(path):
    out = subprocess.run(["build/kvplan", "inspect", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    d = json.loads(out)["datasets"]
    g = lambda k: d["/search/texts/" + k]["data"]
    return g("candidates/perplexity"), g("uniform"), g("candidates/source"), \
        g("candidates/lambda"), g("chunks")

def score(row, uni, part, obj):
    r = [math.log(row[t][part] / uni[t][part]) for t in range(len(uni))]
    m, w = sum(r) / len(r), max(r)
    return {"mean": m, "worst": w, "both": m + w}[obj]

names = {0: "plan", 1: "mean-knapsack", 2: "worst-knapsack", 3: "text0-knapsack", 4: "text1-knapsack", 5: "text2-knapsack", 6: "text3-knapsack", -1: "uniform"}
for path in sys.argv[1:]:
    cand, uni, src, lam, chunks = load(path)
    print(path)
    for k in range(len(cand)):
        if lam[k] == 1 or src[k] == -1:
            held = " ".join("%.4f" % (cand[k][t][1] / uni[t][1]) for t in range(len(uni)))
            cal = " ".join("%.4f" % (cand[k][t][0] / uni[t][0]) for t in range(len(uni)))
            print("  %-15s lambda %.2f  calibration/uniform %s  held-out/uniform %s"
                  % (names[src[k]], lam[k], cal, held))
    for obj in ("mean", "worst", "both"):
        ok = [k for k in range(len(cand))
              if all(cand[k][t][0] <= uni[t][0] * (1 + 1e-6) for t in range(len(uni)))]
        k = min(ok, key=lambda k: (score(cand[k], uni, 0, obj), k))
        held = [cand[k][t][1] / uni[t][1] for t in range(len(uni))]
        print("  objective %-5s picks %s lambda %.2f: held-out/uniform %s (mean log %.4f, worst %.4f)"
              % (obj, names[src[k]], lam[k], " ".join("%.4f" % h for h in held),
                 sum(math.log(h) for h in held) / len(held), max(math.log(h) for h in held)))
