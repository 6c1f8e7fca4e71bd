"""Sweep driver behind jobs/sweep.sh (reads results only through `kvgrid report --json`)."""
import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import time


def seeds(spec):
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


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
    out = a.out or os.path.join("results", "sweeps", f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    os.makedirs(out, exist_ok=False)
    rows = []
    for combo in itertools.product(*axes) if axes else [()]:
        variant = " ".join(f"{k}={v}" for k, v in combo) or "(base)"
        for seed in seeds(a.seeds):
            run_dir = os.path.join(out, f"run-{len(rows):04d}")
            cmd = ["jobs/run.sh", a.experiment, "--", "--out", run_dir, "--seed", str(seed)]
            for k, v in combo:
                cmd += ["--set", f"{k}={v}"]
            cmd += extra
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.time() - t0
            row = {"variant": variant, "seed": seed, "exit": p.returncode, "verdict": "", "oracle_mismatches": "",
                   "divergences": "", "hit_rate": "", "ttft_p50_ms": "", "wall_s": f"{wall:.2f}", "run": run_dir}
            if os.path.exists(os.path.join(run_dir, "run.h5")):
                r = subprocess.run(["build/kvgrid", "report", run_dir, "--json"], capture_output=True, text=True)
                if r.returncode == 0:
                    j = json.loads(r.stdout)
                    row["verdict"] = j.get("verdict") or "incomplete"
                    row["oracle_mismatches"] = j.get("oracle_mismatches", "")
                    row["divergences"] = j.get("divergences", "")
                    if "hit_rate" in j:
                        row["hit_rate"] = f"{j['hit_rate']['total']:.4f}"
                        row["ttft_p50_ms"] = f"{j['ttft_model_ms']['p50']:.3f}"
            rows.append(row)
            print(f"{variant:40s} seed {seed:4d}  exit {p.returncode}  {row['verdict']:10s} {row['wall_s']} s", flush=True)
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"# sweep table: {os.path.join(out, 'sweep.csv')}")
    print("# variant                                  runs  failed  (exit != 0)")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == variant]
        print(f"  {variant:40s} {len(rs):4d}  {sum(1 for r in rs if r['exit'] != 0):6d}")


if __name__ == "__main__":
    main()
