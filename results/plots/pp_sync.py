#!/usr/bin/python3
"""Figure 2b/2c of the first article, scaled: pp_sync vs independent_polling over many seeds.

usage: pp_sync.py SWEEP_DIR OUT.png
Reads SWEEP_DIR/sweep.h5 (one row per run: variant, exit code, first divergence from
`kvgrid check`) and, for one diverged run, the `decisions` tables of its rank files: which write
ACKs each stage consumed at which step (the `writing_check` entries).
"""
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def runs(sweep):
    with h5py.File(os.path.join(sweep, "sweep.h5"), "r") as f:
        g = f["runs"]
        dec = lambda k: [v.decode() if isinstance(v, bytes) else v for v in g[k][:]]  # noqa: E731
        return [dict(variant=v, exit=int(e), first=fd, run=r, seed=int(sd))
                for v, e, fd, r, sd in zip(dec("variant"), g["exit"][:], dec("first_divergence"), dec("run"), g["seed"][:])]


def first_step(text):
    m = re.search(r"\(step (\d+)\)", text or "")
    return int(m.group(1)) if m else None


def acks_by_stage(run):
    """{pp: (steps, ACK ordinals)}: at which step the tp 0, cp 0 rank of each stage consumed its
    1st, 2nd, ... write ACK (from its `writing_check` decisions: count consumed at that step)."""
    out = {}
    with h5py.File(os.path.join(run, "run.h5"), "r") as f:
        for r in sorted(f["ranks"].keys()):
            g = f["ranks"][r]
            if g.attrs["tp"] != 0 or g.attrs["cp"] != 0:
                continue
            d = g["decisions"][:]
            d = d[d["name"] == b"writing_check"]
            steps, ids, n = [], [], 0
            for step, count in zip(d["step"], d["args"][:, 0]):
                for _ in range(int(count)):
                    n += 1
                    steps.append(int(step))
                    ids.append(n)
            out[int(g.attrs["pp"])] = (np.array(steps), np.array(ids))
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rs = runs(sys.argv[1])
    variants = list(dict.fromkeys(r["variant"] for r in rs))
    fig, ax = plt.subplots(1, 3, figsize=(14, 4.2))
    frac = [np.mean([r["exit"] != 0 for r in rs if r["variant"] == v]) for v in variants]
    short = [v.split("=", 1)[-1] for v in variants]
    ax[0].bar(short, [100 * f for f in frac], color=["tab:green" if f == 0 else "tab:red" for f in frac])
    for i, v in enumerate(variants):
        n = sum(1 for r in rs if r["variant"] == v)
        ax[0].text(i, 100 * frac[i] + 2, f"{100 * frac[i]:.0f}% of {n}", ha="center")
    ax[0].set_ylabel("runs that diverged (%)")
    ax[0].set_ylim(0, 115)
    for i, v in enumerate(variants):
        steps = [first_step(r["first"]) for r in rs if r["variant"] == v and first_step(r["first"]) is not None]
        if steps:
            ax[1].scatter(np.full(len(steps), i) + np.random.default_rng(0).uniform(-0.15, 0.15, len(steps)), steps, s=12)
    ax[1].set_xticks(range(len(variants)))
    ax[1].set_xticklabels(short)
    ax[1].set_xlim(-0.6, len(variants) - 0.4)
    ax[1].set_ylabel("step of the first divergence")
    bad = next((r for r in rs if r["exit"] != 0 and os.path.exists(os.path.join(r["run"], "run.h5"))), None)
    if bad:
        top, right = 1, 1
        for pp, (steps, ids) in sorted(acks_by_stage(bad["run"]).items()):
            ax[2].plot(steps, ids, marker="os^v"[pp % 4], linestyle="-", drawstyle="steps-post",
                       label=f"stage {pp}: {len(ids)} consumed")
            top = max([top, *ids])
            right = max([right, *steps])
        ax[2].set_ylim(0, top + 1)
        ax[2].set_xlim(0, max(right, first_step(bad["first"]) or 0) + 2)
        s = first_step(bad["first"])
        if s is not None:
            ax[2].axvline(s, color="grey", linestyle=":", label=f"first divergence (step {s})")
        ax[2].set_title(f"{bad['variant'].split('=', 1)[-1]}, seed {bad['seed']}:\nwhich write ACK each stage consumed, when",
                        fontsize=9)
        ax[2].legend(fontsize=8)
    ax[2].set_xlabel("step")
    ax[2].set_ylabel("write ACKs consumed (n-th ACK)")
    ax[2].yaxis.get_major_locator().set_params(integer=True)
    ax[2].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("cache-event ordering across pipeline stages (experiments/pp_sync.toml)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    for v, f in zip(variants, frac):
        print(f"{v}: {100 * f:.0f}% of runs diverged")
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
