#!/usr/bin/python3
"""CP-sharded versus replicated KV (the first article's Figure 1d), from HDF5 traces only.

From each run's `requests` table: device-tier token hit rate (cached - host tokens over prompt
tokens), host-tier and combined hit rates, tokens served from the host tier, and the mean
modelled prefill queue time (arrival -> admission) and forward time (the request's prefill
steps, waits for restores and gathers included). As in the article, queue and forward means are
separate statistics and are not summed into a TTFT. The first label is the baseline. Runs under
one LABEL are that variant's seeds (mean, min-max error bars).

  cp_sharding.py --out results/figures/cp_sharding replicated=RUN1 sharded=RUN2
"""
import style  # (first: it answers --help before the plotting libraries load)

import numpy as np
from kvtrace import load_groups


def stats(t):
    prompt = max(int(t["prompt_tokens"].sum()), 1)
    cached, host = int(t["cached_tokens"].sum()), int(t["host_tokens"].sum())
    return {
        "device_hit": 100 * (cached - host) / prompt,
        "host_hit": 100 * host / prompt,
        "combined_hit": 100 * cached / prompt,
        "host_tokens": host,
        "queue_ms": float(np.mean(t["queue_ns"])) / 1e6,
        "forward_ms": float(np.mean(t["forward_ns"])) / 1e6,
        "requests": len(t),
    }


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups, need=("host_tokens", "not a serving run?"))
    labels = list(data)
    res = {lab: [stats(t) for _, t in runs] for lab, runs in data.items()}
    mean = {lab: {k: float(np.mean([s[k] for s in rs])) for k in rs[0]} for lab, rs in res.items()}
    for lab in labels:
        for (m, _), s in zip(data[lab], res[lab]):
            print(f"{lab} seed {m['seed']}: device hit {s['device_hit']:.2f}%  host hit {s['host_hit']:.2f}%  "
                  f"combined {s['combined_hit']:.2f}%  host-served tokens {s['host_tokens']}  queue {s['queue_ms']:.3f} ms  "
                  f"forward {s['forward_ms']:.3f} ms  ({s['requests']} requests)")
    base = labels[0]
    b = mean[base]
    for lab in labels[1:]:
        s = mean[lab]
        print(f"{lab} vs {base}: device hit {s['device_hit'] - b['device_hit']:+.2f} pp, "
              f"combined {s['combined_hit'] - b['combined_hit']:+.2f} pp, host-served tokens "
              f"{style.pct_change(s['host_tokens'], b['host_tokens']):+.1f}%, queue {style.pct_change(s['queue_ms'], b['queue_ms']):+.1f}%, "
              f"forward {style.pct_change(s['forward_ms'], b['forward_ms']):+.1f}%")

    fig, ax = style.plt.subplots(1, 4, figsize=(14, 4.2), gridspec_kw=dict(width_ratios=[1.6, 1, 1, 1]))
    x = np.arange(3)
    w = 0.8 / len(labels)
    for i, lab in enumerate(labels):
        vals = [[s["device_hit"], s["host_hit"], s["combined_hit"]] for s in res[lab]]
        bs, m, lo, hi = style.bars(ax[0], x + (i - (len(labels) - 1) / 2) * w, vals, lab, w)
        style.label_bars(ax[0], bs, m, "{:.1f} %", tops=hi, fontsize=7)
    ax[0].set_xticks(x, ["device tier", "host tier", "combined"])
    ax[0].set_ylabel("token hit rate (% of prompt tokens)")
    ax[0].set_ylim(0, 100)
    ax[0].set_title("(a) where the prompt tokens hit")
    ax[0].legend(loc="upper left")
    ax[0].grid(axis="x", visible=False)
    panels = (("host_tokens", "tokens served from host (millions)", 1e-6, "{:.2f} M", "(b) host \u2192 device traffic"),
              ("queue_ms", "mean prefill queue time (ms, modelled)", 1, "{:.2f} ms", "(c) queueing"),
              ("forward_ms", "mean prefill forward time (ms, modelled)", 1, "{:.2f} ms", "(d) prefill forward"))
    for k, (key, ylabel, scale, fmt, title) in enumerate(panels):
        axis = ax[k + 1]
        for i, lab in enumerate(labels):
            bs, m, lo, hi = style.bars(axis, [i], [[s[key] * scale] for s in res[lab]], lab, 0.6)
            style.label_bars(axis, bs, m, fmt, tops=hi, fontsize=8)
        axis.set_xticks(range(len(labels)), labels)
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        axis.grid(axis="x", visible=False)
        style.headroom(axis, 1.3)
        for i, lab in enumerate(labels[1:], 1):
            ch = style.pct_change(mean[lab][key], b[key])
            axis.text(0.97, 0.97, f"{lab}: {ch:+.1f} %", transform=axis.transAxes, ha="right", va="top", fontsize=8,
                      fontweight="bold", color=style.color(lab))
    title = "CP sharding"
    if len(labels) > 1:
        o = labels[1]
        s = mean[o]
        dd = s["device_hit"] - b["device_hit"]
        dh = style.pct_change(s["host_tokens"], b["host_tokens"])
        dc = s["combined_hit"] - b["combined_hit"]
        df = style.pct_change(s["forward_ms"], b["forward_ms"])
        title = (f"{o.capitalize()} KV moves {abs(dd):.1f} pp of hits {'to' if dd > 0 else 'off'} the device tier and "
                 f"{'cuts' if dh < 0 else 'raises'} host-served tokens by {abs(dh):.0f} %\n"
                 f"(combined hit rate {dc:+.1f} pp, mean prefill forward time {df:+.0f} %, {o} vs {base})")
        ax[0].annotate(f"{dd:+.1f} pp", xy=(0, max(s["device_hit"], b["device_hit"])), xytext=(0, 20),
                       textcoords="offset points", ha="center", fontsize=9, fontweight="bold", color=style.color(o))
    m0 = data[base][0][0]
    caption = (f"Experiment {m0['experiment']} ({m0['topology']}), {res[base][0]['requests']} requests per run (the "
               f"whole trace, arrivals as recorded), {style.seeds_caption({lab: [m for m, _ in r] for lab, r in data.items()})}. "
               f"Equal device pages per rank in both; {base}'s host pool stands for one deduplicated pool per CP group, "
               f"the sharded host pools hold the same bytes per group. Device hits: cached tokens not loaded back from "
               f"the host. Queue: arrival to admission; forward: the request's prefill steps, restores and gathers "
               f"included. {style.MODELLED}")
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
