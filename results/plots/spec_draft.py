#!/usr/bin/python3
"""Speculative decoding with HiCache (the first article's Figure 3), from HDF5 traces only.

usage: spec_draft.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
Each run directory's `requests` table (written by the last stage's leader) gives per finished
request its round, prompt and cached tokens and its draft rounds: spec_rounds verify steps that
accepted spec_accepted draft tokens in all. A round's mean acceptance length is the tokens each
verify step produced, (accepted + verify steps) / verify steps; its hit rate is cached over
prompt tokens. Top: acceptance length per round; bottom: hit rate per round.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from kvtrace import requests, save_figure  # noqa: E402


def per_round(t):
    rounds = np.unique(t["round"])
    accept, hit = [], []
    for r in rounds:
        s = t[t["round"] == r]
        steps = max(int(s["spec_rounds"].sum()), 1)
        accept.append((int(s["spec_accepted"].sum()) + steps) / steps)
        hit.append(100 * int(s["cached_tokens"].sum()) / max(int(s["prompt_tokens"].sum()), 1))
    return rounds, accept, hit


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    runs = [a.split("=", 1) for a in sys.argv[2:]]
    fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    meta = None
    summary = {}
    styles = [dict(marker="o", linestyle="-", markersize=9), dict(marker="s", linestyle="--", markersize=7),
              dict(marker="^", linestyle="-.", markersize=6), dict(marker="x", linestyle=":", markersize=6)]
    for i, (label, run) in enumerate(runs):
        style = styles[i % len(styles)]
        meta, t = requests(run)
        if "spec_rounds" not in t.dtype.names:
            raise SystemExit(f"{run}: its requests table has no draft rounds (run without [model.draft]?)")
        rounds, accept, hit = per_round(t)
        ax[0].plot(rounds, accept, label=label, **style)  # identical curves stay visible: styles differ
        ax[1].plot(rounds, hit, label=label, **style)
        oracle = "oracle OK" if int(t["oracle_ok"].min(initial=1)) == 1 else "ORACLE MISMATCH"
        steps = max(int(t["spec_rounds"].sum()), 1)
        summary[label] = (int(t["spec_accepted"].sum()) + steps) / steps
        print(f"{label}: acceptance length per round " + " ".join(f"{a:.2f}" for a in accept) +
              " | hit % " + " ".join(f"{h:.1f}" for h in hit) +
              f" | overall {summary[label]:.3f}, draft mismatch steps {int(t['draft_mismatches'].sum())}, {oracle}")
    ax[0].set_ylabel("mean acceptance length\n(tokens per verify step)")
    ax[0].set_ylim(bottom=0.9)
    ax[0].legend(fontsize=8)
    ax[1].set_ylabel("prefix hit rate (%)")
    ax[1].set_xlabel("round")
    ax[1].set_ylim(0, 105)
    ax[1].legend(fontsize=8)
    save_figure(fig, meta, sys.argv[1])


if __name__ == "__main__":
    main()
