#!/usr/bin/python3
"""P/D disaggregation (the first article's section 5, scaled): decode-side reuse against the full
transfer of every prompt, over several seeds, from HDF5 traces only.

Each run's `requests` table (in a P/D world written by the decode group's last-stage leader)
gives per finished request its round, pd_transferred_tokens (prompt tokens whose KV came from
prefill: the prompt minus decode_prefix_len) and modelled TTFT (arrival to the first token on
decode: prefill, the suffix transfer and decode's own restore). Panels: prompt tokens transferred
per round; mean and median TTFT; the TTFT distribution (all seeds pooled). Runs under one LABEL
are that variant's seeds (mean, min-max). The baseline is the label full_transfer if given, else
the last label.

  pd.py --out results/figures/pd decode_reuse=RUN1 decode_reuse=RUN2 full_transfer=RUN3 ...
"""
import style  # (first: it answers --help before the plotting libraries load)

import matplotlib.ticker
import numpy as np
from kvtrace import load_groups


def per_seed(t):
    rounds = np.unique(t["round"])
    sent = [int(t[t["round"] == r]["pd_transferred_tokens"].sum()) for r in rounds]
    ttft = t["ttft_model_ns"] / 1e6
    return dict(rounds=rounds, sent=sent, total=int(t["pd_transferred_tokens"].sum()), prompt=int(t["prompt_tokens"].sum()),
                mean=float(np.mean(ttft)), median=float(np.median(ttft)), ttft=ttft, requests=len(t))


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups, need=("pd_transferred_tokens", "not a P/D run?"))
    res = {lab: [per_seed(t) for _, t in runs] for lab, runs in data.items()}
    labels = list(res)
    base = "full_transfer" if "full_transfer" in res else labels[-1]
    fig, ax = style.plt.subplots(1, 3, figsize=(13, 4.3), gridspec_kw=dict(width_ratios=[1.3, 1, 1]))
    width = 0.8 / len(labels)
    summary = {}
    for i, lab in enumerate(labels):
        rs = res[lab]
        rounds, sent = style.by_round([s["rounds"] for s in rs], [s["sent"] for s in rs])
        b, mean, lo, hi = style.bars(ax[0], rounds + (i - (len(labels) - 1) / 2) * width, sent, lab, width)
        style.label_bars(ax[0], b, mean / 1e3, "{:.1f}k", tops=hi, fontsize=6.5)
        tt = [[s["mean"], s["median"]] for s in rs]
        b, m, lo, hi = style.bars(ax[1], np.array([0, 1]) + (i - (len(labels) - 1) / 2) * width, tt, lab, width)
        style.label_bars(ax[1], b, m, "{:.2f}", tops=hi)
        pooled = np.sort(np.concatenate([s["ttft"] for s in rs]))
        ax[2].plot(pooled, np.arange(1, len(pooled) + 1) / len(pooled) * 100, color=style.color(lab), label=lab,
                   linestyle=style.LINESTYLES[i % 4])
        summary[lab] = dict(total=style.spread([s["total"] for s in rs]), mean=style.spread([s["mean"] for s in rs]),
                            median=style.spread([s["median"] for s in rs]), prompt=np.mean([s["prompt"] for s in rs]))
        for m, s in zip(data[lab], rs):
            print(f"{lab} seed {m[0]['seed']}: tokens transferred per round " + " ".join(str(x) for x in s["sent"]) +
                  f" (total {s['total']}) | TTFT ms mean {s['mean']:.3f} median {s['median']:.3f}")
    for lab in labels:
        if lab == base:
            continue
        r, f = summary[lab], summary[base]
        print(f"{lab} vs {base}: tokens transferred {style.pct_change(r['total'][0], f['total'][0]):+.1f} %, "
              f"TTFT mean {style.pct_change(r['mean'][0], f['mean'][0]):+.1f} %, "
              f"median {style.pct_change(r['median'][0], f['median'][0]):+.1f} % (means over seeds)")

    ax[0].set_xlabel("round (turn of each conversation)")
    ax[0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[0].set_ylabel("prompt tokens transferred prefill \u2192 decode (tokens)")
    ax[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e3:.0f}k"))
    ax[0].set_title("(a) KV transferred per round")
    style.headroom(ax[0], 1.3)
    ax[0].legend(loc="upper left")
    ax[1].set_xticks([0, 1], ["mean", "median"])
    ax[1].set_ylabel("TTFT (ms, modelled)")
    ax[1].set_title("(b) time to first token")
    ax[1].grid(axis="x", visible=False)
    style.headroom(ax[1], 1.3)
    ax[2].set_xlabel("TTFT (ms, modelled)")
    ax[2].set_ylabel("requests (%, cumulative)")
    ax[2].set_ylim(0, 101)
    ax[2].set_title("(c) TTFT distribution, seeds pooled")
    ax[2].legend(loc="lower right")

    others = [lab for lab in labels if lab != base]
    title = "P/D disaggregation"
    if others:
        o = others[0]
        r, f = summary[o], summary[base]
        ratio = f["total"][0] / max(r["total"][0], 1)
        dm = style.pct_change(r["mean"][0], f["mean"][0])
        dmed = style.pct_change(r["median"][0], f["median"][0])
        title = (f"{o} transfers {ratio:.1f}\u00d7 fewer prompt tokens than {base} "
                 f"and {'cuts' if dm < 0 else 'raises'} mean modelled TTFT by {abs(dm):.0f} %")
        # The headline numbers on the panels they come from.
        ax[0].text(0.98, 0.97, f"total over all rounds: {r['total'][0] / 1e3:.1f}k vs {f['total'][0] / 1e3:.1f}k tokens\n"
                   f"({style.pct_change(r['total'][0], f['total'][0]):+.1f} %)", transform=ax[0].transAxes,
                   ha="right", va="top", multialignment="center", fontsize=8,
                   bbox=dict(boxstyle="round", fc="white", ec="#bbbbbb"))
        ax[1].text(0.97, 0.97, f"{o} vs {base}:\nmean {dm:+.1f} %, median {dmed:+.1f} %", transform=ax[1].transAxes,
                   ha="right", va="top", multialignment="center", fontsize=8,
                   bbox=dict(boxstyle="round", fc="white", ec="#bbbbbb"))
    m0 = data[labels[0]][0][0]
    n_req = res[labels[0]][0]["requests"]
    caption = (f"Experiment {m0['experiment']} ({m0['topology']}), {n_req} requests per run, "
               f"{style.seeds_caption({lab: [m for m, _ in runs] for lab, runs in data.items()})}. "
               f"Transferred tokens: prompt tokens whose KV decode received from prefill (the prompt minus the prefix "
               f"decode already held). TTFT: arrival to the first token on decode. {style.MODELLED}")
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
