#!/usr/bin/python3
"""Figure 1d: CP-sharded versus replicated KV, from HDF5 traces only.

usage: cp_sharding.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]   (the first run is the baseline)
From each run's `requests` table: device-tier token hit rate (cached - host tokens over prompt
tokens), host-tier and combined hit rates, tokens served from the host tier, and the mean
modelled prefill queue time (arrival -> admission) and forward time (the request's steps). As in
the article, queue and forward means are separate statistics and are not summed into a TTFT.
Prints each run's numbers and the changes against the baseline.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from kvtrace import requests  # noqa: E402


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
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    runs = [a.split("=", 1) for a in sys.argv[2:]]
    res, meta = [], None
    for label, run in runs:
        meta, t = requests(run)
        res.append((label, stats(t)))
    for label, s in res:
        print(f"{label}: device hit {s['device_hit']:.2f}%  host hit {s['host_hit']:.2f}%  combined {s['combined_hit']:.2f}%"
              f"  host-served tokens {s['host_tokens']}  queue {s['queue_ms']:.3f} ms  forward {s['forward_ms']:.3f} ms"
              f"  ({s['requests']} requests)")
    base = res[0][1]
    for label, s in res[1:]:
        def rel(k):
            return 100 * (s[k] - base[k]) / base[k] if base[k] else float("nan")
        print(f"{label} vs {res[0][0]}: device hit {s['device_hit'] - base['device_hit']:+.2f} pp, "
              f"combined {s['combined_hit'] - base['combined_hit']:+.2f} pp, host-served tokens {rel('host_tokens'):+.1f}%, "
              f"queue {rel('queue_ms'):+.1f}%, forward {rel('forward_ms'):+.1f}%")

    labels = [l for l, _ in res]
    colors = ["tab:gray", "tab:blue", "tab:green", "tab:purple"][: len(res)]
    fig, ax = plt.subplots(1, 4, figsize=(14, 3.8))
    x = np.arange(3)
    w = 0.8 / len(res)
    for i, (label, s) in enumerate(res):
        vals = [s["device_hit"], s["host_hit"], s["combined_hit"]]
        bars = ax[0].bar(x + (i - (len(res) - 1) / 2) * w, vals, w, label=label, color=colors[i])
        for b, v in zip(bars, vals):
            ax[0].text(b.get_x() + b.get_width() / 2, v + 1, f"{v:.1f}", ha="center", fontsize=7)
    ax[0].set_xticks(x, ["device", "host", "combined"])
    ax[0].set_ylabel("token hit rate (%)")
    ax[0].set_ylim(0, 110)
    ax[0].legend(fontsize=8)
    for k, (key, title, scale) in enumerate(
            (("host_tokens", "tokens served from host (M)", 1e-6), ("queue_ms", "mean queue time (modelled ms)", 1),
             ("forward_ms", "mean forward time (modelled ms)", 1))):
        vals = [s[key] * scale for _, s in res]
        bars = ax[k + 1].bar(labels, vals, color=colors)
        for b, v in zip(bars, vals):
            ax[k + 1].text(b.get_x() + b.get_width() / 2, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
        ax[k + 1].set_title(title, fontsize=9)
    fig.suptitle(f"{meta['experiment']}  {meta['topology']}  seed {meta['seed']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    print(f"wrote {sys.argv[1]}")


if __name__ == "__main__":
    main()
