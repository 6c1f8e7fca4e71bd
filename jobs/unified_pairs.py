#!/usr/bin/python3
"""Cross-layout reuse of unified storage objects: for writer/reader layout pairs, a writer job
serves four prompts into a fresh storage directory, then a reader job of the other layout serves
the same prompts over it. A pair passes when both verdicts and oracles are OK, the reader serves
every reusable page from storage (4 x 240 tokens) and each rank wrote and read exactly one object
per chunk it holds per page (an 8-layer, 8-KV-head model cut into 2-layer x 1-head chunks, so
every TP in {1, 2, 4, 8} and PP in {1, 2, 4} aligns).

  jobs/unified_pairs.py [--pairs smoke|all] [--redis] [--out DIR]     (default: all, files, results/unified_pairs)

--redis: the objects live on a private Redis server (jobs/redis.sh) instead of a directory; the
server is emptied (FLUSHALL) before each pair.

Prints one row per pair and a summary; exit 1 when a pair fails. $KVGRID_BIN names the binary.
"""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVGRID_BIN", os.path.join(ROOT, "build", "kvgrid"))
EXP = os.path.join(ROOT, "experiments", "unified_layout.toml")
ENV = mpi_env()  # jobs/env.sh's settings
MODEL = ["--set", "model.layers=8", "--set", "model.kv_heads=8", "--set", "cache.storage_layer_partition=2",
         "--set", "cache.storage_head_partition=1"]
LAYOUTS = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4) if tp * pp <= 8]
SMOKE = [((4, 2), (1, 1)), ((1, 4), (8, 1))]
PAGES_WRITTEN, PAGES_READ = 4 * 16, 4 * 15  # per prompt: 16 whole pages of KV, 15 reusable


def chunks(tp, pp):
    return (8 // pp // 2) * (8 // tp)  # layer ranges x head groups a rank holds


REDIS = None  # (url, port) of the private server with --redis


def serve(layout, store, out):
    tp, pp = layout
    cmd = [os.environ.get("MPIEXEC", "mpirun"), "-np", str(tp * pp), BIN, "run", EXP, "--out", out, *MODEL,
           "--set", f"topology.tp={tp}", "--set", f"topology.pp={pp}", "--set", "cache.storage_dir=" + store]
    if REDIS:
        cmd += ["--set", "cache.storage=redis", "--set", "cache.storage_url=" + REDIS[0]]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=240)
    if p.returncode != 0 or "# verdict: OK" not in p.stdout or "# oracle mismatches: 0 OK" not in p.stdout:
        return None, (p.stdout + p.stderr)[-2000:]
    rep = subprocess.run([BIN, "report", out, "--json"], capture_output=True, text=True, env=ENV, timeout=120)
    return json.loads(rep.stdout), ""


def pair(writer, reader, work):
    store = tempfile.mkdtemp(prefix="store-", dir=work)
    if REDIS:
        subprocess.run(["redis-cli", "-p", REDIS[1], "flushall"], capture_output=True, timeout=60)
    w, why = serve(writer, store, os.path.join(work, f"w{writer[0]}x{writer[1]}-r{reader[0]}x{reader[1]}"))
    if w is None:
        return False, "writer failed: " + why
    r, why = serve(reader, store, os.path.join(work, f"r{reader[0]}x{reader[1]}-w{writer[0]}x{writer[1]}"))
    shutil.rmtree(store, ignore_errors=True)
    if r is None:
        return False, "reader failed: " + why
    problems = []
    if w["storage_objects"]["written"] != [PAGES_WRITTEN * chunks(*writer)] * (writer[0] * writer[1]):
        problems.append(f"writer objects {w['storage_objects']['written']}")
    if r["storage_objects"]["read"] != [PAGES_READ * chunks(*reader)] * (reader[0] * reader[1]):
        problems.append(f"reader objects {r['storage_objects']['read']}")
    if r["cached_tokens"]["storage"] != 4 * 240:
        problems.append(f"reader storage hit {r['cached_tokens']['storage']} tokens")
    return not problems, "; ".join(problems) or f"read {r['storage_objects']['read'][0]} objects per rank"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", choices=["smoke", "all"], default="all")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "unified_pairs"))
    ap.add_argument("--redis", action="store_true", help="objects on a private Redis server instead of files")
    a = ap.parse_args()
    global REDIS
    server_dir = None
    if a.redis:
        p = subprocess.run([os.path.join(ROOT, "jobs", "redis.sh"), "start"], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 77 if p.returncode == 77 else 1
        url, server_dir = p.stdout.split()
        REDIS = (url, url.rsplit(":", 1)[1])
    pairs = SMOKE if a.pairs == "smoke" else list(itertools.product(LAYOUTS, LAYOUTS))
    os.makedirs(a.out, exist_ok=True)
    failed = 0
    print(f"{'writer':>8} {'reader':>8}  result")
    for writer, reader in pairs:
        ok, what = pair(writer, reader, a.out)
        failed += not ok
        print(f"TP{writer[0]}xPP{writer[1]:<2} TP{reader[0]}xPP{reader[1]:<2}  {'ok' if ok else 'FAILED'}: {what}", flush=True)
    print(f"# pairs {len(pairs)}, failed {failed}" + (" (objects on Redis)" if REDIS else ""))
    if server_dir:
        subprocess.run([os.path.join(ROOT, "jobs", "redis.sh"), "stop", server_dir], capture_output=True, timeout=60)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
