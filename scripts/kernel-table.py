#!/usr/bin/env python3
"""Read the CUDA kernels' compiled code off for the performance model (tests/cuda_model/).

Compiles tests/cuda_model/kmodel_kernels.cu (every kernel cuda/kernels.cu instantiates, and the
model's micro-kernels) for sm_90 with nvcc -ptx, assembles the PTX with `ptxas -v`, and writes
one C initializer row per kernel entry:
  {"name", registers, static shared bytes, stack bytes, loop PTX instructions (all paths),
   loop PTX instructions (shortest path), loop global loads, dependent round trips per loop
   iteration},
where the loop is the kernel's loop (a backward branch's body) with the most global loads
(ld.global*, the innermost of equals), and the round trips are the longest chain of its global
loads that must wait one for another: a load's address derived from another load's result,
or a global store before it (the pointers may alias). Loads / round trips is then the loads
in flight per warp, as a scheduler that hoists every independent load (ptxas does) gets. A kernel without a loop counts its
whole body. PTX, not SASS: cuobjdump / nvdisasm are not part of this machine's toolkit, so the
instruction counts are the virtual ISA's (SASS is typically within a small factor).

Usage: scripts/kernel-table.py [OUT (tests/cuda_model/kernel_code.inc)] [--check]
  --check  write nothing; exit 1 (one line) when OUT differs from what the kernels give now.
Exit 2 with one line when nvcc / ptxas / c++filt are missing.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "cuda_model", "kmodel_kernels.cu")


def tool(name):
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    p = os.path.join(cuda, "bin", name)
    return p if os.access(p, os.X_OK) else shutil.which(name)


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    short = []
    for d in out[: len(names)]:
        d = re.sub(r"^void ", "", d)
        depth, cut = 0, len(d)
        for i, ch in enumerate(d):  # the name up to its parameter list (templates kept)
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "(" and depth == 0:
                cut = i
                break
        short.append(d[:cut])
    return short


INSTR = re.compile(r"^\s*(@!?%\w+\s+)?([a-z][\w.]*)\s*(.*);\s*$")
LABEL = re.compile(r"^(\$\w+):")
REG = re.compile(r"%[a-z]+\d+")


def body_stats(lines):
    """(loop instructions, of them on the shortest path, loop global loads, round trips) of one
    entry's body lines."""
    ins, labels = [], {}
    for ln in lines:
        ln = ln.strip().lstrip("{").rstrip("}").strip()
        m = LABEL.match(ln)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = INSTR.match(ln)
        if m and not m.group(2).startswith("."):
            ins.append((m.group(2), m.group(3), bool(m.group(1))))
    loops = []
    for j, (op, args, _) in enumerate(ins):
        if op.startswith("bra"):
            tgt = args.strip()
            if tgt in labels and labels[tgt] <= j:
                loops.append((labels[tgt], j + 1))
    if not loops:
        loops = [(0, len(ins))]
    def loads(r):
        return sum(1 for op, _, _ in ins[r[0]:r[1]] if op.startswith("ld.global"))
    best = max(loops, key=lambda r: (loads(r), -(r[1] - r[0])))
    region = ins[best[0]:best[1]]
    # round trips: the longest chain of global loads one iteration must wait for one after
    # another, a load waiting for the loads its address derives from and (memory order, as
    # the pointers may alias) for the global stores before it; ptxas may hoist any other load
    depth, st_depth, trips = {}, 0, 0
    for op, args, _ in region:
        if op.startswith("ld.global"):
            dst, _, src = args.partition("[")
            d = 1 + max([depth.get(r, 0) for r in REG.findall(src)] + [st_depth])
            trips = max(trips, d)
            for r in REG.findall(dst):
                depth[r] = d
            continue
        regs = REG.findall(args)
        if op.startswith("st.global"):
            st_depth = max([depth.get(r, 0) for r in regs] + [st_depth])
        elif regs:
            depth[regs[0]] = max([depth.get(r, 0) for r in regs[1:]] + [0])
    return len(region), shortest(ins, labels, best), loads(best), trips


def shortest(ins, labels, loop):
    """Instructions on the shortest path through the loop's body, head to back-edge (forward
    branches taken or not; inner loops' back-edges not taken): the iteration that skips every
    optional part. The full body when no path is found."""
    lo, hi = loop
    inf = float("inf")
    dist = [inf] * (hi - lo)
    dist[0] = 0
    for i in range(lo, hi - 1):
        d = dist[i - lo]
        if d == inf:
            continue
        op, args, pred = ins[i]
        if op.startswith("bra"):
            tgt = labels.get(args.strip())
            if tgt is not None and i < tgt < hi:
                dist[tgt - lo] = min(dist[tgt - lo], d + 1)
            if not pred:
                continue
        if op in ("ret", "exit"):
            continue
        dist[i + 1 - lo] = min(dist[i + 1 - lo], d + 1)
    return dist[-1] + 1 if dist[-1] != inf else hi - lo


def rows(tmp):
    nvcc, ptxas = tool("nvcc"), tool("ptxas")
    if not nvcc or not ptxas or not shutil.which("c++filt"):
        sys.exit("kernel-table.py: needs nvcc, ptxas (CUDA toolkit) and c++filt (binutils)")
    ptx = os.path.join(tmp, "k.ptx")
    flags = ["-I" + os.path.join(ROOT, d) for d in ("runtime", "cuda", "include")]
    subprocess.run([nvcc, "-arch=sm_90", "-O3", "-std=c++17", *flags, "-ptx", SRC, "-o", ptx],
                   check=True)
    res = subprocess.run([ptxas, "-arch=sm_90", "-O3", "-v", ptx, "-o",
                          os.path.join(tmp, "k.cubin")], capture_output=True, text=True, check=True)
    info, cur = {}, None
    for ln in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", ln)
        if m:
            cur = m.group(1)
            info[cur] = [0, 0, 0]
        m = re.search(r"(\d+) bytes stack frame", ln)
        if m and cur:
            info[cur][2] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", ln)
        if m and cur:
            info[cur][0] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", ln)
            info[cur][1] = int(s.group(1)) if s else 0
    text = open(ptx).read().splitlines()
    entries, name, body = {}, None, []
    for ln in text:
        m = re.match(r"^\.visible \.entry (\w+)\(", ln)
        if m:
            name, body = m.group(1), []
            continue
        if name is not None:
            if ln.startswith("}"):
                entries[name] = body
                name = None
            else:
                body.append(ln)
    mangled = sorted(entries)
    out = []
    for mn, short in sorted(zip(mangled, demangle(mangled)), key=lambda p: p[1]):
        regs, smem, stack = info.get(mn, [0, 0, 0])
        li, lmin, ll, trips = body_stats(entries[mn])
        out.append('{"%s", %d, %d, %d, %d, %d, %d, %d},' %
                   (short, regs, smem, stack, li, lmin, ll, trips))
    return out


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    out = args[0] if args else os.path.join(ROOT, "tests", "cuda_model", "kernel_code.inc")
    with tempfile.TemporaryDirectory() as tmp:
        body = rows(tmp)
    head = ["/* Generated by scripts/kernel-table.py from nvcc -ptx / ptxas -v for sm_90 (do not",
            " * edit; rerun it when a kernel changes): name, registers, static shared bytes, stack",
            " * bytes, loop PTX instructions (all paths, shortest path), loop global loads,",
            " * dependent round trips per iteration. */"]
    text = "\n".join(head + body) + "\n"
    if "--check" in sys.argv[1:]:
        old = open(out).read() if os.path.exists(out) else ""
        if old != text:
            sys.exit("kernel-table.py: %s is stale; rerun scripts/kernel-table.py" % out)
        return
    tmpf = out + ".tmp"
    with open(tmpf, "w") as f:
        f.write(text)
    os.replace(tmpf, out)


if __name__ == "__main__":
    main()
