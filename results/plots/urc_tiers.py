#!/usr/bin/python3
"""The second article's Figure 4 (HiCache on the unified radix tree), scaled: per round, the prefix
hit rate and the mean modelled TTFT of a hybrid model's multi-turn benchmark with the device tier
only, + host, + storage, and each configuration's effective input throughput — one row per model
(experiments/urc_swa.toml: FULL + SWA at TP4; experiments/urc_all.toml: FULL + SWA + MAMBA at
TP8), from HDF5 traces only.

A round's hit rate is its cached prompt tokens over its prompt tokens (the article's definition);
the dotted line is the ideal, 1 - new / prompt tokens of the round (all of the history reused).
Effective input throughput is bench_multiturn's: the sum of prompt tokens over the run's modelled
time (first arrival to last finish) — it counts reused tokens, so it measures serving progress.
Labels are VARIANT@ROW (e.g. +storage@urc_swa); runs under one label are that variant's seeds.

  urc_tiers.py --out results/figures/urc_tiers device-only@urc_swa=RUN1 +host@urc_swa=RUN2 ... +storage@urc_all=RUN6
"""
import style  # (first: it answers --help before the plotting libraries load)

import numpy as np
from kvtrace import load_groups

ROWS = {"urc_swa": "FULL + SWA (DeepSeek-V4-Flash-like), TP4", "urc_all": "FULL + SWA + MAMBA (Inkling-like), TP8"}
# The article's end-of-run numbers (its Figure 4 and text), for the caption.
ARTICLE = {"urc_swa": "near 98 % with L3; 145.5K / 14.3K / 9.4K effective input tokens/s (L3 / L1+L2 / L1)",
           "urc_all": "96.8 % with L3; 67.1K / 21.1K / 15.5K effective input tokens/s (L3 / L1+L2 / L1)"}


def per_round(t):
    rounds = np.unique(t["round"])
    hit, ttft, prompt = [], [], []
    for r in rounds:
        s = t[t["round"] == r]
        p = max(int(s["prompt_tokens"].sum()), 1)
        hit.append(100 * int(s["cached_tokens"].sum()) / p)
        ttft.append(float(np.mean(s["ttft_model_ns"])) / 1e6)
        prompt.append(float(np.mean(s["prompt_tokens"])))
    out = float(np.mean(t["output_tokens"])) if len(t) else 0.0
    # Ideal: everything but the round's new tokens (its prompt minus the previous prompt and answer).
    ideal = [0.0] + [100 * (1 - (prompt[k] - prompt[k - 1] - out) / prompt[k]) for k in range(1, len(prompt))]
    return rounds, hit, ttft, ideal


def throughput(t):
    span = (int(t["finish_ns"].max()) - int(t["arrival_ns"].min())) / 1e9
    return float(t["prompt_tokens"].sum()) / span if span > 0 else float("nan")


def main():
    a, groups = style.parse_args(__doc__)
    data = load_groups(groups)
    rows = []
    for label in data:
        if "@" not in label:
            style.die(f"label {label!r}: expected VARIANT@ROW (e.g. +storage@urc_swa)")
        row = label.split("@", 1)[1]
        if row not in rows:
            rows.append(row)
    fig, ax = style.plt.subplots(len(rows), 3, figsize=(14, 4.2 * len(rows)), squeeze=False,
                                 gridspec_kw=dict(width_ratios=[1.2, 1.2, 0.8]))
    notes, spreads = [], []
    for i, row in enumerate(rows):
        labels = [lab for lab in data if lab.split("@", 1)[1] == row]
        variants = [lab.split("@", 1)[0] for lab in labels]
        tput = {}
        ideal_drawn = False
        for k, (lab, var) in enumerate(zip(labels, variants)):
            per = [per_round(t) for _, t in data[lab]]
            rounds, hit = style.by_round([p[0] for p in per], [p[1] for p in per])
            _, ttft = style.by_round([p[0] for p in per], [p[2] for p in per])
            if not ideal_drawn:
                ax[i][0].plot(rounds, per[0][3], color="black", linestyle=":", linewidth=1, label="ideal (1 - new/prompt)")
                ideal_drawn = True
            hm = style.band(ax[i][0], rounds, hit, var, k, markersize=3)
            tm = style.band(ax[i][1], rounds, ttft, var, k, markersize=3)
            spreads += [hm, tm]
            tput[var] = [throughput(t) / 1e3 for _, t in data[lab]]
            last_ideal = per[0][3][-1]
            notes.append((row, f"{var} ends at {hm[0][-1]:.1f} % (ideal {last_ideal:.1f} %), mean TTFT "
                                f"{tm[0][-1]:.0f} ms, {np.mean(tput[var]):.1f}K tokens/s"))
            print(f"{row} {notes[-1][1]}")
        x = np.arange(len(variants))
        for k, var in enumerate(variants):
            rects, mean, lo, hi = style.bars(ax[i][2], [x[k]], tput[var], var, 0.6)
            style.label_bars(ax[i][2], rects, [mean], fmt="{:.1f}K")
        style.headroom(ax[i][2])
        ax[i][2].set_xticks(x, variants)
        ax[i][2].grid(axis="x", visible=False)
        ax[i][0].set_ylabel("prefix hit rate (% of prompt tokens)")
        ax[i][0].set_ylim(-3, 105)
        ax[i][0].legend(loc="lower left", fontsize=7)
        ax[i][1].set_ylabel("mean TTFT (ms, modelled, log)")
        ax[i][1].set_yscale("log")
        ax[i][2].set_ylabel("effective input throughput (K tokens/s)")
        name = ROWS.get(row, row)
        m0 = data[labels[0]][0][0]
        ax[i][0].set_title(f"({chr(97 + 3 * i)}) {name}: hit rate per round")
        ax[i][1].set_title(f"({chr(98 + 3 * i)}) time to first token per round")
        ax[i][2].set_title(f"({chr(99 + 3 * i)}) prompt tokens / modelled time")
        for axis in ax[i][:2]:
            axis.set_xlabel(f"round ({m0['experiment']}, {m0['topology']})")
    title = ("Storage keeps a hybrid model's multi-turn history after the device, then the host, run out\n"
             "(the second article's Figure 4, scaled: hit rate and TTFT per round, effective input throughput)")
    caption = (" ".join(f"{r}, last round: " + "; ".join(t for nr, t in notes if nr == r) + "." for r in rows) +
               " Article (full scale): " + "; ".join(f"{ROWS.get(r, r).split(' (')[0]}: {ARTICLE[r]}" for r in rows if r in ARTICLE) +
               ". The experiments keep the article's rounds and per-round tokens and scale the conversations and the "
               "capacities by the same factor. " + style.spread_note(spreads) + style.MODELLED)
    style.finish(fig, title, caption, a.out, a.vector)


if __name__ == "__main__":
    main()
