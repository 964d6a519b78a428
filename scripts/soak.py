#!/usr/bin/env python3
"""Soak test of `lightseg serve`: N requests from C clients mixing good and bad bodies, each
checked against the status it must get; the server's RSS is sampled throughout.

  build/bin/lightseg serve --port 18090 --threads 2 &
  scripts/soak.py --url http://127.0.0.1:18090 --pid $! --requests 10000 --clients 8 [--json out.json]

Exit 0 when every answer had its expected status and the server is still alive; prints the
counts per kind, the RSS after warm-up (the first 10 % of the requests) and at the end.
Standard library only; loopback only (the URL's host must be 127.0.0.1, ::1 or localhost).
"""
import argparse
import http.client
import json
import random
import struct
import sys
import threading
import time
import urllib.parse
import zlib


def png(width, height, seed):
    """An 8-bit RGB PNG of noise (standard library)."""
    rng = random.Random(seed)
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(width * 3)) for _ in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b""))


def cases(example):
    """(kind, method, path, body, headers, expected statuses)."""
    small = png(96, 64, 1)
    big_header = bytearray(png(64, 64, 2))
    big_header[16:24] = struct.pack(">II", 60000, 60000)  # IHDR claims 3.6 Gpixels (CRC now wrong too)
    smuggled = b"GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    return [
        ("example ids", "POST", "/v1/segment", example, {}, {200}),
        ("example json", "POST", "/v1/segment?format=json", example, {}, {200}),
        ("small overlay", "POST", "/v1/segment?format=overlay&alpha=0.4", small, {}, {200}),
        ("small color", "POST", "/v1/segment?format=color", small, {}, {200}),
        ("truncated png", "POST", "/v1/segment", example[: len(example) // 3], {}, {400}),
        ("garbage", "POST", "/v1/segment", bytes(random.Random(3).randrange(256) for _ in range(2000)), {}, {415}),
        ("gif", "POST", "/v1/segment", b"GIF89a" + b"\x00" * 64, {}, {415}),
        ("empty", "POST", "/v1/segment", b"", {}, {400}),
        ("huge header", "POST", "/v1/segment", bytes(big_header), {}, {400, 413}),
        ("bad format", "POST", "/v1/segment?format=%ff", small, {}, {400}),
        ("bad alpha", "POST", "/v1/segment?format=overlay&alpha=abc", small, {}, {400}),
        ("unknown path", "GET", "/%c0%ae%c0%ae/etc/passwd", None, {}, {404}),
        ("wrong method", "PUT", "/v1/segment", small, {}, {405}),
        ("health", "GET", "/healthz", None, {}, {200}),
        ("model", "GET", "/v1/model", None, {}, {200}),
        # issue 38: costly, hostile and browser-borne requests
        ("costly tta", "POST", "/v1/segment?scales=3,4&flip=1", example, {}, {413}),
        ("snapped tta", "POST", "/v1/segment?scales=1.93,1.95,1.97&flip=1", small, {}, {200}),
        ("length +5", "POST", "/v1/segment", b"hello" + smuggled, {"Content-Length": "+5"}, {400}),
        ("te list", "POST", "/v1/segment", b"5\r\nhello\r\n0\r\n\r\n" + smuggled,
         {"Transfer-Encoding": "gzip, chunked"}, {501}),
        ("get with body", "GET", "/healthz", smuggled, {}, {200}),
        ("many headers", "GET", "/healthz", None, {f"X-a{i}": "b" for i in range(150)}, {431}),
        ("foreign host", "GET", "/v1/model", None, {"Host": "evil.example"}, {421}),
        ("cross-origin post", "POST", "/v1/segment", small, {"Origin": "http://evil.example",
                                                             "Content-Type": "text/plain"}, {403}),
    ]


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:18090")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (RSS)")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--image", default="examples/0016E5_07959.png")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the summary here too")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    if u.hostname not in ("127.0.0.1", "::1", "localhost"):
        sys.exit("soak: loopback only")
    table = cases(open(a.image, "rb").read())
    rng = random.Random(a.seed)
    plan = [rng.randrange(len(table)) for _ in range(a.requests)]
    lock = threading.Lock()
    next_i = [0]
    counts = {c[0]: {"sent": 0, "unexpected": 0} for c in table}
    unexpected = []
    latencies = []
    rss = []  # (request index, kB)
    warm = max(1, a.requests // 10)

    def worker():
        conn = None
        while True:
            with lock:
                i = next_i[0]
                if i >= len(plan):
                    break
                next_i[0] += 1
                if i % 100 == 0:
                    rss.append((i, rss_kb(a.pid)))
            kind, method, path, body, headers, want = table[plan[i]]
            t0 = time.perf_counter()
            status = None
            for attempt in range(2):  # a connection the server closed (after a 4xx) is reopened once
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
                    conn.request(method, path, body=body, headers=headers)
                    r = conn.getresponse()
                    r.read()
                    status = r.status
                    if r.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = None
                    break
                except (OSError, http.client.HTTPException) as e:
                    if conn is not None:
                        conn.close()
                    conn = None
                    status = f"{type(e).__name__}"
            dt = time.perf_counter() - t0
            with lock:
                counts[kind]["sent"] += 1
                latencies.append(dt)
                if status not in want:
                    counts[kind]["unexpected"] += 1
                    if len(unexpected) < 20:
                        unexpected.append((i, kind, status))

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - t0
    rss.append((a.requests, rss_kb(a.pid)))
    alive = rss[-1][1] is not None
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", "/healthz")
        alive = alive and c.getresponse().status == 200
    except OSError:
        alive = False
    after_warm = next((kb for i, kb in rss if i >= warm and kb), None)
    peak = max((kb for _, kb in rss if kb), default=None)
    latencies.sort()
    summary = {
        "requests": a.requests, "clients": a.clients, "seconds": round(seconds, 1),
        "unexpected": sum(v["unexpected"] for v in counts.values()), "first_unexpected": unexpected,
        "alive": alive, "rss_mb_after_warmup": after_warm and round(after_warm / 1024, 1),
        "rss_mb_end": rss[-1][1] and round(rss[-1][1] / 1024, 1), "rss_mb_peak": peak and round(peak / 1024, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1), "per_kind": counts,
    }
    for kind, v in counts.items():
        print(f"{kind:16s} {v['sent']:6d} sent  {v['unexpected']:4d} unexpected")
    print(f"{a.requests} requests, {a.clients} clients, {seconds:.1f} s; unexpected statuses: {summary['unexpected']}; "
          f"server alive: {alive}; RSS after warm-up {summary['rss_mb_after_warmup']} MB, end {summary['rss_mb_end']} MB, "
          f"peak {summary['rss_mb_peak']} MB; latency p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms")
    for u_ in unexpected:
        print("unexpected:", u_)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["unexpected"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
