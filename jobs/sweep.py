"""Sweep driver behind jobs/sweep.sh (reads results only through `kvgrid report --json` and
`kvgrid check`)."""
import argparse
import concurrent.futures
import csv
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time

BIN = os.environ.get("KVGRID_BIN") or "build/kvgrid"  # jobs/run.sh reads the same variable
COLUMNS = ["variant", "seed", "exit", "verdict", "oracle_mismatches", "divergences", "faults", "failed_requests",
           "hit_rate", "ttft_p50_ms", "first_divergence", "wall_s", "run"]


def seeds(spec):
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def run_one(exp, run_dir, seed, combo, extra):
    cmd = ["jobs/run.sh", exp, "--", "--out", run_dir, "--seed", str(seed)]
    for k, v in combo:
        cmd += ["--set", f"{k}={v}"]
    cmd += extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return row_of(run_dir, seed, combo, p.returncode, time.time() - t0)


def row_of(run_dir, seed, combo, exit_code, wall_s, timed_out=False):
    """A sweep table row from a finished run's directory (through `kvgrid report` and `kvgrid check`)."""
    row = {c: "" for c in COLUMNS}
    row.update({"variant": " ".join(f"{k}={v}" for k, v in combo) or "(base)", "seed": seed, "exit": exit_code,
                "wall_s": f"{wall_s:.2f}", "run": run_dir})
    if os.path.exists(os.path.join(run_dir, "run.h5")):
        r = subprocess.run([BIN, "report", run_dir, "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            j = json.loads(r.stdout)
            row["verdict"] = j.get("verdict") or "incomplete"
            row["oracle_mismatches"] = j.get("oracle_mismatches", "")
            row["divergences"] = j.get("divergences", "")
            row["faults"] = j.get("faults_injected", "")
            row["failed_requests"] = j.get("failed", "")
            if "hit_rate" in j:
                row["hit_rate"] = f"{j['hit_rate']['total']:.4f}"
            if "ttft_model_ms" in j:  # the serving loop (the tree loop has no model, hence no TTFT)
                row["ttft_p50_ms"] = f"{j['ttft_model_ms']['p50']:.3f}"
        if exit_code != 0 or row["verdict"] != "OK":
            c = subprocess.run([BIN, "check", run_dir], capture_output=True, text=True)
            m = re.search(r"Found rank divergence: (.*)", c.stdout)
            if m:
                row["first_divergence"] = m.group(1)
    if timed_out:
        row["verdict"] = "timed out"
    return row


def write_h5(path, rows):
    import h5py  # Debian's /usr/bin/python3
    import numpy as np
    with h5py.File(path, "w") as f:
        g = f.create_group("runs")
        for c in COLUMNS:
            vals = [r[c] for r in rows]
            if c in ("seed", "exit"):
                g.create_dataset(c, data=np.array([int(v) for v in vals], dtype=np.int64))
            else:
                g.create_dataset(c, data=np.array([str(v).encode() for v in vals], dtype=h5py.string_dtype()))
        f.attrs["columns"] = ",".join(COLUMNS)


def slurm_script(exp, out, runs, extra, minutes=30):
    """One array task per run; task i runs line i of runs.txt."""
    lines = ["#!/usr/bin/env bash",
             f"# kvgrid sweep of {exp}: {len(runs)} runs, one Slurm array task each.",
             "# Submit from the repository root with --ntasks set to the experiment's world size:",
             f"#   sbatch --ntasks=$(build/kvgrid run {exp} --world-size) {out}/sweep.sbatch",
             "#SBATCH --job-name=kvgrid-sweep",
             f"#SBATCH --array=0-{len(runs) - 1}",
             f"#SBATCH --time={minutes // 60:02d}:{minutes % 60:02d}:00",
             f"#SBATCH --output={out}/slurm-%A_%a.out",
             "set -euo pipefail",
             'cd "${SLURM_SUBMIT_DIR:-.}"',
             "export HDF5_USE_FILE_LOCKING=FALSE",
             f'line=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {out}/runs.txt)',
             'eval "set -- $line"',
             f"exec jobs/run.sh {exp} -- \"$@\""]
    table = []
    for run_dir, seed, combo in runs:
        args = ["--out", run_dir, "--seed", str(seed)]
        for k, v in combo:
            args += ["--set", f"{k}={v}"]
        table.append(" ".join(shlex.quote(a) for a in args + extra))
    return "\n".join(lines) + "\n", "\n".join(table) + "\n"


def slurm_task_states(job):
    """(state, exit code) of each array task of `job`, from `scontrol show job` (no accounting)."""
    p = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"sweep: scontrol show job {job}: {p.stderr.strip()} (job records last MinJobAge seconds)")
    states = {}
    for line in p.stdout.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "ArrayTaskId" in f and f["ArrayTaskId"].isdigit():
            rc, _, sig = f.get("ExitCode", "0:0").partition(":")
            states[int(f["ArrayTaskId"])] = (f.get("JobState", "?"), int(rc) if rc.isdigit() else -1, sig,
                                             seconds(f.get("RunTime", "0")))
    return states


def seconds(runtime):
    """Slurm's [days-]hh:mm:ss as seconds."""
    days, _, hms = runtime.rpartition("-")
    parts = [int(x) for x in hms.split(":") if x.isdigit()]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days.isdigit() else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def run_slurm(exp, out, runs, extra, minutes, throttle):
    """Submits the array (at most `throttle` tasks at once), waits for every task, returns the
    table's rows (wall_s: the task's RunTime from scontrol, whole seconds)."""
    np_ = subprocess.run([BIN, "run", exp, "--world-size"], capture_output=True, text=True, check=True).stdout.strip()
    array = f"0-{len(runs) - 1}%{max(1, throttle)}"
    t0 = time.time()
    p = subprocess.run(["sbatch", "--parsable", "--wait", f"--ntasks={np_}", f"--array={array}",
                        os.path.join(out, "sweep.sbatch")], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    job = p.stdout.strip().split(";")[0]
    if not job:
        sys.exit(f"sweep: sbatch failed (exit {p.returncode}): {p.stderr.strip()}")
    wall = time.time() - t0
    print(f"# slurm job {job}: {len(runs)} tasks of {np_} ranks done in {wall:.0f} s", flush=True)
    states = slurm_task_states(job)
    rows = []
    for i, (run_dir, seed, combo) in enumerate(runs):
        state, rc, sig, run_s = states.get(i, ("UNKNOWN", -1, "", 0))
        timed_out = state == "TIMEOUT"
        if state != "COMPLETED":
            log = os.path.join(out, f"slurm-{job}_{i}.out")
            variant = " ".join(f"{k}={v}" for k, v in combo) or "(base)"
            print(f"# task {i} ({variant}, seed {seed}; {run_dir}): {state}, exit {rc}:{sig} — log {log}", flush=True)
        rows.append(row_of(run_dir, seed, combo, 124 if timed_out else rc, run_s, timed_out))
    return rows


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="jobs/sweep.sh")
    ap.add_argument("experiment")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--set", action="append", default=[], help="key=v1,v2,... (one axis per key)")
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    ap.add_argument("--slurm", action="store_true", help="run the sweep as a Slurm array job: submit, wait, collect")
    ap.add_argument("--slurm-script", action="store_true", help="only write the Slurm array script and runs.txt")
    ap.add_argument("--slurm-time", type=int, default=30, help="time limit of each array task, minutes")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.experiment):
        sys.exit(f"sweep: {a.experiment}: no such experiment file")
    axes = []
    for s in a.set:
        if "=" not in s:
            sys.exit(f"sweep: --set {s}: expected key=v1,v2")
        k, vs = s.split("=", 1)
        axes.append([(k, v) for v in vs.split(",")])
    name = os.path.splitext(os.path.basename(a.experiment))[0]
    out = a.out or os.path.join("results", name, f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    os.makedirs(out, exist_ok=False)
    runs = []
    for combo in itertools.product(*axes) if axes else [()]:
        for seed in seeds(a.seeds):
            runs.append((os.path.join(out, f"run-{len(runs):04d}"), seed, combo))
    if a.slurm or a.slurm_script:
        script, table = slurm_script(a.experiment, out, runs, extra, a.slurm_time)
        with open(os.path.join(out, "sweep.sbatch"), "w") as f:
            f.write(script)
        with open(os.path.join(out, "runs.txt"), "w") as f:
            f.write(table)
        if a.slurm_script:
            print(f"# {len(runs)} runs: sbatch --ntasks=<world size> {os.path.join(out, 'sweep.sbatch')}")
            return
        rows = run_slurm(a.experiment, out, runs, extra, a.slurm_time, a.jobs)
        for row in rows:
            print(f"{row['variant']:40s} seed {row['seed']:4d}  exit {row['exit']}  {row['verdict']:10s}", flush=True)
    else:
        rows = [None] * len(runs)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            futs = {pool.submit(run_one, a.experiment, d, s, c, extra): i for i, (d, s, c) in enumerate(runs)}
            for fut in concurrent.futures.as_completed(futs):
                row = rows[futs[fut]] = fut.result()
                print(f"{row['variant']:40s} seed {row['seed']:4d}  exit {row['exit']}  {row['verdict']:10s} {row['wall_s']} s",
                      flush=True)
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    write_h5(os.path.join(out, "sweep.h5"), rows)
    print(f"# sweep table: {os.path.join(out, 'sweep.csv')} and sweep.h5")
    print("# variant                                  runs  failed  (exit != 0)")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == variant]
        print(f"  {variant:40s} {len(rs):4d}  {sum(1 for r in rs if r['exit'] != 0):6d}")


if __name__ == "__main__":
    main()
