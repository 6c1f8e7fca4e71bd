#!/usr/bin/python3
"""Speculative decoding with HiCache (the first article's Figure 3): the draft's KV across the
tiers, HiCache off / target_only / packed / sidecar, over several seeds, from HDF5 traces only.

Each run's `requests` table (written by the last stage's leader) gives per finished request its
round, prompt and cached tokens and its draft rounds: spec_rounds verify steps that accepted
spec_accepted draft tokens in all. A round's mean acceptance length is the tokens each verify
step produced, (accepted + verify steps) / verify steps; its hit rate is cached over prompt
tokens. Panels: acceptance length per round; hit rate per round; each variant's overall
acceptance length and hit rate. Runs under one LABEL are that variant's seeds (mean, min-max).
The first label is the baseline (HiCache off).

  spec_draft.py --out results/figures/spec_draft hicache-off=RUN1 target_only=RUN2 packed=RUN3 sidecar=RUN4 ...
"""
import style  # (first: it answers --help before the plotting libraries load)

import matplotlib.ticker
import numpy as np
from kvtrace import load_groups


def per_round(t):
    rounds = np.unique(t["round"])
    accept, hit = [], []
    for r in rounds:
        s = t[t["round"] == r]
        steps = max(int(s["spec_rounds"].sum()), 1)
        accept.append((int(s["spec_accepted"].sum()) + steps) / steps)
        hit.append(100 * int(s["cached_tokens"].sum()) / max(int(s["prompt_tokens"].sum()), 1))
    return rounds, accept, hit


def overall(t):
    steps = max(int(t["spec_rounds"].sum()), 1)
    return (int(t["spec_accepted"].sum()) + steps) / steps, 100 * int(t["cached_tokens"].sum()) / max(
        int(t["prompt_tokens"].sum()), 1)


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups, need=("spec_rounds", "run without [model.draft]?"))
    labels = list(data)
    fig, ax = style.plt.subplots(1, 3, figsize=(14, 4.4), gridspec_kw=dict(width_ratios=[1, 1, 1.1]))
    summary = {}
    sizes = [7.5, 6, 5, 4.5]  # curves that coincide stay visible: the later markers sit inside the earlier
    for i, lab in enumerate(labels):
        per = [per_round(t) for _, t in data[lab]]
        rounds, acc = style.by_round([p[0] for p in per], [p[1] for p in per])
        _, hit = style.by_round([p[0] for p in per], [p[2] for p in per])
        style.band(ax[0], rounds, acc, lab, i, markersize=sizes[i % 4], markerfacecolor="none" if i % 2 else None)
        style.band(ax[1], rounds, hit, lab, i, markersize=sizes[i % 4], markerfacecolor="none" if i % 2 else None)
        ov = [overall(t) for _, t in data[lab]]
        summary[lab] = dict(accept=style.spread([o[0] for o in ov]), hit=style.spread([o[1] for o in ov]))
        for (m, t), (r, ac, h), o in zip(data[lab], per, ov):
            oracle = "oracle OK" if int(t["oracle_ok"].min(initial=1)) == 1 else "ORACLE MISMATCH"
            print(f"{lab} seed {m['seed']}: acceptance length per round " + " ".join(f"{x:.2f}" for x in ac) +
                  " | hit % " + " ".join(f"{x:.1f}" for x in h) +
                  f" | overall {o[0]:.3f}, draft mismatch steps {int(t['draft_mismatches'].sum())}, {oracle}")
    x = np.arange(len(labels))
    w = 0.38
    acc_m = [summary[lab]["accept"] for lab in labels]
    ax2 = ax[2].twinx()
    for k, lab in enumerate(labels):
        ov = [overall(t) for _, t in data[lab]]
        b, mean, lo, hi = style.bars(ax[2], [x[k] - w / 2], [[o[0]] for o in ov], lab, w)
        style.label_bars(ax[2], b, mean, "{:.2f}", tops=hi, fontsize=8)
        b, mean, lo, hi = style.bars(ax2, [x[k] + w / 2], [[o[1]] for o in ov], lab, w, hatch="////", alpha=0.45)
        style.label_bars(ax2, b, mean, "{:.0f} %", tops=hi, fontsize=7)
    ax[2].set_xticks(x, labels)
    ax[2].set_ylabel("acceptance length (tokens per verify step)\nsolid bars")
    ax[2].set_ylim(0, max(m[2] for m in acc_m) * 1.25)
    ax2.set_ylabel("prefix hit rate (%), hatched bars")
    ax2.set_ylim(0, 125)
    ax2.grid(False)
    ax2.spines["right"].set_visible(True)
    ax[2].grid(axis="x", visible=False)
    ax[2].set_title("(c) over all rounds")

    for axis in ax[:2]:
        axis.set_xlabel("round (turn of every conversation)")
        axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[0].set_ylabel("mean acceptance length (tokens per verify step)")
    ax[0].set_ylim(0.8, max(m[2] for m in acc_m) * 1.18)
    ax[0].set_title("(a) acceptance length per round")
    ax[0].legend(loc="lower left", ncol=2)
    ax[1].set_ylabel("prefix hit rate (% of prompt tokens)")
    ax[1].set_ylim(-3, 105)
    ax[1].set_title("(b) hit rate per round")
    ax[1].legend(loc="lower right", ncol=2)

    base = labels[0]
    b_acc = summary[base]["accept"][0]
    keep = [lab for lab in labels[1:] if abs(summary[lab]["accept"][0] - b_acc) <= 0.01 * b_acc]
    lose = [lab for lab in labels[1:] if lab not in keep]
    parts = []
    if keep:
        parts.append(f"{' and '.join(keep)} keep{'s' if len(keep) == 1 else ''} {base}'s acceptance length "
                     f"({b_acc:.2f} tokens/step) at a {min(summary[lab]['hit'][0] for lab in keep):.0f} % hit rate")
    for lab in lose:
        parts.append(f"{lab} drops to {summary[lab]['accept'][0]:.2f}")
    title = "; ".join(parts) if parts else "Acceptance length and hit rate per draft mode"
    if len(title) > 95 and "; " in title:
        title = title.replace("; ", ";\n", 1)
    m0 = data[labels[0]][0][0]
    caption = (f"Experiment {m0['experiment']} ({m0['topology']}), {len(data[base][0][1])} requests per run, "
               f"{style.seeds_caption({lab: [m for m, _ in runs] for lab, runs in data.items()})}. Acceptance length: "
               f"(accepted draft tokens + verify steps) / verify steps. {base}: no host tier or storage. Curves that "
               f"coincide are drawn with nested markers. Draw of each draft token seeded by request and position; "
               f"a draft that read the wrong KV accepts nothing. {style.MODELLED}")
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
