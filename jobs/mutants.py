#!/usr/bin/python3
"""Planted-bug testing: how many of the catalogue's bugs (jobs/mutants.txt) the test suite kills.

Each mutant is one substitution at exactly one place of one source file. The job copies the tree
(tracked and untracked, not ignored, files: the working checkout is never touched) into a scratch
directory, builds it there once, and then for each mutant: applies it, rebuilds incrementally,
runs the test the catalogue expects to catch it, and — when that test passes — the whole suite;
then restores the file and touches it so that the next build recompiles it. It prints killed /
survived / did not build per mutant and a score: killed ÷ (mutants − equivalent − not built).
First, every expected test must pass on the unmutated tree (--no-baseline skips that).

  jobs/mutants.sh [--only a,b] [--no-suite] [--dir DIR] [--jobs N] [--markdown FILE]
  jobs/mutants.sh --validate        check the catalogue only (every `old` occurs exactly once)
  jobs/mutants.sh --build-only      prepare the scratch tree and its build

DIR defaults to $KVGRID_MUTANTS_DIR or /tmp/kvgrid-mutants and is kept between runs (the second
run builds incrementally). Not part of the test suite: it takes minutes per surviving mutant.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env  # noqa: E402  jobs/env.sh for Python

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(SRC, "jobs", "mutants.txt")


class Mutant:
    def __init__(self, lineno, fields):
        self.line = lineno
        self.name, self.file, self.old, self.new, self.expect, self.breaks = fields

    @property
    def equivalent(self):
        return self.expect.startswith("equivalent:")


def fail(msg):
    print(f"mutants: {msg}", file=sys.stderr)
    sys.exit(2)


def read_catalogue(path, root):
    """The catalogue's mutants; exit 2 naming the line of the first malformed one."""
    out, names = [], set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            where = f"{os.path.relpath(path, SRC)}:{i}"
            if len(fields) != 6:
                fail(f"{where}: expected 6 tab-separated fields (name, file, old, new, expect, what), found {len(fields)}")
            m = Mutant(i, fields)
            if m.name in names:
                fail(f"{where}: mutant name '{m.name}' is used twice")
            names.add(m.name)
            p = os.path.join(root, m.file)
            if not os.path.isfile(p):
                fail(f"{where}: {m.name}: no file {m.file}")
            n = open(p, encoding="utf-8").read().count(m.old)
            if n != 1 or m.old == m.new or "\n" in m.old:
                fail(f"{where}: {m.name}: `{m.old}` occurs {n} times in {m.file} (it must occur exactly once"
                     + (", and differ from its replacement)" if m.old == m.new else ")"))
            out.append(m)
    return out


def tree_files():
    """Tracked and untracked-not-ignored files of the checkout, relative to it."""
    p = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True, check=True)
    return [f for f in p.stdout.split("\0") if f and os.path.isfile(os.path.join(SRC, f))]


def sync(dst):
    """Copies the checkout into dst, rewriting only files whose bytes differ (their mtimes follow
    the source), so that a kept scratch build stays incremental."""
    changed = 0
    for rel in tree_files():
        a, b = os.path.join(SRC, rel), os.path.join(dst, rel)
        with open(a, "rb") as f:
            data = f.read()
        if os.path.exists(b):
            with open(b, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(b), exist_ok=True)
        shutil.copy2(a, b)
        os.utime(b, None)  # newer than any object built from an older (e.g. interrupted, mutated) copy
        changed += 1
    return changed


def sh(cmd, cwd, timeout, env):
    """Runs cmd in its own process group; on a timeout the whole group (ranks included) is killed."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return 124, f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-2000:]}"


def failed_tests(text):
    """The failing tests of a ctest run's summary (parameterized names shortened at their '/')."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*\d+ - (.*?) \((Failed|Timeout|Subprocess aborted|SEGFAULT|Exception|Not Run)\)", line)
        if m:
            name = m.group(1).split("/(")[0]
            if name not in out:
                out.append(name)
    return out


def run_expected(expect, build, ctest, cwd, env):
    """The test a mutant names: a ctest -R regex, or mpi:N:FILTER (the MPI tests at N ranks)."""
    if expect.startswith("mpi:"):
        _, n, flt = expect.split(":", 2)
        return sh(["mpirun", "-np", n, os.path.join(build, "tests", "kvgrid_mpi_tests"), f"--gtest_filter={flt}",
                   "--gtest_brief=1", "--gtest_color=no"], cwd, 900, env)
    return sh(ctest + ["-R", expect], cwd, 1800, env)


def failed_gtests(text):
    return sorted({ln.split("]", 1)[1].strip().split()[0] for ln in text.splitlines() if "[  FAILED  ]" in ln and "." in ln})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--no-suite", action="store_true", help="run only the expected test, not the suite for survivors")
    ap.add_argument("--suite-filter", help="a ctest -R regex narrowing the 'whole suite' run for survivors (for trying the job)")
    ap.add_argument("--dir", default=os.environ.get("KVGRID_MUTANTS_DIR", "/tmp/kvgrid-mutants"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--markdown", help="write the results as a markdown table")
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the expected tests without a mutant first")
    ap.add_argument("--baseline-only", action="store_true", help="run the expected tests without any mutant, then stop")
    ap.add_argument("--build-only", action="store_true", help="sync and build the scratch tree, run no mutant")
    ap.add_argument("--catalogue", default=CATALOGUE)
    a = ap.parse_args()
    mutants = read_catalogue(a.catalogue, SRC)
    by_dir = {}
    for m in mutants:
        parts = m.file.split("/")
        d = "/".join(parts[:2]) if parts[0] == "src" else parts[0]
        by_dir[d] = by_dir.get(d, 0) + 1
    print(f"# {len(mutants)} mutants in {os.path.relpath(a.catalogue, SRC)}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(by_dir.items())), flush=True)
    if a.validate:
        return 0
    if a.only:
        want = a.only.split(",")
        unknown = [w for w in want if w not in {m.name for m in mutants}]
        if unknown:
            fail(f"--only: no mutant named {', '.join(unknown)}")
        mutants = [m for m in mutants if m.name in want]
    scratch, build = os.path.join(a.dir, "src"), os.path.join(a.dir, "build")
    os.makedirs(scratch, exist_ok=True)
    changed = sync(scratch)
    read_catalogue(a.catalogue, scratch)  # the scratch copy must match the catalogue too
    env = mpi_env()  # jobs/env.sh's settings
    print(f"# scratch tree {scratch} ({changed} files updated), build {build}", flush=True)
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        rc, text = sh(["cmake", "-S", scratch, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], a.dir, 600, env)
        if rc != 0:
            fail(f"configuring the scratch build failed:\n{text[-3000:]}")
    t0 = time.time()
    rc, text = sh(["cmake", "--build", build, "-j", str(a.jobs)], a.dir, 3600, env)
    if rc != 0:
        fail(f"the unmutated scratch tree does not build:\n{text[-3000:]}")
    print(f"# baseline built in {time.time() - t0:.0f} s", flush=True)
    if a.build_only:
        return 0
    ctest = ["ctest", "--test-dir", build, "-j", str(a.jobs), "--timeout", "300", "-E", "cuda_build_check"]
    # The suite a survivor meets: everything but the Slurm label and the catalogue's own check
    # (which fails by construction on a mutated tree).
    suite = ["ctest", "--test-dir", build, "-j", str(a.jobs), "--timeout", "300", "-LE", "slurm|unit_case",
             "-E", "cuda_build_check|cli_mutants_catalogue_current"]
    if a.suite_filter:
        suite += ["-R", a.suite_filter]
    suite_ok = False
    if not a.no_baseline:
        # Without a mutant every expected test passes (else a "kill" would mean nothing).
        t0 = time.time()
        for expect in sorted({m.expect for m in mutants if not m.equivalent}):
            rc, text = run_expected(expect, build, ctest, a.dir, env)
            if rc != 0:
                fail(f"baseline: {expect} fails without any mutant:\n{text[-2000:]}")
        print(f"# baseline: every expected test passes without a mutant ({time.time() - t0:.0f} s)", flush=True)
    if a.baseline_only:
        return 0
    results = []
    for m in mutants:
        t0 = time.time()
        path = os.path.join(scratch, m.file)
        with open(path, encoding="utf-8") as f:
            original = f.read()
        if m.equivalent:
            results.append((m, "equivalent", m.expect[len("equivalent:"):].strip(), 0.0))
            print(f"{m.name:34} equivalent ({m.expect[len('equivalent:'):].strip()})", flush=True)
            continue
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(m.old, m.new, 1))
            rc, text = sh(["cmake", "--build", build, "-j", str(a.jobs)], a.dir, 1800, env)
            if rc != 0:
                status, by = "did not build", next((ln.strip() for ln in text.splitlines() if "error" in ln), "")[:160]
            else:
                rc, text = run_expected(m.expect, build, ctest, a.dir, env)
                if "No tests were found" in text or "0 tests from 0 test suites ran" in text:
                    status, by = "error", f"no test matches {m.expect!r}"
                elif rc != 0:
                    names = failed_gtests(text) if m.expect.startswith("mpi:") else failed_tests(text)
                    status, by = "killed", ", ".join(names) or (f"exit {rc}" + (" (a rank aborted)" if "MPI_ABORT" in text or "aborted" in text else ""))
                elif a.no_suite:
                    status, by = "survived", f"{m.expect} passed (suite not run)"
                else:
                    if not suite_ok:  # once, unmutated: a suite failure must be the mutant's
                        with open(path, "w", encoding="utf-8") as f:
                            f.write(original)
                        os.utime(path, None)
                        rc, text = sh(["cmake", "--build", build, "-j", str(a.jobs)], a.dir, 1800, env)
                        rc, text = sh(suite, a.dir, 3600, env) if rc == 0 else (rc, text)
                        if rc != 0:
                            fail(f"baseline: the suite fails without any mutant: {', '.join(failed_tests(text))}")
                        suite_ok = True
                        with open(path, "w", encoding="utf-8") as f:
                            f.write(original.replace(m.old, m.new, 1))
                        sh(["cmake", "--build", build, "-j", str(a.jobs)], a.dir, 1800, env)
                    rc, text = sh(suite, a.dir, 3600, env)
                    status, by = ("killed", "suite: " + (", ".join(failed_tests(text)) or f"ctest exit {rc}")) if rc != 0 \
                        else ("survived", "the whole suite passed")
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
            os.utime(path, None)  # newer than its object: the next build recompiles it
        results.append((m, status, by, time.time() - t0))
        print(f"{m.name:34} {status:13} {time.time() - t0:6.0f} s  {by}", flush=True)
    # Leave the scratch build unmutated for the next run.
    sh(["cmake", "--build", build, "-j", str(a.jobs)], a.dir, 3600, env)
    count = {s: sum(1 for r in results if r[1] == s) for s in ("killed", "survived", "did not build", "equivalent", "error")}
    scored = count["killed"] + count["survived"]
    score = f"{count['killed']}/{scored}" + (f" = {100.0 * count['killed'] / scored:.1f} %" if scored else "")
    print(f"# killed {count['killed']}, survived {count['survived']}, did not build {count['did not build']}, "
          f"equivalent {count['equivalent']}, errors {count['error']}; score {score}")
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write("| mutant | file | breaks | result | caught by |\n|---|---|---|---|---|\n")
            for m, status, by, _ in results:
                f.write(f"| `{m.name}` | `{m.file}` | {m.breaks} | {status} | {by} |\n")
            f.write(f"\nScore: {score} (killed ÷ killed + survived).\n")
    return 1 if count["survived"] or count["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
