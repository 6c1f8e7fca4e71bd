#!/usr/bin/python3
"""Decision-log digests of every shipped experiment (experiments/*.toml) at given seeds, recorded in
tests/golden/decision_digests.txt and checked against it (except those over a store shared with
another job running at the same time, which are not reproducible by design): a refactoring that must not change
behaviour (the serving loop's shape, a protocol moved behind an interface) keeps every digest.

  jobs/digests.py --check [--seeds 1-3] [--quick] [--skip A,B] [--jobs N]    compare (exit 1 on any difference)
  jobs/digests.py --record [--seeds 1-3] [--only A,B] rewrite the file (after an intended change;
                                                     say in the commit which digests changed and why)

--quick skips the experiments marked slow in the file (minutes each on 2 cores); the test suite
runs `--check --quick --seeds 1`. A digest is the decision-log digest of each group's first rank
(a P/D world has two groups), read from the run's /summary.
"""
import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(SRC, "tests", "golden", "decision_digests.txt")
BIN = os.environ.get("KVGRID_BIN", os.path.join(SRC, "build", "kvgrid"))
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
# Not reproducible by design: a job over a store another job writes at the same time (its
# decisions depend on the other's progress; tests/cli/test_storage.py runs it with its partner).
SHARED = {"buckets"}
SLOW = {"cp_sharding", "mooncake_replay", "policy_sim", "production_mix", "urc_swa", "urc_all"}  # over 15 s each here (policy_sim: a benchmark) (the Figure 4 pair: jobs/figure.sh urc_tiers)
ENV = mpi_env()  # jobs/env.sh's settings


def seeds(spec):
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def digest(exp, seed, tmp):
    path = os.path.join(SRC, "experiments", exp + ".toml")
    np_ = subprocess.run([BIN, "run", path, "--world-size"], capture_output=True, text=True, env=ENV, check=True).stdout.strip()
    out = os.path.join(tmp, f"{exp}-{seed}")
    p = subprocess.run([MPIEXEC, "-np", np_, BIN, "run", path, "--seed", str(seed), "--out", out], capture_output=True,
                       text=True, env=ENV)
    if p.returncode != 0:
        raise RuntimeError(f"{exp} seed {seed} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return run_digest(out)


def run_digest(run_dir):
    """A finished run's digest: each group's first rank's decision-log digest, from /summary."""
    with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:
        rows = f["summary/ranks"][:]
    firsts = {}
    for r in rows:
        firsts.setdefault(int(r["group"]), int(r["decision_digest"]))
    return "+".join(f"0x{firsts[g]:016x}" for g in sorted(firsts))


def read_golden():
    want = {}
    if os.path.exists(GOLDEN):
        for line in open(GOLDEN):
            if line.strip() and not line.startswith("#"):
                exp, seed, d = line.split()
                want[(exp, int(seed))] = d
    return want


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--record", action="store_true")
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--quick", action="store_true", help="skip the slow experiments")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2: digests do not depend on it)")
    ap.add_argument("--only", default="", help="comma-separated experiment names (default: every shipped one)")
    ap.add_argument("--skip", default="", help="comma-separated experiment names not to run (the suite: those whose "
                    "own test runs them as shipped at seed 1 and compares the recorded digest)")
    a = ap.parse_args()
    exps = sorted(f[:-5] for f in os.listdir(os.path.join(SRC, "experiments")) if f.endswith(".toml") and f[:-5] not in SHARED)
    if a.quick:
        exps = [e for e in exps if e not in SLOW]
    if a.only:
        unknown = set(a.only.split(",")) - set(exps)
        if unknown:
            print(f"digests.py: --only names no shipped experiment{' outside the slow set (--quick)' if a.quick else ''}: "
                  f"{', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        exps = [e for e in exps if e in a.only.split(",")]
    if a.skip:
        exps = [e for e in exps if e not in a.skip.split(",")]
    want = read_golden()
    got, bad = {}, 0
    with tempfile.TemporaryDirectory(prefix="kvgrid-digests-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        runs = [(e, s) for e in exps for s in seeds(a.seeds)]
        futures = [pool.submit(digest, e, s, tmp) for e, s in runs]
        for (e, s), fut in zip(runs, futures):  # in order, each as soon as it and those before it are done
            got[(e, s)] = d = fut.result()
            w = want.get((e, s))
            status = "recorded" if a.record else ("OK" if w == d else "MISSING" if w is None else "CHANGED")
            bad += status in ("CHANGED", "MISSING")
            print(f"{e:18} seed {s}: {d}  {status}" + (f" (recorded {w})" if status == "CHANGED" else ""), flush=True)
    if a.record:
        want.update(got)
        with open(GOLDEN, "w") as f:
            f.write("# experiment seed digest — decision-log digest of each group's first rank (jobs/digests.py)\n")
            for (e, s), d in sorted(want.items()):
                f.write(f"{e} {s} {d}\n")
        print(f"# wrote {len(want)} digests to {os.path.relpath(GOLDEN, SRC)}")
        return 0
    print(f"# {len(got) - bad} of {len(got)} digests as recorded")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
