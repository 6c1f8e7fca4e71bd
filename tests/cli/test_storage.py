#!/usr/bin/python3
"""End-to-end tests of the unified KV layout (cache.storage_key_scheme = unified): storage objects
written by one job and read by another job of a different layout over the same directory.

Run one scenario: test_storage.py NAME (ctest registers each). Needs KVGRID_BIN, KVGRID_SOURCE, MPIEXEC.
"""
import collections
import json
import os
import re
import shutil
import subprocess
import sys

from test_cli import ENV, MPIEXEC, BIN, SRC, TMP, expect, out, run, run_single, tool

UKV = os.path.join(SRC, "experiments", "unified_layout.toml")
OBJ = re.compile(r"^([0-9a-f]{64})_(ukv1-[0-9a-f]{16})_L(\d+)-(\d+)(?:_H(\d+))?\.bin$")


def ok_run(np_, name, *sets):
    rc, so, se = run(np_, UKV, "--out", out(name), *sets)
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"{name}: verdict OK, oracle OK", so, se)
    return json.loads(tool("report", out(name), "--json")[1])


def objects(store):
    names = sorted(os.listdir(os.path.join(store, "unified")))
    parsed = [OBJ.match(n) for n in names]
    expect(all(parsed), "every object is named {page_hash}_{namespace}_L{a}-{b}_H{g}.bin", names[:5])
    return parsed


def figure4():
    """The first article's Figure 4 exactly: a 60-layer, 8-KV-head model cut into chunks of 30 layers
    x 2 heads (8 objects per page). The TP4 x PP2 writer job writes one object per rank and page; a
    TP2 x PP1 reader job, a separate mpirun over the same directory, reads four objects per rank and
    page (TP0 heads 0-3, TP1 heads 4-7, both layer ranges) and serves the prompts from storage with
    the oracle OK. Four prompts of 256 tokens + 16 output tokens: 16 whole pages of KV each (the last
    output token has none); a prefetch reuses at most prompt - 1 tokens: 15 pages."""
    store = out("store")
    sets = ["--set", "cache.storage_dir=" + store]
    w = ok_run(8, "writer", *sets)
    expect(w["storage_objects"]["written"] == [4 * 16] * 8, "writer: one object per rank and page", w["storage_objects"])
    objs = objects(store)
    expect(len(objs) == 4 * 16 * 8, "8 objects per page", len(objs))
    ranges = sorted({(int(m.group(3)), int(m.group(4)), int(m.group(5))) for m in objs})
    expect(ranges == [(a, a + 29, g) for a in (0, 30) for g in range(4)], "chunks L0-29/L30-59 x H0..H3", ranges)
    expect(len({m.group(2) for m in objs}) == 1, "one namespace", {m.group(2) for m in objs})
    r = ok_run(2, "reader", *sets, "--set", "topology.tp=2", "--set", "topology.pp=1")
    print("reader objects:", r["storage_objects"], "cached:", r["cached_tokens"])
    expect(r["storage_objects"]["read"] == [4 * 15 * 4] * 2, "reader: four objects per rank and page", r["storage_objects"])
    expect(r["cached_tokens"] == {"device": 0, "host": 0, "storage": 4 * 240}, "every prompt from storage", r["cached_tokens"])
    expect(r["storage_objects"]["written"] == [0, 0] and len(objects(store)) == 512,
           "the reader writes nothing new (its pages' objects exist)", r["storage_objects"])
    # Another tenant (namespace digest) over the same directory reads nothing and writes its own.
    t = ok_run(2, "tenant", *sets, "--set", "topology.tp=2", "--set", "topology.pp=1", "--set", "cache.storage_namespace=b")
    expect(t["cached_tokens"]["storage"] == 0 and t["storage_objects"]["read"] == [0, 0],
           "another namespace never hits these objects (bug catalogue #26)", t["cached_tokens"])
    expect(len({m.group(2) for m in objects(store)}) == 2, "two namespaces side by side", len(objects(store)))
    # A reader that does not align with the grid is refused at start-up with the numbers.
    rc, so, se = run_single(UKV, "--out", out("pp3"), *sets, "--set", "topology.tp=1", "--set", "topology.pp=3")  # refused at load
    expect(rc == 2 and "rank tp 0 pp 0" in se and "layers 0-19 of 60, not whole ranges of cache.storage_layer_partition = 30" in se,
           "PP3 refused: its stages split the 30-layer ranges", so, se)
    rc, so, se = run_single(UKV, "--out", out("lp"), "--set", "cache.storage_key_scheme=rank_suffix")
    expect(rc == 2 and "cache.storage_layer_partition = 30 needs cache.storage_key_scheme" in se,
           "the grid keys need the unified scheme", so, se)


def concurrent_writers():
    """Two writer jobs of different layouts (TP4 x PP1 and TP2 x PP2, 4 ranks each) writing the same
    objects at once into one directory leave whole objects only: every file is a whole object, and
    a third job (TP1 x PP1) reads every page of every prompt intact."""
    store = out("cstore")
    sets = ["--set", "cache.storage_dir=" + store]
    procs = []
    for name, tp, pp in (("cw1", 4, 1), ("cw2", 2, 2)):
        cmd = [MPIEXEC, "-np", "4", BIN, "run", UKV, "--out", out(name), *sets, "--set", f"topology.tp={tp}",
               "--set", f"topology.pp={pp}"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV))
    for p in procs:
        so, se = p.communicate(timeout=240)
        expect(p.returncode == 0 and "# verdict: OK" in so, "both writers finish OK", so, se)
    objs = objects(store)
    expect(len(objs) == 512 and not [n for n in os.listdir(os.path.join(store, "unified")) if n.startswith(".tmp")],
           "512 objects, no temporary file left", len(objs))
    for m in objs:
        with open(os.path.join(store, "unified", m.group(0)), "rb") as f:
            head = f.read(40)
            size = os.fstat(f.fileno()).st_size
        key_len = int.from_bytes(head[12:16], "little")
        payload = int.from_bytes(head[16:24], "little")
        expect(head[:8] == b"KVGRIDO1" and size == 40 + key_len + payload, "a whole object", m.group(0), size)
    r = ok_run(1, "cw-reader", *sets, "--set", "topology.tp=1", "--set", "topology.pp=1")
    expect(r["cached_tokens"]["storage"] == 4 * 240 and r["storage_objects"]["read"] == [4 * 15 * 8],
           "every page read intact (8 objects per page at TP1)", r)


def layout_pairs():
    """An MLA writer/reader pair (replicated latent: one writer per chunk, no head group). The MHA
    pairs of an 8-layer, 8-head model — all 81 of TP in {1,2,4,8} x PP in {1,2,4} — are
    jobs/unified_pairs.py's (its smoke runs through Redis in redis_cross_job; Figure 4 is one)."""
    # MLA: one latent replicated over TP, objects without _H, one writer per chunk (TP rank 0).
    store = out("mla")
    mla = ["--set", "model.layers=8", "--set", "model.attention=mla", "--set", "model.kv_heads=4",
           "--set", "cache.storage_layer_partition=2", "--set", "cache.storage_head_partition=0",
           "--set", "cache.storage_dir=" + store]
    w = ok_run(4, "mla-w", *mla, "--set", "topology.tp=2", "--set", "topology.pp=2")
    expect(w["storage_objects"]["written"] == [2 * 64, 0, 2 * 64, 0], "MLA: TP0 of each stage writes its 2 chunks", w)
    names = [m.group(0) for m in objects(store)]
    expect(len(names) == 4 * 64 and all("_H" not in n for n in names), "4 layer ranges x 64 pages, no head group", names[:3])
    r = ok_run(2, "mla-r", *mla, "--set", "topology.tp=1", "--set", "topology.pp=2")
    expect(r["storage_objects"]["read"] == [2 * 60] * 2 and r["cached_tokens"]["storage"] == 960,
           "MLA reader TP1 x PP2: two objects per rank and page", r)


def host_layout():
    """cache.host_layout = page_unified: a host page holds this rank's storage objects in object order
    (the device<->host copies relayout; a backup copies the row as it is, a read lands in place).
    Next to layer_first host pages in the same TP2 job: the same decisions (decision digest) and
    byte-identical objects. A page_unified TP1 x PP2 reader serves every prompt from the layer_first
    writer's objects, and a layer_first TP4 reader from the page_unified writer's, oracle OK; short
    and corrupt objects read in place are misses, never data. A page_unified host without unified
    keys is refused at load, naming both keys."""
    m = ["--set", "model.layers=8", "--set", "cache.storage_layer_partition=2", "--set", "cache.storage_head_partition=2"]
    files, digests = {}, {}
    for layout in ("layer_first", "page_unified"):
        store = out("hl-" + layout)
        rc, so, se = run(2, UKV, "--out", out("hl-w-" + layout), *m, "--set", "topology.tp=2", "--set", "topology.pp=1",
                         "--set", "cache.storage_dir=" + store, "--set", "cache.host_layout=" + layout)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"{layout} writer OK", so, se)
        digests[layout] = digest_of(so)
        d = os.path.join(store, "unified")
        # (past the 40-byte header, whose last field is the writing job's id: the key and the payload)
        files[layout] = {n: open(os.path.join(d, n), "rb").read()[40:] for n in os.listdir(d) if OBJ.match(n)}
    print("decision digests:", digests, "objects:", {k: len(v) for k, v in files.items()})
    expect(digests["layer_first"] is not None and digests["layer_first"] == digests["page_unified"],
           "the host layout changes no decision", digests)
    expect(len(files["layer_first"]) == 4 * 16 * 16 and files["layer_first"] == files["page_unified"],
           "byte-identical objects, past the job id (4 prompts x 16 pages x 4 layer ranges x 4 head groups)", len(files["layer_first"]), len(files["page_unified"]))
    for name, np_, src, sets in (("hl-r-pu", 2, "layer_first", ["--set", "topology.tp=1", "--set", "topology.pp=2",
                                                                 "--set", "cache.host_layout=page_unified"]),
                                 ("hl-r-lf", 4, "page_unified", ["--set", "topology.tp=4", "--set", "topology.pp=1"])):
        r = ok_run(np_, name, *m, *sets, "--set", "cache.storage_dir=" + out("hl-" + src))
        expect(r["cached_tokens"] == {"device": 0, "host": 0, "storage": 4 * 240} and r["storage_objects"]["written"] == [0] * np_,
               f"{name}: every prompt from the {src} writer's objects", r["cached_tokens"], r["storage_objects"])
    # Damaged objects read in place: a short or corrupt object's page and the pages after it are
    # misses (recomputed), never data, though its bytes landed in the host row (over a copy of the
    # store: the failpoints damage the files).
    shutil.copytree(out("hl-layer_first"), out("hl-faulty"))
    faults = []
    for f in ("storage.read.short", "storage.object.corrupt"):
        faults += ["--set", f"faults.{f}.probability=0.3"]
    r = ok_run(1, "hl-r-faults", *m, "--set", "topology.tp=1", "--set", "topology.pp=1", "--set", "cache.host_layout=page_unified",
               "--set", "cache.storage_dir=" + out("hl-faulty"), *faults)
    expect(r["storage_failed_pages"] > 0 and r["cached_tokens"]["storage"] < 4 * 240,
           "the failpoints fired: fewer pages from storage, oracle OK", r["storage_failed_pages"], r["cached_tokens"])
    rc, so, se = run_single(UKV, "--out", out("hl-bad"), "--set", "cache.storage_key_scheme=rank_suffix",
                            "--set", "cache.host_layout=page_unified")
    expect(rc == 2 and "cache.host_layout" in se and "cache.storage_key_scheme" in se, "refused at load, exit 2", rc, se)


def cp_sharded():
    """CP page-sharded writers and readers (beyond the article, whose unified path refuses CP): a
    TP2 x CP2 sharded writer's owners write only their pages' chunks; readers of another CP degree
    — TP1 x CP4 sharded, TP2 x PP2 replicated — each read exactly the pages
    their owners need (position mod CP) and serve every prompt from storage, oracle OK. The writer
    and the replicated reader keep their host pages in object order (cache.host_layout)."""
    store = out("cp")
    m = ["--set", "model.layers=8", "--set", "cache.storage_layer_partition=2", "--set", "cache.storage_head_partition=2",
         "--set", "cache.storage_dir=" + store]

    def layout(tp, cp, pp, sharding):
        return ["--set", f"topology.tp={tp}", "--set", f"topology.cp={cp}", "--set", f"topology.pp={pp}",
                "--set", "cache.cp_sharding=" + sharding]

    # (host pages in object order on the writer and the replicated reader: cache.host_layout)
    pu = ["--set", "cache.host_layout=page_unified"]
    w = ok_run(4, "cp-w", *m, *layout(2, 2, 1, "sharded"), *pu)
    # 64 pages, each CP owner half of them; a TP rank's 4 heads = 2 groups x 4 layer ranges = 8 chunks
    expect(w["storage_objects"]["written"] == [32 * 8] * 4, "each owner writes its pages' chunks", w["storage_objects"])
    expect(len(objects(store)) == 64 * 16, "every page's 16 chunks, once", len(objects(store)))
    owned = lambda n, r: sum(1 for p in range(15) if p % n == r) * 4  # reusable pages (15 per prompt) owned by r
    for name, (tp, cp, pp, sh), chunks, more in (("cp-r4", (1, 4, 1, "sharded"), 16, []),
                                                 ("cp-rrep", (2, 1, 2, "replicated"), 4, pu)):
        r = ok_run(tp * cp * pp, name, *m, *layout(tp, cp, pp, sh), *more)
        want = [owned(cp, c) * chunks if sh == "sharded" else 60 * chunks for c in range(cp) for _ in range(tp * pp)]
        expect(r["storage_objects"]["read"] == want and r["cached_tokens"]["storage"] == 960,
               f"{name}: every owner reads its pages' chunks", r["storage_objects"], want, r["cached_tokens"])


def draft_state():
    """Draft state as unified objects of its own namespace (beyond the article, which refuses
    speculative decoding with unified keys): a TP2 x PP2 job with a packed 1-layer draft writes the
    draft's objects (L0-0 x 4 head groups per page) beside the target's; a TP1 job with a sidecar
    draft reads both (16 target + 4 draft objects per page) and accepts exactly what the writer
    accepted with no draft mismatch; with the draft's objects gone no page counts as stored. The
    writer's host pages hold its target's and its draft's objects in object order (cache.host_layout)."""
    store = out("draft")
    m = ["--set", "model.layers=8", "--set", "cache.storage_layer_partition=2", "--set", "cache.storage_head_partition=2",
         "--set", "cache.storage_dir=" + store, "--set", "model.draft.layers=1", "--set", "model.draft.steps=3"]
    # (the writer's host pages in object order, the draft's objects after the target's: cache.host_layout)
    w = ok_run(4, "dr-w", *m, "--set", "topology.tp=2", "--set", "topology.pp=2", "--set", "model.draft.mode=packed",
               "--set", "cache.host_layout=page_unified")
    # the last stage's ranks (world ranks 2, 3) write their 2 target chunks and 2 draft groups per page
    expect(w["storage_objects"]["written"] == [64 * 4, 64 * 4, 64 * 6, 64 * 6], "draft objects on the last stage", w)
    spaces = {}
    for mm in objects(store):
        spaces.setdefault(mm.group(2), set()).add((int(mm.group(3)), int(mm.group(4))))
    expect(len(spaces) == 2 and {(0, 0)} in spaces.values(), "the draft's own namespace, one layer range", spaces)
    r = ok_run(1, "dr-r", *m, "--set", "topology.tp=1", "--set", "topology.pp=1", "--set", "model.draft.mode=sidecar")
    expect(r["storage_objects"]["read"] == [60 * 20] and r["cached_tokens"]["storage"] == 960,
           "target and draft objects read (packed writer, sidecar reader)", r)
    expect(r["spec"]["draft_mismatch_steps"] == 0 and r["spec"]["accepted"] == w["spec"]["accepted"] and
           r["spec"]["proposed"] == w["spec"]["proposed"], "the draft restored: the writer's acceptance", r["spec"], w["spec"])
    draft_ns = [ns for ns, r_ in spaces.items() if r_ == {(0, 0)}][0]
    for name in os.listdir(os.path.join(store, "unified")):
        if draft_ns in name:
            os.remove(os.path.join(store, "unified", name))
    g = ok_run(1, "dr-gone", *m, "--set", "topology.tp=1", "--set", "topology.pp=1", "--set", "model.draft.mode=sidecar")
    expect(g["cached_tokens"]["storage"] == 0, "no page without its draft's objects", g["cached_tokens"])


def buckets():
    """Buckets by context length at the same time (experiments/buckets.toml): a short-context TP2 job
    and a long-context TP2 x PP2 job run together over one shared store, fed from one multi-turn
    workload (8 conversations x 4 turns; turns 0-1 are under 330 tokens, 2-3 over). Each serves its
    16 turns with the oracle OK; every long-bucket rank reads objects the short job wrote (cross-
    bucket hits); both headers say the run is not reproducible; routing needs a shared store."""
    store = out("buckets")
    base = [BIN, "run", os.path.join(SRC, "experiments", "buckets.toml"), "--set", "cache.storage_dir=" + store]
    jobs = {"short": subprocess.Popen([MPIEXEC, "-np", "2", *base, "--out", out("bk-short")], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=ENV),
            "long": subprocess.Popen([MPIEXEC, "-np", "4", *base, "--out", out("bk-long"), "--set", "workload.route_min_prompt=330",
                                      "--set", "workload.route_max_prompt=0", "--set", "topology.pp=2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)}
    rep = {}
    for name, p in jobs.items():
        so, se = p.communicate(timeout=240)
        expect(p.returncode == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so and
               "# not reproducible: shared store" in so and "warning" not in se, f"{name} bucket OK", so, se)
        rep[name] = json.loads(tool("report", out("bk-" + name), "--json")[1])
    print({k: (v["requests"], v["cached_tokens"], v["storage_objects"]["read_other_jobs"]) for k, v in rep.items()})
    expect(rep["short"]["requests"] == 16 and rep["long"]["requests"] == 16, "each bucket serves its 16 turns", rep)
    so_ = rep["long"]["storage_objects"]
    expect(all(n > 0 for n in so_["read_other_jobs"]) and rep["long"]["cached_tokens"]["storage"] > 0 and
           so_["read_other_jobs_tokens"][0] == so_["read_other_jobs"][0] // 4 * 16,  # 4 chunks per page at TP2 x PP2
           "the long bucket reads the short bucket's objects (cross-bucket hits, in objects and tokens)", rep["long"])
    rc, so, se = run(2, os.path.join(SRC, "experiments", "buckets.toml"), "--out", out("bk-bad"), "--set",
                     "cache.storage_shared=false")
    expect(rc == 2 and "need cache.storage_shared = true" in se, "routing without a shared store refused", so, se)


def store_sweep():
    """Who evicts unified objects: no rank for its own LRU; the store's capacity is kept by a sweep
    (least recently read or written first). A run whose objects outgrow cache.storage_capacity_mb
    ends with its world rank 0 sweeping the directory within it; `kvgrid store` sweeps any time
    (--dry-run counts only); a missing directory is an input error."""
    store = out("sweep")
    m = ["--set", "model.layers=8", "--set", "cache.storage_layer_partition=2", "--set", "cache.storage_head_partition=2",
         "--set", "cache.storage_dir=" + store, "--set", "cache.storage_capacity_mb=1", "--set", "topology.tp=1",
         "--set", "topology.pp=1"]
    rc, so, se = run(1, UKV, "--out", out("sweep-run"), *m)
    expect(rc == 0 and "# verdict: OK" in so and "# storage: swept " in so, "the run ends with a sweep", so, se)
    d = os.path.join(store, "unified")
    total = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    expect(0 < total <= 1 << 20, "the store within its capacity", total)
    rc, so, se = tool("store", store, "--limit-mb", "0", "--dry-run")
    n = len(os.listdir(d))
    expect(rc == 0 and f": {n} files" in so and f"would remove {n} files" in so and len(os.listdir(d)) == n,
           "a dry run counts", so, se)
    rc, so, se = tool("store", store, "--limit-mb", "0")
    expect(rc == 0 and not os.listdir(d), "a sweep to 0 removes every object", so, se)
    rc, so, se = tool("store", out("nothing-here"), "--limit-mb", "1")
    expect(rc == 2 and "no such storage directory" in se, "a missing directory: exit 2", so, se)


def segment_layout():
    """cache.storage_file_layout = segment: the objects of one write batch in one file whose head
    indexes them. The tiers experiment (TP2 x CP2, rank_suffix keys; synced writes, cache.storage_fsync)
    takes exactly the recorded decisions of a file per object (the layout decides nothing) with storage hits from fewer files
    than objects, and runs under every storage failpoint with the oracle OK. Unified keys across
    jobs: a TP2 writer's segments serve a TP1 reader every page (8 objects per page), and
    `kvgrid store` sweeps segments whole. The layout, or fsync, without cache.storage = file is refused at load."""
    seg = ["--set", "cache.storage_file_layout=segment"]
    rc, so, se = run(4, TIERS, "--out", out("seg"), *seg, "--set", "cache.storage_fsync=true")  # synced: the same decisions
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, "segments: run OK", so, se)
    with open(os.path.join(SRC, "tests", "golden", "decision_digests.txt")) as f:  # a file per object's, recorded
        on_file = [ln.split()[2] for ln in f if ln.startswith("multiturn_tiers 1 ")][0]
    expect(digest_of(so) == on_file, "segments decide exactly as a file per object", digest_of(so), on_file)
    j = json.loads(tool("report", out("seg"), "--json")[1])
    names = [n for _, _, fs_ in os.walk(os.path.join(out("seg"), "storage")) for n in fs_]
    written = sum(j["storage_objects"]["written"])
    expect(j["cached_tokens"]["storage"] > 0 and names and all(n.endswith(".seg") for n in names) and len(names) < written,
           "storage hits, from segment files only, fewer than the objects", j["cached_tokens"], len(names), written)
    faults = []
    for f in ("storage.read.fail", "storage.read.short", "storage.object.corrupt", "storage.write.fail"):
        faults += ["--set", f"faults.{f}.probability=0.2"]
    rc, so, se = run(4, TIERS, "--out", out("segf"), *seg, "--set", "workload.multiturn.clients=16",
                     "--set", "workload.multiturn.rounds=4", *faults)
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, "segments under every storage failpoint", so, se)
    expect(json.loads(tool("report", out("segf"), "--json")[1])["storage_failed_pages"] > 0, "the failpoints fired")
    # Unified keys, two jobs in sequence over one directory.
    store = out("segstore")
    sets = [*seg, "--set", "cache.storage_dir=" + store]
    w = ok_run(2, "seg-w", *sets, "--set", "topology.tp=2", "--set", "topology.pp=1")
    d = os.path.join(store, "unified")
    segs = os.listdir(d)
    expect(sum(w["storage_objects"]["written"]) == 512 and all(n.endswith(".seg") for n in segs) and len(segs) < 512,
           "the writer's 512 objects in segment files", w["storage_objects"], len(segs))
    r = ok_run(1, "seg-r", *sets, "--set", "topology.tp=1", "--set", "topology.pp=1")
    expect(r["cached_tokens"]["storage"] == 4 * 240 and r["storage_objects"]["read"] == [4 * 15 * 8],
           "the TP1 reader: every page from the TP2 writer's segments", r)
    rc, so, se = tool("store", store, "--limit-mb", "0")
    expect(rc == 0 and f": {len(segs)} files" in so and not os.listdir(d), "a sweep removes segments whole", so, se)
    rc, so, se = run_single(TIERS, "--out", out("segbad"), *seg, "--set", "cache.storage=none")
    expect(rc == 2 and 'cache.storage_file_layout = "segment" needs cache.storage = "file"' in se, "refused at load", so, se)
    rc, so, se = run_single(TIERS, "--out", out("segbad2"), "--set", "cache.storage=none", "--set", "cache.storage_fsync=true")
    expect(rc == 2 and 'cache.storage_fsync = true needs cache.storage = "file"' in se, "fsync without files refused", so, se)


class RedisServer:
    """A private Redis server for one test (jobs/redis.sh); exit 77 (skipped) without redis-server,
    unless CI=true, where the packages are part of set-up and a skip is a failure."""

    def __init__(self):
        p = subprocess.run([os.path.join(SRC, "jobs", "redis.sh"), "start", out("redis-" + str(len(os.listdir(TMP))))],
                           capture_output=True, text=True, timeout=60)
        if p.returncode == 77:
            expect(os.environ.get("CI") != "true", "CI=true: redis-server must be installed (jobs/setup.sh)", p.stderr)
            print("skipped: redis-server is not installed (jobs/setup.sh installs it)")
            sys.exit(77)
        expect(p.returncode == 0, "jobs/redis.sh start", p.stdout, p.stderr)
        self.url, self.dir = p.stdout.split()

    def stop(self):
        subprocess.run([os.path.join(SRC, "jobs", "redis.sh"), "stop", self.dir], capture_output=True, timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


TIERS = os.path.join(SRC, "experiments", "multiturn_tiers.toml")


def digest_of(so):
    m = re.search(r"digest (0x[0-9a-f]+) on every rank", so)
    return m.group(1) if m else None


def redis_backend():
    """cache.storage = redis on a private server (jobs/redis.sh): the tiers experiment (TP2 x CP2,
    host + storage under multi-turn load) takes exactly the file backend's decisions (the same
    decision digest: same objects, same hits) with storage hits; every storage failpoint (read
    fail, short, corrupt, slow, write fail) with oracle OK; a malformed URL refused at load."""
    with RedisServer() as srv:
        rc, so, se = run(4, TIERS, "--out", out("rd"), "--set", "cache.storage=redis", "--set", "cache.storage_url=" + srv.url)
        expect(rc == 0 and "# verdict: OK" in so and "# storage: the Redis server is empty at the start and never evicts" in so
               and "not reproducible" not in so, "redis run OK, reproducible on a private server", so, se)
        with open(os.path.join(SRC, "tests", "golden", "decision_digests.txt")) as f:  # the file backend's, recorded
            on_file = [ln.split()[2] for ln in f if ln.startswith("multiturn_tiers 1 ")][0]
        expect(digest_of(so) == on_file, "redis decides exactly as file", digest_of(so), on_file)
        j = json.loads(tool("report", out("rd"), "--json")[1])
        expect(j["cached_tokens"]["storage"] > 0 and j["storage_connection_errors"] == 0, "hits from redis", j["cached_tokens"])
        faults = []
        for f in ("storage.read.fail", "storage.read.short", "storage.object.corrupt", "storage.write.fail"):
            faults += ["--set", f"faults.{f}.probability=0.2"]
        faults += ["--set", "faults.storage.read.slow.probability=0.2", "--set", "faults.storage.read.slow.delay_ms=2"]
        rc, so, se = run(4, TIERS, "--out", out("rdf"), "--set", "cache.storage=redis", "--set", "cache.storage_url=" + srv.url,
                         "--set", "workload.multiturn.clients=16", "--set", "workload.multiturn.rounds=4", *faults)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, "redis under every storage failpoint", so, se)
        expect(re.search(r"# not reproducible: shared store \(a Redis server: \d+ keys already in its database", so),
               "a server holding the first run's objects: not reproducible", so)
        jf = json.loads(tool("report", out("rdf"), "--json")[1])
        expect(jf["storage_failed_pages"] > 0, "the failpoints fired on redis", jf["storage_failed_pages"])
        # A server that may evict is named as such (emptied first, so only maxmemory speaks).
        port = srv.url.rsplit(":", 1)[1]
        for cmd in (["FLUSHALL"], ["CONFIG", "SET", "maxmemory", "64mb"]):
            subprocess.run(["redis-cli", "-p", port, *cmd], capture_output=True, timeout=30, check=True)
        rc, so, se = run(2, TIERS, "--out", out("rdm"), "--set", "cache.storage=redis", "--set", "cache.storage_url=" + srv.url,
                         "--set", "topology.tp=2", "--set", "topology.cp=1", "--set", "workload.multiturn.clients=2",
                         "--set", "workload.multiturn.rounds=1")
        expect(rc == 0 and "# not reproducible: shared store (a Redis server: maxmemory 67108864 bytes, policy noeviction" in so,
               "maxmemory set: not reproducible", so, se)
    rc, so, se = run_single(TIERS, "--out", out("rbad"), "--set", "cache.storage=redis", "--set", "cache.storage_url=http://x:1")
    expect(rc == 2 and "expected redis://HOST:PORT[/DB]" in se, "a malformed URL: exit 2", so, se)


def redis_outage():
    """Connection errors are storage failures, never a crash or a hang: with no server at the URL the
    run serves everything with misses (oracle OK, errors counted and logged); with the server
    stopped mid-run (after the first progress row) the run goes on with misses and finishes OK."""
    with RedisServer() as srv:
        url = srv.url
    small = ["--set", "workload.multiturn.clients=16", "--set", "workload.multiturn.rounds=4"]
    rc, so, se = run(4, TIERS, "--out", out("ro-none"), "--set", "cache.storage=redis", "--set", "cache.storage_url=" + url, *small)
    expect(rc == 0 and "# verdict: OK" in so and "storage misses and failed writes until it is back" in se
           and "# not reproducible: shared store (a Redis server: unreachable at the start" in so, "no server: the run goes on", so, se)
    j = json.loads(tool("report", out("ro-none"), "--json")[1])
    expect(j["storage_connection_errors"] > 0 and j["cached_tokens"]["storage"] == 0, "errors counted, no storage hit", j)
    with RedisServer() as srv:
        cmd = [MPIEXEC, "-np", "4", BIN, "run", TIERS, "--out", out("ro-mid"), "--set", "cache.storage=redis",
               "--set", "cache.storage_url=" + srv.url, "--set", "output.report_every=20"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        lines = []
        for line in p.stdout:  # stop the server once the run is under way
            lines.append(line)
            if re.match(r"^\s+\d+\s+\d+/\d+", line):
                srv.stop()
                break
        so, se = p.communicate(timeout=240)
        so = "".join(lines) + so
    expect(p.returncode == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, "server stopped mid-run", so, se)
    j = json.loads(tool("report", out("ro-mid"), "--json")[1])
    expect(j["storage_connection_errors"] > 0, "the outage counted", j["storage_connection_errors"])


def redis_cross_job():
    """Two jobs share KV through one Redis server: jobs/unified_pairs.py --redis's smoke (TP4 x PP2
    -> TP1 and TP1 x PP4 -> TP8): each reader serves every reusable page from the writer's objects
    with exactly one object per chunk it holds per page."""
    # the layout-pair smoke (a 4-rank and an 8-rank writer; objects and hits counted exactly) on its own server
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "jobs", "unified_pairs.py"), "--pairs", "smoke", "--redis",
                        "--out", out("rpairs")], capture_output=True, text=True, env=ENV, timeout=280)
    expect(p.returncode == 0 and "# pairs 2, failed 0 (objects on Redis)" in p.stdout, "pairs through redis", p.stdout, p.stderr)


def hybrid_components():
    """A hybrid model (FULL + SWA + MAMBA, 8 layers, 4 KV heads) under unified keys: every component
    kind has a namespace of its own and one object per chunk of the 2-layer x 1-head grid holding
    that kind's layers of the range. The TP2 x PP2 writer serves four 512-token prompts (32 pages,
    a 64-token window = 4 SWA pages, a MAMBA state at 512); a TP1 reader — another job, another
    layout — serves the prompts extended by 512 tokens and takes the first 512 of each from storage
    with every component, oracle OK. One missing MAMBA object (one head group of one prompt's
    state) costs that prompt its whole hit on a TP2 reader: the hit is the deepest boundary every
    component can serve on every rank. The TP1 reader keeps its FULL and SWA host pages in object
    order (cache.host_layout)."""
    exp = os.path.join(SRC, "experiments", "hybrid_unified.toml")
    store = out("hstore")
    sets = ["--set", "cache.storage_dir=" + store]
    reader = ["--set", "workload.mooncake.trace=traces/hybrid_unified_reader.jsonl"]

    def hrun(np_, name, *more):
        rc, so, se = run(np_, exp, "--out", out(name), *sets, *more)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"{name}: verdict OK, oracle OK", so, se)
        return json.loads(tool("report", out(name), "--json")[1])

    w = hrun(4, "hw")
    # rank (tp, pp): FULL 2 ranges x 2 heads x 128 pages + SWA 1 x 2 x 16 + MAMBA 1 x 2 x 4
    expect(w["storage_objects"]["written"] == [552] * 4, "writer: 552 objects per rank", w["storage_objects"])
    by_ns = {}
    for m in objects(store):
        by_ns.setdefault(m.group(2), {}).setdefault((int(m.group(3)), int(m.group(4)), int(m.group(5))), 0)
        by_ns[m.group(2)][(int(m.group(3)), int(m.group(4)), int(m.group(5)))] += 1
    shapes = sorted((len(chunks), sorted(set(chunks.values())), sorted({(a, b) for a, b, _ in chunks})) for chunks in by_ns.values())
    expect(shapes == [(8, [4], [(2, 3), (6, 7)]), (8, [16], [(0, 1), (4, 5)]),
                      (16, [128], [(0, 1), (2, 3), (4, 5), (6, 7)])],
           "three namespaces: MAMBA states (ranges with a mamba layer, 4 each), SWA window pages (16), FULL pages (128)", shapes)
    states = [n for n in os.listdir(os.path.join(store, "unified"))
              if min(by_ns, key=lambda d: sum(by_ns[d].values())) in n]
    r = hrun(1, "hr1", "--set", "topology.tp=1", "--set", "topology.pp=1", *reader, "--set", "cache.host_layout=page_unified")
    expect(r["storage_objects"]["read"] == [128 * 16 + 16 * 8 + 4 * 8], "TP1 reader: every chunk of every component", r["storage_objects"])
    expect(r["cached_tokens"] == {"device": 0, "host": 0, "storage": 4 * 512}, "512 tokens of each prompt from storage", r["cached_tokens"])
    os.remove(os.path.join(store, "unified", sorted(states)[0]))
    r = hrun(2, "hr2", "--set", "topology.tp=2", "--set", "topology.pp=1", *reader)
    expect(r["cached_tokens"]["storage"] == 3 * 512, "one missing MAMBA object: that prompt reuses nothing from storage", r["cached_tokens"])


def hybrid_draft():
    """A hybrid draft (full + swa + mamba layers) under unified keys: each of its kinds is a
    namespace of its own beside the target's three, its chunks after the target's in each slot's
    objects. The TP2 x PP2 writer with a packed draft writes on its last stage 552 target objects
    and 296 draft objects per rank (FULL 2 heads x 128 pages, SWA 2 x 16, MAMBA 2 x 4); readers of
    other layouts and the other mode — TP1 sidecar, TP2 packed, PP4 packed — take 512 tokens of
    each prompt from storage with the draft restored from its objects (the acceptance of a reader
    over an empty store, no draft mismatch); with the draft's objects gone no prompt is a hit. The
    writer and the PP4 reader keep their host pages in object order (cache.host_layout)."""
    exp = os.path.join(SRC, "experiments", "hybrid_unified.toml")
    store = out("hdstore")
    draft = ["--set", "cache.storage_dir=" + store, "--set", "model.draft.layers=3", "--set",
             "model.draft.layer_types=full,swa,mamba", "--set", "model.draft.steps=3"]
    reader = ["--set", "workload.mooncake.trace=traces/hybrid_unified_reader.jsonl"]
    spec = r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, 0 draft checksum mismatches"

    def hrun(np_, name, *more):
        rc, so, se = run(np_, exp, "--out", out(name), *draft, *more)
        m = re.search(spec, so)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so and m, f"{name}: OK, no draft mismatch", so, se)
        return json.loads(tool("report", out(name), "--json")[1]), m.groups()

    # (host pages in object order — the draft's SWA and FULL objects after the target's — on the
    # writer and the PP4 reader: cache.host_layout)
    pu = ["--set", "cache.host_layout=page_unified"]
    w, _ = hrun(4, "hdw", "--set", "model.draft.mode=packed", *pu)
    expect(w["storage_objects"]["written"] == [552, 552, 552 + 296, 552 + 296], "the last stage writes the draft's objects",
           w["storage_objects"])
    written_by_ns = collections.Counter(m.group(2) for m in objects(store))  # (the readers add pages later)
    sizes = sorted(written_by_ns.values())
    expect(sizes == [16, 32, 64, 128, 512, 2048], "six namespaces: the target's three kinds and the draft's", sizes)
    tp1 = ["--set", "topology.tp=1", "--set", "topology.pp=1"]
    _, cold = hrun(1, "hd-cold", *tp1, "--set", "model.draft.mode=sidecar", *reader, "--set", "cache.storage_dir=" + out("hd-empty"))
    for name, np_, sets, reads in (("hd-tp1", 1, tp1 + ["--set", "model.draft.mode=sidecar"], [2208 + 592]),
                                   ("hd-tp2", 2, ["--set", "topology.tp=2", "--set", "topology.pp=1", "--set", "model.draft.mode=packed"],
                                    [1400, 1400]),
                                   ("hd-pp4", 4, ["--set", "topology.tp=1", "--set", "topology.pp=4", "--set", "model.draft.mode=packed", *pu],
                                    [576, 528, 576, 1120])):
        r, acc = hrun(np_, name, *sets, *reader)
        print(name, r["storage_objects"]["read"], r["cached_tokens"], acc)
        expect(r["storage_objects"]["read"] == reads and r["cached_tokens"]["storage"] == 4 * 512,
               f"{name}: target and draft objects read, 512 tokens of each prompt", r["storage_objects"], r["cached_tokens"])
        expect(acc == cold, f"{name}: the draft restored from storage proposes as over an empty store", acc, cold)
    # The draft's namespaces: FULL 4 heads x 128 pages, SWA 4 x 16, MAMBA 4 x 4 (as the writer left them).
    draft_ns = [n for n, c in written_by_ns.items() if c in (512, 64, 16)]
    target_before = {n: c for n, c in collections.Counter(m.group(2) for m in objects(store)).items() if n not in draft_ns}
    removed = 0
    for name in os.listdir(os.path.join(store, "unified")):
        if any(ns in name for ns in draft_ns):
            os.remove(os.path.join(store, "unified", name))
            removed += 1
    left = collections.Counter(m.group(2) for m in objects(store))
    expect(len(draft_ns) == 3 and removed >= 592 and left == target_before, "the draft's objects alone removed", removed, left)
    g, _ = hrun(1, "hd-gone", *tp1, "--set", "model.draft.mode=sidecar", *reader)
    expect(g["cached_tokens"]["storage"] == 0, "no prompt without its draft's objects", g["cached_tokens"])


def hybrid_sidecars():
    """A hybrid model's payload sidecars under unified keys (experiments/hybrid_storage.toml: an
    indexer over FULL pages, 2 words, and a compressor over SWA pages, 1 word): each is one object per
    source slot in a namespace of its own, beside its source's chunks; the stage holding the source's
    first layer keeps the sidecar whole on every TP rank and its first TP rank alone writes it. The
    TP2 x PP2 writer job stores 288 indexer objects (one per FULL page, like each FULL chunk's 288)
    and 180 compressor objects (one per SWA window page); readers of other layouts (TP1, TP2, PP2)
    in other jobs take every prompt's history from storage, sidecars included, oracle OK (a word
    left out is an oracle mismatch: jobs/mutants.txt hybrid_unified_sidecar_words_dropped); with
    the compressor's objects gone the writer's objects give no hit (the reader hits what it wrote
    itself, as over an empty store)."""
    exp = os.path.join(SRC, "experiments", "hybrid_storage.toml")
    store = out("scstore")
    unified = ["--set", "cache.storage_key_scheme=unified", "--set", "cache.storage_layer_partition=2", "--set",
               "cache.storage_head_partition=1", "--set", "cache.storage_dir=" + store]

    def srun(np_, name, *more):
        rc, so, se = run(np_, exp, "--out", out(name), *unified, *more)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"{name}: verdict OK, oracle OK", so, se)
        return json.loads(tool("report", out(name), "--json")[1])

    w = srun(4, "sc-w")
    counts = collections.Counter(m.group(2) for m in objects(store))
    print("objects per namespace:", sorted(counts.values()))
    expect(sorted(counts.values()) == [180, 240, 288, 720, 2304],
           "FULL 8 chunks x 288 pages, SWA 4 x 180, MAMBA 4 x 60, indexer 288, compressor 180", counts)
    written = w["storage_objects"]["written"]
    expect(written[0] - written[1] == 288 + 180 and written[1] == written[2] == written[3],
           "the sidecars' objects written once, by the first TP rank of the stage holding them", written)
    for name, np_, sets in (("sc-tp1", 1, ["--set", "topology.tp=1", "--set", "topology.pp=1"]),
                            ("sc-tp2", 2, ["--set", "topology.tp=2", "--set", "topology.pp=1"]),
                            ("sc-pp2", 2, ["--set", "topology.tp=1", "--set", "topology.pp=2"])):
        r = srun(np_, name, *sets)
        so = r["storage_objects"]
        print(name, so["read"], r["cached_tokens"])
        expect(r["cached_tokens"]["storage"] == 5184 and so["read_other_jobs"] == so["read"] and so["written"] == [0] * np_,
               f"{name}: the history from the writer job's objects, sidecars included", so, r["cached_tokens"])
    compressor = [ns for ns, n in counts.items() if n == 180][0]
    for n in os.listdir(os.path.join(store, "unified")):
        if compressor in n:
            os.remove(os.path.join(store, "unified", n))
    g = srun(1, "sc-gone", "--set", "topology.tp=1", "--set", "topology.pp=1", "--set", "cache.storage_dir=" + store)
    cold = srun(1, "sc-cold", "--set", "topology.tp=1", "--set", "topology.pp=1", "--set", "cache.storage_dir=" + out("sc-empty"))
    # (each job writes through as it goes: what it reads then is its own)
    expect(g["cached_tokens"] == cold["cached_tokens"] and g["cached_tokens"]["storage"] < 5184,
           "without the compressor's objects the writer job's give no window, so no hit: as over an empty store",
           g["cached_tokens"], cold["cached_tokens"])


if __name__ == "__main__":
    name = sys.argv[1]
    try:
        globals()[name]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"cli {name}: 1 passed, 0 failed")
