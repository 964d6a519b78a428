#!/usr/bin/python3
"""Winograd F(m, r) matrices by Cook-Toom, for src/infer/onednn/kernels/winograd.h.

Points: 0, 1, -1, 2, -2, 1/2, -1/2 (as many as m + r - 2 needs) and infinity. Prints Bᵀ, G and
Aᵀ in exact fractions for F(4,3) and F(6,3) (the kernels' tiles; F(6,3)'s first row of Bᵀ and
of G are negated there, which leaves the product unchanged), or for the F(m,r) given, and
checks each against a direct 1-D correlation on random data (the kernels' 2-D forms are the
nested 1-D ones).

  /usr/bin/python3 scripts/winograd_matrices.py [M R]   # e.g. 6 2 for F(6, 2)
"""
import random
import sys
from fractions import Fraction as Fr

POINTS = [Fr(0), Fr(1), Fr(-1), Fr(2), Fr(-2), Fr(1, 2), Fr(-1, 2)]


def poly(roots):  # coefficients, lowest degree first, of prod (x - a)
    c = [Fr(1)]
    for a in roots:
        n = [Fr(0)] * (len(c) + 1)
        for i, v in enumerate(c):
            n[i + 1] += v
            n[i] -= a * v
        c = n
    return c


def matrices(m, r):
    n = m + r - 1
    pts = POINTS[:n - 1]
    at = [[pts[k] ** i for k in range(n - 1)] + [Fr(1 if i == m - 1 else 0)] for i in range(m)]
    def f(k):
        p = Fr(1)
        for l in range(n - 1):
            if l != k:
                p *= pts[k] - pts[l]
        return p
    g = [[pts[k] ** j / f(k) for j in range(r)] for k in range(n - 1)] + [[Fr(1 if j == r - 1 else 0) for j in range(r)]]
    bt = [(poly([pts[l] for l in range(n - 1) if l != k]) + [Fr(0)])[:n] for k in range(n - 1)] + [poly(pts)[:n]]
    return bt, g, at


def error(m, r, bt, g, at):
    n = m + r - 1
    d = [random.random() for _ in range(n)]
    w = [random.random() for _ in range(r)]
    gw = [sum(float(g[k][j]) * w[j] for j in range(r)) for k in range(n)]
    bd = [sum(float(bt[k][i]) * d[i] for i in range(n)) for k in range(n)]
    y = [sum(float(at[i][k]) * gw[k] * bd[k] for k in range(n)) for i in range(m)]
    return max(abs(y[i] - sum(d[i + j] * w[j] for j in range(r))) for i in range(m))


for m, r in [(int(sys.argv[1]), int(sys.argv[2]))] if len(sys.argv) == 3 else [(4, 3), (6, 3)]:
    bt, g, at = matrices(m, r)
    print(f"F({m}, {r}): largest error against the direct sums {error(m, r, bt, g, at):.1e}")
    for name, mat in [("Bt", bt), ("G", g), ("At", at)]:
        print(f"  {name}:")
        for row in mat:
            print("    " + "  ".join(f"{str(x):>6}" for x in row))
