#!/usr/bin/python3
"""End-to-end tests of the kvgrid CLI under mpirun: verdicts, exit codes, bad input, traces.

Run one scenario: test_cli.py NAME (ctest registers each). Needs KVGRID_BIN, KVGRID_SOURCE, MPIEXEC.
Ordering between processes is by exit and files, never by sleeping.
"""
import collections
import concurrent.futures
import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time


# h5py (numpy with it: ~0.2 s, a sixth of a short test) is imported on a thread while the test's
# first kvgrid run starts; the name h5py is a stand-in that waits for that import at first use.
def _import_h5py():
    import h5py  # noqa: F401


_h5py_import = threading.Thread(target=_import_h5py)  # (not a daemon: exit waits for it)
_h5py_import.start()


class _H5py:
    def __getattr__(self, name):
        _h5py_import.join()
        import h5py as module
        return getattr(module, name)


h5py = _H5py()

BIN = os.environ["KVGRID_BIN"]
SRC = os.environ["KVGRID_SOURCE"]
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
QUICK = os.path.join(SRC, "experiments", "quickstart.toml")
TREE = os.path.join(SRC, "experiments", "tree.toml")
TIERS = os.path.join(SRC, "experiments", "multiturn_tiers.toml")
MOONCAKE = os.path.join(SRC, "experiments", "mooncake_replay.toml")
CPSHARD = os.path.join(SRC, "experiments", "cp_sharding.toml")
SPEC = os.path.join(SRC, "experiments", "spec_draft.toml")
HYBRID = os.path.join(SRC, "experiments", "hybrid.toml")
PDEX = os.path.join(SRC, "experiments", "pd_example.toml")
PDMT = os.path.join(SRC, "experiments", "pd_multiturn.toml")
sys.path.insert(0, os.path.join(SRC, "jobs"))
from mpi_env import mpi_env  # noqa: E402

# jobs/env.sh's settings: among them a run that fails on purpose ends at once (mpirun's default
# second between its SIGTERM and SIGKILL to the other ranks cost ~2 s per failing run, a third of
# the CLI tests' time) and one node's shared memory only (UCX's and TCP's start-up probing cost
# ~0.2 s of every mpirun, a sixth of the suite's time on 2 cores)
ENV = mpi_env()
TMP = tempfile.mkdtemp(prefix="kvgrid-cli-")
FAST = ["--set", "workload.tree.steps=60", "--set", "output.report_every=30"]


def run(np, *args, timeout=240):
    cmd = [MPIEXEC, "-np", str(np), BIN, "run", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def run_single(*args, timeout=240):
    """`kvgrid run` as a singleton MPI process (no mpirun: a second less per run), for 1-rank runs."""
    p = subprocess.run([BIN, "run", *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def expect_recorded_digest(run_dir, experiment, seed=1):
    """A shipped experiment run as shipped: its decisions are the ones tests/golden/decision_digests.txt
    records (decision_digests skips the experiments whose own test checks this)."""
    sys.path.insert(0, os.path.join(SRC, "jobs"))
    import digests
    want = digests.read_golden().get((experiment, seed))
    got = digests.run_digest(run_dir)
    expect(want is not None and got == want, f"{experiment} seed {seed}: the recorded decisions", got, want)


def tool(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, env=ENV, timeout=120)
    return p.returncode, p.stdout, p.stderr


def expect(cond, msg, *context):
    if not cond:
        print("FAILED:", msg)
        for c in context:
            print("----\n" + str(c)[-4000:])
        sys.exit(1)


def out(name):
    return os.path.join(TMP, name)


def write(name, text):
    path = out(name)
    with open(path, "w") as f:
        f.write(text)
    return path


def tree_ok():
    rc, so, se = run(8, TREE, "--out", out("t"))
    expect(rc == 0, f"quickstart exit {rc}", so, se)
    expect_recorded_digest(out("t"), "tree")
    for line in ["# seed 1", "# topology TP2xCP2xPP2, world 8 ranks", "# verify failures: 0 OK",
                 "# rank divergences: 0 OK", "# verdict: OK"]:
        expect(line in so, f"missing line {line!r}", so)
    expect(so.count("# verdict") == 1, "rank 0 prints alone", so)
    with h5py.File(out("t/run.h5"), "r") as f:
        expect(f["summary"].attrs["verdict"] == b"OK", "summary verdict")
        expect(int(f["meta"].attrs["world_size"]) == 8, "meta world size")
        expect(b"[topology]" in f["meta"].attrs["config"], "effective config stored")
        for r in range(8):
            ev = f[f"ranks/{r:05d}/events"]
            dec = f[f"ranks/{r:05d}/decisions"]
            expect(ev.shape[0] > 0 and dec.shape[0] > 0, f"rank {r} tables empty")
            expect(int(f[f"ranks/{r:05d}"].attrs["world_rank"]) == r, "rank attribute")
        steps = f["ranks/00003/events"]["step"]
        expect(int(steps.max()) == 199, "events cover all steps")
        digests = set(int(x) for x in f["summary/ranks"]["tree_digest"])
        expect(len(digests) == 1, "tree digests agree in the summary")
    rc, so, _ = tool("check", out("t"))
    expect(rc == 0 and "rank divergences: 0 OK" in so, "offline check of a clean run", so)
    # One build identity in every output: --version, the run header, /meta, the report.
    ver = re.search(r"\(git ([0-9a-f]+(?:-dirty)?|unknown)\)", tool("--version")[1])
    expect(ver, "kvgrid --version names its revision", tool("--version"))
    rev = ver.group(1)
    with h5py.File(out("t/run.h5"), "r") as f:
        meta = f["meta"].attrs["git_revision"]
    meta = meta.decode() if isinstance(meta, bytes) else str(meta)
    rc, rep, _ = tool("report", out("t"))
    j = json.loads(tool("report", out("t"), "--json")[1])
    expect(meta == rev == j["git_revision"] and f"git {rev}" in rep, "the same revision everywhere", rev, meta, rep)


def planted_divergence_fails():
    rc, so, se = run(8, TREE, "--out", out("p"), *FAST, "--set", "debug.plant_divergence_rank=5",
                     "--set", "debug.plant_divergence_step=20")
    expect(rc == 1, f"planted divergence must exit 1, got {rc}", so, se)
    expect("# verdict: FAILED" in so, "FAILED verdict", so)
    expect("# rank divergences: 0" not in so, "divergence counted", so)
    expect(re.search(r"step 31: decision logs differ from their group's first rank's on ranks 5$", so, re.M), "names the planted rank", so)
    with h5py.File(out("p/run.h5"), "r") as f:
        expect(f["summary"].attrs["verdict"] == b"FAILED", "summary verdict FAILED")
    rc, so, _ = tool("check", out("p"))
    expect(rc == 1, "offline check finds it", so)
    expect("rank 5" in so and "(step 20)" in so, "first divergence names rank 5 at step 20", so)


def determinism():
    def digest(seed, name):
        rc, so, se = run(4, TREE, "--out", out(name), "--seed", str(seed), *FAST,
                         "--set", "topology.pp=1")
        expect(rc == 0, f"seed {seed} run", so, se)
        m = re.search(r"decision log: (\d+) decisions per rank, digest (0x[0-9a-f]+) on every rank", so)
        expect(m, "decision digest line", so)
        return m.group(2)
    a, b, c = digest(7, "d1"), digest(7, "d2"), digest(8, "d3")
    expect(a == b, f"same seed, same decisions: {a} vs {b}")
    expect(a != c, "another seed, other decisions")


def bad_input():
    cases = [
        (write("malformed.toml", "[cache]\npage_size = = 3\n"), [], r"malformed\.toml:2:\d+: malformed TOML"),
        (write("unknown.toml", "[cache]\npage_sise = 4\n"), [],
         r"unknown\.toml:2:\d+: unknown key 'cache\.page_sise'; did you mean 'cache\.page_size'\? \(every key: kvgrid run --keys\)"),
        (write("type.toml", "[cache]\npage_size = \"x\"\n"), [], r"'cache\.page_size': expected integer.*found string"),
        (write("range.toml", "[workload.tree]\nfollowup_prob = 2.0\n"), [], r"followup_prob.*out of range"),
        (QUICK, ["--set", "cache.bogus=1"], r"--set cache\.bogus=1: unknown key 'cache\.bogus' \(every key: kvgrid run --keys\)"),
        (QUICK, ["--set", "cache.devce_pages=1"], r"unknown key 'cache\.devce_pages'; did you mean 'cache\.device_pages'\?"),
        (QUICK, ["--set", "cache.page_size=abc"], r"expected integer"),
        (out("does-not-exist.toml"), [], r"cannot open experiment file for reading \(/.*does-not-exist\.toml: No such file or directory\)"),
        (TMP, [], r"is a directory"),
        (QUICK, ["--set", "debug.kill_rank=99"], r"rank 99 does not exist"),
        (QUICK, ["--set", "cache.cp_sharding=mirrored"], r"'cache\.cp_sharding': expected string \(one of \"replicated\" \"sharded\" \"any_owner_restore\"\), found \"mirrored\""),
        # the GPU backend: this build has none (a CUDA build without a GPU says so instead: build_check.sh)
        (QUICK, ["--set", "engine.transfer=cuda"],
         r'engine\.transfer = "cuda" needs kvgrid built with -DKVGRID_CUDA=ON|engine\.transfer = "cuda": no usable GPU'),
        (QUICK, ["--set", "engine.collectives=nccl"], r'engine\.collectives = "nccl" needs'),
        (QUICK, ["--set", "engine.cuda_copy=dma"], r"'engine\.cuda_copy': expected string \(one of \"memcpy\" \"kernel\" \"batch\"\)"),
        (QUICK, ["--set", "cache.cp_sharding=sharded", "--set", "cache.device_pages=64"],
         r"cache\.device_pages = 64 leaves no KV pages once the two gather slots of cache\.gather_pages = 1024"),
    ]
    for path, extra, pattern in cases:
        target = out("never-" + os.path.basename(path))
        rc, so, se = run(2, path, "--out", target, *extra)  # (validation precedes the world-size check)
        expect(rc == 2, f"{path} {extra}: exit {rc}, expected 2", so, se)
        expect(re.search(pattern, se), f"{path} {extra}: message {pattern!r}", se)
        expect(se.count("kvgrid run: error:") == 1, "one message, from rank 0", se)
        expect(not os.path.exists(os.path.join(target, "run.h5")), "no trace for bad input")
    # jobs/mpi_env.py reads jobs/env.sh for the Python jobs: it took every setting, and a line it
    # cannot read as the shell would is an error naming the file and line.
    import mpi_env
    with open(os.path.join(SRC, "jobs", "env.sh")) as f:
        exported = re.findall(r"^export (\w+)=(\S+)$", f.read(), re.M)
    expect(exported and list(mpi_env.env_sh().items()) == exported and all(ENV[k] == v for k, v in exported),
           "every jobs/env.sh setting in the tests' environment", exported)
    odd = write("env.sh", "# comment\nexport A=1\n\nexport B=${B:-2}\n")
    try:
        mpi_env.env_sh(odd)
        expect(False, "a default the Python reader cannot follow is refused")
    except ValueError as e:
        expect(f"{odd}:4: " in str(e) and "export B=${B:-2}" in str(e), "names the file, the line and the text", e)


def wrong_np():
    rc, so, se = run(3, QUICK, "--out", out("np"))
    expect(rc == 2, f"wrong -np exit {rc}", so, se)
    expect("needs 8 ranks but the job has 3" in se, "names both numbers", se)
    expect(se.count("needs 8 ranks") == 1, "printed once", se)
    expect(not os.path.exists(out("np/run.h5")), "no trace")


def out_dir_errors():
    rc, so, se = run(8, TREE, "--out", out("no/such/parent/run"))
    expect(rc == 2 and "parent directory" in se and "does not exist" in se, "missing parent", se)
    rc, so, se = run(8, TREE, "--out", out("twice"), *FAST)
    expect(rc == 0, "first run", so, se)
    before = os.path.getmtime(out("twice/run.h5"))
    rc, so, se = run(8, TREE, "--out", out("twice"), *FAST)
    expect(rc == 2 and "already holds a run" in se, "refuses to overwrite", se)
    expect(os.path.getmtime(out("twice/run.h5")) == before, "earlier run untouched")
    rc, so, se = tool("report", out("nothing-here"))
    expect(rc == 2 and "no such run" in se, "report of a missing run", se)
    bogus = write("bogus.h5", "not hdf5")
    rc, so, se = tool("check", bogus)
    expect(rc == 2 and "not an HDF5 file" in se, "check of a non-HDF5 file", se)


def killed_run_readable():
    rc, so, se = run(8, TREE, "--out", out("k"), "--set", "debug.kill_rank=2", "--set", "debug.kill_at_step=60",
                     "--set", "output.flush_every=8")
    expect(rc != 0, "a killed rank fails the job", so, se)
    with h5py.File(out("k/run.h5"), "r") as f:
        expect("meta" in f and "summary" not in f, "meta written at start, no summary")
        last = int(f["ranks/00002/decisions"]["step"].max())
        expect(48 <= last < 60, f"rank 2 kept everything up to its last flush (last step {last})")
        for r in range(8):
            expect(f[f"ranks/{r:05d}/events"].shape[0] > 0, f"rank {r} readable")
    rc, so, se = tool("report", out("k"))
    expect(rc == 0 and "incomplete" in so, "report of an aborted run", so, se)
    rc, so, se = tool("check", out("k"))
    expect(rc == 0 and "incomplete run" in so, "check compares common prefixes", so, se)


def rank_local_input_error():
    """An input error one rank alone finds while it builds its stack (debug.input_error_rank: a shard's
    storage keys, a pool that does not fit) — the other ranks are already waiting in their start-up
    collectives, which it will never join: the job stops with exit 2 and that rank's message within
    seconds (the grace in which every rank could have reported the same error), instead of the
    others waiting for ever; an error every rank finds alike still prints one message and exits 2."""
    TWO_STAGES = ["--set", "topology.tp=1", "--set", "topology.cp=1", "--set", "topology.pp=2"]
    t0 = time.monotonic()
    rc, so, se = run(2, QUICK, "--out", out("local-err"), *TWO_STAGES, "--set", "debug.input_error_rank=1",
                     timeout=60)
    took = time.monotonic() - t0
    expect(rc == 2 and "debug.input_error_rank = 1: this rank's stack cannot be built" in so + se and
           "not every rank reported an input error" in so + se and took < 30, "a rank-local input error stops the job, exit 2", rc, took, so, se)
    rc, so, se = run(2, QUICK, "--out", out("all-err"), *TWO_STAGES, "--set", "debug.input_error_rank=7")
    expect(rc == 2 and (so + se).count("error:") == 1 and "debug.input_error_rank" in se,
           "an error every rank finds: one message, exit 2", so, se)


def watchdog_stall():
    rc, so, se = run(4, TREE, "--out", out("w"), "--set", "topology.pp=1", "--set", "engine.deadline_s=1",
                     "--set", "faults.rank.stall.probability=1", "--set", "faults.rank.stall.ranks=[3]",
                     "--set", "faults.rank.stall.from_step=30", "--set", "faults.rank.stall.duration_ms=60000",
                     timeout=120)
    expect(rc == 1, f"watchdog must end the run with exit 1, got {rc}", so, se)
    expect(re.search(r"watchdog: rank [0-2] waited [0-9.]+ s \(deadline 1 s\) for .*step 30", se),
           "names rank, wait and step", se)
    expect("last decisions" in se and "match_prefix" in se, "prints last decisions", se)
    with h5py.File(out("w/run.h5"), "r") as f:
        expect("summary" not in f, "no summary after the watchdog")
        # Each rank that passed its deadline flushed before any rank aborted (they wait for each
        # other, a bounded grace): all three hold their decisions up to the stall (rank 0 up to step
        # 29, where it waits for rank 3; its peers into step 30).
        last = [int(f[f"ranks/{r:05d}/decisions"]["step"].max()) for r in range(3)]
        expect(min(last) >= 29, "decisions flushed up to the stall on every waiting rank", last)
        faults = f["ranks/00003/faults"]
        expect(faults.shape[0] >= 1 and faults[0]["name"] == b"rank.stall", "stall recorded")
    rc, so, se = tool("check", out("w"))
    expect(rc == 0 and "incomplete run" in so, "check reads every rank's tables", so, se)


def report_json():
    rc, so, se = run(8, QUICK, "--out", out("j"), "--set", "faults.rank.stall.probability=0.5",
                     "--set", "faults.rank.stall.duration_ms=0", "--set", "workload.gsp.groups=4")  # 64 requests
    expect(rc == 0, "run", so, se)
    rc, so, se = tool("report", out("j/run.h5"), "--json")
    expect(rc == 0, "report --json", so, se)
    j = json.loads(so)
    for key in ["requests", "finished", "failed", "prompt_tokens", "cached_tokens", "hit_rate", "computed_tokens",
                "ttft_model_ms", "input_token_throughput", "oracle_mismatches", "divergences", "faults_injected",
                "wall_s", "seed", "topology", "rounds"]:
        expect(key in j, f"report --json has {key}", so)
    expect(j["verdict"] == "OK" and j["complete"] is True and j["world_size"] == 8, "fields", so)
    expect(j["requests"] == j["finished"] == 64 and j["failed"] == 0, "request counts", so)
    expect(set(j["cached_tokens"]) == {"device", "host", "storage"}, "cached tokens by tier", so)
    expect(set(j["hit_rate"]) == {"device", "host", "storage", "total"}, "hit rate by tier", so)
    expect(j["computed_tokens"] == j["prompt_tokens"] - sum(j["cached_tokens"].values()), "computed tokens", so)
    expect(j["transferred_tokens"] == {"d2h": 0, "h2d": 0, "storage_read": 0, "storage_write": 0, "pd": 0}, "no tiers, no copies", so)
    expect(0.5 < j["hit_rate"]["device"] < 1.0, "gsp reuses its system prompts", so)
    t = j["ttft_model_ms"]
    expect(0 < t["p50"] <= t["p90"] <= t["p99"], "TTFT percentiles ordered", so)
    expect(j["input_token_throughput"] > 0 and j["oracle_mismatches"] == 0 and j["divergences"] == 0, "totals", so)
    expect(j["faults_injected"] > 0 and j["faults"].get("rank.stall", 0) == j["faults_injected"], "fault counts", so)
    expect([r["round"] for r in j["rounds"]] == [0, 1], "rounds of a two-turn workload", so)
    expect(j["rounds"][1]["hit_rate"] > j["rounds"][0]["hit_rate"], "the second turn reuses the first", so)
    rc, so, se = tool("report", out("j"))
    expect(rc == 0 and "# verdict OK" in so and "TTFT (modelled)" in so, "text report", so)
    with h5py.File(out("j/run.h5"), "r") as f:
        rows = f["ranks/00004/requests"]  # last stage's leader (pp 1, cp 0, tp 0)
        expect(rows.shape[0] == 64 and int(rows["oracle_ok"].min()) == 1, "requests table")
        expect(f["ranks/00000/requests"].shape[0] == 0, "only the checker records requests")
    # For tools: the report against its JSON Schema (docs/report.schema.json) — a serving run and a
    # tree run; digests as hex strings; SGLang bench_serving's names beside kvgrid's.
    import jsonschema
    with open(os.path.join(SRC, "docs", "report.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(j, schema)
    expect(j["schema_version"] == 2 and j["kvgrid_version"], "schema and kvgrid versions", j)
    expect(all(re.fullmatch(r"0x[0-9a-f]{16}", r["decision_digest"]) for r in j["ranks"]), "hex digests", j["ranks"])
    expect(j["mean_ttft_ms"] == t["mean"] and j["median_ttft_ms"] == t["p50"] and j["p99_ttft_ms"] == t["p99"]
           and j["input_throughput"] == j["input_token_throughput"] and j["mean_tpot_ms"] > 0 and j["mean_itl_ms"] > 0,
           "SGLang-compatible names", j)
    rc, so, se = run(8, TREE, "--out", out("j-tree"), *FAST)
    jt = json.loads(tool("report", out("j-tree"), "--json")[1])
    jsonschema.validate(jt, schema)
    expect("device_hit_rate" not in jt and jt["hit_rate"]["device"] == jt["hit_rate"]["total"] > 0, "tree: device tier only", jt)
    for bad in ({**j, "schema_version": 1}, {**j, "ranks": [{**j["ranks"][0], "tree_digest": 12345}]}):
        try:
            jsonschema.validate(bad, schema)
            expect(False, "the schema rejects a wrong report", bad["schema_version"])
        except jsonschema.ValidationError:
            pass

def pd_world():
    pd = write("pd.toml", "[workload]\nkind = \"tree\"\n" 
              "[topology.prefill]\ntp = 2\npp = 2\n[topology.decode]\ntp = 2\ncp = 1\npp = 1\n"
                          "[workload.tree]\nsteps = 40\n")
    rc, so, se = run(6, pd, "--out", out("pd"))
    expect(rc == 0, "two-group world runs", so, se)
    expect("# topology prefill TP2xCP1xPP2 + decode TP2xCP1xPP1, world 6 ranks" in so, "topology line", so)
    with h5py.File(out("pd/run.h5"), "r") as f:
        expect(int(f["ranks/00004"].attrs["group"]) == 1, "decode group starts at rank 4")


def pd_example():
    """The first article's Figure 5 (experiments/pd_example.toml): the 12K-token request finds A on
    decode's device and B in its host tier, restores B and receives only C (4K tokens, not 12K);
    full_transfer receives all 12K; every request's transfer is its prompt minus decode_prefix_len,
    also with TP2 x PP2 on both sides and from prefill TP2 x PP2 into decode TP1 (heterogeneous);
    a group whose TP cannot split the heads is refused."""
    for variant, np_, sets, want in (("decode_reuse", 2, [], (8192, 4096, 4096)),
                                     ("full_transfer", 2, [], (0, 0, 12288)),
                                     ("tp2pp2", 8, ["--set", "topology.prefill.tp=2", "--set", "topology.prefill.pp=2",
                                                    "--set", "topology.decode.tp=2", "--set", "topology.decode.pp=2"],
                                      (8192, 4096, 4096)),
                                     ("hetero", 5, ["--set", "topology.prefill.tp=2", "--set", "topology.prefill.pp=2",
                                                    "--set", "topology.decode.tp=1"], (8192, 4096, 4096)),
                                     # the NCCL transport's ordering layer (tags kept apart over an
                                     # order-matched data plane), here over MPI
                                     ("ordered", 5, ["--set", "topology.prefill.tp=2", "--set", "topology.prefill.pp=2",
                                                     "--set", "topology.decode.tp=1", "--set", "engine.collectives=mpi_ordered"],
                                      (8192, 4096, 4096))):
        pd = "full_transfer" if variant == "full_transfer" else "decode_reuse"
        rc, so, se = run(np_, PDEX, "--out", out("pde-" + variant), "--set", "protocol.pd=" + pd, *sets)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"{variant} run", so, se)
        if variant == "ordered":
            expect("collectives mpi_ordered" in so, "the header names the P/D transport", so)
        if variant == "decode_reuse":  # the experiment as shipped (protocol.pd's default)
            expect_recorded_digest(out("pde-" + variant), "pd_example")
        with h5py.File(out(f"pde-{variant}/run.h5"), "r") as f:
            tables = [f["ranks"][r]["requests"][:] for r in f["ranks"] if int(f["ranks"][r].attrs["group"]) == 1]
            t = [x for x in tables if len(x)][0]  # the decode group's last-stage leader
        expect(len(t) == 4 and (t["oracle_ok"] == 1).all(), f"{variant}: four requests, oracle OK", t)
        expect(((t["prompt_tokens"] - t["cached_tokens"]) == t["pd_transferred_tokens"]).all() and
               (t["cached_tokens"] % 16 == 0).all(), f"{variant}: prompt - decode_prefix_len (page-aligned) sent", t)
        last = t[t["request"] == 3][0]
        got = (int(last["cached_tokens"]), int(last["host_tokens"]), int(last["pd_transferred_tokens"]))
        print(variant, "request 3: decode_prefix_len, of it restored from host, transferred:", got)
        expect(got == want, f"{variant}: Figure 5's counts", got, want)
        j = json.loads(tool("report", out("pde-" + variant), "--json")[1])
        expect(j["transferred_tokens"]["pd"] == int(t["pd_transferred_tokens"].sum()), "report counts the sends", j)
    rc, so, se = run(4, PDEX, "--out", out("pde-bad"), "--set", "topology.prefill.tp=3")
    expect(rc == 2 and "is not divisible by the prefill group's tp = 3" in se, "a group that cannot split the heads", so, se)


def pd_shape():
    """The pd figure at small scale (experiments/pd_multiturn.toml): decode_reuse transfers far fewer
    tokens than full_transfer and lowers mean and median TTFT; the figure from the two HDF5 traces;
    broken transfers (pd.transfer.fail) fail exactly their requests, reported by reason, oracle OK."""
    small = ["--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=3"]
    j = {}
    for v in ("decode_reuse", "full_transfer"):
        rc, so, se = run(4, PDMT, "--out", out("pdm-" + v), "--set", "protocol.pd=" + v, *small)
        expect(rc == 0 and "# verdict: OK" in so, f"{v} run", so, se)
        j[v] = json.loads(tool("report", out("pdm-" + v), "--json")[1])
    r, f = j["decode_reuse"], j["full_transfer"]
    print("transferred", r["transferred_tokens"]["pd"], f["transferred_tokens"]["pd"], "ttft", r["ttft_model_ms"], f["ttft_model_ms"])
    expect(f["transferred_tokens"]["pd"] == f["prompt_tokens"] and r["transferred_tokens"]["pd"] < 0.4 * f["prompt_tokens"],
           "decode reuse sends a fraction of the prompts", r["transferred_tokens"], f["transferred_tokens"])
    expect(r["ttft_model_ms"]["mean"] < f["ttft_model_ms"]["mean"] and r["ttft_model_ms"]["p50"] < f["ttft_model_ms"]["p50"],
           "lower TTFT", r["ttft_model_ms"], f["ttft_model_ms"])
    png = out("pd.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "pd.py"), png,
                        f"decode_reuse={out('pdm-decode_reuse')}", f"full_transfer={out('pdm-full_transfer')}"],
                       capture_output=True, text=True)
    expect(p.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "tokens transferred" in p.stdout,
           "figure from HDF5", p.stdout, p.stderr)
    rc, so, se = run(4, PDMT, "--out", out("pdm-fail"), *small, "--set", "faults.pd.transfer.fail.probability=0.2")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# verify failures: 0 OK" in so, "broken transfers run", so, se)
    jf = json.loads(tool("report", out("pdm-fail"), "--json")[1])
    fired = jf["faults"].get("pd.transfer.fail", 0)
    expect(fired > 0 and jf["failed_by_reason"]["pd_transfer"] == fired and jf["failed"] == fired and
           jf["finished"] + jf["failed"] == r["finished"], "each broken transfer fails its request", jf["failed_by_reason"], fired)


def pd_restore_fail():
    """Broken decode-side restores (pd.restore.fail, drawn on each decode rank): the requests that
    fail with reason pd_restore are exactly those whose restore broke on some decode rank (its
    pd_recv event, status 1), each had a host restore, the rest are decoded oracle-OK and nothing
    leaks; the report counts them by reason (with aborts too, the run's footer and the report agree
    and every request has one row). The unchecked variant decodes on the broken KV: the oracle
    catches it."""
    sets = ["--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=3", "--set", "cache.device_pages=400",
            "--set", "faults.pd.restore.fail.probability=0.3"]
    rc, so, se = run(4, PDMT, "--out", out("pdr"), *sets)
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so and "# verify failures: 0 OK" in so,
           "broken restores run", so, se)
    broke, failed, restored = set(), set(), 0
    with h5py.File(out("pdr/run.h5"), "r") as f:
        for r in f["ranks"]:
            g = f["ranks"][r]
            if int(g.attrs["group"]) != 1:
                continue
            ev = g["events"][:]
            recv = ev[ev["op"] == b"pd_recv"]
            broke |= {int(x) for x in recv[recv["status"] == 1]["request"]}
            fail = ev[ev["op"] == b"pd_restore_fail"]  # every decode rank: (host_loaded, decode_prefix_len)
            restored = int((fail["args"][:, 0] > 0).sum()) if len(fail) else 0
            q = g["requests"][:]
            if len(q):
                failed = {int(x) for x in q[q["failed"] == 3]["request"]}
    print("restores broken on some decode rank:", sorted(broke), "failed pd_restore:", sorted(failed))
    expect(broke and failed == broke, "exactly the requests whose restore broke fail", sorted(broke), sorted(failed))
    expect(restored == len(failed), "each had a host restore", restored, len(failed))
    j = json.loads(tool("report", out("pdr"), "--json")[1])
    expect(j["failed_by_reason"]["pd_restore"] == len(failed) == j["failed"], "report by reason", j["failed_by_reason"])
    rc, so, se = tool("report", out("pdr"))
    expect(f"{len(failed)} by a broken restore" in so, "report text", so)
    # With aborts too: decode records every request once (prefill's rank holds no rows), and the
    # run's footer counts what decode finished and failed, as the report does.
    rc, so, se = run(4, PDMT, "--out", out("pdr-abort"), *sets, "--set", "faults.request.abort.probability=0.01")
    m = re.search(r"# requests (\d+) finished, (\d+) failed \(aborted, broken transfer or restore\) of (\d+)", so)
    ja = json.loads(tool("report", out("pdr-abort"), "--json")[1])
    fr = ja["failed_by_reason"]
    expect(rc == 0 and m and (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (ja["finished"], ja["failed"], ja["requests"])
           and ja["finished"] + ja["failed"] == ja["requests"] and fr["abort"] > 0 and fr["pd_restore"] > 0
           and fr["abort"] + fr["pd_restore"] + fr["pd_transfer"] == ja["failed"], "footer and report agree", so, ja)
    with h5py.File(out("pdr-abort/run.h5"), "r") as f:
        rows = {r: len(f["ranks"][r]["requests"]) for r in f["ranks"]}
    expect(sum(rows.values()) == ja["requests"], "one row per request, written by decode", rows)
    rc, so, se = run(4, PDMT, "--out", out("pdr-bug"), *sets, "--set", "protocol.pd_restore=unchecked")
    m = re.search(r"# oracle mismatches: (\d+) FAILED", so)
    expect(rc == 1 and m and int(m.group(1)) > 0, "unchecked restores caught by the oracle", so, se)


def load_back_fail():
    """Broken host->device load-backs (transfer.load.fail, drawn per rank and layer copy) at
    TP2xPP2 with aborts: the verdict is OK, the requests whose load broke on some rank (load_broken)
    are exactly those recomputed on every rank (load_fail, the same set on each), the report counts
    them, and cached + computed = prompt tokens still. In a P/D world prefill's load-backs break and
    are recomputed by every prefill rank; protocol.load_back = unchecked reads the broken loads:
    FAILED on oracle mismatches."""
    sets = ["--set", "topology.cp=1", "--set", "topology.pp=2", "--set", "workload.multiturn.clients=8",
            "--set", "workload.multiturn.rounds=4", "--set", "faults.transfer.load.fail.probability=0.02",
            "--set", "engine.debug_checks=true"]
    rc, so, se = run(4, TIERS, "--out", out("lb"), *sets, "--set", "faults.request.abort.probability=0.01")
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so,
           "broken load-backs run", so, se)
    broke, fails, mid_load = set(), [], set()
    with h5py.File(out("lb/run.h5"), "r") as f:
        for r in f["ranks"]:
            ev = f["ranks"][r]["events"][:]
            broke |= {int(x) for x in ev[ev["op"] == b"load_broken"]["request"]}
            fails.append(sorted(int(x) for x in ev[ev["op"] == b"load_fail"]["request"]))
            ab = ev[ev["op"] == b"abort"]
            mid_load |= {int(x) for x in ab[ab["args"][:, 2] == 2]["request"]}  # aborted before its outcome was read
    print("load-backs broken on some rank:", sorted(broke), "recomputed:", fails[0], "aborted mid-load:", sorted(mid_load))
    expect(broke and all(x == fails[0] for x in fails), "every rank recomputes the same requests", fails)
    expect(set(fails[0]) == broke - mid_load, "exactly the broken ones", sorted(broke), fails[0], sorted(mid_load))
    j = json.loads(tool("report", out("lb"), "--json")[1])
    expect(j["load_back"]["failed_requests"] == len(fails[0]) and j["load_back"]["recomputed_tokens"] > 0, "report", j)
    expect(sum(j["cached_tokens"].values()) + j["computed_tokens"] == j["prompt_tokens"], "cached + computed = prompt", j)
    rc, so, se = tool("report", out("lb"))
    expect(f"# load-backs: {len(fails[0])} broken on some rank" in so, "report text", so)
    # P/D: prefill's load-backs break (decode's restores have pd.restore.fail): recomputed by prefill,
    # every request decoded oracle-OK.
    rc, so, se = run(4, PDMT, "--out", out("lb-pd"), "--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=3",
                     "--set", "cache.device_pages=300", "--set", "faults.transfer.load.fail.probability=0.05")
    expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, "P/D prefill's broken load-backs", so, se)
    with h5py.File(out("lb-pd/run.h5"), "r") as f:
        pf = [sorted(int(x) for x in f["ranks"][r]["events"][:][f["ranks"][r]["events"]["op"][:] == b"load_fail"]["request"])
              for r in f["ranks"] if int(f["ranks"][r].attrs["group"]) == 0]
    expect(pf[0] and all(x == pf[0] for x in pf), "prefill ranks recompute the same broken loads", pf)
    rc, so, se = run(4, TIERS, "--out", out("lb-bug"), *sets, "--set", "protocol.load_back=unchecked")
    m = re.search(r"# oracle mismatches: (\d+) FAILED", so)
    expect(rc == 1 and m and int(m.group(1)) > 0, "unchecked load-backs caught by the oracle", so[-3000:], se[-3000:])


def decision_digests():
    """Every quick shipped experiment at seed 1 takes exactly the decisions recorded in
    tests/golden/decision_digests.txt (jobs/digests.py --check; the job checks seeds 1-3 and the
    slow experiments too): a change meant to keep behaviour keeps them."""
    # quickstart, tree, the three hybrid experiments, hybrid_tiers, hybrid_spec and pd_example are run
    # as shipped at seed 1 by their own tests, which compare the recorded digest (expect_recorded_digest)
    p = subprocess.run([os.path.join(SRC, "jobs", "digests.py"), "--check", "--quick", "--seeds", "1", "--skip",
                        "quickstart,tree,hybrid_swa,hybrid_mamba,hybrid_all,hybrid_tiers,hybrid_spec,pd_example"],
                       capture_output=True,
                       text=True, env=dict(ENV, KVGRID_BIN=BIN, MPIEXEC=MPIEXEC), timeout=240)
    m = re.search(r"# (\d+) of (\d+) digests as recorded", p.stdout)
    expect(p.returncode == 0 and m and m.group(1) == m.group(2) and int(m.group(1)) >= 13, "decisions as recorded",
           p.stdout, p.stderr)


def metric_identity():
    """Every figure is named for what it counts and they add up, with each tier combination (device
    only, + host, + host + storage): cached (device + host + storage) + computed = prompt tokens in
    the text report, the JSON and the trace's requests table, and the last progress row's
    dev% / host% / stor% are the JSON's hit rates by tier."""
    base = ["--set", "topology.cp=1", "--set", "workload.multiturn.clients=4", "--set", "workload.multiturn.rounds=4"]
    combos = {"device": ["--set", "cache.storage=none", "--set", "cache.host_pages=0"],
              "host": ["--set", "cache.storage=none", "--set", "cache.device_pages=96"],
              "storage": ["--set", "cache.device_pages=96", "--set", "cache.host_pages=110"]}
    for name, sets in combos.items():
        rc, so, se = run(2, TIERS, "--out", out("mi-" + name), *base, *sets)
        expect(rc == 0 and "# verdict: OK" in so, f"{name} run", so, se)
        j = json.loads(tool("report", out("mi-" + name), "--json")[1])
        cached = j["cached_tokens"]
        expect(sum(cached.values()) + j["computed_tokens"] == j["prompt_tokens"], f"{name}: JSON adds up", j)
        expect(abs(sum(j["hit_rate"][t] for t in ("device", "host", "storage")) - j["hit_rate"]["total"]) < 1e-9,
               f"{name}: rates by tier add up to the total", j["hit_rate"])
        tiers_used = {t for t, v in cached.items() if v > 0}
        allowed = {"device": {"device"}, "host": {"device", "host"}, "storage": {"device", "host", "storage"}}[name]
        expect(name in tiers_used and tiers_used <= allowed, f"{name}: tokens come from its tiers, its own included", cached)
        text = tool("report", out("mi-" + name))[1]
        m = re.search(r"prompt tokens (\d+) = cached (\d+) \(hit rate: device ([\d.]+)%, host ([\d.]+)%, storage ([\d.]+)%\) "
                      r"\+ computed (\d+)", text)
        expect(m and int(m.group(1)) == int(m.group(2)) + int(m.group(6)) == j["prompt_tokens"]
               and int(m.group(2)) == sum(cached.values()), f"{name}: the text report adds up", text)
        with h5py.File(out(f"mi-{name}/run.h5"), "r") as f:
            q = [f["ranks"][r]["requests"][:] for r in f["ranks"] if len(f["ranks"][r]["requests"])][0]
        q = q[q["failed"] == 0]
        expect(int(q["cached_tokens"].sum()) + int(q["computed_tokens"].sum()) == int(q["prompt_tokens"].sum()) == j["prompt_tokens"],
               f"{name}: the trace adds up", q["cached_tokens"].sum(), q["computed_tokens"].sum(), q["prompt_tokens"].sum())
        expect(int(q["host_tokens"].sum()) == cached["host"] + cached["storage"]
               and int(q["storage_tokens"].sum()) == cached["storage"], f"{name}: host and storage columns", cached)
        rows = [l.split() for l in so.splitlines() if re.match(r"^ +\d+ +\d+/", l)]
        dev, host, stor = (float(x) for x in rows[-1][4:7])
        expect(abs(dev - 100 * j["hit_rate"]["device"]) < 0.01 and abs(host - 100 * j["hit_rate"]["host"]) < 0.01
               and abs(stor - 100 * j["hit_rate"]["storage"]) < 0.01, f"{name}: progress row by tier", rows[-1], j["hit_rate"])


def step_rows():
    """output.steps: `timed` (the default) times every phase; `model` keeps every row and modelled
    column with the wall columns 0; `none` writes no rows (experiments/policy_sim.toml) — the same
    decisions all three ways."""
    ps = os.path.join(SRC, "experiments", "policy_sim.toml")
    tables, digests = {}, set()
    for mode in ("timed", "model", "none"):
        rc, so, se = run_single(ps, "--out", out("rows-" + mode), "--set", "workload.mooncake.first_n=30",
                                "--set", "output.steps=" + mode)
        expect(rc == 0 and "# verdict: OK" in so, f"output.steps={mode} run", so, se)
        with h5py.File(out(f"rows-{mode}/run.h5"), "r") as f:
            tables[mode] = f["ranks"][list(f["ranks"])[0]]["steps"][:]
        digests.add(re.search(r"digest (0x[0-9a-f]+)", so).group(1))
    timed, model = tables["timed"], tables["model"]
    wall = [n for n in timed.dtype.names if n.endswith("_wall_ns")]
    same = [n for n in timed.dtype.names if n not in wall and n != "wall_start_ns"]
    expect(len(digests) == 1 and len(timed) == len(model) > 100 and len(tables["none"]) == 0,
           "same decisions; rows, rows, none", digests, len(timed), len(model), len(tables["none"]))
    expect(all((timed[n] == model[n]).all() for n in same), "every other column equal")
    expect(all(int(model[n].sum()) == 0 for n in wall) and int(timed["forward_wall_ns"].sum()) > 0,
           "wall columns 0 with model, timed with timed", {n: int(model[n].sum()) for n in wall})


def helper_thread():
    """engine.helper_thread is the same run as without it: policy_sim's first 200 requests with pages
    corrupted (device.page.corrupt) give the same oracle mismatches — the same printed lines, events
    at the same steps, requests marked wrong, summary — with long chunks checked on the helper
    thread; with --strict both stop at the same mismatch with the same message."""
    base = [os.path.join(SRC, "experiments", "policy_sim.toml"), "--set", "workload.mooncake.first_n=200",
            "--set", "faults.device.page.corrupt.probability=0.002"]
    def run_case(mode, strict):
        d = out(f"helper-{mode}-{int(strict)}")
        rc, so, se = run_single(*base, "--out", d, "--set", "engine.helper_thread=" + str(mode == "thread").lower(),
                                *(["--strict"] if strict else []))
        if strict:
            return rc, so, se, None
        with h5py.File(os.path.join(d, "run.h5"), "r") as f:
            g = f["ranks"][list(f["ranks"])[0]]
            return rc, so, se, (f["summary"]["ranks"][:], g["events"][:], g["requests"][:])
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = {(m, st): pool.submit(run_case, m, st) for st in (False, True) for m in ("inline", "thread")}
    (rc0, so0, se0, t0), (rc1, so1, se1, t1) = runs[("inline", False)].result(), runs[("thread", False)].result()
    lines = lambda se: [l for l in se.splitlines() if "oracle mismatch at step" in l]
    expect(rc0 == rc1 != 0 and "# verdict: FAILED" in so0 and "# verdict: FAILED" in so1, "both runs fail", so0, so1)
    expect(len(lines(se0)) >= 3 and lines(se0) == lines(se1), "the same mismatches printed", se0, se1)
    m = re.search(r"# oracle mismatches: (\d+) FAILED \((\d+) long chunks checked on the helper thread\)", so1)
    expect(m and int(m.group(2)) > 10 and f"# oracle mismatches: {m.group(1)} FAILED\n" in so0,
           "the footer counts the same mismatches and the thread's chunks", so0, so1)
    (r0, e0, q0), (r1, e1, q1) = t0, t1
    expect(int(r0["oracle_thread_chunks"][0]) == 0 and int(r1["oracle_thread_chunks"][0]) == int(m.group(2)),
           "oracle_thread_chunks: 0 without the helper, the footer's count with it", r0["oracle_thread_chunks"], r1["oracle_thread_chunks"])
    for col in r0.dtype.names:
        if col != "oracle_thread_chunks":
            expect((r0[col] == r1[col]).all(), f"summary column {col} equal", r0[col], r1[col])
    expect(len(e0) == len(e1) and all((e0[c] == e1[c]).all() for c in e0.dtype.names if c != "wall_ns")
           and (e0["op"] == b"oracle_mismatch").sum() == int(m.group(1)), "the events equal but for wall time", len(e0), len(e1))
    expect(len(q0) == len(q1) and all((q0[c] == q1[c]).all() for c in q0.dtype.names if "wall" not in c), "the requests equal")
    (rc0, so0, se0, _), (rc1, so1, se1, _) = runs[("inline", True)].result(), runs[("thread", True)].result()
    stop = lambda se: [l for l in se.splitlines() if "FAILED: oracle mismatch with --strict" in l]
    expect(rc0 == rc1 != 0 and stop(se0) and stop(se0) == stop(se1), "--strict stops both at the same mismatch", se0, se1)


def fused_decode():
    """engine.decode = fused keeps every decision, KV word and clock of `step`: the decision and tree
    digests, the device pool's content (kv_digest), the requests table (TTFT, finish, tokens cached)
    and the steps table's modelled columns are equal — policy_sim (its first 200 requests) at seeds
    1-3, and one-rank versions of the quickstart (gsp, one running), the tiers experiment (host tier,
    write_back) and the Mooncake replay (64 running, host tier); policy_sim fuses most steps. Every
    other shipped experiment is refused at load with its reason (exit 2, nothing written)."""
    one = ["--set", "topology.tp=1", "--set", "topology.cp=1", "--set", "topology.pp=1"]
    cases = [("policy_sim", s, ["--set", "workload.mooncake.first_n=200"]) for s in (1, 2, 3)] + [
        ("quickstart", 1, one + ["--set", "workload.gsp.groups=4", "--set", "engine.max_running=1"]),
        ("multiturn_tiers", 1, one + ["--set", "cache.storage=none", "--set", "cache.write_policy=write_back",
                                      "--set", "workload.multiturn.clients=2"]),
        # (flushes rarer than checks: a check step is then not quiet for the check's sake alone)
        ("mooncake_replay", 2, one + ["--set", "cache.storage=none", "--set", "workload.mooncake.first_n=100",
                                      "--set", "output.flush_every=999983"])]
    def run_case(k, mode):  # (not `one`, the one-rank settings above)
        name, seed, sets = cases[k]
        # (policy_sim as shipped writes no steps table; the others compare its modelled columns too)
        rows = "none" if k == 1 else "model"
        d = out(f"fused-{name}-{seed}-{mode}")
        rc, so, se = run_single(os.path.join(SRC, "experiments", name + ".toml"), "--out", d, "--seed", str(seed),
                                *sets, "--set", "engine.decode=" + mode, "--set", "output.steps=" + rows)
        expect(rc == 0 and "# verdict: OK" in so, f"{name} seed {seed} with {mode}", so, se)
        with h5py.File(os.path.join(d, "run.h5"), "r") as f:
            ranks = f["summary"]["ranks"][:]
            attrs = {a: f["summary"].attrs[a] for a in f["summary"].attrs if a != "wall_s"}
            g = f["ranks"][list(f["ranks"])[0]]
            steps, reqs, events = g["steps"][:], g["requests"][:], g["events"][:]
        return ranks, steps, reqs, so, attrs, events
    # (one process per run, two at a time: the step and fused runs of a case side by side)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = {(k, mode): pool.submit(run_case, k, mode) for k in range(len(cases)) for mode in ("step", "fused")}
    for k, (name, seed, sets) in enumerate(cases):
        (r0, st0, q0, so0, a0, e0), (r1, st1, q1, so1, a1, e1) = runs[(k, "step")].result(), runs[(k, "fused")].result()
        for col in r0.dtype.names:  # every summary column: digests, KV, clocks, copies, counts
            if col != "fused_steps":
                expect((r0[col] == r1[col]).all(), f"{name} seed {seed}: {col} equal", r0[col], r1[col])
        expect(a0 == a1, f"{name} seed {seed}: the run's summary (steps, checks, requests) equal", a0, a1)
        ev = [c for c in e0.dtype.names if c != "wall_ns"]  # every event: checks, copies, finishes, at their steps
        expect(len(e0) == len(e1) and all((e0[c] == e1[c]).all() for c in ev),
               f"{name} seed {seed}: the events tables equal but for wall time", len(e0), len(e1))
        expect(len(q0) == len(q1) and all((q0[c] == q1[c]).all() for c in q0.dtype.names if "wall" not in c),
               f"{name} seed {seed}: the requests tables equal")
        model_cols = [c for c in st0.dtype.names if "wall" not in c]
        expect(len(st0) == len(st1) and all((st0[c] == st1[c]).all() for c in model_cols),
               f"{name} seed {seed}: the steps tables' modelled columns equal")
        fused, total = int(r1["fused_steps"][0]), int(a1["steps"])
        want = total // 2 if name == "policy_sim" else 10  # (one request at a time: most steps)
        expect(int(r0["fused_steps"][0]) == 0 and fused >= want, f"{name} seed {seed}: {fused} of {total} steps fused", so1)
    # Every other shipped experiment: refused at load, by name and reason, writing nothing (four at a
    # time: a refusal is mostly a singleton MPI start-up's waiting, a fifth of a second).
    def refused(toml):
        d = out("fused-refused-" + os.path.basename(toml)[:-5])
        return (toml, d) + run_single(toml, "--out", d, "--set", "engine.decode=fused")
    tomls = [t for t in sorted(glob.glob(os.path.join(SRC, "experiments", "*.toml"))) if not t.endswith("/policy_sim.toml")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for toml, d, rc, so, se in pool.map(refused, tomls):
            expect(rc == 2 and 'engine.decode = "fused" is refused for this experiment: ' in se and not os.path.exists(d),
                   f"{os.path.basename(toml)}: fused refused with the reason", so, se)


def trace_self_describing():
    """The trace explains itself: every column of every table (events, decisions, faults,
    requests, steps, summary/ranks) carries a unit and a description, strings are variable-length
    UTF-8, every op and decision name seen has
    its meaning, /meta names the rank file holding the requests table, and jobs/export.sh writes
    the tables as CSV — over a tiered PP run with broken load-backs, aborts and delayed messages,
    a P/D run with broken restores, and a tree run."""
    runs = [(4, os.path.join(SRC, "experiments", "pp_sync.toml"), "td-pp",
             ["--set", "faults.transfer.load.fail.probability=0.05", "--set", "faults.request.abort.probability=0.02",
              "--set", "faults.p2p.delay.probability=0.2"]),
            (4, PDMT, "td-pd", ["--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=2",
                                "--set", "cache.device_pages=400", "--set", "faults.pd.restore.fail.probability=0.2"]),
            (8, TREE, "td-tree", FAST)]
    for np_, exp, name, sets in runs:
        rc, so, se = run(np_, exp, "--out", out(name), "-q", *sets)
        expect(rc == 0, f"{name} run", so, se)
        with h5py.File(out(name + "/run.h5"), "r") as f:
            tables = [(f"ranks/{r}/{t}", f["ranks"][r][t]) for r in f["ranks"] for t in ("events", "decisions", "faults", "requests", "steps")]
            tables.append(("summary/ranks", f["summary/ranks"]))
            for where, d in tables:
                expect("description" in d.attrs, f"{name}: {where} has a description")
                for col in d.dtype.names:
                    expect(f"{col}.unit" in d.attrs and f"{col}.description" in d.attrs, f"{name}: {where}.{col} described",
                           list(d.attrs))
                for col in d.dtype.names:  # strings: variable-length UTF-8 (no padding, no truncation)
                    info = h5py.check_string_dtype(d.dtype[col])
                    expect(info is None or (info.encoding == "utf-8" and info.length is None),
                           f"{name}: {where}.{col} is a variable-length UTF-8 string", info)
                key, prefix = {"events": ("op", "op."), "decisions": ("name", "name.")}.get(where.split("/")[-1], (None, None))
                if key:
                    seen = {x.decode().rstrip("\x00") for x in d[key][:]}
                    missing = sorted(n for n in seen if prefix + n not in d.attrs)
                    expect(not missing, f"{name}: {where}: every {key} documented", missing)
            rr = int(f["meta"].attrs["requests_rank"])
            if exp == TREE:
                expect(rr == -1, "the tree loop records no requests", rr)
            else:
                expect(len(f["ranks"][f"{rr:05d}"]["requests"]) > 0, f"{name}: /meta/requests_rank holds the requests", rr)
                nreq = len(f["ranks"][f"{rr:05d}"]["requests"])
            nev = sum(len(f["ranks"][r]["events"]) for r in f["ranks"])
        p = subprocess.run([os.path.join(SRC, "jobs", "export.sh"), out(name)], capture_output=True, text=True, timeout=120)
        expect(p.returncode == 0, f"{name}: export", p.stdout, p.stderr)
        with open(out(name + "/csv/events.csv")) as fh:
            expect(sum(1 for _ in csv.reader(fh)) == nev + 1, f"{name}: events.csv has every event")
        if exp != TREE:
            with open(out(name + "/csv/requests.csv")) as fh:
                expect(sum(1 for _ in csv.reader(fh)) == nreq + 1, f"{name}: requests.csv has every request")
    p = subprocess.run([os.path.join(SRC, "jobs", "export.sh"), out("no-such-run")], capture_output=True, text=True, timeout=60)
    expect(p.returncode == 2 and "no such run" in p.stderr, "export of a missing run", p.stdout, p.stderr)


def help_and_usage():
    for args in (["--help"], ["run", "--help"], ["report", "--help"], ["check", "--help"]):
        rc, so, se = tool(*args)
        expect(rc == 0 and "Usage" in so + se or "usage" in (so + se).lower(), f"{args} help", so, se)
    rc, so, se = tool("run", "--keys")
    expect(rc == 0 and "cache.page_size" in so and 'faults."rank.stall".probability' in so, "key list", so)
    expect("cache.page_size  (integer in [1, 65536])  default 16" in so, "ranges as integers, defaults", so)
    rc, so, se = tool("run", "--keys", "--json")
    keys = {k["key"]: k for k in json.loads(so)}
    expect(keys["cache.page_size"]["default"] == 16 and keys["cache.page_size"]["min"] == 1
           and keys["protocol.load_back"]["choices"] == ["agreed", "unchecked"], "--keys --json", so[:2000])
    rc, so, se = tool("run", "--keys", "--template", out("template.toml"))
    expect(rc == 0 and os.path.exists(out("template.toml")), "--template writes a file", so, se)
    rc, so, se = tool("run", out("template.toml"), "--world-size")
    expect(rc == 0 and so.strip() == "1", "the template is a valid experiment", so, se)
    rc, so, se = tool("run", "--keys", "--template", out("template.toml"))
    expect(rc == 2 and "not overwritten" in se, "an existing file is never overwritten", so, se)
    rc, so, se = tool("run", TREE, "--set", "cache.page_size=0", "--world-size")
    expect(rc == 2 and "expected integer in [1, 65536], found 0" in se, "integer range in the message", se)
    rc, so, se = tool("frobnicate")
    expect(rc == 2 and "unknown command 'frobnicate'" in se, f"unknown command exit {rc}", so, se)
    rc, so, se = tool("report")
    expect(rc == 2, "missing argument exit 2", so, se)
    rc, so, se = tool("help")
    expect(rc == 0 and "run" in so and "timeline" in so, "kvgrid help", so, se)
    rc, so, se = tool("help", "report")
    expect(rc == 0 and "--json" in so, "kvgrid help report", so, se)
    # `--set k=v EXPERIMENT`: the experiment is not swallowed as a second pair.
    rc, so, se = tool("run", "--set", "cache.page_size=32", TREE, "--world-size")
    expect(rc == 0 and so.strip() == "8", "--set before the experiment", so, se)


def quickstart_serve_ok():
    rc, so, se = run(8, QUICK, "--out", out("q"))
    expect(rc == 0, f"quickstart exit {rc}", so, se)
    expect_recorded_digest(out("q"), "quickstart")
    # A compact header (the full configuration only with -v), rows with done% and ETA; -q: none.
    header = [l for l in so.splitlines() if l.startswith("#") and "step  finished" not in l]
    expect(len([l for l in header if not l.startswith("# ") or "effective configuration" in l]) == 0
           and "full configuration: -v" in so, "compact header", so)
    rows = [l.split() for l in so.splitlines() if re.match(r"^ +\d+ +\d+/", l)]
    expect(rows and rows[-1][11] == "100.0" and rows[-1][12] == "0.0" and rows[-1][8] == "0", "the last row: 100% done, no time left", rows)
    rc, so2, se = run(8, QUICK, "--out", out("q-v"), "-v", "--set", "workload.gsp.groups=2")
    expect(rc == 0 and "# effective configuration:" in so2 and "#   [cache]" in so2, "-v prints the configuration", so2)
    rc, so3, se = run(8, QUICK, "--out", out("q-q"), "-q", "--set", "workload.gsp.groups=2")
    expect(rc == 0 and not re.search(r"^ +\d+ +\d+/", so3, re.M) and "# verdict: OK" in so3, "-q: no rows", so3)
    for line in ["# seed 1", "# topology TP2xCP2xPP2, world 8 ranks", "# oracle mismatches: 0 OK",
                 "# rank divergences: 0 OK", "# verify failures: 0 OK", "# verdict: OK",
                 "# requests 256 finished of 256"]:
        expect(line in so, f"missing line {line!r}", so)
    rc, so, _ = tool("check", out("q"))
    expect(rc == 0 and "rank divergences: 0 OK" in so, "offline check", so)


def shape_mismatch():
    rc, so, se = run(8, QUICK, "--out", out("s"), "--set", "debug.shrink_stage=1", "--set", "debug.shrink_device_pages=100")
    expect(rc == 1, f"a shrunk stage must fail the run, exit {rc}", so, se)
    m = re.search(r"shape mismatch at step \d+ on stage 1: request \d+: stage 0 sent (\d+) tokens(?: \[\d+, \d+\))?, "
                  r"this stage scheduled (\d+)(?: \[\d+, \d+\))?", se)
    expect(m and m.group(1) != m.group(2), "names the request and both counts", se)
    rc, so, _ = tool("report", out("s"))
    expect(rc == 0 and "incomplete" in so, "the aborted run's trace is readable", so)


def corrupt_page_detected():
    for payload in ("full", "digest"):
        args = ["--set", f"engine.payload={payload}", "--set", "faults.device.page.corrupt.probability=0.05"]
        rc, so, se = run(4, QUICK, "--out", out("c" + payload), "--set", "topology.pp=1", *args)
        expect(rc == 1 and "# verdict: FAILED" in so, f"{payload}: FAILED verdict", so, se)
        m = re.search(r"# oracle mismatches: (\d+) FAILED", so)
        expect(m and int(m.group(1)) > 0, f"{payload}: mismatches counted", so)
        rows = [l.split() for l in so.splitlines() if re.match(r"^ +\d+ +\d+/", l)]
        wrong = [int(r[8]) for r in rows]
        expect(wrong == sorted(wrong) and wrong[-1] == int(m.group(1)), f"{payload}: the rows' wrong column counts them", rows)
        printed = re.findall(r"oracle mismatch at step", se)
        expect(0 < len(printed) <= 5 * 4, f"{payload}: at most five lines per rank on stderr", len(printed))
        expect("# rank divergences: 0 OK" in so, f"{payload}: decisions still agree", so)
        rc, so, se = run(4, QUICK, "--out", out("x" + payload), "--set", "topology.pp=1", "--strict", *args)
        expect(rc == 1 and "oracle mismatch with --strict" in se, f"{payload}: --strict stops the run", so, se)


def mooncake_smoke():
    rc, so, se = run(8, MOONCAKE, "--out", out("m"), "--set", "workload.mooncake.first_n=40",
                     "--set", "output.report_every=500")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# requests 40 finished of 40" in so, "replay", so, se)
    bad = write("bad.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\nnot json\n')
    rc, so, se = run(8, MOONCAKE, "--out", out("mb"), "--set", f"workload.mooncake.trace={bad}")
    expect(rc == 2 and re.search(r"bad\.jsonl:2: malformed JSON", se), "malformed line named, exit 2", so, se)
    expect(not os.path.exists(out("mb/run.h5")), "no trace for a bad trace file")


def workload_export():
    """kvgrid workload --export: the requests as Mooncake JSONL. The Mooncake replay's first 40
    lines come back with the same timestamps, lengths and block sharing (hash ids equal up to a
    renaming); exporting the export gives the same file; a closed-loop workload's follow-ups move
    with --service-ms; bad input exits 2 and writes nothing."""
    trace = os.path.join(SRC, "experiments", "traces", "mooncake_synthetic_trace.jsonl")
    f1 = out("mc.jsonl")
    rc, so, se = tool("workload", MOONCAKE, "--set", "workload.mooncake.first_n=40", "--export", f1)
    expect(rc == 0 and re.search(r"# workload .*: 40 requests", so) and "wrote" in so, "export", so, se)
    mine = [json.loads(l) for l in open(f1)]
    with open(trace) as fh:
        orig = [json.loads(l) for l, _ in zip(fh, range(40))]
    rename = {}
    for a, b in zip(orig, mine):
        expect(abs(a["timestamp"] - b["timestamp"]) < 1e-5 and a["input_length"] == b["input_length"] and
               max(a["output_length"], 1) == b["output_length"] and len(a["hash_ids"]) == len(b["hash_ids"]),
               "timestamps and lengths kept", a["timestamp"], b["timestamp"])
        for x, y in zip(a["hash_ids"], b["hash_ids"]):
            expect(rename.setdefault(x, y) == y, "a block id maps to one id", x, y)
    expect(len(set(rename.values())) == len(rename), "and back (a bijection)", len(rename))
    f2 = out("mc2.jsonl")
    rc, so, se = tool("workload", MOONCAKE, "--set", f"workload.mooncake.trace={f1}", "--export", f2)
    expect(rc == 0 and open(f1).read() == open(f2).read(), "the export of the export is the export", so, se)
    # A closed loop (gsp turns): block ids number in order of first appearance; follow-ups move with --service-ms.
    gsp = ["--set", "workload.gsp.groups=3", "--set", "workload.gsp.turns=2"]
    times = []
    for ms in ("1000", "5000"):
        f = out(f"gsp-{ms}.jsonl")
        rc, so, se = tool("workload", QUICK, *gsp, "--service-ms", ms, "--export", f)
        expect(rc == 0 and "closed loop" in so, "gsp export", so, se)
        lines = [json.loads(l) for l in open(f)]
        seen = -1
        for l in lines:
            expect(len(l["hash_ids"]) == -(-l["input_length"] // 512), "a block per 512 tokens", l["input_length"])
            for h in l["hash_ids"]:
                expect(h <= seen + 1, "ids in order of first appearance", h, seen)
                seen = max(seen, h)
        times.append(max(l["timestamp"] for l in lines))
    expect(times[1] - times[0] >= 4000 - 1e-6, "second turns 4 s later with --service-ms 5000", times)
    for args, msg in ((["workload", TREE, "--export", out("t.jsonl")], "has no requests to export"),
                      (["workload", QUICK, "--export", os.path.join(out("no-dir"), "x.jsonl")], "cannot write"),
                      (["workload", QUICK, "--service-ms", "-1"], "--service-ms must be"),
                      (["workload", QUICK, "--set", "cache.nope=1"], "cache.nope")):
        rc, so, se = tool(*args)
        expect(rc == 2 and msg in se, f"{args[1:]}: exit 2, named", so, se)
    expect(not os.path.exists(out("t.jsonl")), "nothing written for bad input")


def config_docs_current():
    """docs/configuration.md's key reference is what the binary's schema says (jobs/config_docs.py),
    and the check names the line where a page differs."""
    script = os.path.join(SRC, "jobs", "config_docs.py")
    env = dict(os.environ, KVGRID_BIN=BIN)
    p = subprocess.run([script, "--check"], capture_output=True, text=True, env=env, timeout=60)
    expect(p.returncode == 0 and "is current" in p.stdout, "the page is current (run jobs/config_docs.py)", p.stdout, p.stderr)
    page = open(os.path.join(SRC, "docs", "configuration.md")).read()
    stale = write("configuration.md", page.replace("| `cache.page_size` | integer in [1, 65536] | `16` |",
                                                   "| `cache.page_size` | integer in [1, 65536] | `32` |"))
    p = subprocess.run([script, "--check", "--page", stale], capture_output=True, text=True, env=env, timeout=60)
    expect(p.returncode == 1 and re.search(r"configuration\.md:\d+: differs", p.stderr) and "`32`" in p.stderr,
           "a drifted page is named with its line", p.stdout, p.stderr)


def jobs_and_plot():
    env = dict(ENV, PATH=os.path.dirname(MPIEXEC) + ":" + os.environ.get("PATH", ""))
    p = subprocess.run([os.path.join(SRC, "jobs", "run.sh"), QUICK, "--", "--out", out("r"), "--set",
                        "workload.gsp.groups=4"], capture_output=True, text=True, env=env, timeout=240)
    expect(p.returncode == 0 and "# verdict: OK" in p.stdout, "jobs/run.sh picks -np from the topology", p.stdout, p.stderr)
    rc, so, se = tool("run", QUICK, "--world-size", "--set", "topology.pp=3", "--set", "model.layers=6")
    expect(rc == 0 and so.strip() == "12", "--world-size", so, se)
    png = out("fig.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "hit_ttft.py"), out("r"), png],
                       capture_output=True, text=True, timeout=120)
    expect(p.returncode == 0 and os.path.getsize(png) > 10000, "plot written from HDF5 only", p.stdout, p.stderr)
    with open(png, "rb") as f:
        expect(f.read(8) == b"\x89PNG\r\n\x1a\n", "a PNG file")
    p = subprocess.run([os.path.join(SRC, "jobs", "figure.sh"), "--list"], capture_output=True, text=True)
    expect(p.returncode == 0 and "hit-ttft" in p.stdout, "figure list", p.stdout, p.stderr)


def host_tier_keeps_history():
    small = ["--set", "workload.multiturn.clients=16", "--set", "workload.multiturn.rounds=4", "--set", "cache.device_pages=128",
             "--set", "cache.storage=none", "--set", "workload.multiturn.round_barrier=false",
             "--set", "workload.multiturn.sub_question_length=128"]
    late = {}
    for name, host in (("device", "0"), ("host", "8192")):
        rc, so, se = run(4, TIERS, "--out", out("tier-" + name), "--set", f"cache.host_pages={host}", *small)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, f"{name} run", so, se)
        rc, so, se = tool("report", out("tier-" + name), "--json")
        j = json.loads(so)
        late[name] = j["rounds"][-1]["hit_rate"]
        if name == "host":
            expect(j["hit_rate"]["host"] > 0.05 and j["transferred_tokens"]["h2d"] > 0 and j["transferred_tokens"]["d2h"] > 0,
                   "history comes back from the host", so)
    expect(late["device"] < 0.3 and late["host"] > 0.7, f"late-round hit rate: device only {late['device']:.2f}, "
           f"with host {late['host']:.2f}")
    # Real copies on worker threads (completions in real time, different on every rank): still agreed.
    rc, so, se = run(4, TIERS, "--out", out("tier-threaded"), *small, "--set", "engine.transfer=threaded")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, "threaded engine", so, se)
    # SGLang #26921 + #28429: a host allocation fails on one rank; with skip_when_empty its ACK queue
    # is empty while its peers' is not, they enter the collective alone and the watchdog reports it.
    rc, so, se = run(4, TIERS, "--out", out("tier-hang"), *small, "--set", "protocol.tp_sync=skip_when_empty",
                     "--set", "engine.deadline_s=2", "--set", "faults.host.alloc.fail.probability=1",
                     "--set", "faults.host.alloc.fail.ranks=[1]", timeout=120)
    expect(rc == 1 and re.search(r"watchdog: rank [023] waited [0-9.]+ s \(deadline 2 s\) for tp_sync all-reduce", se),
           "the hang becomes a watchdog report", so, se)
    # The host and storage tiers across stages: the combination sweep's smoke (cli_combinations, tiers + PP).


def tiers_shape():
    """The tiers experiment at small scale, three ways: device-only loses its hit rate first, the host
    tier delays the drop, storage keeps the late-round hit rate above 90% — and the figure is drawn
    from the three HDF5 traces."""
    small = ["--set", "workload.multiturn.clients=8", "--set", "workload.multiturn.rounds=5",
             "--set", "workload.multiturn.request_length=256", "--set", "workload.multiturn.sub_question_length=16",
             "--set", "workload.multiturn.output_length=16", "--set", "workload.multiturn.max_in_flight=4",
             "--set", "engine.max_running=4", "--set", "cache.device_pages=64", "--set", "cache.host_pages=168"]
    variants = {"device": ["--set", "cache.storage=none", "--set", "cache.host_pages=0"],
                "host": ["--set", "cache.storage=none"], "storage": []}
    hit, tier = {}, {}
    for name, sets in variants.items():
        rc, so, se = run(4, TIERS, "--out", out("shape-" + name), *small, *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, f"{name} run", so, se)
        rc, so, se = tool("report", out("shape-" + name), "--json")
        j = json.loads(so)
        hit[name] = [r["hit_rate"] for r in j["rounds"]]
        tier[name] = j["rounds"][-1]["hit_rate_by_tier"]
        if name == "storage":
            expect(j["transferred_tokens"]["storage_read"] > 0 and j["transferred_tokens"]["storage_write"] > 0
                   and j["hit_rate"]["storage"] > 0, "storage read and written", so)
            expect(all(j["transferred_bytes"][k] > 0 for k in ("d2h", "h2d", "storage_read", "storage_write"))
                   and j["transfer_time_model_ms"]["storage_read"] > 0 and j["transfer_time_model_ms"]["h2d"] > 0,
                   "bytes and modelled transfer time per direction", so)
            expect(os.path.isdir(out("shape-storage/storage")), "storage objects inside the run directory")
            # Backups' writes land at their modelled ticks (storage_writer.hpp): one storage_write
            # event per batch, from its start on the write queue to its end, carrying every byte written.
            with h5py.File(out("shape-storage/run.h5"), "r") as f:
                ws = [f["ranks"][r]["events"][:] for r in f["ranks"]]
                ws = [e[e["op"] == b"storage_write"] for e in ws]
                written = int(sum(f["summary/ranks"]["storage_write_bytes"]))
            expect(all(len(e) > 0 for e in ws) and all((e["args"][:, 1] > e["args"][:, 0]).all() for e in ws),
                   "storage_write events with modelled start < end on every rank")
            expect(sum(int(e["args"][:, 2].sum()) for e in ws) == written, "the write events carry the bytes written",
                   written)
    summary = " | ".join(f"{n}: " + " ".join(f"{h:.2f}" for h in v) for n, v in hit.items())
    print("per-round hit rate:", summary)
    expect(max(hit["device"][1:]) < 0.1, "device only: history lost from round 1 on", summary)
    expect(hit["host"][1] > 0.8 and hit["host"][-1] < 0.6, "host: keeps round 1, drops by the last round", summary)
    expect(hit["storage"][-1] > 0.9 and tier["storage"]["storage"] > 0.2, "storage: late rounds above 90%", summary, tier)
    png = out("shape.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "tiers.py"), png,
                        *(f"{n}={out('shape-' + n)}" for n in variants)], capture_output=True, text=True)
    expect(p.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "figure from HDF5", p.stdout, p.stderr)
    # Real copies and storage reads on threads (completions in real time, different per rank): still agreed.
    rc, so, se = run(4, TIERS, "--out", out("shape-threaded"), *small, "--set", "engine.transfer=threaded")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, "threaded storage", so, se)
    # A storage directory set explicitly outlives its run: the same conversations, replayed, find
    # their first round in storage.
    store = out("shared-store")
    for i in (1, 2):
        rc, so, se = run(4, TIERS, "--out", out(f"reuse-{i}"), *small, "--set", "workload.multiturn.rounds=2",
                         "--set", f"cache.storage_dir={store}")
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so, f"reuse run {i}", so, se)
        j = json.loads(tool("report", out(f"reuse-{i}"), "--json")[1])
        first = j["rounds"][0]["hit_rate_by_tier"]["storage"]
        expect((first == 0) if i == 1 else (first > 0.8), f"run {i}: round 0 storage hit {first:.2f}", j["rounds"])
    expect(not os.path.exists(out("reuse-1/storage")), "an explicit directory replaces <run dir>/storage")
    # A storage tier needs the host tier: a start-up error naming both keys, nothing written.
    rc, so, se = run(4, TIERS, "--out", out("shape-nohost"), "--set", "cache.host_pages=0")
    expect(rc == 2 and "cache.storage" in se and "cache.host_pages" in se, "storage without host tier", so, se)
    expect(not os.path.exists(out("shape-nohost/run.h5")), "no trace")


def cp_sharding_shape():
    """Figure 1d at small scale (MLA, TP2xCP2, a multi-turn history that outgrows the replicated
    device tier): sharding raises the device hit rate and cuts host-served tokens while the
    combined rate stays, both runs oracle OK, the figure drawn from the two HDF5 traces; the
    buggy any_owner_restore fails the run through the oracle; the Mooncake experiment itself runs."""
    small = ["--set", "model.attention=mla", "--set", "cache.storage=none", "--set", "workload.multiturn.clients=16",
             "--set", "workload.multiturn.rounds=5", "--set", "cache.device_pages=512", "--set", "cache.gather_pages=256",
             "--set", "engine.payload=digest", "--set", "cost.kv_bytes=full"]
    variants = {"replicated": ["--set", "cache.host_pages=4096"],
                "sharded": ["--set", "cache.cp_sharding=sharded", "--set", "cache.host_pages=2048"]}
    j = {}
    for name, sets in variants.items():
        rc, so, se = run(4, TIERS, "--out", out("cps-" + name), *small, *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, f"{name} run", so, se)
        j[name] = json.loads(tool("report", out("cps-" + name), "--json")[1])
    rep, sh = j["replicated"], j["sharded"]
    print("device/host hit: replicated", rep["hit_rate"], "sharded", sh["hit_rate"])
    expect(sh["hit_rate"]["device"] > rep["hit_rate"]["device"] + 0.2, "sharding raises the device hit rate", rep, sh)
    expect(sh["transferred_tokens"]["h2d"] < 0.5 * rep["transferred_tokens"]["h2d"], "fewer tokens from the host", rep, sh)
    expect(abs(sh["hit_rate"]["total"] - rep["hit_rate"]["total"]) < 0.03, "combined hit rate about the same", rep, sh)
    expect(sh["gather"]["bytes"] > 0 and rep["gather"]["bytes"] == 0, "only the sharded run gathers", rep["gather"], sh["gather"])
    expect(sh["device_pages_per_rank"]["pool"] < rep["device_pages_per_rank"]["pool"], "gather slots charged", sh)
    png = out("cps.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "cp_sharding.py"), png,
                        *(f"{n}={out('cps-' + n)}" for n in variants)], capture_output=True, text=True)
    expect(p.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "device hit +" in p.stdout,
           "figure from HDF5", p.stdout, p.stderr)
    rc, so, se = tool("timeline", out("cps-sharded"))
    gathers = [e for e in json.loads(so)["traceEvents"] if e["ph"] == "X" and e["name"] == "gather"]
    expect(rc == 0 and gathers and all(e["tid"] == 7 and e["dur"] > 0 and e["args"]["bytes"] > 0 for e in gathers),
           "gathers as slices on the timeline", gathers[:3], se)
    # A slice spans the layers' gathers, each latency + bytes at the full payload's size / bandwidth
    # (8 layers, page 16 x head_dim 16 per digest word, 10 us, 200 GB/s; whole ns per layer); restores
    # can only stretch it.
    excess = [e["dur"] - 8 * (10 + e["args"]["bytes"] * 16 * 16 / 200 / 1e3) for e in gathers]
    expect(abs(min(excess)) < 1e-2, "gather slices start at layer 0's gather", min(excess), gathers[:3])
    # Restoring onto any free page: the ranks agree on every decision, only the KV is wrong.
    rc, so, se = run(4, TIERS, "--out", out("cps-any"), "--set", "cache.storage=none", "--set", "cache.cp_sharding=any_owner_restore",
                     "--set", "cache.gather_pages=256")
    expect(rc == 1 and re.search(r"# oracle mismatches: [1-9]\d* FAILED", so) and "# rank divergences: 0 OK" in so,
           "any_owner_restore caught by the oracle", so, se)
    # Across stages with storage and aborts (TP2xCP2xPP2): a prefetch planned at the end of a step
    # kept its anchor node while an earlier launch's host allocation evicted host-only leaves.
    rc, so, se = run(8, os.path.join(SRC, "experiments", "pp_sync.toml"), "--out", out("cps-pp"), "--seed", "1",
                     "--set", "topology.cp=2", "--set", "cache.cp_sharding=sharded", "--set", "cache.gather_pages=24",
                     "--set", "cache.device_pages=160", "--set", "faults.request.abort.probability=0.02")
    expect(rc == 0 and "# verdict: OK" in so, "sharded across stages with storage and aborts", so, se)
    # The figure's own experiment (Mooncake trace, digest) at CP 2 on its first requests.
    rc, so, se = run(4, CPSHARD, "--out", out("cps-mooncake"), "--set", "topology.cp=2", "--set", "workload.mooncake.first_n=150",
                     "--set", "cache.cp_sharding=sharded", "--set", "cache.host_pages=131072")
    expect(rc == 0 and "# verdict: OK" in so and "CP pages sharded" in so, "cp_sharding.toml runs sharded", so, se)


def spec_draft_shape():
    """Figure 3 (experiments/spec_draft.toml, TP2xPP2, a multi-turn history restored from host and
    storage): packed and sidecar keep the HiCache-off run's acceptance round by round while hitting
    the cache; target_only hits the cache but its acceptance collapses on restored prefixes, with
    draft_mismatch events in its trace; the target's oracle is OK in all four; the figure is drawn
    from the four HDF5 traces; a packed draft shaped unlike the target is refused (exit 2)."""
    variants = {"off": ["--set", "cache.host_pages=0", "--set", "cache.storage=none"],
                "target_only": ["--set", "model.draft.mode=target_only"],
                "packed": ["--set", "model.draft.mode=packed"],
                "sidecar": ["--set", "model.draft.mode=sidecar"]}
    j = {}
    for name, sets in variants.items():
        rc, so, se = run(4, SPEC, "--out", out("spec-" + name), *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, f"{name} run", so, se)
        j[name] = json.loads(tool("report", out("spec-" + name), "--json")[1])
    off = j["off"]
    per_round = {n: [round(r["acceptance_length_mean"], 6) for r in v["rounds"]] for n, v in j.items()}
    print("acceptance length per round:", per_round)
    print("hit rate:", {n: v["hit_rate"] for n, v in j.items()})
    expect(2.2 < off["spec"]["acceptance_length_mean"] < 2.8 and off["hit_rate"]["total"] == 0,
           "HiCache off: no hits, acceptance near 1 + p + p^2 + p^3", off["spec"])
    for n in ("packed", "sidecar"):
        v = j[n]
        expect(per_round[n] == per_round["off"] and v["spec"]["accepted"] == off["spec"]["accepted"],
               f"{n} keeps the HiCache-off acceptance", per_round, v["spec"])
        expect(v["spec"]["draft_mismatch_steps"] == 0, f"{n}: the draft read the right KV", v["spec"])
        expect(v["hit_rate"]["total"] > 0.5 and v["hit_rate"]["host"] > 0.2 and v["hit_rate"]["storage"] > 0.03,
               f"{n} hits the host and storage tiers", v["hit_rate"])
    t = j["target_only"]
    expect(t["hit_rate"]["total"] > 0.5, "target_only hits the cache", t["hit_rate"])
    expect(all(x < 1.3 for x in per_round["target_only"][1:4]) and per_round["target_only"][0] == per_round["off"][0],
           "target_only's acceptance collapses once prefixes are restored (round 0 has none)", per_round)
    expect(t["spec"]["draft_mismatch_steps"] > 0, "target_only counts draft checksum mismatches", t["spec"])
    with h5py.File(out("spec-target_only/run.h5"), "r") as f:
        ops = f["ranks/00002/events"]["op"]  # the last stage's leader
        expect((ops == b"draft_mismatch").sum() == t["spec"]["draft_mismatch_steps"] and (ops == b"draft_round").sum() > 0,
               "draft checksum mismatches in the trace", (ops == b"draft_mismatch").sum())
    png = out("spec.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "spec_draft.py"), png,
                        *(f"{n}={out('spec-' + n)}" for n in variants)], capture_output=True, text=True)
    expect(p.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "oracle OK" in p.stdout,
           "figure from HDF5", p.stdout, p.stderr)
    rc, so, se = run(4, SPEC, "--out", out("spec-bad"), "--set", "model.draft.head_dim=8")
    expect(rc == 2 and "model.draft.mode = \"packed\" needs the draft's KV rows shaped like the target's" in se
           and not os.path.exists(out("spec-bad/run.h5")), "an incompatible packed draft is refused", so, se)


def request_abort():
    """request.abort at TP2xCP2xPP2: every stage releases the same requests at the same step; they
    count as failed in the summary and the report, never as finished or cached."""
    rc, so, se = run(8, QUICK, "--out", out("abort"), "--set", "faults.request.abort.probability=0.05")
    expect(rc == 0 and "# verdict: OK" in so and re.search(r"# requests \d+ finished, \d+ failed \(aborted\) of 256", so),
           "aborts at every stage, verdict OK", so, se)
    j = json.loads(tool("report", out("abort"), "--json")[1])
    expect(j["failed"] > 0 and j["finished"] + j["failed"] == j["requests"] == 256
           and j["faults"].get("request.abort", 0) >= j["failed"], "report counts the aborted requests", j)
    with h5py.File(out("abort/run.h5"), "r") as f:
        expect(int(f["summary"].attrs["failed"]) == j["failed"], "summary attribute failed")


def sweep_env():
    return dict(ENV, PATH=os.path.dirname(MPIEXEC) + ":" + os.environ.get("PATH", ""))


def sweep_rows(experiment, seeds, axis, name):
    """Runs jobs/sweep.sh over one --set axis into out(name) and returns its sweep.csv rows."""
    p = subprocess.run([os.path.join(SRC, "jobs", "sweep.sh"), experiment, "--seeds", seeds, "--set", axis,
                        "--out", out(name)], capture_output=True, text=True, env=sweep_env(), timeout=280, cwd=SRC)
    expect(p.returncode == 0, f"sweep {axis} ran", p.stdout, p.stderr)
    with open(out(name + "/sweep.csv")) as f:
        return list(csv.DictReader(f))


def pp_sync_sweep():
    """protocol.pp_sync at TP2xPP2 with the host tier: a sweep of both variants; pp_sync never
    diverges, independent_polling does in most seeds (shape mismatch); a failing run prints its seed
    and a command that reproduces it, and the rerun has the same first divergence."""
    env = sweep_env()
    pp = os.path.join(SRC, "experiments", "pp_sync.toml")
    rows = sweep_rows(pp, "1-3", "protocol.pp_sync=pp_sync,independent_polling", "ppsweep")
    good = [r for r in rows if "=pp_sync" in r["variant"]]
    bad = [r for r in rows if "independent_polling" in r["variant"]]
    expect(len(good) == 3 and all(r["exit"] == "0" and r["verdict"] == "OK" for r in good), "pp_sync never diverges", rows)
    failed = sum(1 for r in bad if r["exit"] != "0")
    expect(failed >= 2, f"independent_polling diverges in most seeds ({failed} of 3)", rows)
    # Storage prefetch decisions across stages: per_rank lets every stage stop on its own.
    rows = sweep_rows(pp, "1-3", "protocol.prefetch_consensus=pp_consensus,per_rank", "pcsweep")
    good = [r for r in rows if "pp_consensus" in r["variant"]]
    bad = [r for r in rows if "per_rank" in r["variant"]]
    expect(all(r["exit"] == "0" and r["verdict"] == "OK" for r in good), "pp_consensus never diverges", rows)
    failed = sum(1 for r in bad if r["exit"] != "0")
    expect(failed >= 2, f"prefetch per_rank diverges in most seeds ({failed} of 3)", rows)
    j = json.loads(tool("report", good[0]["run"] if os.path.isabs(good[0]["run"]) else os.path.join(SRC, good[0]["run"]),
                        "--json")[1])
    expect(j["hit_rate"]["storage"] > 0.05, "storage hits at PP 2", j["hit_rate"])
    # The failure names its seed and a command that reruns it; the rerun's first divergence is the same.
    rc, so, se = run(4, pp, "--out", out("pp-fail-1"), "--seed", "3", "--set", "protocol.pp_sync=independent_polling")
    m = re.search(r"# seed 3; reproduce: (mpirun -np 4 \S+ run \S+ --seed 3 --set 'protocol.pp_sync=independent_polling')", so + se)
    expect(rc == 1 and m, "failure prints the seed and the command", so, se)
    rc2, so2, se2 = run(4, pp, "--out", out("pp-fail-2"), "--seed", "3", "--set", "protocol.pp_sync=independent_polling")
    first = []
    for d in ("pp-fail-1", "pp-fail-2"):
        rc, so, se = tool("check", out(d))
        line = re.search(r"# Found rank divergence: .*", so)
        expect(rc == 1 and line, f"check finds the divergence in {d}", so, se)
        first.append(line.group(0))
    expect(first[0] == first[1], "the rerun diverges at the same first entry", first)
    # Real copies and storage reads on threads (completions in real time, different on every rank).
    rc, so, se = run(4, pp, "--out", out("pp-threaded"), "--set", "engine.transfer=threaded")
    expect(rc == 0 and "# verdict: OK" in so and "# not reproducible: engine.transfer = threaded (copies land in real time" in so,
           "pp_sync + prefetch_consensus with the threaded engine, marked not reproducible", so, se)
    expect("not reproducible" not in so2, "a simulated run is not marked", so2)
    # The Figure 2b/2c job at small scale: a sweep of both variants and its PNG from HDF5.
    p = subprocess.run([os.path.join(SRC, "jobs", "figure.sh"), "pp_sync"], capture_output=True, text=True,
                       env=dict(env, KVGRID_FIGURE_SEEDS="1", KVGRID_FIGURE_DIR=out("figures"), KVGRID_FIGURE_RUNS=out("figure-runs")),
                       timeout=280, cwd=SRC)
    expect(p.returncode == 0 and "independent_polling: 100% of runs diverged" in p.stdout
           and "pp_sync: 0% of runs diverged" in p.stdout, "figure.sh pp_sync", p.stdout, p.stderr)
    with open(out("figures/pp_sync.png"), "rb") as f:
        expect(f.read(8) == b"\x89PNG\r\n\x1a\n", "a PNG file")
    expect(len(glob.glob(out("figure-runs/pp_sync/sweep-*/sweep.h5"))) == 1, "the sweep under KVGRID_FIGURE_RUNS", p.stdout)


def online_consensus():
    """protocol.consensus_check: a planted divergence stops the run at the next check with the first
    unequal entry and its class; `kvgrid check` on the same run prints the same divergence. Also for
    a real protocol bug (independent_polling), caught before its shape mismatch, and for each class
    planted with equal log lengths (call order on a CP peer, arguments on a TP peer, results on a
    whole stage: found across stages)."""
    pp = os.path.join(SRC, "experiments", "pp_sync.toml")
    plant = ["--set", "debug.plant_divergence_step=20"]
    cases = [("planted", 8, QUICK, ["--set", "debug.plant_divergence_rank=5", *plant]),
             ("polling", 4, pp, ["--seed", "3", "--set", "protocol.pp_sync=independent_polling",
                                 "--set", "protocol.consensus_interval=2"]),
             # equal log lengths: only the digests tell (a CP peer, a TP peer, a whole stage)
             ("order", 8, QUICK, ["--set", "debug.plant_divergence_rank=6", "--set", "debug.plant_divergence_kind=order", *plant]),
             ("arguments", 8, QUICK, ["--set", "debug.plant_divergence_rank=5", "--set", "debug.plant_divergence_kind=arguments", *plant]),
             ("results", 8, QUICK, ["--set", "debug.plant_divergence_stage=1", "--set", "debug.plant_divergence_kind=results", *plant])]
    classes = {"order": "different call order", "arguments": "different arguments", "results": "same arguments, different results"}
    for name, np, exp, extra in cases:
        rc, so, se = run(np, exp, "--out", out("online-" + name), "--set", "protocol.consensus_check=on", *extra)
        found = re.findall(r"\] (Found rank divergence: .*)", so + se)
        expect(rc == 1 and len(found) == 1, f"{name}: one report, exit 1", so, se)
        if name in classes:
            expect(classes[name] in found[0] and "(step 20)" in found[0], f"{name}: the class and the planted step", found)
        expect("shape mismatch" not in so + se, f"{name}: stopped before any shape mismatch", so, se)
        rc, so2, se2 = tool("check", out("online-" + name))
        offline = re.findall(r"# (Found rank divergence: .*)", so2)
        expect(rc == 1 and offline == found, f"{name}: online and offline agree", found, offline, so2)
    rc, so, se = run(8, QUICK, "--out", out("online-planted-2"), "--set", "protocol.consensus_check=on",
                     "--set", "protocol.consensus_interval=16", *cases[0][3])
    expect(re.search(r"found a rank divergence at step 31\b", so + se), "the check after step 20 at interval 16 is step 31",
           so, se)


def timeline_export():
    """kvgrid timeline: Chrome/Perfetto trace events from the HDF5 trace — one process per rank with
    step slices holding their phases, prefill/decode batch slices, copies on their stream's thread,
    ACKs as instants, every step message a matched flow, counters; a request span per request;
    a step window, sampling, a wall-clock track set and -o FILE."""
    pp = os.path.join(SRC, "experiments", "pp_sync.toml")
    rc, so, se = run(4, pp, "--out", out("tl"), "--set", "workload.multiturn.rounds=2")
    expect(rc == 0, "run", so, se)
    rc, so, se = tool("timeline", out("tl"))
    expect(rc == 0, "timeline", se)
    ev = json.loads(so)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    expect(sorted(names) == [0, 1, 2, 3, 4] and names[2].startswith("rank 2 (pp 1") and names[4].startswith("requests"),
           "a process per rank and one for the requests", names)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    tid = {name: t for (p, t), name in threads.items() if p == 0}
    copies = [e for e in ev if e["ph"] == "X" and e["name"] in ("d2h", "h2d", "storage_read")]
    expect(copies and all(e["dur"] > 0 and e["tid"] in (tid["device->host copies"], tid["host->device copies"],
                                                         tid["storage reads"]) for e in copies), "copies as slices", copies[:3])
    expect(any(e["ph"] == "i" and e["name"] == "write_ack" for e in ev), "ACKs consumed as instants")
    starts = {e["id"] for e in ev if e["ph"] == "s"}
    ends = {e["id"] for e in ev if e["ph"] == "f"}
    expect(starts and starts == ends, "every stage-to-stage message a matched flow", len(starts), len(ends))
    # Step slices hold their phases: every phase slice lies inside its step's slice, on the steps thread.
    steps = [e for e in ev if e["ph"] == "X" and e["name"].startswith("step ") and e["pid"] < 4]
    expect(steps and all(e["tid"] == tid["steps"] for e in steps), "step slices", steps[:2])
    phase_names = {"faults", "receive", "cache_events", "schedule", "gather", "forward", "verify", "send", "complete", "report"}
    phases = [e for e in ev if e["ph"] == "X" and e["name"] in phase_names]
    expect({e["name"] for e in phases} >= {"forward", "receive"}, "forward and the later stages' receive waits", {e["name"] for e in phases})
    by_rank = {}
    for e in steps:
        by_rank.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    inside = all(any(b - 1e-3 <= p["ts"] and p["ts"] + p["dur"] <= end + 1e-3 for b, end in by_rank[p["pid"]]) for p in phases)
    expect(inside, "every phase inside a step")
    for kind in ("prefill", "decode"):
        k = [e for e in ev if e["ph"] == "X" and e["name"] == kind and e["tid"] == tid[kind]]
        expect(k and all(e["args"]["tokens"] > 0 for e in k), f"{kind} batch slices", k[:2])
    # Counters: device and host pages (this experiment has a host tier), queues.
    pages = [e for e in ev if e["ph"] == "C" and e["name"] == "pages in use"]
    expect(pages and all("device" in e["args"] and "host" in e["args"] for e in pages) and
           max(e["args"]["device"] for e in pages) > 0, "page counters", pages[:2])
    expect(any(e["ph"] == "C" and e["name"] == "requests" and e["args"]["running"] > 0 for e in ev), "queue counters")
    # A span per request, nested queued/prefill/decode, begin and end matched.
    h5 = h5py_requests(out("tl"))
    spans = [e for e in ev if e["ph"] == "b" and e["name"].startswith("request ")]
    expect(len(spans) == h5 and h5 > 0, "an async span per request", len(spans), h5)
    begins = collections.Counter((e["id"], e["name"]) for e in ev if e["ph"] == "b")
    finishes = collections.Counter((e["id"], e["name"]) for e in ev if e["ph"] == "e")
    expect(begins == finishes and {n for _, n in begins} >= {"queued", "prefill", "decode"}, "spans matched and nested")
    # A step window and sampling; the wall-clock track set.
    rc, so, se = tool("timeline", out("tl"), "--from", "10", "--to", "20", "--every", "2", "--wall")
    ev2 = json.loads(so)["traceEvents"]
    kept = {int(e["name"].split()[1]) for e in ev2 if e["ph"] == "X" and e["name"].startswith("step ") and e["pid"] < 4}
    expect(rc == 0 and kept and kept <= set(range(10, 21, 2)), "steps 10-20, every second", sorted(kept), se)
    expect(all(e["args"]["step"] in range(10, 21) for e in ev2 if e["ph"] == "i"), "instants in the window")
    walls = {e["pid"] for e in ev2 if e["ph"] == "X" and e["pid"] >= 100000}
    expect(walls == {100000, 100001, 100002, 100003}, "a wall-clock process per rank", walls)
    # -o FILE; a file that cannot be written is an input error and leaves nothing.
    target = out("tl.json")
    rc, so, se = tool("timeline", out("tl"), "-o", target)
    expect(rc == 0 and so == "" and json.load(open(target))["traceEvents"] == ev, "-o FILE holds the timeline", se)
    bad = os.path.join(out("no-such-dir"), "tl.json")
    rc, so, se = tool("timeline", out("tl"), "-o", bad)
    expect(rc == 2 and "cannot write" in se and not os.path.exists(bad), "an unwritable -o is an input error", se)
    rc, so, se = tool("timeline", out("tl"), "--from", "5", "--to", "2")
    expect(rc == 2 and "--from 5 is after --to 2" in se, "an empty window is an input error", se)
    rc, so, se = tool("timeline", out("does-not-exist"))
    expect(rc == 2 and "kvgrid timeline: error" in se, "a missing run is an input error", se)


def h5py_requests(run_dir):
    """The number of rows of the run's requests table (the rank /meta/requests_rank names)."""
    with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:
        rank = int(f["meta"].attrs["requests_rank"])
        return len(f[f"ranks/{rank:05d}/requests"])


def sweep_smoke():
    env = dict(ENV, PATH=os.path.dirname(MPIEXEC) + ":" + os.environ.get("PATH", ""))
    p = subprocess.run([os.path.join(SRC, "jobs", "sweep.sh"), TREE, "--seeds", "1-2", "--set",
                        "debug.plant_divergence_rank=-1,3", "--out", out("sw"), "--jobs", "2", "--",
                        "--set", "workload.tree.steps=40", "--set", "debug.plant_divergence_step=5"],
                       capture_output=True, text=True, env=env, timeout=240, cwd=SRC)
    expect(p.returncode == 0, "sweep ran", p.stdout, p.stderr)
    with open(out("sw/sweep.csv")) as f:
        rows = list(csv.DictReader(f))
    expect(len(rows) == 4, "2 variants x 2 seeds", rows)
    clean = [r for r in rows if r["variant"] == "debug.plant_divergence_rank=-1"]
    planted = [r for r in rows if r["variant"] == "debug.plant_divergence_rank=3"]
    expect(all(r["exit"] == "0" and r["verdict"] == "OK" for r in clean), "clean variant OK", rows)
    expect(all(r["exit"] == "1" and r["verdict"] == "FAILED" and int(r["divergences"]) > 0 for r in planted),
           "planted variant caught in every seed", rows)
    expect(all("rank 3" in r["first_divergence"] and "(step 5)" in r["first_divergence"] for r in planted)
           and all(r["first_divergence"] == "" for r in clean), "first divergence column", rows)
    with h5py.File(out("sw/sweep.h5"), "r") as f:
        expect(list(f["runs/exit"][:]) == [int(r["exit"]) for r in rows], "sweep.h5 holds the same table")
    # --slurm-script writes an array script (one task per run) and its run table instead of running: golden text.
    p = subprocess.run([os.path.join(SRC, "jobs", "sweep.sh"), "experiments/pp_sync.toml", "--seeds", "1-2", "--set",
                        "protocol.pp_sync=pp_sync,independent_polling", "--out", out("sl"), "--slurm-script", "--",
                        "--set", "engine.payload=full"], capture_output=True, text=True, env=env, timeout=60, cwd=SRC)
    expect(p.returncode == 0 and not os.path.exists(out("sl/run-0000")), "slurm script written, nothing run", p.stdout, p.stderr)
    for name in ("sweep.sbatch", "runs.txt"):
        with open(os.path.join(SRC, "tests", "cli", "golden", name)) as f:
            want = f.read().replace("@OUT@", out("sl"))
        with open(out("sl/" + name)) as f:
            got = f.read()
        expect(got == want, f"{name} matches tests/cli/golden/{name}", got, want)


def hybrid_runs():
    """experiments/hybrid.toml (full + swa + mamba layers through the unified tree core) at 1 and
    2 ranks, in both payloads: oracle OK, ranks agree, SWA tombstones made and healed, MAMBA
    states copied and saved; the same workload with full attention only (no sidecars: RadixTree)
    reuses at least as much (the hybrid reuse rule is stricter: here no pool is tight enough to
    delay an admission and the device pool never evicts, so every hybrid boundary is one full
    attention has too); hybrid settings the device tier cannot serve are refused."""
    j, console = {}, {}
    text = open(HYBRID).read()
    plain = write("hybrid-plain.toml", text[:text.index("[[model.sidecar]]")] + text[text.index("[cache]"):])
    for name, np_, path, sets in (("tp1", 1, HYBRID, ["--set", "engine.debug_checks=true"]),
                                  ("tp2", 2, HYBRID, ["--set", "topology.tp=2", "--set", "engine.payload=full"]),
                                  ("full_only", 1, plain, ["--set", "model.layer_types=full"])):
        rc, so, se = (run_single if np_ == 1 else lambda *a: run(np_, *a))(path, "--out", out("hybrid-" + name), *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
               and "# verify failures: 0 OK" in so, f"hybrid {name} run", so, se)
        j[name] = json.loads(tool("report", out("hybrid-" + name), "--json")[1])
        console[name] = so
    for name in ("tp1", "tp2"):
        h = j[name]["hybrid"]
        print(name, "hit rate", j[name]["hit_rate"]["device"], h)
        expect(h["swa_tombstones_made"] > 0 and h["swa_tombstones_healed"] > 0, f"{name}: tombstones made and healed", h)
        expect(h["mamba_states_copied"] > 0 and h["mamba_states_saved"] > 0 and h["swa_freed_pages"] > 0,
               f"{name}: states copied and saved, SWA pages freed behind the window", h)
        expect(j[name]["hit_rate"]["device"] > 0.3, f"{name} reuses prefixes", j[name]["hit_rate"])
        expect(h["swa_cost_tokens"] > 0 and h["full_alone_tokens"] > j[name]["cached_tokens"]["device"],
               f"{name}: the SWA rule cost reuse", h, j[name]["cached_tokens"])
    expect("hybrid" not in j["full_only"], "a full-attention run (RadixTree) has no hybrid block", j["full_only"].keys())
    expect(j["full_only"]["hit_rate"]["device"] >= j["tp1"]["hit_rate"]["device"],
           "full attention alone reuses at least what the hybrid model may", j["full_only"]["hit_rate"], j["tp1"]["hit_rate"])
    print("full attention alone: hit rate", j["full_only"]["hit_rate"]["device"])
    # What the hybrid run says FULL alone would have reused is what the full-attention run reused
    # (same admissions, no FULL eviction in either): the rule-cost figure is measured, not guessed.
    expect(j["tp1"]["hybrid"]["full_alone_tokens"] == j["full_only"]["cached_tokens"]["device"],
           "FULL alone in the hybrid run = the full-attention run's reuse", j["tp1"]["hybrid"], j["full_only"]["cached_tokens"])
    rc, so, se = run_single(HYBRID, "--out", out("hybrid-tp1-again"))
    digests = [re.search(r"# decision log: .* digest (0x[0-9a-f]+)", t) for t in (console["tp1"], so)]
    expect(rc == 0 and all(digests) and digests[0].group(1) == digests[1].group(1),
           "the same seed gives the same decisions (with or without debug checks)", console["tp1"], so, se)
    bad = [(["--set", "model.layer_types=full,bogus"], r'"bogus" is not a layer type \(full, swa, mamba\)'),
           (["--set", "model.swa_window=0"], r"has swa layers: set model\.swa_window"),
           (["--set", "model.layer_types=swa,mamba"], r"has no full layer"),
           (["--set", "model.mamba_chunk=24"], r"model\.mamba_chunk = 24 is not a multiple of cache\.page_size = 16"),
           (["--set", "topology.pp=2", "--set", "model.layer_types=full,swa,mamba,swa,swa,mamba"],
            r"leaves stage 1 \(layers 3\.\.5\) without a full layer"),
           (["--set", "topology.cp=2", "--set", "cache.cp_sharding=sharded"], r'cache\.cp_sharding = "sharded" \(CP replicated only\)'),
           (["--set", "cache.mamba_slots=2"], r"cache\.mamba_slots = 2: .* give at least 3"),
           (["--set", "model.layer_types=full,mamba"], r'\[\[model\.sidecar\]\] #2 \("compressor"\): source = "swa" but'),
           (["--set", "model.sidecar.words=3"], r"'model\.sidecar' is an array of tables \(\[\[model\.sidecar\]\]\): set it in the experiment file")]
    dup = write("hybrid-dup.toml", text.replace('name = "compressor"', 'name = "indexer"'))
    typo = write("hybrid-typo.toml", text.replace('words = 1\n', 'wrods = 1\n'))
    for path, pattern in ((dup, r'#2 \("indexer"\): the name is taken by sidecar #1'),
                          (typo, r"hybrid-typo\.toml:\d+:\d+: unknown key 'wrods' in \[\[model\.sidecar\]\]; did you mean 'model\.sidecar\.words'")):
        bad.append(([], pattern, path))
    rc, so, se = run_single(HYBRID, "--out", out("hybrid-alloc-fail"), "--set", "faults.device.alloc.fail.probability=0.3")
    fired = json.loads(tool("report", out("hybrid-alloc-fail"), "--json")[1])["faults"].get("device.alloc.fail", 0)
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "32 finished of 32" in so and fired > 0,
           "device.alloc.fail: refused admissions wait and run later", so, se, fired)
    rc, so, se = run_single(HYBRID, "--out", out("hybrid-small-swa"), "--set", "cache.swa_pages=8")
    expect(rc != 0 and "its SWA footprint of 16 pages" in so + se and "exceed cache.swa_pages = 8" in so + se,
           "an SWA pool that can never hold one request fails the run naming the key", rc, so, se)
    for sets, pattern, *path in bad:
        target = out("hybrid-bad")
        rc, so, se = run_single(path[0] if path else HYBRID, "--out", target, *sets)
        expect(rc == 2 and re.search(pattern, se) and not os.path.exists(os.path.join(target, "run.h5")),
               f"{sets}: exit 2 naming the problem", rc, so, se)


def hybrid_grids():
    """Hybrid models on other grids: PP2 whose stages hold different layer kinds (stage 0 full +
    SWA, stage 1 full + MAMBA), TP2xPP2 and CP2 (replicated): oracle OK and every rank agrees with
    protocol.component_boundary = whole_model; local_components (each stage's tree keeps only its
    own layers' components) is caught at PP2 by a shape mismatch: with states only every 128
    tokens the MAMBA-only stage reuses shorter prefixes than the SWA-only one (the same setting is
    clean with whole_model). TP2xPP2 puts the stages the other way round, so the SWA sidecar lives
    on stage 1."""
    split = ["--set", "model.layer_types=full,swa,swa,full,mamba,mamba", "--set", "model.mamba_chunk=128"]
    flipped = ["--set", "model.layer_types=full,mamba,mamba,full,swa,swa"]
    for name, np_, sets in (("pp2", 2, ["--set", "topology.pp=2", *split, "--set", "engine.debug_checks=true"]),
                            ("tp2pp2", 4, ["--set", "topology.tp=2", "--set", "topology.pp=2", *flipped]),
                            ("cp2", 2, ["--set", "topology.cp=2", "--set", "engine.payload=full"])):
        rc, so, se = run(np_, HYBRID, "--out", out("hybrid-" + name), *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
               and "# verify failures: 0 OK" in so, f"hybrid {name}", so, se)
        h = json.loads(tool("report", out("hybrid-" + name), "--json")[1])
        expect(h["hit_rate"]["device"] > 0.3 and h["hybrid"]["swa_tombstones_made"] > 0, f"{name} reuses, SWA tombstones", h["hit_rate"], h["hybrid"])
    caught = 0
    for seed in (1, 2, 3):
        rc, so, se = run(2, HYBRID, "--out", out(f"hybrid-local-{seed}"), "--seed", str(seed), "--set", "topology.pp=2", *split,
                         "--set", "protocol.component_boundary=local_components")
        hit = rc == 1 and bool(re.search(r"shape mismatch at step \d+ on stage 1: request \d+: stage 0 sent \d+ tokens \[(\d+), \d+\), "
                                    r"this stage scheduled \d+ \[(\d+), \d+\)", so + se))
        print("local_components seed", seed, "rc", rc, "caught" if hit else "not caught")
        caught += hit
    expect(caught >= 2, f"local_components caught in {caught} of 3 seeds")


def component_bugs():
    """The component bug record (bug-catalogue #14-#23, #21 twice): every planted bug of cache.component_bugs
    caught at seed 1 in its scenario and the correct code clean in the same scenario
    (jobs/component_bugs.py --check; the job's longer seed loops give docs/hybrid.md's table).
    Bad input: an unknown bug is refused naming the key and the choices."""
    p = subprocess.run([os.path.join(SRC, "jobs", "component_bugs.py"), "--check", "--seeds", "1"], capture_output=True,
                       text=True, env=dict(ENV, KVGRID_BIN=BIN), timeout=240)
    print(p.stdout)
    expect(p.returncode == 0 and "# 11 of 11 bugs caught in every seed, the correct code clean" in p.stdout,
           "every component bug caught, the correct code clean", p.stdout, p.stderr)
    for bug, by in (("shared_state_slot", "caught by oracle 1/1"), ("unfinished_insert_live", "caught by verify() 1/1"),
                    ("swa_veto_full_leaf", "caught by insert check 1/1"), ("swa_load_whole_node", "caught by verify() 1/1")):
        line = next((x for x in p.stdout.splitlines() if bug in x), "")
        expect(by in line, f"{bug} caught by {by}", line)
    exp = os.path.join(SRC, "experiments", "component_bugs.toml")
    rc, so, se = run_single(exp, "--out", out("bugs-bad"), "--set", "cache.component_bugs=shared_state_slot,nonsense")
    expect(rc == 2 and "key 'cache.component_bugs': expected array of strings (one of" in se
           and 'found an array containing "nonsense"' in se and not os.path.exists(out("bugs-bad")),
           "an unknown bug is refused", so, se)


def mutants_catalogue_current():
    """jobs/mutants.txt still applies to the code: every planted bug's text occurs exactly once in
    its file (jobs/mutants.sh --validate), and a malformed line is refused naming it."""
    p = subprocess.run([os.path.join(SRC, "jobs", "mutants.sh"), "--validate"], capture_output=True, text=True, timeout=60)
    expect(p.returncode == 0 and re.search(r"# (\d+) mutants in jobs/mutants.txt", p.stdout)
           and int(re.search(r"# (\d+) mutants", p.stdout).group(1)) >= 30, "the catalogue applies", p.stdout, p.stderr)
    bad = os.path.join(TMP, "bad_mutants.txt")
    with open(bad, "w") as f:
        f.write("# comment\nx\tprotocols/tp_sync.cpp\tno such text\tother\tunit\twhat\n")
    p = subprocess.run([os.path.join(SRC, "jobs", "mutants.sh"), "--validate", "--catalogue", bad], capture_output=True,
                       text=True, timeout=60)
    expect(p.returncode == 2 and "bad_mutants.txt:2: x: `no such text` occurs 0 times in protocols/tp_sync.cpp" in p.stderr,
           "a mutant that does not apply is named", p.stderr)


def hybrid_experiments():
    """The three hybrid experiments (FULL + SWA, FULL + MAMBA, all three) run at TP2xPP2 with device
    pressure: oracle OK, every rank agreeing, and the report's per-component figures (what FULL
    alone would reuse and what each rule cut, tombstones); A -> B -> A and concurrent cold
    prefills run clean at TP2xPP2 with the correct code; their decisions are the recorded ones
    (tests/golden/decision_digests.txt: this test checks them for decision_digests)."""
    figures = {}
    for name in ("hybrid_swa", "hybrid_mamba", "hybrid_all"):
        exp = os.path.join(SRC, "experiments", name + ".toml")
        rc, so, se = run(4, exp, "--out", out(name))
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, name, so, se)
        expect_recorded_digest(out(name), name)
        h = json.loads(tool("report", out(name), "--json")[1])
        figures[name] = h["hybrid"]
        text = tool("report", out(name))[1]
        expect(re.search(r"# hybrid reuse at admission: FULL alone would reuse \d+ tokens; SWA's rule cuts \d+ of them, "
                         r"MAMBA's \d+", text), f"{name}: the rule costs in the report", text)
    sw, mb, al = figures["hybrid_swa"], figures["hybrid_mamba"], figures["hybrid_all"]
    expect(sw["swa_cost_tokens"] > 0 and sw["mamba_cost_tokens"] == 0 and sw["swa_tombstones_made"] > 0, "SWA's rule costs", sw)
    expect(mb["mamba_cost_tokens"] > 0 and mb["swa_cost_tokens"] == 0 and mb["swa_tombstones_made"] == 0, "MAMBA's rule costs", mb)
    expect(al["swa_cost_tokens"] > 0 and al["mamba_cost_tokens"] > 0, "both rules cost in the three-kind model", al)
    exp = os.path.join(SRC, "experiments", "component_bugs.toml")
    for kind in ("aba", "cold_prefix"):
        rc, so, se = run(4, exp, "--out", out("grid-" + kind), "--set", "topology.tp=2", "--set", "topology.pp=2",
                         "--set", "model.layers=4", "--set", "model.layer_types=full,swa,mamba,full", "--set", f"workload.kind={kind}")
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
               and "# verify failures: 0 OK" in so, f"{kind} at TP2xPP2", so, se)


def hybrid_host():
    """Hybrid models with the host tier (experiments/hybrid_tiers.toml at TP2xPP2): oracle OK, ranks
    agreeing, the recorded decisions as shipped, part of the reuse loaded back from the host; write_back across stages; the buggy
    protocol.pp_sync = independent_polling parts the stages' decision logs."""
    exp = os.path.join(SRC, "experiments", "hybrid_tiers.toml")
    rc, so, se = run(4, exp, "--out", out("ht"))
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
           and "# verify failures: 0 OK" in so, "hybrid_tiers", so, se)
    expect_recorded_digest(out("ht"), "hybrid_tiers")
    rep = json.loads(tool("report", out("ht"), "--json")[1])
    expect(rep["cached_tokens"]["host"] > 0 and rep["cached_tokens"]["device"] > 0, "reuse from both tiers", rep["cached_tokens"])
    rc, so, se = run(4, exp, "--out", out("ht-bug"), "--set", "protocol.pp_sync=independent_polling")
    expect(rc != 0 and re.search(r"# rank divergences: [1-9]\d* FAILED", so), "independent_polling caught", so, se)
    # write_back across stages (TP2 x PP2; one stage: the MPI test HybridHost.*): an evicted node's
    # backup is an agreed write, the node kept on the device until it is published; its history is
    # loaded back later.
    rc, so, se = run(4, exp, "--out", out("ht-wb"), "--set", "cache.write_policy=write_back")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so, "write_back at TP2xPP2", so, se)
    rep = json.loads(tool("report", out("ht-wb"), "--json")[1])
    expect(rep["cached_tokens"]["host"] > 0, "write_back: reuse from the host", rep["cached_tokens"])
    # transfer.load.fail across stages (TP2 x PP2; one stage: the MPI test HybridHost.*): a load-back
    # is private until its outcome is agreed over every stage a step later; a broken one is dropped
    # on every rank (the request computes from its device boundary), oracle OK; protocol.load_back
    # = unchecked reads it.
    lf = ["--set", "faults.transfer.load.fail.probability=0.05", "--set", "faults.transfer.load.fail.ranks=[1]"]
    rc, so, se = run(4, exp, "--out", out("ht-lf"), *lf)
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
           and "# verify failures: 0 OK" in so, "transfer.load.fail at TP2xPP2", so, se)
    rep = json.loads(tool("report", out("ht-lf"), "--json")[1])
    expect(rep["load_back"]["failed_requests"] >= 1 and rep["load_back"]["recomputed_tokens"] > 0 and
           rep["cached_tokens"]["host"] > 0, "broken load-backs dropped, the others kept", rep["load_back"], rep["cached_tokens"])
    # A broken load-back past a device boundary inside the history (request 28 matches 320 tokens
    # on the device and 448 with the host): dropped, it computes from 320 with the state there
    # copied again into its running slot (a state left as loaded is an oracle mismatch).
    rc, so, se = run(4, exp, "--out", out("ht-lf-state"), "--set", "model.layer_types=full,mamba,full,mamba",
                     "--set", "faults.transfer.load.fail.probability=0.3", "--set", "faults.transfer.load.fail.ranks=[1]")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# verify failures: 0 OK" in so, "a dropped load-back's state", so, se)
    with h5py.File(out("ht-lf-state/run.h5"), "r") as f:
        ev = f["ranks"]["00000"]["events"][:]
        fell_back = [int(e["request"]) for e in ev if e["op"] == b"load_fail" and e["args"][1] > 0]
    expect(fell_back, "a load-back dropped back to a device boundary past the root", fell_back)
    rc, so, se = run(4, exp, "--out", out("ht-lf-bug"), *lf, "--set", "protocol.load_back=unchecked")
    expect(rc != 0 and re.search(r"# oracle mismatches: [1-9]\d* FAILED", so), "load_back = unchecked caught", so, se)


def hybrid_pd():
    """P/D with a hybrid model (experiments/hybrid_pd.toml, the first article's Figure 5 with FULL +
    SWA): decode reuses A+B (8K) and receives C; per layer of each kind the prefill ranks send
    exactly the suffixes' FULL pages, the prompts' tail-window SWA pages and (with MAMBA layers) one
    state per request — counted by hand below; full_transfer sends every prompt whole (the tail
    windows are the same); the two sidecars' words travel beside their source's pages (every run
    here carries them: a missing word is an oracle mismatch); prefill TP2 x PP2 into decode TP1 agrees on
    the counts (equal TP2 x PP2 layouts: the MPI test Pd.HybridModels*); multi-turn conversations with broken transfers fail exactly those requests, oracle
    OK; with decode's host tier request 3 restores B (every component) and a broken restore is
    taken back before decode_prefix_len is answered (the unchecked variant is caught); at decode PP2
    the restore is private until agreed over both stages and a broken one fails its request."""
    exp = os.path.join(SRC, "experiments", "hybrid_pd.toml")
    # Requests (prompt, decode_prefix_len): A (4096, 0), A+B (8192, 4096), X (12288, 0), A+B+C
    # (12288, 8192). FULL: (prompt - dpl) / 16 pages; SWA: the 1024-token window before each
    # prompt's end, 64 pages (its start is after every dpl); a state per request.
    reuse_full, whole_full = (4096 + 4096 + 12288 + 4096) // 16, (4096 + 8192 + 12288 + 12288) // 16
    mamba = ["--set", "model.layer_types=full,swa,mamba"]
    tp2pp2 = ["--set", "topology.prefill.tp=2", "--set", "topology.prefill.pp=2"]
    for name, np_, sets, want, counts in (
            ("fullswa", 2, [], (8192, 4096), (reuse_full, 256, 0)),
            ("mamba", 2, mamba, (8192, 4096), (reuse_full, 256, 4)),
            ("whole", 2, ["--set", "protocol.pd=full_transfer"], (0, 12288), (whole_full, 256, 0)),
            ("hetero", 5, mamba + tp2pp2, (8192, 4096), (reuse_full, 256, 4))):
        rc, so, se = run(np_, exp, "--out", out("hpd-" + name), *sets)
        expect(rc == 0 and "# verdict: OK" in so and "# oracle mismatches: 0 OK" in so, f"hybrid P/D {name}", so, se)
        with h5py.File(out(f"hpd-{name}/run.h5"), "r") as f:
            tables = [f["ranks"][r]["requests"][:] for r in f["ranks"] if int(f["ranks"][r].attrs["group"]) == 1]
            t = [x for x in tables if len(x)][0]
        expect(((t["prompt_tokens"] - t["cached_tokens"]) == t["pd_transferred_tokens"]).all(),
               f"{name}: prompt - decode_prefix_len sent", t)
        last = t[t["request"] == 3][0]
        got = (int(last["cached_tokens"]), int(last["pd_transferred_tokens"]))
        expect(got == want, f"{name}: request 3's decode_prefix_len and transfer", got, want)
        h = json.loads(tool("report", out("hpd-" + name), "--json")[1])["hybrid"]
        moved = (h["pd_sent_full_pages"], h["pd_sent_swa_pages"], h["pd_sent_states"])
        print(name, "request 3 (dpl, received):", got, "FULL pages, SWA pages, states sent:", moved)
        expect(moved == counts, f"{name}: pages and states moved", moved, counts)
    # The article's own Figure 5 state with decode's host tier: X evicts B to decode's host; request
    # 3 restores B — FULL pages, the SWA window before 8K and the state at 8K — and receives C. A
    # broken restore (pd.restore.fail) is agreed inside decode's admission and taken back before
    # decode_prefix_len is answered: the suffix grows instead (oracle OK); pd_restore = unchecked
    # decodes on it and is caught.
    host = mamba + ["--set", "cache.device_pages=1024", "--set", "cache.host_pages=2048", "--set", "cache.host_swa_pages=1024",
                    "--set", "cache.host_mamba_slots=32"]
    for name, sets, want, ok in (("host", [], (8192, 4096, 4096), True),
                                 ("host-broken", ["--set", "faults.pd.restore.fail.probability=0.3"], (4096, 0, 8192), True),
                                 ("host-unchecked", ["--set", "faults.pd.restore.fail.probability=0.3", "--set",
                                                     "protocol.pd_restore=unchecked"], (8192, 4096, 4096), False)):
        rc, so, se = run(2, exp, "--out", out("hpd-" + name), *host, *sets)
        if not ok:
            expect(rc != 0 and re.search(r"# oracle mismatches: [1-9]\d* FAILED", so), f"{name}: caught", so, se)
            continue
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so, f"hybrid P/D {name}", so, se)
        with h5py.File(out(f"hpd-{name}/run.h5"), "r") as f:
            t = [f["ranks"][r]["requests"][:] for r in f["ranks"] if int(f["ranks"][r].attrs["group"]) == 1]
            t = [x for x in t if len(x)][0]
        last = t[t["request"] == 3][0]
        got = (int(last["cached_tokens"]), int(last["host_tokens"]), int(last["pd_transferred_tokens"]))
        print(name, "request 3 (dpl, of it restored from host, received):", got)
        expect(got == want, f"{name}: request 3", got, want)
    # Conversations (FULL + SWA, TP2 on both sides) with broken transfers: decode reuses its own
    # history, each broken transfer fails its request, the rest decode oracle-OK.
    pdmt = ["--set", "cache.host_pages=0", "--set", "model.layer_types=full,swa", "--set", "model.swa_window=256",
            "--set", "cache.swa_pages=2048", "--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=3"]
    rc, so, se = run(4, PDMT, "--out", out("hpd-mt"), *pdmt, "--set", "faults.pd.transfer.fail.probability=0.2")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# verify failures: 0 OK" in so, "hybrid P/D conversations", so, se)
    j = json.loads(tool("report", out("hpd-mt"), "--json")[1])
    fired = j["faults"].get("pd.transfer.fail", 0)
    expect(j["hit_rate"]["device"] > 0.3 and j["transferred_tokens"]["pd"] < j["prompt_tokens"],
           "decode reuses its own hybrid history", j["hit_rate"], j["transferred_tokens"])
    expect(fired > 0 and j["failed_by_reason"]["pd_transfer"] == fired == j["failed"], "each broken transfer fails its request",
           j["failed_by_reason"], fired)
    # Decode's host tier at decode PP2: the restore is private until agreed over both stages — the
    # same Figure 5 state; a broken restore fails request 3 (pd_restore_fail) instead, oracle OK.
    for name, sets, want in (("host-pp2", [], (8192, 4096, 4096)),
                             ("host-pp2-broken", ["--set", "faults.pd.restore.fail.probability=0.3"], None)):
        rc, so, se = run(3, exp, "--out", out("hpd-" + name), *host, "--set", "topology.decode.pp=2", *sets)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# verify failures: 0 OK" in so, f"hybrid P/D {name}", so, se)
        with h5py.File(out(f"hpd-{name}/run.h5"), "r") as f:
            t = [f["ranks"][r]["requests"][:] for r in f["ranks"] if int(f["ranks"][r].attrs["group"]) == 1]
            t = [x for x in t if len(x)][0]
        last = t[t["request"] == 3][0]
        got = (int(last["cached_tokens"]), int(last["host_tokens"]), int(last["pd_transferred_tokens"]))
        if want:
            expect(got == want, f"{name}: request 3", got, want)
        else:
            j = json.loads(tool("report", out("hpd-" + name), "--json")[1])
            expect(j["failed"] == 1 and j["failed_by_reason"].get("pd_restore", 0) == 1, f"{name}: request 3 failed",
                   j["failed_by_reason"], got)


def hybrid_pd_draft():
    """Speculative decoding in P/D with a hybrid draft (experiments/pd_multiturn.toml, a FULL + SWA
    (+ MAMBA) target and a draft of the same kinds): the suffix carries the draft's FULL pages, its
    SWA layers' tail window and its state at the prompt's end beside the target's, so decode's draft
    reads the right KV — the same rounds and acceptance at every layout pair (prefill TP2 into decode
    TP2, TP1, TP1 x PP2; prefill TP2 x PP2 into TP1), no draft checksum mismatch, oracle OK; decode's
    host tier restores the draft's data inside (packed) or beside (sidecar) the target's host copies
    with the device-only run's acceptance, and in Figure 5's state (FULL + SWA + MAMBA, 8 output
    tokens) decode restores 8K from its host, the draft's window and state included, with no draft
    mismatch (target_only: blind); broken transfers fail exactly their requests. Without the
    draft's state legs every proposal reads a wrong state (jobs/mutants.txt
    pd_hybrid_draft_state_not_sent)."""
    base = ["--set", "model.swa_window=256", "--set", "workload.gsp.groups=2", "--set", "workload.gsp.turns=3",
            "--set", "model.draft.mode=packed", "--set", "engine.chunk_size=512"]
    mamba = base + ["--set", "model.layer_types=full,swa,mamba,swa", "--set", "model.mamba_chunk=64", "--set",
                    "model.mamba_state=4", "--set", "cache.mamba_slots=64", "--set", "model.draft.layers=3", "--set",
                    "model.draft.layer_types=full,swa,mamba", "--set", "cache.host_pages=0", "--set", "cache.swa_pages=2048"]
    swa = base + ["--set", "model.layer_types=full,swa", "--set", "model.draft.layers=2", "--set",
                  "model.draft.layer_types=full,swa"]
    pressure = ["--set", "cache.device_pages=400", "--set", "cache.swa_pages=200", "--set", "cache.host_pages=4000",
                "--set", "cache.host_swa_pages=1000"]
    spec = r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, (\d+) draft checksum mismatches"
    rounds = None
    for name, np_, sets in (("tp2", 4, mamba), ("tp1", 3, mamba + ["--set", "topology.decode.tp=1"]),
                            ("pp2", 4, mamba + ["--set", "topology.decode.tp=1", "--set", "topology.decode.pp=2"]),
                            ("hetero", 5, mamba + ["--set", "topology.prefill.pp=2", "--set", "topology.decode.tp=1"]),
                            # every leg (FULL pages, SWA windows, states, the draft's) through the
                            # NCCL transport's ordering layer, over MPI
                            ("hetero-ordered", 5, mamba + ["--set", "topology.prefill.pp=2", "--set", "topology.decode.tp=1",
                                                           "--set", "engine.collectives=mpi_ordered"]),
                            ("swa", 4, swa + ["--set", "cache.host_pages=0", "--set", "cache.swa_pages=2048"]),
                            ("host", 4, swa + pressure),
                            ("host-sidecar", 4, swa + pressure + ["--set", "model.draft.mode=sidecar"])):
        rc, so, se = run(np_, PDMT, "--out", out("hpdd-" + name), *sets)
        m = re.search(spec, so)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so and m,
               f"hybrid draft in P/D {name}", so, se)
        got = tuple(int(x) for x in m.groups())
        print(name, "rounds, accepted, proposed, draft mismatches:", got)
        expect(got[3] == 0 and 0 < got[1] < got[2], f"{name}: the draft reads the right KV and tokens are accepted", got)
        rounds = rounds or got
        expect(got == rounds, f"{name}: the same rounds and acceptance as prefill TP2 into decode TP2", got, rounds)
        j = json.loads(tool("report", out("hpdd-" + name), "--json")[1])
        if name == "swa":
            expect(j["hit_rate"]["device"] > 0.3, "decode reuses its own history, the draft's with it", j["hit_rate"])
        if name.startswith("host"):
            expect(j["cached_tokens"]["host"] > 0, f"{name}: history restored from decode's host tier", j["cached_tokens"])
    # Figure 5's state (experiments/hybrid_pd.toml, FULL + SWA + MAMBA) with 8 output tokens a request
    # and decode's host tier: decode restores B from its host — the draft's FULL pages, window and
    # state with the target's — and the draft reads them right; target_only leaves it blind.
    trace = out("pd_figure5_out8.jsonl")
    with open(os.path.join(SRC, "experiments", "traces", "pd_figure5.jsonl")) as f, open(trace, "w") as g:
        for line in f:
            g.write(json.dumps(dict(json.loads(line), output_length=8)) + "\n")
    fig5 = ["--set", "model.layer_types=full,swa,mamba", "--set", "model.draft.layers=3", "--set",
            "model.draft.layer_types=full,swa,mamba", "--set", "workload.mooncake.trace=" + trace, "--set",
            "cache.device_pages=1024", "--set", "cache.host_pages=2048", "--set", "cache.host_swa_pages=1024", "--set",
            "cache.host_mamba_slots=32"]
    runs = {}
    for mode in ("packed", "sidecar", "target_only"):
        rc, so, se = run(2, os.path.join(SRC, "experiments", "hybrid_pd.toml"), "--out", out("hpdd-f5-" + mode), *fig5,
                         "--set", "model.draft.mode=" + mode)
        m = re.search(spec, so)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so and m, f"Figure 5 with a hybrid draft, {mode}", so, se)
        j = json.loads(tool("report", out("hpdd-f5-" + mode), "--json")[1])
        runs[mode] = tuple(int(x) for x in m.groups())
        expect(j["cached_tokens"]["host"] == 8192, f"{mode}: decode restores from its host tier", j["cached_tokens"])
    print("Figure 5 with a hybrid draft (rounds, accepted, proposed, mismatches):", runs)
    expect(runs["packed"] == runs["sidecar"] and runs["packed"][3] == 0 and runs["packed"][1] > 0,
           "the restored draft reads its window and state right, packed and sidecar alike", runs)
    expect(runs["target_only"][3] > 0, "target_only: the restored draft is blind", runs)
    rc, so, se = run(4, PDMT, "--out", out("hpdd-broken"), *mamba, "--set", "faults.pd.transfer.fail.probability=0.2")
    m = re.search(spec, so)
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and m and int(m.group(4)) == 0, "broken transfers", so, se)
    j = json.loads(tool("report", out("hpdd-broken"), "--json")[1])
    fired = j["faults"].get("pd.transfer.fail", 0)
    expect(fired > 0 and j["failed_by_reason"]["pd_transfer"] == fired == j["failed"], "each broken transfer fails its request",
           j["failed_by_reason"], fired)


def hybrid_spec():
    """Speculative decoding with a hybrid model (experiments/hybrid_spec.toml at TP2xPP2, a full + SWA
    + MAMBA draft): rounds run, draft tokens are accepted (decode steps of several tokens), the
    draft's own window and state read right (no draft checksum mismatch), the history is reused,
    oracle OK, ranks agreeing and the recorded decisions as shipped; the #21 variant under multi-token acceptance (mtp_state_at_floor) is
    caught by the oracle; with the host tier under device pressure (packed: the draft's FULL layers,
    SWA layers and state words inside the target's host copies) the history comes back from the host
    with exactly the device-only run's acceptance and no draft mismatch, also when the last stage
    holds no target layer of the draft's SWA and MAMBA kinds (their host copies in pools of their
    own) (a hybrid draft under unified keys: test_storage.py hybrid_draft)."""
    exp = os.path.join(SRC, "experiments", "hybrid_spec.toml")
    rc, so, se = run(4, exp, "--out", out("hsp"))
    expect(rc == 0 and "# verdict: OK" in so and "# rank divergences: 0 OK" in so, "hybrid_spec", so, se)
    expect_recorded_digest(out("hsp"), "hybrid_spec")
    m = re.search(r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, 0 draft checksum mismatches", so)
    expect(m and int(m.group(1)) > 0 and 0 < int(m.group(2)) < int(m.group(3)),
           "draft rounds with acceptances, the hybrid draft reading the right window and state", so)
    j = json.loads(tool("report", out("hsp"), "--json")[1])
    expect(j["hit_rate"]["device"] > 0.3 and j["hybrid"]["mamba_states_saved"] > 0, "history reused", j["hit_rate"], j["hybrid"])
    rc, so, se = run(4, exp, "--out", out("hsp-bug"), "--set", "cache.component_bugs=mtp_state_at_floor")
    expect(rc != 0 and re.search(r"# oracle mismatches: [1-9]\d* FAILED", so), "mtp_state_at_floor caught", so, se)
    host = ["--set", "cache.device_pages=300", "--set", "cache.swa_pages=160", "--set", "cache.mamba_slots=32",
            "--set", "cache.host_pages=2000", "--set", "cache.host_swa_pages=1000", "--set", "cache.host_mamba_slots=128"]
    rc, so2, se = run(4, exp, "--out", out("hsp-host"), *host)
    m2 = re.search(r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, 0 draft checksum mismatches", so2)
    expect(rc == 0 and "# verdict: OK" in so2 and m2 and m2.groups() == m.groups(),
           "with the host tier: the device-only run's rounds and acceptance, no draft mismatch", so2, se)
    j = json.loads(tool("report", out("hsp-host"), "--json")[1])
    expect(j["cached_tokens"]["host"] > 0, "history loaded back from the host", j["cached_tokens"])
    # The last stage (layers 4-7, all full) holds no target SWA or MAMBA layer: the draft's window
    # and state go to host pools of their own, packed or sidecar, with the acceptance of the same
    # layout on the device alone.
    stage1_full = ["--set", "model.layer_types=full,swa,mamba,swa,full,full,full,full"]
    rc, so3, se = run(4, exp, "--out", out("hsp-dev-full"), *stage1_full)
    base = re.search(r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, 0 draft checksum mismatches", so3)
    expect(rc == 0 and base, "device only, an all-FULL last stage", so3, se)
    for mode in ("packed", "sidecar"):
        rc, so3, se = run(4, exp, "--out", out("hsp-host-" + mode), *host, "--set", "model.draft.mode=" + mode, *stage1_full)
        m3 = re.search(r"# speculative decoding: (\d+) rounds, (\d+) of (\d+) proposed tokens accepted.*, 0 draft checksum mismatches", so3)
        expect(rc == 0 and "# verdict: OK" in so3 and m3 and m3.groups() == base.groups(),
               f"{mode}: a last stage without the draft's kinds keeps the acceptance", so3, se)
        j = json.loads(tool("report", out("hsp-host-" + mode), "--json")[1])
        expect(j["cached_tokens"]["host"] > 0, f"{mode}: history loaded back from the host", j["cached_tokens"])
    rc, so, se = run_single(os.path.join(SRC, "experiments", "component_bugs.toml"), "--out", out("hsp-bad"),
                            "--set", "cache.component_bugs=mtp_state_at_floor")
    expect(rc == 2 and 'model.draft.mode = "none" (it would change nothing)' in se, "mtp bug without a draft refused", so, se)
    for sets, why in ((["--set", "model.layer_types=full,swa"], 'has mamba layers, but model.layer_types = "full,swa" has none'),
                      (["--set", "model.draft.layer_types=swa"], "has no full layer"),
                      (["--set", "model.draft.layer_types=full,bogus"], '"bogus" is not a layer type')):
        rc, so, se = run_single(exp, "--out", out("hsp-bad"), "--set", "topology.tp=1", "--set", "topology.pp=1", *sets)
        expect(rc == 2 and "model.draft.layer_types" in se and why in se, f"{sets} refused", so, se)


def agentic_sessions():
    """Session-aware eviction on agent trajectories (experiments/agentic_sessions.toml, TP2, device +
    host): sessions open and close, every finisher registers, and against cache.eviction = lru the
    session order takes no open session's KV (LRU does) and its device hit rate is at least LRU's;
    the planted session_close_resets_recency shows in the report (recency inversions, a lower device
    hit rate) with session-less traffic beside the sessions;
    without sessions in the workload (hybrid_tiers at TP2xPP2) session-aware eviction makes exactly
    LRU's decisions (equal decision digests on every rank);
    the planted session_no_generation with late finishers (abandoned sessions) is caught by
    verify(); session-aware eviction on a full-attention model and a malformed session_id in a
    trace are refused by name."""
    exp = os.path.join(SRC, "experiments", "agentic_sessions.toml")
    reps = {}
    for ev in ("session", "lru"):
        rc, so, se = run(2, exp, "--out", out(f"as-{ev}"), "--set", f"cache.eviction={ev}", "--set", "engine.debug_checks=true")
        expect(rc == 0 and "# verdict: OK" in so and "# rank divergences: 0 OK" in so, f"agentic_sessions {ev}", so, se)
        reps[ev] = json.loads(tool("report", out(f"as-{ev}"), "--json")[1])
    s, l = reps["session"], reps["lru"]
    expect(s["sessions"]["opened"] == s["sessions"]["closed"] > 12 and s["sessions"]["registered"] == s["requests"]
           and s["sessions"]["stale_finishes"] == 0, "sessions opened, closed, registered", s["sessions"])
    expect(s["sessions"]["forced_evictions_referenced"] < l["sessions"]["forced_evictions_referenced"],
           "LRU takes open sessions' KV, session-aware eviction less", s["sessions"], l["sessions"])
    expect(s["hit_rate"]["device"] >= l["hit_rate"]["device"], "device hit rate at least LRU's", s["hit_rate"], l["hit_rate"])
    # #24 shown by its metrics: with session-less traffic beside the sessions and clients closing a
    # while after their last turn, closing that resets recency evicts KV used after the closed one
    inv = {}
    for ev in ("session", "session_close_resets_recency"):
        rc, so, se = run(2, exp, "--out", out(f"as-{ev}-mix"), "--set", f"cache.eviction={ev}", "--seed", "3",
                         "--set", "workload.agentic.session_fraction=0.5", "--set", "workload.agentic.close_delay_ms=50")
        expect(rc == 0 and "# verdict: OK" in so, f"agentic_sessions {ev} with session-less traffic", so, se)
        inv[ev] = json.loads(tool("report", out(f"as-{ev}-mix"), "--json")[1])
    s2, b2 = inv["session"], inv["session_close_resets_recency"]
    expect(s2["sessions"]["recency_inversions"] == 0 < b2["sessions"]["recency_inversions"]
           and b2["hit_rate"]["device"] <= s2["hit_rate"]["device"], "close resetting recency shown by its metrics",
           s2["sessions"], b2["sessions"], s2["hit_rate"], b2["hit_rate"])
    # Without sessions in the workload, session-aware eviction makes exactly LRU's decisions.
    digests = {}
    for ev in ("lru", "session"):
        hx = os.path.join(SRC, "experiments", "hybrid_tiers.toml")
        rc, so, se = run(4, hx, "--out", out(f"as-nosess-{ev}"), "--set", f"cache.eviction={ev}")
        expect(rc == 0 and "# verdict: OK" in so, f"hybrid_tiers with cache.eviction={ev}", so, se)
        with h5py.File(os.path.join(out(f"as-nosess-{ev}"), "run.h5"), "r") as f:
            digests[ev] = sorted(int(d) for d in f["summary/ranks"]["decision_digest"])
    expect(digests["lru"] == digests["session"], "no sessions: session = lru, decision by decision", digests)
    rc, so, se = run(2, exp, "--out", out("as-ng"), "--set", "cache.eviction=session_no_generation",
                     "--set", "workload.agentic.abandon_prob=0.5", "--set", "engine.debug_checks=true")
    expect(rc != 0 and "holds references after it was closed" in so + se, "session_no_generation caught by verify()", so, se)
    rc, so, se = run_single(os.path.join(SRC, "experiments", "quickstart.toml"), "--out", out("as-bad"),
                            "--set", "cache.eviction=session")
    expect(rc == 2 and "cache.eviction" in se and "full-attention model" in se, "session eviction on RadixTree refused", so, se)
    trace = write("sessions.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "session_id": 1.5}\n')
    rc, so, se = run_single(exp, "--out", out("as-bad2"), "--set", "topology.tp=1", "--set", "workload.kind=mooncake",
                            "--set", f"workload.mooncake.trace={trace}")
    expect(rc == 2 and "sessions.jsonl:1" in se and "session_id" in se, "bad session_id refused", so, se)


def hybrid_storage():
    """Hybrid models with all three tiers (experiments/hybrid_storage.toml at TP2xPP2): twelve
    conversations in a cycle that the device and host cannot keep come back from storage (objects
    per component), every round after the first at its ideal reuse; without storage nothing is
    reused; a second job over the first one's storage directory reuses the history in its first
    round; the buggy protocol.prefetch_consensus = per_rank parts the stages (shape mismatch)."""
    exp = os.path.join(SRC, "experiments", "hybrid_storage.toml")
    store = out("hs-store")
    rc, so, se = run(4, exp, "--out", out("hs"), "--set", f"cache.storage_dir={store}")
    expect(rc == 0 and "# oracle mismatches: 0 OK" in so and "# rank divergences: 0 OK" in so
           and "# verify failures: 0 OK" in so, "hybrid_storage", so, se)
    rep = json.loads(tool("report", out("hs"), "--json")[1])
    expect(rep["hit_rate"]["storage"] > 0.6 and rep["cached_tokens"]["device"] == 0, "reuse from storage", rep["hit_rate"])
    for name in os.listdir(store):  # objects per component, in one directory per shard
        kinds = {"mamba" if f.endswith(".mamba.bin") else "swa" if f.endswith(".swa.bin") else "full"
                 for f in os.listdir(os.path.join(store, name))}
        expect(kinds == {"full", "swa", "mamba"}, f"FULL, SWA and MAMBA objects in {name}", kinds)
    rc, so, se = run(4, exp, "--out", out("hs-none"), "--set", "cache.storage=none")
    rep_none = json.loads(tool("report", out("hs-none"), "--json")[1])
    expect(rc == 0 and sum(rep_none["cached_tokens"].values()) < sum(rep["cached_tokens"].values()) / 4,
           "without storage the cycle defeats device and host", rep_none["cached_tokens"], rep["cached_tokens"])
    # Another job (same layout, same prompts: seed 1's workload) over the same objects.
    rc, so, se = run(4, exp, "--out", out("hs-again"), "--set", f"cache.storage_dir={store}")
    again = json.loads(tool("report", out("hs-again"), "--json")[1])
    expect(rc == 0 and again["cached_tokens"]["storage"] > rep["cached_tokens"]["storage"],
           "the second job reuses the first one's history from its first round on", again["cached_tokens"], rep["cached_tokens"])
    rc, so, se = run(4, exp, "--out", out("hs-bug"), "--set", "protocol.prefetch_consensus=per_rank",
                     "--set", "cache.prefetch_policy=best_effort")
    expect(rc != 0 and "shape mismatch" in so + se, "per_rank caught", so, se)


def urc_tiers_shape():
    """The second article's Figure 4 at small scale (experiments/urc_all.toml on one rank, 12 rounds of
    240 + 16 tokens, four conversations one at a time, capacities scaled with them): the device
    loses the history first, the host later, storage never — its last round within 1 pp of the
    ideal 1 - new/prompt tokens — and results/plots/urc_tiers.py draws the runs."""
    exp = os.path.join(SRC, "experiments", "urc_all.toml")
    small = ["topology.tp=1", "workload.multiturn.rounds=12", "workload.multiturn.request_length=240",
             "workload.multiturn.sub_question_length=240", "workload.multiturn.output_length=16", "cache.page_size=16",
             "model.mamba_chunk=16", "engine.chunk_size=512", "workload.multiturn.clients=4", "cache.device_pages=250",
             "cache.host_pages=500", "cache.prefetch_threshold=16"]
    variants = {"device-only": ["cache.storage=none", "cache.host_pages=0"], "+host": ["cache.storage=none"], "+storage": []}
    kept, last, runs = {}, {}, []
    for label, sets in variants.items():
        d = out("urc-" + label.strip("+"))
        args = [a for s in small + sets for a in ("--set", s)]
        rc, so, se = run_single(exp, "--out", d, *args)
        expect(rc == 0 and "# oracle mismatches: 0 OK" in so, f"urc_all {label}", so, se)
        with h5py.File(os.path.join(d, "run.h5"), "r") as f:
            t = f["ranks/00000/requests"][:]
        hits, prompts = [], []
        for r in sorted(set(t["round"])):
            s = t[t["round"] == r]
            hits.append(100.0 * s["cached_tokens"].sum() / s["prompt_tokens"].sum())
            prompts.append(s["prompt_tokens"].mean())
        kept[label] = sum(1 for h in hits[1:] if h >= 50)
        ideal = 100.0 * (1 - (prompts[-1] - prompts[-2] - 16) / prompts[-1])
        last[label] = (hits[-1], ideal)
        runs.append(f"{label}@urc_all={d}")
    expect(kept["device-only"] < kept["+host"] < kept["+storage"] == 10,  # round 1 reuses under half
           "each lower tier keeps the history longer (follow-up rounds at 50 % or more)", kept)
    expect(abs(last["+storage"][0] - last["+storage"][1]) <= 1.0 and last["device-only"][0] < 10,
           "storage ends within 1 pp of the ideal; the device alone keeps nothing", last)
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "results", "plots", "urc_tiers.py"), "--out", out("urc"),
                        *runs], capture_output=True, text=True, env=ENV, timeout=120)
    expect(p.returncode == 0 and os.path.exists(out("urc.png")), "urc_tiers.py draws the runs", p.stdout, p.stderr)



def production_mix_smoke():
    """jobs/production_mix.sh at a reduced size (2M prompt tokens, a 200K-token request): P/D with a
    CP-sharded PP2 prefill group and a TP2xPP2 decode group, a draft, host and storage tiers, every
    failpoint at a low probability — oracle OK, ranks agreed, the huge request finished, peak RSS
    per rank and both timelines reported, the bounds met. The committed trace is what
    jobs/production_mix_trace.py writes with its defaults."""
    d = out("pmx")
    p = subprocess.run([os.path.join(SRC, "jobs", "production_mix.sh"), "--total", "2000000", "--huge", "200000", "--out", d],
                       capture_output=True, text=True, env=dict(ENV, KVGRID_BIN=BIN, MPIEXEC=MPIEXEC), timeout=240, cwd=SRC)
    so = p.stdout
    expect(p.returncode == 0 and "bounds (oracle OK, ranks agree, the 200,000-token request finished" in so and so.rstrip().endswith("OK"),
           "the reduced mix within its bounds", so, p.stderr)
    expect(re.search(r"peak RSS per rank \d+-\d+ MiB \(8 ranks\)", so), "peak RSS of every rank", so)
    expect("largest request: 200,000 tokens, finished, oracle OK" in so, "the huge request finished", so)
    expect(re.search(r"speculative decoding: acceptance length 2\.\d+, 0 draft mismatches", so), "the draft rides the suffix intact", so)
    with open(os.path.join(d, "timeline-window.json")) as f:
        events = json.load(f)
    expect(len(events.get("traceEvents", events)) > 100, "the step window's timeline loads", d)
    j = json.load(open(os.path.join(d, "report.json")))
    expect(j["oracle_mismatches"] == 0 and j["divergences"] == 0 and j["faults_injected"] > 0, "report", j)
    fresh = out("pm-trace.jsonl")
    subprocess.run([os.path.join(SRC, "jobs", "production_mix_trace.py"), "--out", fresh], check=True, capture_output=True, timeout=60)
    with open(fresh) as a, open(os.path.join(SRC, "experiments", "traces", "production_mix.jsonl")) as b:
        expect(a.read() == b.read(), "experiments/traces/production_mix.jsonl is the generator's default output")


if __name__ == "__main__":
    name = sys.argv[1]
    try:
        globals()[name]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"cli {name}: 1 passed, 0 failed")
