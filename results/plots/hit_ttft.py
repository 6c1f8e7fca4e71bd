#!/usr/bin/python3
"""The quickstart's serving run over modelled time: the cumulative prefix hit rate and every
request's modelled TTFT, from one run's HDF5 trace only.

Reads the `requests` table that the last stage's leader wrote: per finished request its arrival,
first-token and finish times on the modelled clock, prompt and cached tokens. Top: cached over
prompt tokens of the requests finished so far, by finish time; bottom: each request's TTFT at its
first token, with the median of the first and the last quarter of requests.

  hit_ttft.py --out results/figures/hit-ttft RUN_DIR
"""
PLOT_ARGS = "run"  # (style.py reads it for --help)
import style  # (first: it answers --help before the plotting libraries load)

import numpy as np
from kvtrace import load_groups


def main():
    a, groups = style.parse_args(__doc__, kind=PLOT_ARGS)
    (label, [(meta, t)]), = load_groups(groups).items()
    t = np.sort(t, order="finish_ns")
    finish_s = t["finish_ns"] / 1e9
    cum_hit = 100 * np.cumsum(t["cached_tokens"]) / np.maximum(np.cumsum(t["prompt_tokens"]), 1)
    c = style.color(label)
    fig, ax = style.plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax[0].plot(finish_s, cum_hit, color=c, label=label)
    final = float(cum_hit[-1])
    ax[0].annotate(f"{final:.1f} % after {len(t)} requests", (finish_s[-1], final), xytext=(-6, -16),
                   textcoords="offset points", ha="right", fontsize=8.5, fontweight="bold", color=c,
                   arrowprops=dict(arrowstyle="-", color=c, lw=0.6))
    ax[0].set_ylabel("prefix hit rate (% of prompt tokens,\ncumulative over finished requests)")
    ax[0].set_ylim(0, 100)
    ax[0].set_title("(a) cumulative hit rate")
    by_first = np.sort(t, order="first_token_ns")
    first_s = by_first["first_token_ns"] / 1e9
    ttft = by_first["ttft_model_ns"] / 1e6
    ax[1].scatter(first_s, ttft, s=7, color=c, alpha=0.6, linewidths=0, label="one request")
    q = max(len(ttft) // 4, 1)
    early, late = float(np.median(ttft[:q])), float(np.median(ttft[-q:]))
    for sl, med, name in ((slice(0, q), early, "first"), (slice(len(ttft) - q, len(ttft)), late, "last")):
        xs = first_s[sl]
        ax[1].plot([xs[0], xs[-1]], [med, med], color="black", lw=1.6)
        ax[1].annotate(f"median of the {name} {q}: {med:.1f} ms", ((xs[0] + xs[-1]) / 2, med), xytext=(0, 6),
                       textcoords="offset points", ha="center", va="bottom", fontsize=8, fontweight="bold",
                       bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    ax[1].set_ylabel("TTFT (ms, modelled)")
    ax[1].set_xlabel("modelled time (s)")
    ax[1].set_ylim(0, float(np.percentile(ttft, 99.5)) * 1.15)
    ax[1].set_title("(b) time to first token of each request")
    ax[1].legend(loc="upper right", markerscale=2)
    shown = int(np.sum(ttft <= ax[1].get_ylim()[1]))
    trend = "falls" if late < early else "rises"
    title = (f"Prefix reuse reaches a {final:.0f} % hit rate; median TTFT {trend} from {early:.1f} to {late:.1f} ms "
             f"(modelled)")
    caption = (f"Experiment {meta['experiment']} ({meta['topology']}), {style.seeds_text([meta['seed']])}, one run, "
               f"{len(t)} finished requests ({shown} shown in (b), the rest above its axis). Hit rate: cached over "
               f"prompt tokens, counted when a request finishes. {style.MODELLED}")
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
