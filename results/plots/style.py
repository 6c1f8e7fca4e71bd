"""What every plot script shares: the command line, one colour per variant, spreads over seeds,
titles and captions, and writing PNG + PDF.

Every script is called the same way:

    script.py --out OUT_BASENAME [LABEL=]RUN_DIR ...

and writes OUT_BASENAME.png and OUT_BASENAME.pdf (`--vector svg` for SVG). Runs given under the
same LABEL form one group (one variant over several seeds); a run without LABEL= is labelled by
its directory's name. The old order (OUT.png first or last, no --out) is still accepted.
"""
import argparse
import os
import sys
import textwrap

_IMAGE_EXT = (".png", ".pdf", ".svg")


def _parser(doc, kind):
    what = {"runs": "[LABEL=]RUN_DIR", "run": "RUN_DIR", "sweep": "SWEEP_DIR"}[kind]
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage=f"%(prog)s --out OUT_BASENAME {what}" + (" ..." if kind == "runs" else ""))
    ap.add_argument("--out", metavar="OUT_BASENAME",
                    help="writes OUT_BASENAME.png and OUT_BASENAME.pdf (a .png/.pdf/.svg suffix is dropped)")
    ap.add_argument("--vector", choices=("pdf", "svg"), default="pdf", help="the vector format next to the PNG")
    ap.add_argument("runs", nargs="+", metavar=what,
                    help={"runs": "a run directory (or its run.h5); runs under the same LABEL are one variant's seeds",
                          "run": "one run directory (or its run.h5)",
                          "sweep": "a jobs/sweep.sh output directory (with sweep.h5)"}[kind])
    return ap, what


# `--help` needs no plotting library: it is answered here, before matplotlib and numpy are imported
# (0.6 s a call). A script imports this module first; one whose arguments are not runs says which
# (PLOT_ARGS = "run" or "sweep") before importing it.
if any(a in ("-h", "--help") for a in sys.argv[1:]) and "__main__" in sys.modules:
    _main = sys.modules["__main__"]
    _parser(_main.__doc__, getattr(_main, "PLOT_ARGS", "runs"))[0].parse_args()  # (prints the help, exits)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 120
plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.25, "grid.linewidth": 0.6, "legend.frameon": False,
    "pdf.fonttype": 42, "svg.fonttype": "none",
})

# One colour per variant, the same in every panel of every figure (Okabe-Ito, colour-blind safe).
# Baselines are grey; the variant a figure argues for is blue; a buggy or weaker variant vermillion.
GREY, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#7a7a7a", "#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7")
COLORS = {
    "run": BLUE,
    # tiers
    "device-only": GREY, "+host": ORANGE, "+storage": BLUE,
    # pp_sync (and the prefetch consensus pair)
    "pp_sync": GREEN, "independent_polling": VERMILLION, "pp_consensus": GREEN, "per_rank": VERMILLION,
    # cp_sharding
    "replicated": GREY, "sharded": BLUE,
    # spec_draft
    "hicache-off": GREY, "target_only": VERMILLION, "packed": BLUE, "sidecar": GREEN,
    # pd
    "full_transfer": GREY, "decode_reuse": BLUE,
    # sessions
    "lru": GREY, "session": BLUE,
}
_SPARE = [PURPLE, SKY, YELLOW, ORANGE, GREEN, VERMILLION, BLUE, GREY]
# Tiers are told apart by hatching, so that colour stays the variant's.
TIER_HATCH = {"device": "", "host": "////", "storage": "xxx"}
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", "-.", ":"]


def color(label):
    """The variant's colour: fixed for the labels above, else a spare one picked by the label."""
    if label in COLORS:
        return COLORS[label]
    return _SPARE[sum(label.encode()) % len(_SPARE)]


# ---- the command line ------------------------------------------------------------------------


def parse_args(doc, kind="runs"):
    """Parses `--out OUT [LABEL=]RUN_DIR...`. kind "runs": one or more runs, grouped by label;
    "run": exactly one run; "sweep": exactly one sweep directory. Returns (args, groups) with
    groups an ordered {label: [run dir, ...]}; args.out is the basename without extension."""
    ap, what = _parser(doc, kind)
    a = ap.parse_args()
    runs = list(a.runs)
    if a.out is None:  # the old order: OUT.png before (variant scripts) or after (single-run scripts) the runs
        legacy = [r for r in runs if r.lower().endswith(_IMAGE_EXT) and "=" not in r]
        if len(legacy) != 1:
            ap.error("--out OUT_BASENAME is required")
        a.out = legacy[0]
        runs.remove(legacy[0])
    a.out = os.path.splitext(a.out)[0] if a.out.lower().endswith(_IMAGE_EXT) else a.out
    groups = {}
    for r in runs:
        label, path = _split_label(r)
        if label is None:
            label = "run" if kind != "runs" else os.path.basename(os.path.normpath(path))
        groups.setdefault(label, []).append(path)
    n = sum(len(v) for v in groups.values())
    if kind in ("run", "sweep") and n != 1:
        ap.error(f"expected one {what}, got {n}")
    for paths in groups.values():
        for p in paths:
            if not os.path.exists(p):
                ap.error(f"{p}: no such run directory or file")
    return a, groups


def _split_label(arg):
    if "=" in arg:
        label, path = arg.split("=", 1)
        if label and os.sep not in label:
            return label, path
    return None, arg


# ---- numbers over seeds ----------------------------------------------------------------------

def spread(per_seed):
    """mean, min and max over seeds: of per-seed numbers (three floats) or of equally long per-seed
    sequences (three arrays; NaN where a seed lacks a value)."""
    a = np.array(per_seed, dtype=float)
    with np.errstate(all="ignore"):
        if a.ndim == 1:  # one number per seed
            return float(np.nanmean(a)), float(np.nanmin(a)), float(np.nanmax(a))
        return np.nanmean(a, axis=0), np.nanmin(a, axis=0), np.nanmax(a, axis=0)


def by_round(per_seed_rounds, per_seed_values):
    """Aligns per-seed (rounds, values) on the union of rounds: (rounds, [seed][round] with NaN)."""
    rounds = np.unique(np.concatenate([np.asarray(r) for r in per_seed_rounds]))
    rows = []
    for rs, vs in zip(per_seed_rounds, per_seed_values):
        d = dict(zip((int(x) for x in rs), vs))
        rows.append([d.get(int(r), np.nan) for r in rounds])
    return rounds, rows


def band(ax, x, per_seed, label, i=0, **kw):
    """A variant's mean over seeds as a line, its min-max as a shaded band (several seeds)."""
    mean, lo, hi = spread(per_seed)
    c = color(label)
    line, = ax.plot(x, mean, color=c, marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)],
                    label=label, **kw)
    if len(per_seed) > 1:
        ax.fill_between(x, lo, hi, color=c, alpha=0.18, linewidth=0)
    return mean, lo, hi


def bars(ax, x, per_seed, label, width, **kw):
    """A variant's bars (mean over seeds) with min-max error bars when there are several seeds."""
    mean, lo, hi = spread(per_seed)
    err = np.vstack([mean - lo, hi - mean]) if len(per_seed) > 1 else None
    kw.setdefault("edgecolor", "black")
    kw.setdefault("linewidth", 0.4)
    b = ax.bar(x, mean, width, color=kw.pop("color", color(label)), label=label, yerr=err,
               error_kw=dict(ecolor="black", elinewidth=0.8, capsize=2), **kw)
    return b, mean, lo, hi


def label_bars(ax, rects, values, fmt="{:.1f}", tops=None, fontsize=7, rotation=0):
    """Writes each value above its bar (above its error bar when `tops` gives the bar's top)."""
    for k, (r, v) in enumerate(zip(rects, values)):
        y = tops[k] if tops is not None else r.get_height() + r.get_y()
        ax.annotate(fmt.format(v), (r.get_x() + r.get_width() / 2, y), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=fontsize, rotation=rotation)


def headroom(ax, factor=1.18):
    """Room above the tallest bar or line for the labels written there."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, lo + (hi - lo) * factor)


def spread_note(spreads, threshold=0.01):
    """A caption sentence when the min-max spread over seeds is too small to see: each of
    `spreads` is a (mean, min, max) of arrays or numbers."""
    worst = 0.0
    for mean, lo, hi in spreads:
        mean, lo, hi = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (mean, lo, hi))
        scale = np.nanmax(np.abs(mean)) if np.any(np.isfinite(mean)) else 0.0
        if scale > 0:
            worst = max(worst, float(np.nanmax(hi - lo)) / scale)
    if worst < threshold:
        return f"Over the seeds, no value spreads by more than {100 * threshold:g} % of its panel's largest value (bands too thin to see). "
    return ""


def pct_change(new, base):
    return 100.0 * (new - base) / base if base else float("nan")


def seeds_text(seeds):
    """'seed 1', 'seeds 1-3' or 'seeds 1, 4, 9'."""
    s = sorted(set(int(x) for x in seeds))
    if len(s) == 1:
        return f"seed {s[0]}"
    if s == list(range(s[0], s[-1] + 1)):
        return f"seeds {s[0]}\u2013{s[-1]}"
    return "seeds " + ", ".join(str(x) for x in s)


def seeds_caption(metas_by_label):
    """'seeds 1-3 per variant' when every variant ran the same seeds, else per variant."""
    per = {lab: seeds_text(m["seed"] for m in ms) for lab, ms in metas_by_label.items()}
    if len(set(per.values())) == 1:
        n = len(next(iter(metas_by_label.values())))
        return next(iter(per.values())) + (" per variant" if len(per) > 1 else "") + \
            (" (mean; shaded bands and error bars: min\u2013max over seeds)" if n > 1 else "")
    return "; ".join(f"{lab}: {s}" for lab, s in per.items())


# ---- title, caption and output ---------------------------------------------------------------

MODELLED = "Times are modelled by kvgrid's cost model (8B model, H100-class constants), not measured."


def finish(fig, title, caption, out, vector="pdf"):
    """Titles the figure with its claim, writes the caption under the panels, lays them out so
    that nothing overlaps, and writes OUT.png and OUT.<vector>."""
    w, h = fig.get_size_inches()
    fig.suptitle(title, fontsize=11.5, fontweight="bold")
    text = fig.text(0.01, 0.008, "", ha="left", va="bottom", fontsize=7.5, color="#333333", linespacing=1.3)
    renderer = fig.canvas.get_renderer()
    width_chars = int(w * 72 / (7.5 * 0.5))
    while True:  # wrap the caption to the figure's width, as rendered
        lines = []
        for para in caption.split("\n"):
            lines += textwrap.wrap(para, width_chars) or [""]
        text.set_text("\n".join(lines))
        if text.get_window_extent(renderer).width <= 0.98 * w * fig.dpi or width_chars < 40:
            break
        width_chars -= 4
    bottom = (len(lines) * 7.5 * 1.3 / 72 + 0.12) / h
    title_lines = title.count("\n") + 1
    top = 1 - (title_lines - 1) * 11.5 * 1.3 / 72 / h  # tight_layout leaves room for the first line itself
    fig.tight_layout(rect=(0, bottom, 1, top), h_pad=1.2, w_pad=1.5)
    save(fig, out, vector)


def save(fig, out, vector="pdf"):
    d = os.path.dirname(out)
    if d:
        os.makedirs(d, exist_ok=True)
    paths = [f"{out}.png", f"{out}.{vector}"]
    fig.savefig(paths[0], dpi=DPI, metadata={"Software": None})
    # No creation date in the vector file, so that the same traces give the same bytes.
    fig.savefig(paths[1], metadata={"CreationDate": None} if vector == "pdf" else {"Date": None})
    plt.close(fig)
    print("wrote " + " and ".join(paths))
    return paths


def die(msg):
    sys.exit(f"{os.path.basename(sys.argv[0])}: {msg}")
