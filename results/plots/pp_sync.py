#!/usr/bin/python3
"""Cache-event ordering across pipeline stages (the first article's Figure 2b/2c, scaled):
pp_sync against independent_polling over many seeds, from a jobs/sweep.sh directory.

Reads SWEEP_DIR/sweep.h5 (one row per run: variant, seed, exit code, first divergence from
`kvgrid check`) and, for one diverged run, the `decisions` tables of its rank files: which write
ACK each stage consumed at which step (the `writing_check` entries). Panels: the share of runs
that diverged per variant (95 % Wilson interval); the step of each run's first divergence; when
each stage consumed its write ACKs in one diverged run.

  pp_sync.py --out results/figures/pp_sync SWEEP_DIR
"""
PLOT_ARGS = "sweep"  # (style.py reads it for --help)
import style  # (first: it answers --help before the plotting libraries load)

import math
import os
import re

import h5py
import numpy as np
from kvtrace import meta


def runs(sweep):
    path = os.path.join(sweep, "sweep.h5")
    if not os.path.exists(path):
        style.die(f"{sweep}: no sweep.h5 (not a jobs/sweep.sh directory?)")
    with h5py.File(path, "r") as f:
        g = f["runs"]
        dec = lambda k: [v.decode() if isinstance(v, bytes) else v for v in g[k][:]]  # noqa: E731
        out = [dict(variant=v, exit=int(e), first=fd, run=r, seed=int(sd))
               for v, e, fd, r, sd in zip(dec("variant"), g["exit"][:], dec("first_divergence"), dec("run"), g["seed"][:])]
    for r in out:  # run paths are relative to where the sweep ran (the repository root) or absolute
        if not os.path.exists(r["run"]) and os.path.exists(os.path.join(sweep, os.path.basename(r["run"]))):
            r["run"] = os.path.join(sweep, os.path.basename(r["run"]))
    return out


def first_step(text):
    m = re.search(r"\(step (\d+)\)", text or "")
    return int(m.group(1)) if m else None


def wilson(k, n, z=1.96):
    """95 % Wilson score interval of k successes in n trials, in %."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return 100 * max(0.0, c - h), 100 * min(1.0, c + h)


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
    a, groups = style.parse_args(__doc__, kind=PLOT_ARGS)
    sweep = next(iter(groups.values()))[0]
    rs = runs(sweep)
    variants = list(dict.fromkeys(r["variant"] for r in rs))
    short = [v.split("=", 1)[-1] for v in variants]
    colors = [style.color(s) for s in short]
    fig, ax = style.plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw=dict(width_ratios=[0.9, 0.9, 1.4]))
    counts = []
    for i, v in enumerate(variants):
        sel = [r for r in rs if r["variant"] == v]
        k, n = sum(r["exit"] != 0 for r in sel), len(sel)
        counts.append((k, n))
        lo, hi = wilson(k, n)
        p = 100 * k / n
        ax[0].bar(i, p, 0.6, color=colors[i], edgecolor="black", linewidth=0.4, label=short[i],
                  yerr=[[p - lo], [hi - p]], error_kw=dict(ecolor="black", elinewidth=0.8, capsize=3))
        ax[0].annotate(f"{k} of {n}\n({p:.0f} %)", (i, hi), xytext=(0, 3), textcoords="offset points", ha="center",
                       va="bottom", fontsize=8.5, fontweight="bold")
    ax[0].set_xticks(range(len(variants)), short)
    ax[0].set_ylabel("runs that diverged (% of seeds)")
    ax[0].set_ylim(0, 125)
    ax[0].set_yticks(range(0, 101, 20))
    ax[0].grid(axis="x", visible=False)
    ax[0].set_title("(a) diverged runs, 95 % Wilson interval")
    rng = np.random.default_rng(0)  # horizontal jitter only, so that equal steps stay readable
    for i, v in enumerate(variants):
        steps = [first_step(r["first"]) for r in rs if r["variant"] == v and first_step(r["first"]) is not None]
        if steps:
            ax[1].scatter(i + rng.uniform(-0.18, 0.18, len(steps)), steps, s=14, color=colors[i], alpha=0.7,
                          linewidths=0)
            txt = f"steps {min(steps)}\u2013{max(steps)}\nmedian {np.median(steps):g}" if min(steps) != max(steps) \
                else f"step {steps[0]}"
            ax[1].annotate(txt, (i, max(steps)), xytext=(0, 6), textcoords="offset points", ha="center",
                           va="bottom", fontsize=8, fontweight="bold")
        else:
            ax[1].annotate("no divergence", (i, 0.5), xycoords=("data", "axes fraction"), ha="center", fontsize=8.5,
                           fontweight="bold", color=colors[i])
    ax[1].set_xticks(range(len(variants)), short)
    ax[1].set_xlim(-0.6, len(variants) - 0.4)
    ax[1].set_ylim(bottom=0)
    style.headroom(ax[1], 1.35)
    ax[1].set_ylabel("first divergence (serving step)")
    ax[1].grid(axis="x", visible=False)
    ax[1].set_title("(b) when each diverged run diverged")
    bad = next((r for r in rs if r["exit"] != 0 and os.path.exists(os.path.join(r["run"], "run.h5"))), None)
    if bad:
        c = style.color(bad["variant"].split("=", 1)[-1])
        acks = acks_by_stage(bad["run"])
        s = first_step(bad["first"])
        top = max([1] + [int(ids.max()) for _, ids in acks.values() if len(ids)])
        last = max([s or 0] + [int(st.max()) for st, _ in acks.values() if len(st)])  # a diverged run stops here
        end = last + 2
        for pp, (steps, ids) in sorted(acks.items()):
            # From step 0 with none consumed to the run's last step: a stage that consumed none is a flat line.
            xs = np.concatenate([[0], steps, [last]])
            ys = np.concatenate([[0], ids, [ids[-1] if len(ids) else 0]])
            n = len(ids)
            ax[2].plot(xs, ys, linestyle=style.LINESTYLES[pp % 4], drawstyle="steps-post", lw=1.8,
                       color=c if pp == 0 else "black", label=f"stage {pp}: {n} write ACK{'s' if n != 1 else ''} consumed")
            ax[2].plot(steps, ids, marker="os^v"[pp % 4], linestyle="none", color=c if pp == 0 else "black")
        ax[2].set_ylim(-0.2, top + 1.5)
        ax[2].set_xlim(0, end)
        if s is not None:
            ax[2].axvline(s, color="grey", linestyle=":")
            ax[2].annotate(f"first divergence\nstep {s}", (s, top + 0.8), xytext=(-4, 0), textcoords="offset points",
                           ha="right", va="center", fontsize=8, fontweight="bold")
        ax[2].set_title(f"(c) {bad['variant'].split('=', 1)[-1]}, seed {bad['seed']}: "
                        f"write ACKs each stage consumed, by step")
        ax[2].legend(loc="center left")
    else:
        ax[2].text(0.5, 0.5, "no run diverged", transform=ax[2].transAxes, ha="center")
    ax[2].set_xlabel("serving step")
    ax[2].set_ylabel("write ACKs consumed (count)")
    ax[2].yaxis.get_major_locator().set_params(integer=True)
    ax[2].xaxis.get_major_locator().set_params(integer=True)
    for v, (k, n) in zip(variants, counts):
        print(f"{v}: {100 * k / n:.0f}% of runs diverged ({k} of {n})")
    diverged = [(v, k, n) for v, (k, n) in zip(short, counts) if k]
    clean = [(v, k, n) for v, (k, n) in zip(short, counts) if not k]
    title = "; ".join([f"{v} diverges in {k} of {n} seeds" for v, k, n in diverged] +
                      [f"{v} never ({k} of {n})" for v, k, n in clean])
    m0 = meta(rs[0]["run"]) if os.path.exists(os.path.join(rs[0]["run"], "run.h5")) else \
        {"experiment": "pp_sync", "topology": "?"}
    seeds = style.seeds_text(r["seed"] for r in rs)
    caption = (f"Experiment {m0['experiment']} ({m0['topology']}) swept by jobs/sweep.sh: {seeds} for each of "
               f"{', '.join(short)} ({len(rs)} runs). A run diverged when ranks that must agree took different "
               f"cache decisions (it stops with a shape mismatch, exit 1); the first divergence is the one kvgrid check names. "
               f"(c): the step at which each stage's leader consumed each write ACK, in the first diverged run of the "
               f"sweep; where the two lines part, the stages act on different cache state. Copy times are modelled, "
               f"slower on stage 1 (cost.stage_skew).")
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
