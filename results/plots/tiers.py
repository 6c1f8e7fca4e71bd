#!/usr/bin/python3
"""The tiers experiment (the second article's multi-turn benchmark, scaled): per-round prefix hit
rate and modelled TTFT with the device tier only, + a host tier, + file storage, over several
seeds, from HDF5 traces only.

Each run's `requests` table (written by the last stage's leader) gives per finished request its
round, prompt, cached, host and storage tokens, and modelled TTFT. A round's hit rate is its
cached tokens over its prompt tokens; panel (c) splits it by the tier the tokens came from
(device / host / storage, by hatching). Runs under one LABEL are that variant's seeds (mean,
min-max band). Give the variants from the fewest tiers to the most.

  tiers.py --out results/figures/tiers device-only=RUN1 device-only=RUN2 +host=RUN3 ... +storage=RUN5
"""
import style  # (first: it answers --help before the plotting libraries load)

import matplotlib.patches
import matplotlib.ticker
import numpy as np
from kvtrace import load_groups

TIERS = ("device", "host", "storage")


def per_round(t):
    rounds = np.unique(t["round"])
    out = {k: [] for k in ("hit", *TIERS, "ttft")}
    for r in rounds:
        s = t[t["round"] == r]
        prompt = max(int(s["prompt_tokens"].sum()), 1)
        cached, host, storage = (int(s[k].sum()) for k in ("cached_tokens", "host_tokens", "storage_tokens"))
        out["hit"].append(100 * cached / prompt)
        out["device"].append(100 * (cached - host) / prompt)   # host_tokens include those prefetched from storage
        out["host"].append(100 * (host - storage) / prompt)
        out["storage"].append(100 * storage / prompt)
        out["ttft"].append(float(np.mean(s["ttft_model_ns"])) / 1e6)
    return rounds, out


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups, need=("storage_tokens", "not a serving run?"))
    labels = list(data)
    fig, ax = style.plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw=dict(width_ratios=[1, 1, 1.35]))
    width = 0.8 / len(labels)
    last, spreads = {}, []
    for i, lab in enumerate(labels):
        per = [per_round(t) for _, t in data[lab]]
        rounds, hit = style.by_round([p[0] for p in per], [p[1]["hit"] for p in per])
        _, ttft = style.by_round([p[0] for p in per], [p[1]["ttft"] for p in per])
        hm, hlo, hhi = style.band(ax[0], rounds, hit, lab, i)
        tm, tlo, thi = style.band(ax[1], rounds, ttft, lab, i)
        spreads += [(hm, hlo, hhi), (tm, tlo, thi)]
        last[lab] = dict(round=int(rounds[-1]), hit=(hm[-1], hlo[-1], hhi[-1]), ttft=(tm[-1], tlo[-1], thi[-1]),
                         hit_mean=hm, ttft_mean=tm)
        x = rounds + (i - (len(labels) - 1) / 2) * width
        bottom = np.zeros(len(rounds))
        for tier in TIERS:
            _, vals = style.by_round([p[0] for p in per], [p[1][tier] for p in per])
            mean = style.spread(vals)[0]
            ax[2].bar(x, mean, width, bottom=bottom, color=style.color(lab), hatch=style.TIER_HATCH[tier],
                      edgecolor="black", linewidth=0.4, alpha=0.9)
            bottom += np.nan_to_num(mean)
        for (m, _), (r, v) in zip(data[lab], per):
            print(f"{lab} seed {m['seed']}: hit % per round " + " ".join(f"{h:.1f}" for h in v["hit"]) +
                  " | TTFT ms " + " ".join(f"{x:.1f}" for x in v["ttft"]))
    # Headline numbers: every variant's last-round hit rate and TTFT, at the last round's points.
    for k, lab in enumerate(labels):
        L = last[lab]
        for axis, key, fmt in ((ax[0], "hit", "{:.0f} %"), (ax[1], "ttft", "{:.0f} ms")):
            axis.annotate(fmt.format(L[key][0]), (L["round"], L[key][0]), xytext=(8, 0), textcoords="offset points",
                          va="center", ha="left", fontsize=8, color=style.color(lab), fontweight="bold")
    # Keep the end labels apart: spread them vertically when they would overlap.
    _declutter(ax[0])
    _declutter(ax[1])
    for axis in ax:
        axis.set_xlabel("round (turn of every conversation)")
        axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    rmax = max(L["round"] for L in last.values())
    for axis in ax[:2]:
        axis.set_xlim(-0.3, rmax + 0.9)
    ax[0].set_ylabel("prefix hit rate (% of prompt tokens)")
    ax[0].set_ylim(-3, 105)
    ax[0].set_title("(a) hit rate per round")
    ax[0].legend(loc="center right", bbox_to_anchor=(1.0, 0.45))
    ax[1].set_ylabel("mean TTFT (ms, modelled)")
    ax[1].set_title("(b) time to first token per round")
    ax[1].set_ylim(bottom=0)
    ax[1].legend(loc="upper left")
    ax[2].set_ylabel("prefix hit rate by tier (%, mean over seeds)")
    ax[2].set_ylim(0, 112)
    ax[2].set_title("(c) where the hits came from")
    ax[2].grid(axis="x", visible=False)
    handles = [matplotlib.patches.Patch(facecolor=style.color(lab), edgecolor="black", linewidth=0.4, label=lab)
               for lab in labels]
    handles += [matplotlib.patches.Patch(facecolor="white", edgecolor="black", hatch=style.TIER_HATCH[t],
                                         linewidth=0.4, label=f"from {t}") for t in TIERS]
    ax[2].legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, columnspacing=0.8,
                 handlelength=1.4, handletextpad=0.4)

    hits = [last[lab]["hit"][0] for lab in labels]
    ttfts = [last[lab]["ttft"][0] for lab in labels]
    r = last[labels[0]]["round"]
    # How long each variant keeps the history: follow-up rounds (after round 0) with a hit rate of 50 % or more.
    kept = [int(np.sum(last[lab]["hit_mean"][1:] >= 50)) for lab in labels]
    n_follow = len(last[labels[0]]["hit_mean"]) - 1
    if len(labels) > 1 and all(b >= a_ for a_, b in zip(kept, kept[1:])) and kept[-1] > kept[0]:
        title = (f"Each lower tier keeps the multi-turn history longer: a hit rate of 50 % or more in "
                 f"{', '.join(str(k) for k in kept[:-1])} and {kept[-1]} of {n_follow} follow-up rounds")
    else:
        title = "Follow-up rounds with a hit rate of 50 % or more: " + ", ".join(
            f"{lab} {k} of {n_follow}" for lab, k in zip(labels, kept))
    title += (f"\n({', '.join(labels)}; round {r}: hit rate " + " / ".join(f"{h:.0f}" for h in hits) +
              " %, mean TTFT " + " / ".join(f"{x:.0f}" for x in ttfts) + " ms modelled)")
    m0 = data[labels[0]][0][0]
    n_req = len(data[labels[0]][0][1])
    caption = (f"Experiment {m0['experiment']} ({m0['topology']}), {n_req} requests per run, "
               f"{style.seeds_caption({lab: [m for m, _ in runs] for lab, runs in data.items()})}. "
               f"Hit rate: cached over prompt tokens of the round's finished requests; (c) splits it by the tier the "
               f"cached tokens were served from (solid: device, hatched: loaded back from host, cross-hatched: prefetched "
               f"from storage). {style.spread_note(spreads)}{style.MODELLED}")
    style.finish(fig, title, caption, a.out, a.vector)


def _declutter(axis, min_gap_pt=9):
    """Moves the value labels at the right end of the lines apart when they would overlap."""
    texts = [t for t in axis.texts]
    if len(texts) < 2:
        return
    fig = axis.figure
    fig.canvas.draw()
    trans = axis.transData
    ys = [trans.transform(t.xy)[1] for t in texts]
    order = np.argsort(ys)
    gap = min_gap_pt * fig.dpi / 72
    placed = []
    for k in order:
        y = ys[k]
        if placed and y - placed[-1] < gap:
            y = placed[-1] + gap
        placed.append(y)
        texts[k].set_position((8, (y - ys[k]) * 72 / fig.dpi))


if __name__ == "__main__":
    main()
