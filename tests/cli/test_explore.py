#!/usr/bin/python3
"""kvgrid explore and kvgrid run --schedule (docs/exploration.md), end to end at 2 ranks:

- a schedule replays exactly (decision digest), '' is the seeded run itself;
- bound 1 runs exactly 1 + (choice points of the default run) - (dominated ones) schedules, and
  every correct protocol is clean over every schedule of its scenario within the bound;
- every buggy variant's violation is found with the fewest flips, shrunk to the earliest choice
  point, and its printed replay command fails the same way;
- a hang is a violation that does not end the exploration;
- bad input exits 2 naming what is wrong.
Needs KVGRID_BIN, KVGRID_SOURCE, MPIEXEC (as test_cli.py).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["KVGRID_BIN"]
SRC = os.environ["KVGRID_SOURCE"]
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
TMP = tempfile.mkdtemp(prefix="kvgrid-explore-")
sys.path.insert(0, os.path.join(SRC, "jobs"))
from mpi_env import mpi_env  # noqa: E402

# jobs/env.sh's settings (among them: a violating run ends at once — the buggy variants took 11 s
# instead of 3)
ENV = mpi_env()
PP = os.path.join(SRC, "experiments", "explore_pp.toml")
STORAGE = os.path.join(SRC, "experiments", "explore_storage.toml")
PD = os.path.join(SRC, "experiments", "explore_pd.toml")
TP2 = ["--set", "topology.tp=2", "--set", "topology.pp=1"]
failures = []
runs = 0


def expect(cond, msg, *context):
    if not cond:
        print("FAILED:", msg)
        for c in context:
            print("   ", str(c)[-4000:])
        failures.append(msg)


def mpi(np, *args, timeout=240):
    p = subprocess.run([MPIEXEC, "-np", str(np), BIN, *args], capture_output=True, text=True, env=ENV, timeout=timeout,
                       cwd=SRC)
    return p.returncode, p.stdout, p.stderr


def run(exp, *args):
    global runs
    runs += 1
    return mpi(2, "run", exp, "--out", os.path.join(TMP, f"run{runs}"), "-q", *args)


def explore(exp, *args):
    return mpi(2, "explore", exp, "--out", os.path.join(TMP, "explore"), *args)


def digest(so):
    m = re.search(r"# decision log: \d+ decisions per rank, digest (0x[0-9a-f]+)", so)
    return m.group(1) if m else None


def stats(so):
    m = re.search(r"# schedules: (\d+) run \((\d+) did not reach a flip.*?\), (\d+) without the reduction.*?, (\d+) dominated", so)
    return tuple(int(x) for x in m.groups()) if m else None


def replay():
    """The same schedule, the same run; '' is the seeded run; a flip changes the decisions."""
    rc0, so0, se0 = run(PP)
    rc1, so1, se1 = run(PP, "--schedule", "")
    expect(rc0 == 0 and rc1 == 0 and digest(so0) and digest(so0) == digest(so1), "'' replays the seeded run", so0, so1, se1)
    m = re.search(r"# schedule: (\d+) choice points over all ranks, 0 flips applied", so1)
    expect(m and int(m.group(1)) > 5, "the choice points are counted", so1)
    a = run(PP, "--schedule", "0:2,0:4")
    b = run(PP, "--schedule", "0:4,0:2")
    expect(a[0] == b[0] == 0 and digest(a[1]) == digest(b[1]), "a schedule replays exactly (in any order)", a, b)
    expect(digest(a[1]) != digest(so0), "the flips changed the decisions", a[1], so0)
    expect("# schedule: " in a[1] and "2 flips applied" in a[1] and "schedule: point 4 at step" in a[1] + a[2],
           "the applied flips are printed", a[1], a[2])
    return int(m.group(1)) if m else 0


def counts(base_points):
    """Bound 1: the default run, then one schedule per choice point it met that is not dominated."""
    rc, so, se = explore(PP, "--bound", "1")
    st = stats(so)
    expect(rc == 0 and st and st[0] == 1 + base_points - st[3] and st[2] == base_points and st[1] == 0,
           f"bound 1 runs 1 + {base_points} - dominated schedules", so, se)
    expect("# verdict: clean: every schedule within the bound" in so, "pp_sync clean at bound 1", so)
    # TP peers: once one rank's copy is delayed, the other's early completion cannot move the MIN
    rc, so, se = explore(PP, "--bound", "2", *TP2)
    st = stats(so)
    expect(rc == 0 and st and st[3] > 0 and "# violations: 0" in so, "dominated points are not branched on", so, se)


def correct_protocols():
    """Every correct variant, every schedule of its scenario within the bound: no violation."""
    # (tp_sync with host.alloc.fail, load_back with transfer.load.fail and CP sharding with the layer
    # gather are jobs/explore.sh's rows: suite time)
    cases = [("pp_sync bound 2", PP, ["--bound", "2"]),
             ("pp_consensus", STORAGE, ["--bound", "1"]),
             ("pd_restore", PD, ["--bound", "1"])]
    for name, exp, args in cases:
        rc, so, se = explore(exp, *args)
        st = stats(so)
        print(name, st)
        expect(rc == 0 and st and st[0] > 10 and "# violations: 0" in so, f"{name}: clean", so, se)


REPLAYED = {"pp_sync independent_polling", "prefetch per_rank", "pd_restore unchecked"}


def buggy_variants():
    """Each buggy variant: found, with the fewest flips, shrunk, and its replay fails the same way."""
    cases = [  # name, experiment, args, expected schedule (None: any of that many flips), what it says
        ("pp_sync independent_polling", PP, ["--set", "protocol.pp_sync=independent_polling"], "0:0",
         r"rank 0 \(pp 0, cp 0, tp 0\) at step 1: copy #0 \(stream 0, submitted at step 0, modelled pending\): complete"),
        ("tp_sync per_rank", PP, [*TP2, "--set", "protocol.tp_sync=per_rank"], "0:0", r"copy #0 .*: complete"),
        ("prefetch per_rank", STORAGE, ["--set", "protocol.prefetch_consensus=per_rank"], None, r"storage read of pages .*: seen"),
        ("pd_restore unchecked", PD, ["--set", "protocol.pd_restore=unchecked"], None,
         r"rank 1 \(decode, pp 0.*failpoint pd.restore.fail .*: fires"),
        ("cp any_owner_restore", PP, ["--set", "topology.cp=2", "--set", "topology.pp=1", "--set", "cache.gather_pages=8",
                                      "--set", "cache.device_pages=26", "--set", "workload.multiturn.clients=4", "--set",
                                      "workload.multiturn.rounds=3", "--set", "cache.cp_sharding=any_owner_restore"], "", None),
    ]
    for name, exp, args, want, says in cases:
        rc, so, se = explore(exp, "--bound", "2", *args)
        m = re.search(r"# counterexample: (\d+) flips?, schedule '([^']*)'", so)
        print(name, m.group(0) if m else None)
        expect(rc == 1 and "# verdict: VIOLATION" in so and m, f"{name}: found", so, se)
        if not m:
            continue
        expect(int(m.group(1)) == (1 if want is None else len([x for x in want.split(",") if x])),
               f"{name}: the fewest flips", m.group(0))
        if want is not None:
            expect(m.group(2) == want, f"{name}: schedule {want}", m.group(0))
        if says:
            expect(re.search(says, so), f"{name}: the flip in words", so)
        if name not in REPLAYED:  # (every replay costs a failing mpirun: three in the suite)
            continue
        cmd = re.search(r"#   replay: mpirun -np 2 build/kvgrid run (\S+) (.*)", so)
        expect(cmd, f"{name}: a replay command", so)
        if not cmd:
            continue
        import shlex
        rargs = shlex.split(cmd.group(2))
        rc2, so2, se2 = run(exp, *rargs)
        first = re.search(r"#   (Found rank divergence: .*|oracle mismatches \d+.*)", so)
        expect(rc2 == 1 and first and ((first.group(1).startswith("Found") and first.group(1) in so2 + se2)
                                       or (first.group(1).startswith("oracle") and "# oracle mismatches: 0 OK" not in so2)),
               f"{name}: the replay fails the same way", first.group(0) if first else so, so2[-2000:], se2[-2000:])


def hang():
    """A rank that stalls past the deadline at one choice point: a violation, the search goes on."""
    rc, so, se = explore(PP, "--bound", "1", "--deadline", "0.5", "--keep-going", "--no-shrink",
                         "--set", "faults.rank.stall.probability=0", "--set", "faults.rank.stall.ranks=[1]",
                         "--set", "faults.rank.stall.from_step=8", "--set", "faults.rank.stall.duration_ms=1200")
    st = stats(so)
    v = re.search(r"# violations: (\d+)", so)
    print("hang", st, v.group(0) if v else None)
    expect(rc == 1 and st and v and 1 <= int(v.group(1)) < st[0] and "hang: watchdog: rank 0 waited" in so,
           "hangs are violations and the exploration continues", so, se)


def bad_input():
    for args, msg in ((["run", PP, "--schedule", "1:x"], "--schedule: entry '1:x' is not rank:index"),
                      (["run", PP, "--schedule", "0:1", "--set", "engine.transfer=threaded"], "--schedule needs engine.transfer"),
                      (["explore", PP, "--set", "engine.transfer=threaded"], "kvgrid explore needs engine.transfer"),
                      (["explore", PP, "--bound", "9"], "--bound: Value 9 not in range"),
                      (["explore", os.path.join(SRC, "experiments", "tree.toml")], "not workload.kind = \"tree\"")):
        out = ["--out", os.path.join(TMP, "bad")] if args[0] == "run" else []
        if "tree.toml" in args[1]:  # under mpirun: every rank refuses it
            rc, so, se = mpi(4, *args, *out)
        else:  # the rest without mpirun (a failing mpirun costs a second of teardown)
            p = subprocess.run([BIN, *args, *out], capture_output=True, text=True, env=ENV, timeout=120)
            rc, so, se = p.returncode, p.stdout, p.stderr
        expect(rc == 2 and msg in so + se, f"{' '.join(args[-2:])}: exit 2 naming it", so, se)
    expect(not os.path.exists(os.path.join(TMP, "bad")), "nothing written by a refused run")


if __name__ == "__main__":
    points = replay()
    counts(points)
    correct_protocols()
    buggy_variants()
    hang()
    bad_input()
    if failures:  # (a failure's runs stay for reading)
        print(f"{len(failures)} FAILED:", *failures, sep="\n  ")
        print("runs kept in", TMP)
        sys.exit(1)
    shutil.rmtree(TMP, ignore_errors=True)
    print("all explore checks passed")
