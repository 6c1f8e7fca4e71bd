#!/usr/bin/python3
"""The second article's Figure 6 (session-aware eviction on agent trajectories), scaled: per batch
size, plain LRU against session-aware eviction (cache.eviction = lru | session) on
experiments/agentic_sessions.toml — (a) the prefix hit rate stacked as device hits and host hits,
(b) the mean modelled TTFT with the reduction labelled on each pair, (c) the FULL tokens of open
sessions' KV that device eviction took (forced evictions of referenced KV, SGLang PR #27058's
measure) — from HDF5 traces only.

A hit rate is the cached prompt tokens over the prompt tokens of the finished requests; host hits
are the cached tokens loaded back from the host tier. Labels are VARIANT-bBATCH (lru-b8,
session-b8); runs under one label are that variant's seeds.

  sessions.py --out results/figures/sessions lru-b4=RUN1 session-b4=RUN2 lru-b8=RUN3 ...
"""
import style  # (first: it answers --help before the plotting libraries load)

import h5py
import numpy as np
from kvtrace import load_groups, trace_path

VARIANTS = ("lru", "session")
ARTICLE = ("Article (TP8, SWE-bench agent trajectories): device hit ~42 -> 51 % (DeepSeek-V4-Pro, batch 128), "
           "~5 -> 34 % (Qwen3.5-397B, batch 32), device + host ~58 -> 67 % (Qwen, batch 64); TTFT -11.0 % and -2.9 % "
           "(DeepSeek, batch 128 and 256), -13.5 % and -16.6 % (Qwen, batch 32 and 64). SGLang PR #27058: about 343K "
           "tokens force-evicted with plain LRU on a replayed sub-agent trace, none with the session cache.")


def forced(run):
    """FULL tokens of referenced KV device eviction took (the ranks holding sessions agree: the most)."""
    with h5py.File(trace_path(run), "r") as f:
        rows = f["summary/ranks"][:]
    if "forced_referenced_tokens" not in rows.dtype.names:
        style.die(f"{run}: its rank summary has no forced_referenced_tokens (a run from before sessions?)")
    return int(rows["forced_referenced_tokens"].max())


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups)
    cells = {}
    for label, runs in groups.items():
        var, sep, b = label.rpartition("-b")
        if not sep or var not in VARIANTS or not b.isdigit():
            style.die(f"label {label!r}: expected lru-bN or session-bN (N: the batch size)")
        per_seed = []
        for (m, t), run in zip(data[label], runs):
            p = max(int(t["prompt_tokens"].sum()), 1)
            host = int(t["host_tokens"].sum())
            dev = int(t["cached_tokens"].sum()) - host
            per_seed.append((100 * dev / p, 100 * host / p, float(np.mean(t["ttft_model_ns"])) / 1e6, forced(run)))
        cells[(var, int(b))] = np.array(per_seed)
    batches = sorted({b for _, b in cells})
    for b in batches:
        for v in VARIANTS:
            if (v, b) not in cells:
                style.die(f"batch {b}: no {v}-b{b} runs (each batch size needs both variants)")
    fig, ax = style.plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw=dict(width_ratios=[1.2, 1.0, 1.0]))
    x = np.arange(len(batches))
    w = 0.38
    notes = []
    for k, v in enumerate(VARIANTS):
        xs = x + (k - 0.5) * w
        dev = [cells[(v, b)][:, 0].mean() for b in batches]
        host = [cells[(v, b)][:, 1].mean() for b in batches]
        col = style.color(v)
        ax[0].bar(xs, dev, w, color=col, label=f"{v}: device")
        ax[0].bar(xs, host, w, bottom=dev, color=col, alpha=0.45, hatch=style.TIER_HATCH["host"], label=f"{v}: host")
        style.label_bars(ax[0], ax[0].patches[-len(batches):], [d + h for d, h in zip(dev, host)], fmt="{:.1f}")
        for i, b in enumerate(batches):  # one bar per batch: variants may have run different seeds
            style.bars(ax[1], [xs[i]], list(cells[(v, b)][:, 2]), v, w)
            rects, fmean, _, _ = style.bars(ax[2], [xs[i]], list(cells[(v, b)][:, 3] / 1e3), v, w)
            style.label_bars(ax[2], rects, [fmean], fmt="{:.1f}K")
    for i, b in enumerate(batches):
        base, new = cells[("lru", b)], cells[("session", b)]
        cut = style.pct_change(new[:, 2].mean(), base[:, 2].mean())
        top = max(base[:, 2].max(), new[:, 2].max())
        ax[1].annotate(f"{cut:+.1f} %", (x[i], top), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        notes.append(f"batch {b}: device hit {base[:, 0].mean():.1f} -> {new[:, 0].mean():.1f} %, device + host "
                     f"{base[:, 0].mean() + base[:, 1].mean():.1f} -> {new[:, 0].mean() + new[:, 1].mean():.1f} %, mean TTFT "
                     f"{base[:, 2].mean():.2f} -> {new[:, 2].mean():.2f} ms ({cut:+.1f} %), forced evictions of referenced KV "
                     f"{base[:, 3].mean():.0f} -> {new[:, 3].mean():.0f} tokens")
        print(notes[-1])
    style.headroom(ax[1], 1.25)
    style.headroom(ax[2])
    m0 = next(iter(data.values()))[0][0]
    for axis in ax:
        axis.set_xticks(x, [f"batch {b}" for b in batches])
        axis.grid(axis="x", visible=False)
    ax[0].set_ylabel("prefix hit rate (% of prompt tokens)")
    ax[0].set_ylim(0, 120)
    ax[0].legend(loc="upper right", fontsize=7, ncol=2)
    ax[1].set_ylabel("mean TTFT (ms, modelled)")
    ax[2].set_ylabel("open sessions' KV force-evicted (K FULL tokens)")
    ax[0].set_title(f"(a) device and host hits ({m0['experiment']}, {m0['topology']})")
    ax[1].set_title("(b) time to first token, change against LRU")
    ax[2].set_title("(c) forced evictions of referenced KV")
    title = ("Session-aware eviction keeps open agent sessions' KV on the device that LRU evicts\n"
             "(the second article's Figure 6, scaled: LRU vs session-aware per batch size)")
    caption = ("; ".join(notes) + ". " + ARTICLE + " Here: a FULL + SWA model at TP2 with device and host tiers, "
               "agent sessions with sub-agents (experiments/agentic_sessions.toml); batch size = requests running at "
               "once = sessions active at once. " + style.seeds_caption({k: [m for m, _ in v] for k, v in data.items()}) +
               ". " + style.MODELLED)
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
