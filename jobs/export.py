#!/usr/bin/python3
"""Writes a run's trace tables as flat CSV files any tool reads (spreadsheets, pandas, R, DuckDB).

  jobs/export.sh RUN [OUT_DIR]      (OUT_DIR: RUN/csv)

One file per table — events.csv, decisions.csv, faults.csv, steps.csv (every rank's rows, with a `rank` column),
requests.csv (the rank /meta/requests_rank names), summary_ranks.csv — plus meta.csv (the /meta
attributes) and columns.csv (every column's unit and description, from the trace's own attributes).
Array columns (args, results) become one column per element (args_0, args_1, ...).
"""
import csv
import os
import sys

import h5py
import numpy as np


def text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace").rstrip("\x00")
    if isinstance(v, np.generic):
        return v.item()
    return v


def flat_columns(dtype):
    cols = []
    for name in dtype.names:
        shape = dtype[name].shape
        cols.extend([f"{name}_{i}" for i in range(shape[0])] if shape else [name])
    return cols


def rows_of(table, rank=None):
    for r in table:
        out = [] if rank is None else [rank]
        for name in table.dtype.names:
            v = r[name]
            out.extend(text(x) for x in v) if np.ndim(v) else out.append(text(v))
        yield out


def write_table(out, name, table):
    """One table of one file as NAME.csv; returns its (table, column, unit, description) rows."""
    with open(os.path.join(out, name + ".csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(flat_columns(table.dtype))
        w.writerows(rows_of(table[:]))
    return [(name, n, text(table.attrs.get(n + ".unit", "")), text(table.attrs.get(n + ".description", "")))
            for n in table.dtype.names]


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    run = sys.argv[1]
    path = run if run.endswith(".h5") else os.path.join(run, "run.h5")
    if not os.path.exists(path):
        print(f"export: {path}: no such run (expected a run directory or its run.h5)", file=sys.stderr)
        return 2
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(path), "csv")
    os.makedirs(out, exist_ok=True)
    written = []
    with h5py.File(path, "r") as f:
        meta = {k: text(v) for k, v in f["meta"].attrs.items()}
        with open(os.path.join(out, "meta.csv"), "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["key", "value"])
            for k, v in sorted(meta.items()):
                w.writerow([k, v])
        docs = []
        ranks = sorted(f["ranks"])
        for table in ("events", "decisions", "faults", "steps"):
            first = f["ranks"][ranks[0]][table]
            with open(os.path.join(out, table + ".csv"), "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["rank"] + flat_columns(first.dtype))
                for r in ranks:
                    w.writerows(rows_of(f["ranks"][r][table][:], int(r)))
            docs += [(table, n, text(first.attrs.get(n + ".unit", "")), text(first.attrs.get(n + ".description", "")))
                     for n in first.dtype.names]
            written.append(table + ".csv")
        rr = int(meta.get("requests_rank", -1))
        if rr >= 0:
            docs += write_table(out, "requests", f["ranks"][f"{rr:05d}"]["requests"])
            written.append("requests.csv")
        if "summary" in f:
            docs += write_table(out, "summary_ranks", f["summary/ranks"])
            written.append("summary_ranks.csv")
        with open(os.path.join(out, "columns.csv"), "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["table", "column", "unit", "description"])
            w.writerows(docs)
    print(f"# wrote {', '.join(['meta.csv'] + written + ['columns.csv'])} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
