#!/usr/bin/python3
"""The component bug record (bug-catalogue #14-#23) as seeds: every planted bug of
`cache.component_bugs` in its scenario (experiments/component_bugs.toml plus the bug's --set
lines), over a range of seeds, next to the correct code in the same scenario. Prints, per bug, in
how many seeds it was caught, from which seed on, and what caught it (the oracle, verify(), an
insert's own post-condition); a bug counts as caught only by what its table entry names.
--markdown writes the docs' table.

  jobs/component_bugs.py --seeds 1-10 [--markdown FILE] [--bugs a,b] [--jobs N]
  jobs/component_bugs.py --check --seeds 1     exit 1 unless every bug is caught, by what it names, in every seed and
                                               the correct code runs clean (the test suite's smoke)
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digests import seeds  # noqa: E402  "1-3,7" -> [1, 2, 3, 7]
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVGRID_BIN", os.path.join(SRC, "build", "kvgrid"))
EXP = os.path.join(SRC, "experiments", "component_bugs.toml")
ENV = mpi_env()  # jobs/env.sh's settings

FULL_SWA = ["model.layer_types=full,swa"]
# bug -> (catalogue number, scenario: --set lines on experiments/component_bugs.toml, the scenario
# in words, what must catch it: "oracle", "verify()" or "insert check" — the hybrid cache's own
# post-condition that every page of an inserted prefix holds a FULL page)
BUGS = {
    "swa_run_across_tombstones": (14, FULL_SWA, "A → B → A, FULL + SWA", "oracle"),
    "heal_frees_stale": (15, FULL_SWA + ["workload.kind=cold_prefix", "workload.cold_prefix.prefix_len=500",
                                         "engine.chunk_size=100"], "concurrent cold prefills, FULL + SWA, chunks of 100", "oracle"),
    "unfinished_insert_live": (16, [], "A → B → A, window 48 < chunk 128", "verify()"),
    "floored_frontier": (17, ["model.swa_window=8"], "A → B → A, window 8 < page 16", "oracle"),
    "swa_veto_full_leaf": (18, [], "A → B → A", "insert check"),
    "swa_load_whole_node": (19, FULL_SWA + ["cache.host_pages=512", "cache.device_pages=64", "workload.kind=multiturn",
                                            "workload.multiturn.clients=8", "workload.multiturn.rounds=4",
                                            "workload.multiturn.request_length=160", "workload.multiturn.sub_question_length=16",
                                            "workload.multiturn.output_length=16", "workload.multiturn.max_in_flight=4"],
                            "multi-turn with the host tier, turns shorter than the window (32 < 48 tokens), device pressure",
                            "verify()"),
    "split_truncates_state": (20, ["model.layer_types=full,mamba"], "A → B → A, FULL + MAMBA (B splits A mid-edge)", "oracle"),
    "state_at_floor": (21, ["workload.kind=multiturn", "workload.multiturn.output_length=40"],
                       "multi-turn, 40 output tokens (decode passes checkpoint depths)", "oracle"),
    "mtp_state_at_floor": (21, ["workload.kind=multiturn", "workload.multiturn.output_length=40", "model.draft.mode=packed",
                                "model.draft.layers=1", "model.draft.steps=3", "model.draft.accept_prob=0.7"],
                           "multi-turn with speculative decoding (3 draft tokens a round): verify steps pass checkpoint depths",
                           "oracle"),
    "shared_state_slot": (22, [], "A → B → A", "oracle"),
    "read_past_boundary": (23, [], "A → B → A", "oracle"),
}


def plain(msg):
    """A check's message without its numbers and the request it names."""
    msg = re.sub(r"^request \d+: ", "", msg.strip())
    return re.sub(r"\d+", "N", msg)


def catcher(text):
    """What stopped or failed a run, from its console, as (class, detail); None: it ran clean."""
    if m := re.search(r"oracle mismatches: (\d+) FAILED", text):
        return "oracle", f"{m.group(1)} mismatches"
    if "shape mismatch" in text:
        return "shape mismatch", ""
    if m := re.search(r"verify failed at step \d+: \S+ \[rank \d+\] check failed: `.*?` (.*)", text):
        return "verify()", plain(m.group(1))
    if m := re.search(r"internal error: (\S+?):\d+ \[rank \d+\] check failed: `.*?` (.*)", text):
        where = os.path.basename(m.group(1))
        return ("insert check" if where == "hybrid_cache.cpp" else where + " check"), plain(m.group(2))
    if "verdict: OK" in text:
        return None
    return "failed", text.strip().splitlines()[-1][:120] if text.strip() else "no output"


def run(sets, seed, tmp, n):
    out = os.path.join(tmp, f"r{n}")
    args = [BIN, "run", EXP, "--seed", str(seed), "--out", out]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=600)
    text = p.stdout + p.stderr
    c = catcher(text)
    if c is None and p.returncode != 0:
        c = f"exit {p.returncode}"
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--bugs", default=",".join(BUGS))
    ap.add_argument("--markdown")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one process each; default 2)")
    a = ap.parse_args()
    ss = seeds(a.seeds)
    rows, bad = [], 0
    print(f"# component bugs over seeds {a.seeds}: {BIN}", flush=True)
    bugs = a.bugs.split(",")
    for bug in bugs:
        if bug not in BUGS:
            print(f"unknown bug {bug!r}; known: {', '.join(BUGS)}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="kvgrid-bugs-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        # every run at once (the correct code and the planted bug, per seed), read back in order
        runs = {}
        for bug in bugs:
            sets = BUGS[bug][1]
            for s in ss:
                for planted in (False, True):
                    n = len(runs) + 1
                    runs[(bug, s, planted)] = pool.submit(run, sets + ([f"cache.component_bugs={bug}"] if planted else []), s, tmp, n)
        for bug in bugs:
            num, sets, words, expected = BUGS[bug]
            clean, caught, what = 0, [], {}
            unclean = []
            for s in ss:
                if (c := runs[(bug, s, False)].result()) is None:
                    clean += 1
                else:
                    unclean.append(f"seed {s}: {c}")
                c = runs[(bug, s, True)].result()
                if c is not None:
                    key = f"{c[0]}: {c[1]}" if c[1] else c[0]
                    what[key] = what.get(key, 0) + 1
                    if c[0] == expected:
                        caught.append(s)
            first = caught[0] if caught else None
            ok = clean == len(ss) and len(caught) == len(ss)
            bad += not ok
            how = "; ".join(f"{k} ×{v}" if len(what) > 1 else k for k, v in sorted(what.items(), key=lambda kv: -kv[1]))
            print(f"#{num:<3} {bug:26} correct clean {clean}/{len(ss)}  caught by {expected} {len(caught)}/{len(ss)}"
                  f" (first seed {first})  [{how or 'nothing'}]", flush=True)
            for u in unclean:  # what stopped the correct code
                print(f"#      the correct code failed at {u}", flush=True)
            rows.append((num, bug, words, how or "not caught", len(caught), len(ss), first, clean))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| # | `cache.component_bugs` | scenario | caught by | caught in | correct code clean |\n")
            f.write("|---|---|---|---|---|---|\n")
            for num, bug, words, how, k, total, first, clean in rows:
                since = f" (from seed {first})" if first is not None else ""
                f.write(f"| {num} | `{bug}` | {words} | {how} | {k}/{total}{since} | {clean}/{total} |\n")
    if a.check:
        print(f"# {len(rows) - bad} of {len(rows)} bugs caught in every seed, the correct code clean")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
