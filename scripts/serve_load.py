#!/usr/bin/env python3
"""Load client for `lightseg serve`: C concurrent clients (one keep-alive connection each) post
the same image to /v1/segment for a fixed time; prints requests/s and latency percentiles.

  build/bin/lightseg serve --port 8080 &
  scripts/serve_load.py --url http://127.0.0.1:8080 --image examples/0016E5_07959.png \
      --clients 4 --seconds 30 [--format ids] [--warmup 3]

Python standard library only; the server does the work, so the GIL does not limit it.
"""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--image", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=3, help="seconds of load before measuring")
    ap.add_argument("--format", default="ids", choices=["ids", "color", "overlay", "json"])
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()

    body = open(a.image, "rb").read()
    u = urllib.parse.urlparse(a.url)
    path = "/v1/segment?format=" + a.format
    lock = threading.Lock()
    latencies, errors, statuses = [], [], {}
    t_start = time.monotonic() + a.warmup
    t_end = t_start + a.seconds

    def client():
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=120)
        while True:
            t0 = time.monotonic()
            if t0 >= t_end:
                break
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/octet-stream"})
                r = conn.getresponse()
                r.read()
                status = r.status
            except Exception as e:  # connection closed by the server (keep-alive limit): reconnect
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=120)
                with lock:
                    errors.append(str(e))
                continue
            t1 = time.monotonic()
            if t0 >= t_start and t1 <= t_end:
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if status == 200:
                        latencies.append((t1 - t0) * 1000)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(latencies)
    res = {
        "clients": a.clients,
        "seconds": a.seconds,
        "requests_ok": len(lat),
        "requests_per_second": len(lat) / a.seconds,
        "p50_ms": percentile(lat, 0.50),
        "p90_ms": percentile(lat, 0.90),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1] if lat else float("nan"),
        "statuses": statuses,
        "connection_errors": len(errors),
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{a.clients} clients, {a.seconds:.0f} s, {a.image}: {res['requests_ok']} ok, "
              f"{res['requests_per_second']:.2f} requests/s; latency p50 {res['p50_ms']:.1f} ms, "
              f"p90 {res['p90_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, max {res['max_ms']:.1f} ms; "
              f"statuses {statuses}, connection errors {len(errors)}")
    return 0 if lat and set(statuses) == {200} else 1


if __name__ == "__main__":
    sys.exit(main())
