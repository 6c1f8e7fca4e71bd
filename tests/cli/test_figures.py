#!/usr/bin/python3
"""Every plot script under results/plots/ draws its figure from small kvgrid runs.

One very small run per kind of figure (a multi-turn run with all three tiers, a speculative
decoding run, a P/D run, a two-run pp_sync sweep); a run feeds several scripts and stands for
several variants and seeds (the same run under a label twice is a group of two seeds). Each
script runs the way jobs/figure.sh calls it, `script.py --out BASENAME [LABEL=]RUN...`, and must
write BASENAME.png and BASENAME.pdf; `--help` says what the figure shows; jobs/figure.sh --list
names a plot script per figure that exists. Needs KVGRID_BIN, KVGRID_SOURCE, MPIEXEC (as
test_cli.py).
"""
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.environ["KVGRID_BIN"]
SRC = os.environ["KVGRID_SOURCE"]
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
PLOTS = os.path.join(SRC, "results", "plots")
sys.path.insert(0, os.path.join(SRC, "jobs"))
from mpi_env import mpi_env  # noqa: E402

ENV = mpi_env(MPLBACKEND="Agg")  # jobs/env.sh's settings
TMP = tempfile.mkdtemp(prefix="kvgrid-figures-")


def exp(name):
    return os.path.join(SRC, "experiments", name + ".toml")


def expect(cond, msg, *context):
    if not cond:
        print("FAILED:", msg)
        for c in context:
            print("----\n" + str(c)[-4000:])
        sys.exit(1)


def out(name):
    return os.path.join(TMP, name)


def kvgrid_run(np, experiment, name, *sets):
    cmd = [MPIEXEC, "-np", str(np), BIN, "run", experiment, "--out", out(name), "-q"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    expect(p.returncode == 0 and "# verdict: OK" in p.stdout, f"{name} run", p.stdout, p.stderr)
    return out(name)


# Tiny runs, two ranks each where the figure allows it.
MULTITURN = ["topology.tp=2", "topology.cp=1", "workload.multiturn.clients=4", "workload.multiturn.rounds=3",
             "workload.multiturn.request_length=128", "workload.multiturn.sub_question_length=16",
             "workload.multiturn.output_length=8", "workload.multiturn.max_in_flight=4", "engine.max_running=4",
             "cache.device_pages=24", "cache.host_pages=40"]
SPEC = ["topology.tp=1", "workload.multiturn.clients=4", "workload.multiturn.rounds=3",
        "workload.multiturn.request_length=128", "workload.multiturn.sub_question_length=16",
        "workload.multiturn.output_length=8", "workload.multiturn.max_in_flight=4", "engine.max_running=4",
        "cache.device_pages=24", "cache.host_pages=40"]
PD = ["topology.prefill.tp=1", "topology.decode.tp=1", "workload.gsp.groups=2", "workload.gsp.prompts_per_group=2",
      "workload.gsp.turns=2", "workload.gsp.system_prompt_len=256", "workload.gsp.question_len=64",
      "workload.gsp.output_len=8"]

AGENTIC = ["workload.agentic.sessions=4", "workload.agentic.max_active=4", "workload.agentic.turns_max=3",
           "workload.agentic.system_prompt_len=256"]


def pp_sync_sweep():
    env = dict(ENV, KVGRID_BIN=BIN, PATH=os.path.dirname(MPIEXEC) + ":" + os.environ.get("PATH", ""))
    p = subprocess.run([os.path.join(SRC, "jobs", "sweep.sh"), exp("pp_sync"), "--seeds", "1",
                        "--set", "protocol.pp_sync=pp_sync,independent_polling", "--out", out("ppsweep"), "--",
                        "--set", "output.flush_every=1", "--set", "workload.multiturn.rounds=2"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=SRC)
    expect(p.returncode == 0 and os.path.exists(out("ppsweep/sweep.h5")), "pp_sync sweep", p.stdout, p.stderr)
    return out("ppsweep")


def plot(script, name, *runs):
    """Runs one plot script; returns (name, seconds) or fails with its output."""
    t0 = time.time()
    base = out(os.path.join("figures", name))
    p = subprocess.run(["/usr/bin/python3", os.path.join(PLOTS, script), "--out", base, *runs],
                       capture_output=True, text=True, env=ENV, timeout=120)
    expect(p.returncode == 0, f"{script} --out {base}", p.stdout, p.stderr)
    for ext, magic in (("png", b"\x89PNG\r\n\x1a\n"), ("pdf", b"%PDF")):
        path = f"{base}.{ext}"
        expect(os.path.exists(path) and os.path.getsize(path) > 1000, f"{script}: {path} written and not empty",
               p.stdout, p.stderr)
        with open(path, "rb") as f:
            expect(f.read(len(magic)) == magic, f"{script}: {path} is a {ext.upper()} file")
    return name, time.time() - t0


def main():
    t0 = time.time()
    # The figure list: every figure has a plot script, and every plot script a figure.
    p = subprocess.run([os.path.join(SRC, "jobs", "figure.sh"), "--list"], capture_output=True, text=True, env=ENV)
    expect(p.returncode == 0, "figure.sh --list", p.stdout, p.stderr)
    listed = {line.split()[0]: line.split()[2] for line in p.stdout.splitlines() if line.strip()}
    scripts = sorted(f for f in os.listdir(PLOTS) if f.endswith(".py") and f not in ("kvtrace.py", "style.py"))
    expect(sorted(os.path.basename(s) for s in listed.values()) == scripts, "a figure per plot script", listed, scripts)

    mt = kvgrid_run(2, exp("multiturn_tiers"), "mt", *MULTITURN)
    spec = kvgrid_run(2, exp("spec_draft"), "spec", *SPEC)
    pd = kvgrid_run(2, exp("pd_multiturn"), "pd", *PD)
    ag = kvgrid_run(2, exp("agentic_sessions"), "ag", *AGENTIC)
    sweep = pp_sync_sweep()
    print(f"runs: {time.time() - t0:.1f} s")

    jobs = [("hit_ttft.py", "hit-ttft", mt),
            ("tiers.py", "tiers", f"device-only={mt}", f"+host={mt}", f"+host={mt}", f"+storage={mt}"),
            ("pp_sync.py", "pp_sync", sweep),
            ("cp_sharding.py", "cp_sharding", f"replicated={mt}", f"sharded={mt}", f"sharded={mt}"),
            ("spec_draft.py", "spec_draft", f"hicache-off={spec}", f"target_only={spec}", f"packed={spec}",
             f"packed={spec}", f"sidecar={spec}"),
            ("pd.py", "pd", f"decode_reuse={pd}", f"decode_reuse={pd}", f"full_transfer={pd}"),
            ("urc_tiers.py", "urc_tiers", f"device-only@urc_swa={mt}", f"+storage@urc_swa={mt}", f"+storage@urc_swa={mt}",
             f"device-only@urc_all={mt}", f"+host@urc_all={mt}"),
            ("sessions.py", "sessions", f"lru-b4={ag}", f"session-b4={ag}", f"session-b4={ag}", f"lru-b8={ag}",
             f"session-b8={ag}")]
    expect(sorted(j[0] for j in jobs) == scripts, "the test covers every plot script", scripts)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, s in pool.map(lambda j: plot(*j), jobs):
            print(f"{name}: {s:.1f} s")
    # --help says what the figure shows and the common argument order (two at a time: each
    # script's start-up imports matplotlib).
    def usage(s):
        return s, subprocess.run(["/usr/bin/python3", os.path.join(PLOTS, s), "--help"], capture_output=True, text=True,
                                 env=ENV, timeout=60)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for s, p in pool.map(usage, scripts):
            expect(p.returncode == 0 and "--out OUT_BASENAME" in p.stdout and len(p.stdout) > 300, f"{s} --help",
                   p.stdout, p.stderr)
    # A missing --out is a usage error (exit 2), not a figure somewhere.
    p = subprocess.run(["/usr/bin/python3", os.path.join(PLOTS, "pd.py"), f"decode_reuse={pd}"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    expect(p.returncode == 2 and "--out" in p.stderr, "pd.py without --out", p.stdout, p.stderr)
    print(f"all plot scripts OK in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
