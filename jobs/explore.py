#!/usr/bin/python3
"""Systematic exploration of every protocol with a buggy variant (docs/exploration.md): for each,
the buggy variant under `kvgrid explore` until its first violation (the fewest flips, shrunk to the
earliest choice points), then the correct variant over *every* schedule within the bound — at least
the bound where the buggy one failed. Prints a table (protocol, scenario, variant, bound, schedules
without the reduction, schedules run, time, result) and optionally writes it as Markdown.

  jobs/explore.sh [--bound N] [--only pp_sync,tp_sync,...] [--markdown FILE] [--deadline S]
  --bound: the correct variants' bound (default 2; never below the flips their buggy twin needed).
Exit 0 when every correct variant is clean and every buggy variant is found; 1 otherwise; 2 on
bad arguments.
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVGRID_BIN", os.path.join(SRC, "build", "kvgrid"))
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
ENV = mpi_env()  # jobs/env.sh's settings

TP2 = ["topology.tp=2", "topology.pp=1"]
CP2 = ["topology.cp=2", "topology.pp=1", "cache.gather_pages=8", "cache.device_pages=26",
       "workload.multiturn.clients=4", "workload.multiturn.rounds=3"]
LOADS = ["cache.device_pages=14", "workload.multiturn.clients=4", "workload.multiturn.rounds=3",
         "faults.transfer.load.fail.probability=0"]
# name, experiment, scenario in words, settings, key, correct value, buggy value
PROTOCOLS = [
    ("pp_sync", "explore_pp", "TP1xPP2, host tier", [], "protocol.pp_sync", "pp_sync", "independent_polling"),
    ("tp_sync", "explore_pp", "TP2, host tier", TP2, "protocol.tp_sync", "min_allreduce", "per_rank"),
    ("tp_sync (allocations)", "explore_pp", "TP2, host tier, host.alloc.fail", TP2 + ["faults.host.alloc.fail.probability=0"],
     "protocol.tp_sync", "min_allreduce", "skip_when_empty"),
    ("prefetch_consensus", "explore_storage", "TP1xPP2, host + storage", [], "protocol.prefetch_consensus", "pp_consensus", "per_rank"),
    ("cp_sharding", "explore_pp", "CP2, host tier", CP2, "cache.cp_sharding", "sharded", "any_owner_restore"),
    ("layer_gather", "explore_pp", "CP2 sharded, host tier", CP2 + ["cache.cp_sharding=sharded"], "protocol.layer_gather",
     "after_restore", "before_restore_event"),
    ("load_back", "explore_pp", "TP1xPP2, transfer.load.fail", LOADS, "protocol.load_back", "agreed", "unchecked"),
    ("pd_restore", "explore_pd", "prefill 1 + decode 1, pd.restore.fail", [], "protocol.pd_restore", "agreed", "unchecked"),
]


def explore(experiment, sets, bound, deadline):
    args = [MPIEXEC, "-np", "2", BIN, "explore", os.path.join(SRC, "experiments", experiment + ".toml"),
            "--bound", str(bound), "--deadline", str(deadline)]
    for s in sets:
        args += ["--set", s]
    start = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=SRC)
    wall = time.monotonic() - start
    st = re.search(r"# schedules: (\d+) run .*?, (\d+) without the reduction", p.stdout)
    ce = re.search(r"# counterexample: (\d+) flips?, schedule '([^']*)'", p.stdout)
    verdict = re.search(r"# verdict: (.*)", p.stdout)
    return {"rc": p.returncode, "run": int(st.group(1)) if st else None, "unreduced": int(st.group(2)) if st else None,
            "flips": int(ce.group(1)) if ce else None, "schedule": ce.group(2) if ce else None, "wall": wall,
            "verdict": verdict.group(1) if verdict else "(no verdict)", "out": p.stdout, "err": p.stderr}


def main():
    ap = argparse.ArgumentParser(prog="jobs/explore.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", type=int, default=2, help="the correct variants' bound (default 2)")
    ap.add_argument("--only", default="", help="comma-separated protocol names")
    ap.add_argument("--markdown", default="", help="write the table to FILE as Markdown")
    ap.add_argument("--deadline", type=float, default=5.0, help="hang deadline per wait, seconds (default 5)")
    a = ap.parse_args()
    names = [p[0] for p in PROTOCOLS]
    only = [x for x in a.only.split(",") if x]
    bad = [x for x in only if x not in names]
    if bad or not 0 <= a.bound <= 8:
        print(f"jobs/explore.sh: " + (f"--only {','.join(bad)}: unknown; known: {', '.join(names)}" if bad
                                     else f"--bound {a.bound}: expected 0 to 8"), file=sys.stderr)
        return 2
    if not os.access(BIN, os.X_OK):
        print(f"jobs/explore.sh: {BIN} is not an executable (run jobs/setup.sh)", file=sys.stderr)
        return 2
    rows, ok = [], True
    print(f"# {'protocol':22} {'variant':21} {'bound':>5} {'unreduced':>9} {'run':>6} {'time':>7}  result")
    for name, exp, scenario, sets, key, good, buggy in PROTOCOLS:
        if only and name not in only:
            continue
        b = explore(exp, sets + [f"{key}={buggy}"], max(a.bound, 1), a.deadline)
        found = b["rc"] == 1 and b["flips"] is not None
        g = explore(exp, sets + [f"{key}={good}"], max(a.bound, b["flips"] or 0), a.deadline)
        clean = g["rc"] == 0 and "clean" in g["verdict"]
        ok = ok and found and clean
        for variant, r, bound, result in (
                (buggy, b, max(a.bound, 1), f"found: '{b['schedule']}' ({b['flips']} flip{'' if b['flips'] == 1 else 's'})" if found else "NOT FOUND: " + b["verdict"]),
                (good, g, max(a.bound, b["flips"] or 0), "clean" if clean else "VIOLATION: " + g["verdict"])):
            row = (name, f"{exp} ({scenario})", variant, bound, r["unreduced"], r["run"], r["wall"], result)
            rows.append(row)
            print(f"  {name:22} {variant:21} {bound:>5} {str(r['unreduced']):>9} {str(r['run']):>6} {r['wall']:>6.1f}s  {result}")
            if "NOT" in result or "VIOLATION" in result:
                print(r["out"][-3000:], r["err"][-2000:])
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| protocol | scenario (2 ranks) | variant | bound | schedules without the reduction | schedules run | time | result |\n")
            f.write("|---|---|---|---:|---:|---:|---:|---|\n")
            for n, sc, v, bd, u, r, w, res in rows:
                f.write(f"| {n} | {sc} | `{v}` | {bd} | {u} | {r} | {w:.1f} s | {res} |\n")
    print("# OK: every correct variant clean within its bound, every buggy variant found" if ok else "# FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
