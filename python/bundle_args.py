"""The command line of the reference bundle generators (python/gen_*.py): --out DIR --seed S."""
import argparse
import os

import numpy as np


def parse(doc, seed_offset=0):
    """--out (made if missing) and --seed (default 0), with doc as the help: (out, a generator seeded
    with seed + seed_offset)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed + seed_offset)
    os.makedirs(args.out, exist_ok=True)
    return args.out, rng
