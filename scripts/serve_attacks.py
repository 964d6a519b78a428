#!/usr/bin/env python3
"""The hostile and costly traffic of issue 38, measured against a running `lightseg serve`
(loopback only; standard library only). Each check prints one JSON line.

  build/bin/lightseg serve --port 18091 --threads 2 &
  scripts/serve_attacks.py --port 18091 --pid $! flood        # N1: 2 header floods for 30 s
  scripts/serve_attacks.py --port 18091 --pid $! slow         # N2: 41 uploads at 9 kB/s + a normal POST
  scripts/serve_attacks.py --port 18091 --pid $! smuggle      # N3/N4: the smuggling variants
  scripts/serve_attacks.py --port 18091 --pid $! costly       # N5: the TTA request, time and peak RSS
  scripts/serve_attacks.py --port 18091 --pid $! limit-shapes # N5: 4 shapes at the pixel limit in turn
  scripts/serve_attacks.py --port 18091 --pid $! sizes        # N6: 20 rotating sizes, a small image between
"""
import argparse
import json
import socket
import struct
import sys
import threading
import time
import zlib


def png(width, height, seed=1):
    """An 8-bit RGB PNG of a smooth pattern (cheap to make at any size)."""
    row = bytes((x * 7 + seed * 13) & 255 for x in range(width * 3))
    raw = b"".join(b"\x00" + row[y % 3:] + row[:y % 3] for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class RssSampler:
    """Samples the server's RSS every 50 ms while it runs."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop_ = pid, 0.0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            self.peak = max(self.peak, rss_mb(self.pid) or 0)
            time.sleep(0.05)

    def stop(self):
        self.stop_ = True
        self.t.join()
        return self.peak


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s, timeout):
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def statuses(data):
    return [int(data[i + 9:i + 12]) for i in range(len(data)) if data.startswith(b"HTTP/1.1 ", i)]


def request(port, method, path, body=b"", headers=None, timeout=120):
    s = connect(port)
    s.settimeout(timeout)
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "image/png", "Connection": "close"}
    h.update(headers or {})
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    t0 = time.monotonic()
    s.sendall(head.encode() + body)
    data = read_all(s, timeout)
    s.close()
    head_end = data.find(b"\r\n\r\n")
    hdrs = {}
    for line in data[:head_end].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        hdrs[k.decode().lower()] = v.decode().strip()
    return {"status": statuses(data[:12])[0] if data.startswith(b"HTTP/1.1 ") else None,
            "seconds": round(time.monotonic() - t0, 3), "headers": hdrs, "body": data[head_end + 4:]}


def flood(a):
    """N1: 2 clients stream header lines as fast as they can for --seconds."""
    before = rss_mb(a.pid)
    sampler = RssSampler(a.pid)
    results = [None, None]

    def client(i):
        """Streams header lines until the server answers and closes, then again, until --seconds."""
        lines = b"".join(b"X-a%d: b\r\n" % k for k in range(2000))
        sent, t0, codes, first = 0, time.monotonic(), {}, None
        while time.monotonic() - t0 < a.seconds:
            s = connect(a.port)
            s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            s.setblocking(False)
            got, c0 = b"", time.monotonic()
            while time.monotonic() - t0 < a.seconds:
                try:
                    sent += s.send(lines)
                except BlockingIOError:
                    time.sleep(0.001)
                except (BrokenPipeError, ConnectionResetError):
                    break
                try:
                    b = s.recv(65536)
                    if not b:
                        break
                    got += b
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    break
            s.setblocking(True)
            got += read_all(s, 1)
            s.close()
            st = statuses(got)[:1]
            key = str(st[0]) if st else "none"
            codes[key] = codes.get(key, 0) + 1
            if first is None:
                first = round(time.monotonic() - c0, 3)
        results[i] = {"sent_bytes": sent, "connections_by_status": codes, "first_answer_after_s": first}

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = sampler.stop()
    time.sleep(1)
    print(json.dumps({"check": "flood", "clients": results, "rss_before_mb": round(before, 1),
                      "rss_peak_mb": round(peak, 1), "rss_after_mb": round(rss_mb(a.pid), 1)}))


def slow(a):
    """N2: 41 uploads at 9 kB/s, then one normal POST timed."""
    stop = False
    conns = []
    for _ in range(41):
        s = connect(a.port)
        s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                  b"Content-Length: 16000000\r\n\r\n")
        conns.append(s)

    def trickle():
        while not stop:
            for s in conns:
                try:
                    s.send(b"x" * 900)  # 9 kB/s each at 10 sends a second
                except OSError:
                    pass
            time.sleep(0.1)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(2)
    img = png(480, 360)
    answers = []
    for _ in range(5):
        r = request(a.port, "POST", "/v1/segment", img)
        answers.append({"status": r["status"], "seconds": r["seconds"]})
        time.sleep(0.5)
    stop = True
    t.join()
    for s in conns:
        s.close()
    print(json.dumps({"check": "slow", "uploaders": 41, "normal_requests": answers}))


def smuggle(a):
    """N3/N4: a short first framing, a GET /v1/model after it."""
    smuggled = b"GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    body = b"hello" + smuggled
    variants = {
        "two lengths": b"Content-Length: 5\r\nContent-Length: %d\r\n" % len(body),
        "+5": b"Content-Length: +5\r\n",
        "5abc": b"Content-Length: 5abc\r\n",
        "0x5": b"Content-Length: 0x5\r\n",
        "TE Chunked": b"Transfer-Encoding: Chunked\r\n",
        "TE gzip, chunked": b"Transfer-Encoding: gzip, chunked\r\n",
        "TE xchunked": b"Transfer-Encoding: xchunked\r\n",
        "GET with a body": None,
    }
    out = {}
    for name, framing in variants.items():
        s = connect(a.port)
        t0 = time.monotonic()
        if framing is None:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled)
        elif name == "TE Chunked":
            s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled)
        else:
            s.sendall(b"POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\n" + body)
        data = read_all(s, 12)
        out[name] = {"statuses": statuses(data), "closed_after_s": round(time.monotonic() - t0, 2),
                     "model_served": b'"classes"' in data}
        s.close()
    print(json.dumps({"check": "smuggle", "variants": out}))


def costly(a):
    """N5: the TTA request of the issue on a 1024x1024 PNG, and a plain one at the pixel limit."""
    big = png(1024, 1024)
    limit = png(2048, 2048)
    small = png(480, 360)
    out = []
    for name, body, path in [("tta 1.93..1.99 + flip, 1024^2", big, "/v1/segment?format=ids&scales=1.93,1.95,1.97,1.99&flip=1"),
                             ("tta again (plans cached)", big, "/v1/segment?format=ids&scales=1.93,1.95,1.97,1.99&flip=1"),
                             ("plain 2048^2 (the pixel limit)", limit, "/v1/segment?format=ids"),
                             ("plain 480x360", small, "/v1/segment?format=ids")]:
        before = rss_mb(a.pid)
        sampler = RssSampler(a.pid)
        r = request(a.port, "POST", path, body, timeout=600)
        peak = sampler.stop()
        out.append({"request": name, "status": r["status"], "seconds": r["seconds"],
                    "augmentation": r["headers"].get("x-augmentation"), "queue_ms": r["headers"].get("x-queue-ms"),
                    "inference_ms": r["headers"].get("x-inference-ms"), "rss_before_mb": round(before, 1),
                    "rss_peak_mb": round(peak, 1), "vm_hwm_mb": round(hwm_mb(a.pid), 1)})
    print(json.dumps({"check": "costly", "requests": out}))


def limit_shapes(a):
    """N5's memory: shapes at the pixel limit in turn (each a plan of its own)."""
    out = []
    for w, h in [(2048, 2048), (2040, 2056), (2056, 2040), (2032, 2064), (2048, 2048)]:
        sampler = RssSampler(a.pid)
        r = request(a.port, "POST", "/v1/segment", png(w, h), timeout=300)
        peak = sampler.stop()
        out.append({"size": f"{w}x{h}", "status": r["status"], "seconds": r["seconds"], "rss_peak_mb": round(peak, 1),
                    "vm_hwm_mb": round(hwm_mb(a.pid), 1), "rss_after_mb": round(rss_mb(a.pid), 1)})
    print(json.dumps({"check": "limit-shapes", "requests": out}))


def sizes(a):
    """N6: 20 image sizes in turn, a 64x48 image timed between them."""
    small = png(64, 48)
    times, big_times = [], []
    for rnd in range(2):
        for i in range(20):
            w, h = 320 + 16 * i, 240 + 12 * i
            r = request(a.port, "POST", "/v1/segment", png(w, h, i))
            big_times.append(r["seconds"])
            r = request(a.port, "POST", "/v1/segment", small)
            times.append(r["seconds"])
    times.sort()
    print(json.dumps({"check": "sizes", "small_median_s": times[len(times) // 2], "small_max_s": times[-1],
                      "rotating_median_s": sorted(big_times)[len(big_times) // 2], "rotating_max_s": max(big_times)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18091)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("check", choices=["flood", "slow", "smuggle", "costly", "limit-shapes", "sizes"])
    a = ap.parse_args()
    {"flood": flood, "slow": slow, "smuggle": smuggle, "costly": costly, "limit-shapes": limit_shapes,
     "sizes": sizes}[a.check](a)


if __name__ == "__main__":
    sys.exit(main())
