"""The environment kvgrid's Python jobs and tests give mpirun and kvgrid: jobs/env.sh's settings, read
from that file (its `export NAME=VALUE` lines) so that the shell and Python use one list. These jobs
start their mpirun on this machine, so Open MPI's transports default to shared memory only (ob1 over
vader: probing UCX and TCP cost ~0.2 s of every mpirun, a sixth of the test suite's time on 2 cores)
unless the environment names them.

    from mpi_env import mpi_env      # (jobs/ on sys.path)
    ENV = mpi_env(MPLBACKEND="Agg")  # os.environ + jobs/env.sh + the given extras
"""
import os
import re

ENV_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "env.sh")
ONE_MACHINE = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader"}
_EXPORT = re.compile(r"^export ([A-Za-z_][A-Za-z0-9_]*)=([^\s$`\"']*)$")


def env_sh(path=ENV_SH):
    """jobs/env.sh's settings, {name: value} in order. A line that is not a comment, blank or a plain
    `export NAME=VALUE` is an error naming the file and line: the shell and Python must not drift."""
    settings = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            m = _EXPORT.match(text)
            if not m:
                raise ValueError(f"{path}:{n}: jobs/mpi_env.py reads only `export NAME=VALUE` lines: {text}")
            settings[m.group(1)] = m.group(2)
    return settings


def mpi_env(base=None, **extra):
    """base (default os.environ) with the one-machine transports unless it names them, then
    jobs/env.sh's settings (as sourcing it would), then extra."""
    env = dict(ONE_MACHINE)
    env.update(os.environ if base is None else base)
    env.update(env_sh())
    env.update(extra)
    return env
