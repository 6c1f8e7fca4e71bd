#!/usr/bin/python3
"""Per-round hit rate and modelled TTFT of the tiers experiment, from HDF5 traces only.

usage: tiers.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
Each run directory's `requests` table (written by the last stage's leader) gives per finished
request its round, prompt and cached tokens, and modelled TTFT. The hit rate of a round is its
cached tokens over its prompt tokens; the bars split it by tier (device / host / storage).
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from kvtrace import requests, save_figure  # noqa: E402


def per_round(t):
    rounds = np.unique(t["round"])
    out = {k: [] for k in ("hit", "device", "host", "storage", "ttft")}
    for r in rounds:
        s = t[t["round"] == r]
        prompt = max(int(s["prompt_tokens"].sum()), 1)
        cached, host, storage = (int(s[k].sum()) for k in ("cached_tokens", "host_tokens", "storage_tokens"))
        out["hit"].append(100 * cached / prompt)
        out["device"].append(100 * (cached - host) / prompt)
        out["host"].append(100 * (host - storage) / prompt)
        out["storage"].append(100 * storage / prompt)
        out["ttft"].append(float(np.mean(s["ttft_model_ns"])) / 1e6)
    return rounds, out


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    runs = [a.split("=", 1) for a in sys.argv[2:]]
    fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    width = 0.8 / len(runs)
    meta = None
    for i, (label, run) in enumerate(runs):
        meta, t = requests(run)
        rounds, v = per_round(t)
        x = rounds + (i - (len(runs) - 1) / 2) * width
        bottom = np.zeros(len(rounds))
        for tier, color in (("device", "tab:blue"), ("host", "tab:orange"), ("storage", "tab:green")):
            ax[0].bar(x, v[tier], width, bottom=bottom, color=color, edgecolor="black", linewidth=0.4,
                      label=tier if i == 0 else None)
            bottom += np.array(v[tier])
        for xi, h in zip(x, v["hit"]):
            ax[0].text(xi, h + 1, label, rotation=90, ha="center", va="bottom", fontsize=7)
        ax[1].plot(rounds, v["ttft"], marker="o", label=label)
        print(f"{label}: hit % per round " + " ".join(f"{h:.1f}" for h in v["hit"]) +
              " | TTFT ms " + " ".join(f"{x:.1f}" for x in v["ttft"]))
    ax[0].set_ylabel("hit rate (%) by tier")
    ax[0].set_ylim(0, 125)
    ax[0].legend(loc="upper left", ncol=3, fontsize=8)
    ax[1].set_ylabel("mean TTFT (modelled ms)")
    ax[1].set_xlabel("round")
    ax[1].legend(fontsize=8)
    save_figure(fig, meta, sys.argv[1])


if __name__ == "__main__":
    main()
