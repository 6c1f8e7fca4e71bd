"""Reading kvgrid's HDF5 traces for the plot scripts (Debian's /usr/bin/python3 has h5py)."""
import os

import h5py


def trace_path(run):
    return os.path.join(run, "run.h5") if os.path.isdir(run) else run


def meta(run):
    """The /meta attributes of a run (experiment, topology, seed, ...), strings decoded."""
    with h5py.File(trace_path(run), "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["meta"].attrs.items()}


def requests(run):
    """(meta attributes, finished requests) of a run directory or its run.h5: the `requests` table
    the last stage's leader wrote, aborted requests left out (they have no first token)."""
    path = trace_path(run)
    with h5py.File(path, "r") as f:
        m = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["meta"].attrs.items()}
        for r in sorted(f["ranks"].keys()):
            t = f["ranks"][r]["requests"][:]
            if "failed" in t.dtype.names:
                t = t[t["failed"] == 0]
            if len(t):
                return m, t
    raise SystemExit(f"{path}: no requests table with rows (not a serving run?)")


def load_groups(groups, need=None):
    """{label: [(meta, requests), ...]} for {label: [run, ...]}; `need` names a column every run's
    table must have (with a message saying what kind of run lacks it)."""
    out = {}
    for label, runs in groups.items():
        for run in runs:
            m, t = requests(run)
            if need and need[0] not in t.dtype.names:
                raise SystemExit(f"{run}: its requests table has no {need[0]} ({need[1]})")
            out.setdefault(label, []).append((m, t))
    return out
