#!/usr/bin/python3
"""The combination sweep behind jobs/combinations.sh: every pair of features (and each feature
alone) over experiments/combinations.toml, at 4 and 8 ranks, under sets of failpoints, over seeds;
then each buggy protocol variant in every cell where it is active.

Features: tiers (host pool and file storage), cp (CP2, pages sharded), pp (PP2), pd (a prefill and
a decode group, decode reuses its own tree), draft (a packed MTP-style draft, 3 tokens a round),
hybrid (FULL, SWA and MAMBA layers). A pair kvgrid refuses at load (hybrid + cp) runs once and
must still be refused (exit 2). A cell's ranks are split over P/D's groups first, then CP and PP, and TP takes the rest.

The correct protocols must give verdict OK (no oracle mismatch, no divergence) and no draft
mismatch in every run. A buggy variant is caught in a run that fails (exit != 0: oracle mismatch,
divergence, shape mismatch, a check; exit 2 is bad input, not a catch) or, for target_only, counts draft mismatches; it must be
caught in at least one seed of every cell where it is active. Results go through `kvgrid report
--json` and `kvgrid check` only (jobs/sweep.py's table: sweep.csv and sweep.h5 with one row per run).

  jobs/combinations.sh [--ranks 4,8] [--seeds 1-3] [--cells tiers+pp,...] [--faults none,copies,...]
                       [--bugs a,b] [--out DIR] [--jobs N] [--deadline S] [--markdown FILE] [--smoke] [--golden FILE]
  --smoke: the suite's cut (three cells at 4 ranks, seed 1, a 5 s watchdog for the variant that hangs); its
  table and summary are golden text (--golden FILE writes them).
  Exit 1 when a correct run fails or a buggy variant escapes a cell where it is active.
"""
import argparse
import concurrent.futures
import csv
import itertools
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402  the sweep table's columns, rows, HDF5 writer and seed lists ("1-3,7")
from sweep import seeds  # noqa: E402
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVGRID_BIN", os.path.join(SRC, "build", "kvgrid"))
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
BASE = os.path.join(SRC, "experiments", "combinations.toml")
ENV = mpi_env()  # jobs/env.sh's settings

FEATURES = ["tiers", "cp", "pp", "pd", "draft", "hybrid"]
SETS = {
    "tiers": ["cache.host_pages=128", "cache.storage=file"],
    # two gather slots of 32 pages (a 432-token prompt needs 27) come out of the device budget
    "cp": ["cache.cp_sharding=sharded", "cache.device_pages=80", "cache.gather_pages=32"],
    "pp": [],
    "pd": [],
    "draft": ["model.draft.mode=packed", "model.draft.layers=1", "model.draft.steps=3", "model.draft.accept_prob=0.7"],
    # FULL, SWA (a 64-token window) and MAMBA layers; at PP2 each stage holds a FULL layer and another kind
    "hybrid": ["model.layer_types=full,swa,full,mamba", "model.swa_window=64", "model.mamba_chunk=64",
               "cache.swa_pages=64", "cache.mamba_slots=32"],
}
# pairs kvgrid refuses at load (docs/limitations.md): the sweep checks that they still are
REFUSED = {("cp", "hybrid"): "SWA pages and MAMBA states have no owner placement and no layer gather"}
REFUSE = "refused"  # the plan's bug slot of a refused pair's one run


# pairs whose features change each other's sizes: a sharded host pool holds each page once per CP
# group, so tiers + CP halve it per rank to keep the storage tier in use
PAIR_SETS = {("tiers", "cp"): ["cache.host_pages=64"]}


# failpoint sets: name -> [(failpoint, probability, its parameters, whether a cell has anything for
# it to act on)]; a cell runs the failpoints of a set it has something for, and a set only where
# at least one applies
def tiers(c):
    return "tiers" in c


def any_cell(c):
    return True


FAULTS = {
    "none": [],
    "copies": [("transfer.delay", 0.1, {"delay_us": 2000}, tiers), ("transfer.fail", 0.05, {}, tiers),
               ("transfer.load.fail", 0.05, {}, tiers), ("host.alloc.fail", 0.05, {}, tiers)],
    "storage": [("storage.read.slow", 0.3, {"delay_ms": 1}, tiers), ("storage.read.fail", 0.2, {}, tiers),
                ("storage.read.short", 0.2, {}, tiers), ("storage.object.corrupt", 0.2, {}, tiers)],
    "requests": [("request.abort", 0.02, {}, any_cell), ("device.alloc.fail", 0.05, {}, any_cell),
                 ("p2p.delay", 0.1, {"delay_us": 500}, lambda c: "pp" in c or "pd" in c)],  # stage messages, P/D suffixes
    "pd": [("pd.transfer.fail", 0.1, {}, lambda c: "pd" in c),
           ("pd.restore.fail", 0.2, {}, lambda c: "pd" in c and "tiers" in c)],  # decode's host restores
}


def failpoints(fs, cell):
    """The failpoints of set `fs` that have something to act on in `cell`."""
    return [name for name, p, extra, has in FAULTS[fs] if has(cell)]


def fault_sets(fs, cell):
    """--set lines of the failpoints of `fs` that apply in `cell`."""
    out = []
    for name, p, extra, need in FAULTS[fs]:
        if name in failpoints(fs, cell):
            out += [f"faults.{name}.probability={p}"] + [f"faults.{name}.{k}={v}" for k, v in extra.items()]
    return out


# buggy variant -> (the features it needs, all of them; what replaces the correct setting; the
# failpoint set it runs under; its bug-catalogue entries and what it breaks, for the docs)
BUGS = {
    "tp_sync=per_rank": ({"tiers"}, ["protocol.tp_sync=per_rank"], "copies",
                         "#11, #2: each rank consumes the backup ACKs it sees itself"),
    "pp_sync=independent_polling": ({"tiers", "pp"}, ["protocol.pp_sync=independent_polling"], "copies",
                                    "#3: each stage polls its own copies' events"),
    "cp_sharding=any_owner_restore": ({"tiers", "cp"}, ["cache.cp_sharding=any_owner_restore"], "none",
                                      "a sharded restore lands on any free page, not on its owner"),
    "layer_gather=before_restore_event": ({"tiers", "cp"}, ["protocol.layer_gather=before_restore_event"], "none",
                                          "#9's class: layer l's gather is posted before its restore copies landed"),
    "draft=target_only": ({"draft", "tiers"}, ["model.draft.mode=target_only"], "none",
                          "#6: the draft reads a prefix the cache kept only for the target"),
    "pd_restore=unchecked": ({"pd", "tiers"}, ["protocol.pd_restore=unchecked"], "pd",
                             "#8's class: decode's broken host restores are published unchecked"),
    "load_back=unchecked": ({"tiers"}, ["protocol.load_back=unchecked"], "copies",
                            "#8, #12: a broken host->device load-back is read unchecked"),
    "component_boundary=local_components": ({"hybrid", "pp"}, ["protocol.component_boundary=local_components"], "none",
                                            "a stage's tree keeps only the components of its own layers"),
}

SMOKE = {"ranks": "4", "seeds": "1", "deadline": "5", "cells": "tiers+pp,cp+pd,tiers+draft", "faults": "none,copies",
         "bugs": "pp_sync=independent_polling,draft=target_only,load_back=unchecked"}


def die(msg):
    """Bad arguments: the message, exit 2, nothing written."""
    print(f"combinations: {msg}", file=sys.stderr)
    sys.exit(2)


def cells(spec):
    """Cells as sorted feature tuples: every pair and every single feature, or the named ones."""
    if spec:
        out = []
        for c in spec.split(","):
            fs = tuple(sorted(c.split("+"), key=FEATURES.index)) if all(f in FEATURES for f in c.split("+")) else None
            if not fs or len(fs) > 2 or len(set(fs)) != len(fs):
                die(f"--cells {c}: expected one feature or two joined by + among {', '.join(FEATURES)}")
            out.append(fs)
        return out
    return [(f,) for f in FEATURES] + list(itertools.combinations(FEATURES, 2))


def name(cell):
    return "+".join(cell)


def topology(cell, ranks):
    """The [topology] block of a cell (P/D: a prefill and a decode group), as TOML text."""
    groups, cp, pp = (2 if "pd" in cell else 1), (2 if "cp" in cell else 1), (2 if "pp" in cell else 1)
    if ranks < 1 or ranks % (groups * cp * pp):
        die(f"--ranks {ranks}: cell {name(cell)} needs a multiple of {groups * cp * pp} ranks")
    group = ranks // groups
    tp = group // (cp * pp)
    if "pd" not in cell:
        return f"[topology]\ntp = {tp}\ncp = {cp}\npp = {pp}\n"
    if "cp" in cell:  # different shard groups: prefill shards over every rank of its group, decode over CP2 or not at all
        n = group // pp
        pre, dec = (1, n, pp), ((n // 2, 2, pp) if n >= 4 else (n, 1, pp))
    else:
        pre = dec = (tp, cp, pp)
    return "".join(f"[topology.{g}]\ntp = {t[0]}\ncp = {t[1]}\npp = {t[2]}\n" for g, t in (("prefill", pre), ("decode", dec)))


def experiment(out, cell, ranks):
    """Writes the cell's experiment file (the base with the cell's topology) and returns its path."""
    with open(BASE) as f:
        text = f.read()
    text = re.sub(r"^\[topology\]\n(?:[a-z]+ = \d+\n)+", topology(cell, ranks), text, count=1, flags=re.M)
    path = os.path.join(out, f"{name(cell)}@{ranks}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def applies(fs, cell):
    return fs == "none" or bool(failpoints(fs, cell))


def active(bug, cell):
    return BUGS[bug][0] <= set(cell)


def run_one(exp, ranks, run_dir, seed, sets):
    cmd = [MPIEXEC, "-np", str(ranks), BIN, "run", exp, "--out", run_dir, "--seed", str(seed)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=600)
        rc, timed_out = p.returncode, False
        if os.path.isdir(run_dir):  # what the run printed, beside its trace (the reproduce line of a failure)
            with open(os.path.join(run_dir, "console.txt"), "w") as f:
                f.write(p.stdout + p.stderr)
    except subprocess.TimeoutExpired:
        rc, timed_out = 124, True
    except OSError as e:  # the launcher or the binary went missing (rebuilt under a running sweep): a failed row
        print(f"# {run_dir}: {e}", flush=True)
        rc, timed_out = 127, False
    row = sweep.row_of(run_dir, seed, [], rc, time.time() - t0, timed_out)
    row["draft_mismatch"], row["fired"] = 0, {}
    if os.path.exists(os.path.join(run_dir, "run.h5")):
        r = subprocess.run([BIN, "report", run_dir, "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            j = json.loads(r.stdout)
            row["draft_mismatch"] = j.get("spec", {}).get("draft_mismatch_steps", 0)
            row["fired"] = j.get("faults", {})
    return row


def caught_by(row):
    """What caught a failed run, in words."""
    if row["draft_mismatch"]:
        return "draft mismatch"
    if str(row["oracle_mismatches"]) not in ("", "0"):
        return "oracle"
    if row["first_divergence"] or str(row["divergences"]) not in ("", "0"):
        return "divergence"
    return f"exit {row['exit']}"


def failed(row):
    """A run that did not end clean: it stopped, failed its checks, read a blind draft prefix, or was
    refused at load."""
    return row["exit"] != 0 or row["verdict"] != "OK" or row["draft_mismatch"] > 0


def caught(row):
    """A buggy variant's run that a check caught: failed, but not refused at load (exit 2 is bad input)."""
    return failed(row) and row["exit"] != 2


def main():
    ap = argparse.ArgumentParser(prog="jobs/combinations.sh", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--cells", default="")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--bugs", default=",".join(BUGS))
    ap.add_argument("--out")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--deadline", default="", help="watchdog deadline of every run, seconds (default: the experiment's 30; "
                    "a buggy variant that hangs ends there)")
    ap.add_argument("--markdown", help="write the docs' summary matrix and bug table to this file")
    ap.add_argument("--golden", help="write the table's deterministic columns and the summary to this file (the suite's golden text)")
    ap.add_argument("--smoke", action="store_true", help="the test suite's cut: " + " ".join(f"--{k} {v}" for k, v in SMOKE.items()))
    a = ap.parse_args()
    if a.smoke:
        for k, v in SMOKE.items():
            setattr(a, k, v)
    for f in a.faults.split(","):
        if f not in FAULTS:
            die(f"--faults {f}: unknown; known: {', '.join(FAULTS)}")
    bugs = [b for b in a.bugs.split(",") if b]
    for b in bugs:
        if b not in BUGS:
            die(f"--bugs {b}: unknown; known: {', '.join(BUGS)}")
    try:
        float(a.deadline or 0)
        ranks = [int(r) for r in a.ranks.split(",")]
        ss = seeds(a.seeds)
    except ValueError:
        die(f"--ranks {a.ranks} / --seeds {a.seeds} / --deadline {a.deadline}: expected numbers like 4,8, 1-3 and 30")
    cs = cells(a.cells)
    for cell, n in itertools.product(cs, ranks):
        topology(cell, n)  # refuses a cell that does not fit before anything is written
    out = a.out or os.path.join(SRC, "results", "combinations", time.strftime("sweep-%Y%m%d-%H%M%S", time.gmtime()))
    if os.path.exists(out):
        die(f"--out {out}: exists (a sweep writes a new directory)")
    os.makedirs(out)

    # every run: (cell, ranks, fault set, bug or None, seed)
    plan = []
    for cell, n in itertools.product(cs, ranks):
        if cell in REFUSED:  # one run, at the first rank count and seed: it must be refused at load (exit 2)
            plan += [(cell, n, "none", REFUSE, ss[0])] if n == ranks[0] else []
            continue
        for fs in a.faults.split(","):
            if applies(fs, cell):
                plan += [(cell, n, fs, None, s) for s in ss]
        for b in bugs:
            if active(b, cell):
                plan += [(cell, n, BUGS[b][2], b, s) for s in ss]
    print(f"# combination sweep: {len(cs)} cells x ranks {a.ranks} x seeds {a.seeds}, {len(plan)} runs ({BIN}); "
          f"table under {out}", flush=True)

    exps = {(cell, n): experiment(out, cell, n) for cell, n in itertools.product(cs, ranks)}  # before any run reads one

    def launch(i, item):
        cell, n, fs, bug, s = item
        sets = sets_of(cell) + fault_sets(fs, cell) + (BUGS[bug][1] if bug in BUGS else [])
        sets += [f"engine.deadline_s={a.deadline}"] if a.deadline else []
        try:
            row = run_one(exps[(cell, n)], n, os.path.join(out, f"run-{i:04d}"), s, sets)
        except OSError as e:  # kvgrid itself went missing (rebuilt under a running sweep): a failed row, not a lost sweep
            row = {c: "" for c in sweep.COLUMNS}
            row.update(seed=s, exit=127, verdict=f"error: {e}", draft_mismatch=0, fired={}, run=os.path.join(out, f"run-{i:04d}"))
        row["variant"] = f"{name(cell)}@{n} faults={fs}" + (f" bug={bug}" if bug else "")
        return row

    rows = [None] * len(plan)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = {pool.submit(launch, i, item): i for i, item in enumerate(plan)}
        for fut in concurrent.futures.as_completed(futs):
            i = futs[fut]
            row = rows[i] = fut.result()
            bug = plan[i][3]
            bad = row["exit"] != 2 if bug == REFUSE else not caught(row) if bug else failed(row)
            print(f"{row['variant']:60s} seed {row['seed']:3d}  exit {row['exit']}  {row['verdict'] or '-':10s}"
                  f"{' draft mismatches ' + str(row['draft_mismatch']) if row['draft_mismatch'] else ''}"
                  f"{'  <-- UNEXPECTED' if bad else ''}", flush=True)
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sweep.COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    sweep.write_h5(os.path.join(out, "sweep.h5"), rows)
    print(f"# sweep table: {os.path.join(out, 'sweep.csv')} and sweep.h5")
    return summarize(a, cs, ranks, bugs, plan, rows)


def sets_of(cell):
    return [s for f in cell for s in SETS[f]] + PAIR_SETS.get(tuple(cell), [])


def summarize(a, cs, ranks, bugs, plan, rows):
    """Prints the summary (deterministic: the suite's golden text) and writes --markdown."""
    lines, bad = [], 0
    lines.append("# correct protocols: runs failed/total per cell (feature x feature; the diagonal is the feature alone)")
    lines.append("  " + "".join(f"{f:>10s}" for f in FEATURES))
    matrix, refusals = {}, {}
    for (cell, n, fs, bug, s), row in zip(plan, rows):
        if bug == REFUSE:
            refusals[tuple(cell)] = row["exit"] == 2
            bad += row["exit"] != 2
        if bug is None:
            k = tuple(cell) if len(cell) == 2 else (cell[0], cell[0])
            t, f = matrix.get(k, (0, 0))
            matrix[k] = (t + 1, f + failed(row))
            bad += failed(row)
    for f1 in FEATURES:
        cellsx = []
        for f2 in FEATURES:
            k = tuple(sorted((f1, f2), key=FEATURES.index))
            t, f = matrix.get(k, (0, 0))
            cellsx.append({True: "refused", False: "RAN"}[refusals[k]] if k in refusals else f"{f}/{t}" if t else "-")
        lines.append(f"  {f1:8s}" + "".join(f"{c:>10s}" for c in cellsx))
    lines.append("# buggy variants: cells where active, caught in at least one seed (seeds caught)")
    escapes = []
    for b in bugs:
        per = {}
        for (cell, n, fs, bug, s), row in zip(plan, rows):
            if bug == b:
                per.setdefault(f"{name(cell)}@{n}", []).append((s, caught(row)))
        seeds_caught = {k: [s for s, x in v if x] for k, v in per.items()}
        how = sorted({caught_by(row) for (cell, n, fs, bug, s), row in zip(plan, rows) if bug == b and caught(row)})
        missed = [k for k, v in seeds_caught.items() if not v]
        escapes += [(b, k) for k in missed]
        detail = " ".join(f"{k}:{len(v)}/{len(per[k])}" for k, v in seeds_caught.items())
        lines.append(f"  {b:36s} {len(per) - len(missed)}/{len(per)} cells  {detail}  [{', '.join(how) or 'nothing'}]")
    bad += len(escapes)
    lines.append("# failpoints that never fired in a cell where their set ran (all seeds)")
    fired, nothing, c_cell = {}, True, {}
    for (cell, n, fs, bug, s), row in zip(plan, rows):
        c_cell[f"{name(cell)}@{n}"] = cell
        if bug is None and fs != "none":
            d = fired.setdefault((fs, f"{name(cell)}@{n}"), {})
            for k, v in row["fired"].items():
                d[k] = d.get(k, 0) + v
    for (fs, c), d in fired.items():
        never = [f for f in failpoints(fs, c_cell[c]) if not d.get(f)]
        if never:
            nothing = False
            lines.append(f"  {c:16s} {fs:9s} " + " ".join(never))
    if nothing:
        lines.append("  (none: every failpoint fired in every cell)")
    for b, k in escapes:
        lines.append(f"  ESCAPED: {b} in {k}")
    for c, ok in refusals.items():
        lines.append(f"  {'refused at load as documented' if ok else 'NOT REFUSED (docs/limitations.md says it is)'}: "
                     f"{name(c)} ({REFUSED[c]})")
    lines.append(f"# {'OK' if not bad else 'FAILED'}: {sum(1 for p in plan if p[3] is None)} correct runs, "
                 f"{sum(1 for p in plan if p[3] in BUGS)} buggy runs")
    print("\n".join(lines), flush=True)
    if a.golden:
        keep = [c for c in sweep.COLUMNS if c not in ("wall_s", "run")]
        with open(a.golden, "w") as f:
            f.write(f"# jobs/combinations.sh --ranks {a.ranks} --seeds {a.seeds} --cells {a.cells or '(all)'} --faults {a.faults} "
                    f"--bugs {','.join(bugs)}\n")
            f.write("\t".join(keep + ["draft_mismatch"]) + "\n")
            for row in rows:
                f.write("\t".join(str(row[c]) for c in keep + ["draft_mismatch"]) + "\n")
            f.write("\n".join(lines) + "\n")
    if a.markdown:
        write_markdown(a.markdown, matrix, refusals, bugs, plan, rows, a)
    return 1 if bad else 0


def write_markdown(path, matrix, refusals, bugs, plan, rows, a):
    with open(path, "w") as f:
        f.write(f"Correct protocols, runs failed / total (ranks {a.ranks}, seeds {a.seeds}, failpoint sets "
                f"{a.faults}; the diagonal is the feature alone):\n\n")
        f.write("| | " + " | ".join(FEATURES) + " |\n|---|" + "---|" * len(FEATURES) + "\n")
        for f1 in FEATURES:
            vals = []
            for f2 in FEATURES:
                k = tuple(sorted((f1, f2), key=FEATURES.index))
                t, x = matrix.get(k, (0, 0))
                vals.append(("refused" if refusals[k] else "RAN") if k in refusals else f"{x}/{t}" if t else "–")
            f.write(f"| **{f1}** | " + " | ".join(vals) + " |\n")
        f.write("\nBuggy variants, seeds caught / run in each cell where the variant is active:\n\n")
        f.write("| variant | needs | what it breaks | cells caught | caught by | per cell |\n|---|---|---|---|---|---|\n")
        for b in bugs:
            per = {}
            for (cell, n, fs, bug, s), row in zip(plan, rows):
                if bug == b:
                    per.setdefault(f"{name(cell)}@{n}", []).append(caught(row))
            k = sum(1 for v in per.values() if any(v))
            how = ", ".join(sorted({caught_by(r) for p, r in zip(plan, rows) if p[3] == b and caught(r)})) or "nothing"
            detail = ", ".join(f"{c} {sum(v)}/{len(v)}" for c, v in per.items())
            f.write(f"| `{b}` | {' + '.join(sorted(BUGS[b][0], key=FEATURES.index))} | {BUGS[b][3]} | {k}/{len(per)} | {how} | {detail} |\n")


if __name__ == "__main__":
    sys.exit(main())
