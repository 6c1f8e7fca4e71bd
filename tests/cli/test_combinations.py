#!/usr/bin/python3
"""The combination sweep's smoke (jobs/combinations.sh --smoke): three cells at 4 ranks and seed 1
— tiers + PP, CP-sharded P/D between different shard groups, tiers + a draft — the correct
protocols clean with and without copy failpoints, and pp_sync's independent polling, the
target-only draft and unchecked load-backs caught in every cell where they are active. The table's
deterministic columns and the summary are golden text (tests/cli/golden/combinations_smoke.txt;
after a change meant to move decisions, regenerate it with
`jobs/combinations.sh --smoke --golden tests/cli/golden/combinations_smoke.txt`). Bad arguments
exit 2 naming what is wrong, writing nothing. Needs KVGRID_BIN, KVGRID_SOURCE, MPIEXEC (as
test_cli.py).
"""
import difflib
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["KVGRID_BIN"]
SRC = os.environ["KVGRID_SOURCE"]
ENV = dict(os.environ, KVGRID_BIN=BIN, MPIEXEC=os.environ.get("MPIEXEC", "mpirun"))
TMP = tempfile.mkdtemp(prefix="kvgrid-combinations-")
JOB = os.path.join(SRC, "jobs", "combinations.sh")
failures = []


def expect(cond, msg, *context):
    if not cond:
        print("FAILED:", msg)
        for c in context:
            print("   ", str(c)[-4000:])
        failures.append(msg)


def smoke():
    out, got = os.path.join(TMP, "smoke"), os.path.join(TMP, "smoke.txt")
    p = subprocess.run([JOB, "--smoke", "--out", out, "--golden", got], capture_output=True, text=True, env=ENV, timeout=280)
    print(p.stdout[-3000:], p.stderr[-2000:])
    expect(p.returncode == 0 and "# OK: 5 correct runs, 4 buggy runs" in p.stdout, "smoke passes", p.stdout, p.stderr)
    with open(os.path.join(SRC, "tests", "cli", "golden", "combinations_smoke.txt")) as f:
        want = f.read()
    have = open(got).read() if os.path.exists(got) else "(no golden text written)"
    expect(have == want, "table and summary match tests/cli/golden/combinations_smoke.txt",
           "".join(difflib.unified_diff(want.splitlines(True), have.splitlines(True), "golden", "this run")))
    with open(os.path.join(out, "sweep.csv")) as f:
        expect(len(f.read().splitlines()) == 1 + 9, "sweep.csv: a header and one row per run")
    expect(os.path.exists(os.path.join(out, "sweep.h5")), "sweep.h5 written")


def bad_arguments():
    for args, msg in ((["--cells", "tiers+gpu"], "--cells tiers+gpu: expected one feature or two joined by +"),
                      (["--cells", "tiers+pp+pd"], "--cells tiers+pp+pd: expected one feature or two"),
                      (["--faults", "disk"], "--faults disk: unknown; known: none, copies, storage, requests, pd"),
                      (["--bugs", "tp_sync=max"], "--bugs tp_sync=max: unknown"),
                      (["--ranks", "6", "--cells", "cp+pp"], "--ranks 6: cell cp+pp needs a multiple of 4 ranks"),
                      (["--seeds", "x"], "expected numbers like 4,8, 1-3 and 30"),
                      (["--deadline", "soon"], "--deadline soon: expected numbers"),
                      (["--out", TMP], f"--out {TMP}: exists")):
        out = os.path.join(TMP, "bad")
        p = subprocess.run(["/usr/bin/python3", JOB[:-3] + ".py", *args] + ([] if "--out" in args else ["--out", out]),
                           capture_output=True, text=True, env=ENV, timeout=60)
        expect(p.returncode == 2 and msg in p.stderr and not os.path.exists(out), f"refused: {' '.join(args)}",
               p.returncode, p.stderr)


if __name__ == "__main__":
    smoke()
    bad_arguments()
    print("FAILED:" if failures else "OK", *failures, sep="\n  ")
    if not failures:
        shutil.rmtree(TMP, ignore_errors=True)  # a failure's runs stay for reading
    sys.exit(1 if failures else 0)
