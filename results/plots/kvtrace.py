"""Reading kvgrid's HDF5 traces for the plot scripts (Debian's /usr/bin/python3 has h5py)."""
import os

import h5py


def requests(run):
    """(meta attributes, finished requests) of a run directory or its run.h5: the `requests` table
    the last stage's leader wrote, aborted requests left out (they have no first token)."""
    path = os.path.join(run, "run.h5") if os.path.isdir(run) else run
    with h5py.File(path, "r") as f:
        meta = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["meta"].attrs.items()}
        for r in sorted(f["ranks"].keys()):
            t = f["ranks"][r]["requests"][:]
            if "failed" in t.dtype.names:
                t = t[t["failed"] == 0]
            if len(t):
                return meta, t
    raise SystemExit(f"{path}: no requests table with rows (not a serving run?)")


def save_figure(fig, meta, path, extra=""):
    """Titles `fig` with the run's experiment, topology and seed, and writes it to `path`."""
    fig.suptitle(f"{meta['experiment']}  {meta['topology']}  seed {meta['seed']}{extra}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
