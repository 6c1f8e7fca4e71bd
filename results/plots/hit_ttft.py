#!/usr/bin/python3
"""Hit rate and modelled TTFT over (modelled) time, from a serving run's HDF5 trace only.

usage: hit_ttft.py RUN_DIR_OR_RUN_H5 OUT.png
Reads the `requests` table that the last stage's leader wrote: per finished request its arrival,
first-token and finish times on the modelled clock, prompt and cached tokens.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from kvtrace import requests, save_figure  # noqa: E402


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    meta, t = requests(sys.argv[1])
    t = np.sort(t, order="finish_ns")
    finish_s = t["finish_ns"] / 1e9
    cum_hit = np.cumsum(t["cached_tokens"]) / np.maximum(np.cumsum(t["prompt_tokens"]), 1)
    fig, ax = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    ax[0].plot(finish_s, 100 * cum_hit, color="tab:blue")
    ax[0].set_ylabel("device hit rate (%)\n(cumulative)")
    ax[0].set_ylim(0, 100)
    ax[1].scatter(t["first_token_ns"] / 1e9, t["ttft_model_ns"] / 1e6, s=6, color="tab:orange")
    ax[1].set_ylabel("TTFT (modelled ms)")
    ax[1].set_xlabel("modelled time (s)")
    save_figure(fig, meta, sys.argv[2], f"  ({len(t)} requests)")


if __name__ == "__main__":
    main()
