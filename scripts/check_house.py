#!/usr/bin/env python3
"""The house rules of the source tree (issue 39), checked: exit 1 naming each breach.

  - no file under src/ over 600 lines (a longer one usually holds two rooms);
  - the CLI (tools/) includes public headers only (lightseg/...), never a src/ header;
  - a public header (include/lightseg/) includes only public headers and system ones;
  - no include circle: following the project's own includes from any file never leads back to it;
  - one SIMD helper set: vector types (`vector_size`) are declared in src/core/simd.h only;
  - x86 intrinsics (_mm*_ calls, __m128/__m256/__m512 types) only in files under an x86/ folder;
  - one CPU feature probe: __builtin_cpu_supports only in src/core/isa.cpp (cpu_isa_level).

Usage: scripts/check_house.py [ROOT] (default: the checkout this script is in).
"""
import os
import re
import sys

MAX_LINES = 600
SIMD_SET = "src/core/simd.h"
FEATURE_PROBE = "src/core/isa.cpp"
INTRINSIC = re.compile(r"\b(_mm\d*_\w+|__m(128|256|512)\w*)\b")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root, top):
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if f.endswith((".h", ".hpp", ".cpp", ".cc")):
                yield os.path.relpath(os.path.join(d, f), root)


def resolve(root, here, name):
    """The project file an #include "name" in `here` reads, or None (a system or generated header)."""
    for base in (os.path.dirname(here), "src", "include", "tools/lightseg"):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    rooms = {d for d in os.listdir(os.path.join(root, "src")) if os.path.isdir(os.path.join(root, "src", d))}
    files = [f for top in ("src", "include", "tools") for f in sources(root, top)]
    breaches = []
    graph = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            text = fh.read()
        names = INCLUDE.findall(text)
        graph[f] = [p for p in (resolve(root, f, n) for n in names) if p]
        if f.startswith("src/") and text.count("\n") > MAX_LINES:
            breaches.append(f"{f}: {text.count(chr(10))} lines (at most {MAX_LINES})")
        code = re.sub(r"//[^\n]*", "", text)  # what comments name is not code
        if f.startswith("src/") and f != SIMD_SET and "vector_size" in code:
            breaches.append(f"{f}: declares a vector type (one SIMD helper set: {SIMD_SET})")
        if f.startswith("src/") and "/x86/" not in f and INTRINSIC.search(code):
            breaches.append(f"{f}: uses x86 intrinsics ({INTRINSIC.search(code).group(0)}) outside an x86/ folder")
        if f.startswith(("src/", "include/", "tools/")) and f != FEATURE_PROBE and "__builtin_cpu_supports" in code:
            breaches.append(f"{f}: probes CPU features itself (one probe: {FEATURE_PROBE}, cpu_isa_level)")
        if f.startswith("tools/"):
            for n in names:
                if n.split("/")[0] in rooms:
                    breaches.append(f'{f}: the CLI includes "{n}", a src/ header (public headers only)')
        if f.startswith("include/"):
            for n in names:
                if not n.startswith("lightseg/"):
                    breaches.append(f'{f}: the public header includes "{n}", not a public header')

    # include circles: a depth-first search that reports each back edge's cycle once
    state, stack, seen_cycles = {}, [], set()

    def visit(f):
        state[f] = 1
        stack.append(f)
        for g in graph.get(f, []):
            if state.get(g) == 1:
                cycle = stack[stack.index(g):] + [g]
                key = frozenset(cycle)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    breaches.append("include circle: " + " -> ".join(cycle))
            elif g not in state:
                visit(g)
        stack.pop()
        state[f] = 2

    sys.setrecursionlimit(10000)
    for f in sorted(graph):
        if f not in state:
            visit(f)

    for b in breaches:
        print(b)
    print(f"check_house: {len(files)} files, {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
