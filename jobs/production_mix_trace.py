#!/usr/bin/python3
"""Writes the production mix's request trace (Mooncake JSONL: timestamp ms, input_length,
output_length, hash_ids of 512-token blocks) — long prompts with multi-turn reuse and one
request of a million tokens, the shape of the first article's production runs.

  jobs/production_mix_trace.py [--out experiments/traces/production_mix.jsonl] [--total 30000000]
                               [--seed 7] [--huge 1000000] [--rate 2.0]

Conversations open at Poisson times (--rate per second). A conversation's first prompt is
30K-200K tokens, heavy-tailed (a Pareto draw of shape 1.2 from 30K, capped at 200K); each later
turn (1-4 turns, 5 % more likely to continue per turn than the last) repeats the previous prompt's
whole blocks (its reusable prefix), adds the previous answer and 1K-4K new tokens, arrives 2-20 s
of modelled time after the previous turn, and the conversation ends before its context passes
200K. One request of --huge tokens (its own blocks) arrives at a third of the trace's time span.
Prompt tokens stop at --total. Same arguments, same file (seeded).
"""
import argparse
import json
import random
import sys

BLOCK = 512


def generate(total, seed, huge, rate):
    rng = random.Random(seed)
    next_id = 0

    def fresh(n):
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    rows, tokens, t = [], 0, 0.0
    budget = total - huge
    while tokens < budget:
        t += rng.expovariate(rate) * 1000.0
        first = min(200_000, int(30_000 * rng.paretovariate(1.2)))
        if tokens + first > budget:
            break  # the next conversation does not fit: the trace ends
        length, ids, at, turn = first, fresh((first + BLOCK - 1) // BLOCK), t, 0
        while True:
            if tokens + length > budget:
                break
            out = rng.randint(32, 128)
            rows.append({"timestamp": int(at), "input_length": length, "output_length": out, "hash_ids": ids})
            tokens += length
            turn += 1
            if turn >= 4 or rng.random() > 0.45 + 0.05 * turn:
                break
            grown = length + out + rng.randint(1_000, 4_000)
            if grown > 200_000:
                break
            keep = length // BLOCK  # the previous prompt's whole blocks: the reusable prefix
            ids = ids[:keep] + fresh((grown + BLOCK - 1) // BLOCK - keep)
            length, at = grown, at + rng.uniform(2_000, 20_000)
        if not rows:
            break
    span = max(r["timestamp"] for r in rows) if rows else 0
    if huge > 0:
        rows.append({"timestamp": span // 3, "input_length": huge, "output_length": 16,
                     "hash_ids": fresh((huge + BLOCK - 1) // BLOCK)})
    rows.sort(key=lambda r: r["timestamp"])  # (stable: a conversation's turns keep their order)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="experiments/traces/production_mix.jsonl")
    ap.add_argument("--total", type=int, default=30_000_000, help="prompt tokens in all, the huge request included")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--huge", type=int, default=1_000_000, help="tokens of the one huge request (0: none)")
    ap.add_argument("--rate", type=float, default=2.0, help="conversations opened per second (modelled)")
    a = ap.parse_args()
    if a.total <= a.huge or a.rate <= 0:
        print("production_mix_trace.py: --total must exceed --huge and --rate be positive", file=sys.stderr)
        return 2
    rows = generate(a.total, a.seed, a.huge, a.rate)
    if not rows:
        print(f"production_mix_trace.py: no request fits in --total {a.total}", file=sys.stderr)
        return 2
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    import os
    os.replace(tmp, a.out)  # whole or not at all
    lens = [r["input_length"] for r in rows]
    print(f"{a.out}: {len(rows)} requests, {sum(lens):,} prompt tokens, prompts {min(lens):,}-{max(lens):,}, "
          f"seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
