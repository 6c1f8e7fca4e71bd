#!/usr/bin/python3
"""P/D disaggregation: tokens transferred per round and modelled TTFT, from HDF5 traces only.

usage: pd.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
Each run directory's `requests` table (in a P/D world written by the decode group's last-stage
leader) gives per finished request its round, pd_transferred_tokens (prompt tokens whose KV came
from prefill: the prompt minus decode_prefix_len) and modelled TTFT (arrival to the first token
on decode: prefill, the suffix transfer and decode's own restore). Left: tokens transferred per
round; right: mean and median TTFT per variant.
"""
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from kvtrace import requests, save_figure  # noqa: E402


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    runs = [a.split("=", 1) for a in sys.argv[2:]]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(runs)
    meta, stats = None, {}
    for i, (label, run) in enumerate(runs):
        meta, t = requests(run)
        if "pd_transferred_tokens" not in t.dtype.names:
            raise SystemExit(f"{run}: its requests table has no P/D transfers (not a P/D run?)")
        rounds = np.unique(t["round"])
        sent = [int(t[t["round"] == r]["pd_transferred_tokens"].sum()) for r in rounds]
        ttft = t["ttft_model_ns"] / 1e6
        stats[label] = (float(np.mean(ttft)), float(np.median(ttft)), int(t["pd_transferred_tokens"].sum()))
        ax[0].bar(rounds + (i - (len(runs) - 1) / 2) * width, sent, width, label=label, edgecolor="black", linewidth=0.4)
        ax[1].bar(np.array([0, 1]) + (i - (len(runs) - 1) / 2) * width, stats[label][:2], width, label=label,
                  edgecolor="black", linewidth=0.4)
        print(f"{label}: tokens transferred per round " + " ".join(str(s) for s in sent) +
              f" (total {stats[label][2]}) | TTFT ms mean {stats[label][0]:.3f} median {stats[label][1]:.3f}")
    if len(runs) >= 2:
        (a, ra), (b, rb) = list(stats.items())[:2]
        print(f"{a} vs {b}: tokens transferred {100 * (ra[2] / rb[2] - 1):+.1f} %, TTFT mean {100 * (ra[0] / rb[0] - 1):+.1f} %, "
              f"median {100 * (ra[1] / rb[1] - 1):+.1f} %")
    ax[0].set_xlabel("round")
    ax[0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[0].set_ylabel("prompt tokens transferred prefill -> decode")
    ax[0].legend(fontsize=8)
    ax[1].set_xticks([0, 1], ["mean", "median"])
    ax[1].set_ylabel("modelled TTFT (ms)")
    ax[1].legend(fontsize=8)
    save_figure(fig, meta, sys.argv[1])


if __name__ == "__main__":
    main()
