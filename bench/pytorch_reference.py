#!/usr/bin/python3
"""The lightseg network in PyTorch (eager), for speed comparisons with `lightseg bench`.

Needs PyTorch: Debian's `apt-get install python3-torch` (1.13, the same oneDNN as LibTorch),
run with /usr/bin/python3. Nothing in the build or the tests needs it.

Same modules, parameter names and data flow as src/model/*.cpp (docs/NETWORK.md defaults, or a
configuration / weights file), so a .lsw weights file loads here unchanged.

  /usr/bin/python3 bench/pytorch_reference.py --size 360x480 --threads 2          # inference
  /usr/bin/python3 bench/pytorch_reference.py --train --threads 2                  # training
  /usr/bin/python3 bench/pytorch_reference.py --weights m.lsw --save-logits out.npy ...
  python3 bench/pytorch_reference.py --device cuda --precision fp16 --cuda-graph --batch 8  # GPU peer

Inference: eval mode, channels_last, torch.no_grad(), input N×3×H×W RGB 0..255 normalised
inside the timed call (as `lightseg bench` does). On CUDA: cudnn.benchmark, weights and input in
--precision, optionally the call replayed as a CUDA graph; each timed call ends with a synchronize. Training: batch 8, 360×480 crops,
Adam, cross-entropy (ignore 255), channels_last, random data (speed does not depend on it).
The last stdout line with --json is one JSON object.
"""
import argparse
import json
import math
import statistics
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULTS = {
    "in_channels": 3, "c0": 32, "c1": 64, "c2": 128,
    "stage1": {"layers": 3, "type": "FEB", "dilations": [2, 2, 2]},
    "stage2": {"layers": 6, "type": "FEB", "dilations": [4, 4, 8, 8, 16, 16]},
    "feb_ratio": 0.5, "spatial_attention": True, "num_classes": 11,
}
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)


def conv(cin, cout, k=(3, 3), s=1, d=(1, 1), g=1, bias=False):
    k = (k, k) if isinstance(k, int) else k
    d = (d, d) if isinstance(d, int) else d
    return nn.Conv2d(cin, cout, k, s, (d[0] * (k[0] - 1) // 2, d[1] * (k[1] - 1) // 2), d, g, bias)


class BNAct(nn.Module):
    def __init__(self, c, act=True):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.PReLU(c) if act else None

    def forward(self, x):
        x = self.bn(x)
        return self.act(x) if self.act is not None else x


class CBA(nn.Module):  # ConvBNAct
    def __init__(self, cin, cout, k=3, s=1, d=1, g=1, act=True):
        super().__init__()
        self.conv = conv(cin, cout, k, s, d, g)
        self.bn_act = BNAct(cout, act)

    def forward(self, x):
        return self.bn_act(self.conv(x))


class FEB(nn.Module):  # C4.1–C4.8
    def __init__(self, c, d, ratio):
        super().__init__()
        m = max(1, int(math.floor(c * ratio + 0.5)))
        self.dw1 = CBA(c, c, 3, g=c)
        self.pw1 = CBA(c, m, 1)
        self.dw2 = CBA(m, m, 3, g=m)
        self.dw_dilated = CBA(m, m, 3, d=d, g=m)
        self.conv3d = CBA(m, m, 3)
        self.pw2 = CBA(m, c, 1, act=False)
        self.act = nn.PReLU(c)

    def forward(self, x):
        p = self.pw1(self.dw1(x))
        u = p + self.dw2(p) + self.dw_dilated(p)
        return self.act(x + self.pw2(self.conv3d(u)))


class DAB(nn.Module):
    def __init__(self, c, d):
        super().__init__()
        h = c // 2
        self.pre = BNAct(c)
        self.reduce = CBA(c, h, 3)
        self.dw31 = CBA(h, h, (3, 1), g=h)
        self.dw13 = CBA(h, h, (1, 3), g=h)
        self.ddw31 = CBA(h, h, (3, 1), d=(d, 1), g=h)
        self.ddw13 = CBA(h, h, (1, 3), d=(1, d), g=h)
        self.post = BNAct(h)
        self.expand = conv(h, c, 1)

    def forward(self, x):
        y = self.reduce(self.pre(x))
        return self.expand(self.post(self.dw13(self.dw31(y)) + self.ddw13(self.ddw31(y)))) + x


class ResidualBlock(nn.Module):
    def __init__(self, c, d):
        super().__init__()
        self.conv1 = conv(c, c, 3, d=d)
        self.conv2 = conv(c, c, 3)
        self.bn1 = nn.BatchNorm2d(c)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class Downsampling(nn.Module):  # C3.1
    def __init__(self, cin, cout):
        super().__init__()
        self.split = cout > cin
        if self.split:
            self.conv = conv(cin, cout - cin, 3, 2)
            self.bn_act = BNAct(cout)
        else:
            self.cba = CBA(cin, cout, 3, 2)

    def forward(self, x):
        if not self.split:
            return self.cba(x)
        pooled = F.max_pool2d(x, 2, 2, ceil_mode=True)
        return self.bn_act(torch.cat([self.conv(x), pooled], 1))


class SemanticBranch(nn.Module):  # claim 3
    def __init__(self, cin, cout, stage, ratio):
        super().__init__()
        self.down = Downsampling(cin, cout)
        dil = stage.get("dilations") or [1] * stage["layers"]
        kind = stage.get("type", "FEB")
        make = {"FEB": lambda d: FEB(cout, d, ratio), "DAB": lambda d: DAB(cout, d),
                "ResNet": lambda d: ResidualBlock(cout, d)}[kind]
        self.layers = nn.Sequential(*[make(dil[i]) for i in range(stage["layers"])])
        self.fuse = CBA(2 * cout, cout, 1)

    def forward(self, x):
        d = self.down(x)
        return self.fuse(torch.cat([d, self.layers(d)], 1))


class InitModule(nn.Module):
    def __init__(self, cin, c0):
        super().__init__()
        self.conv1 = CBA(cin, c0, 3, 2)
        self.conv2 = CBA(c0, c0, 3)
        self.conv3 = CBA(c0, c0, 3)

    def forward(self, x):
        return self.conv3(self.conv2(self.conv1(x)))


class SpatialBranch(nn.Module):  # claim 2
    def __init__(self, c0):
        super().__init__()
        self.conv1 = CBA(c0, c0, 3, 2)
        self.compress1 = conv(c0, 1, 1, bias=True)
        self.conv2 = CBA(c0, c0, 3, 2)
        self.compress2 = conv(c0, 1, 1, bias=True)

    def forward(self, f1):
        s1 = self.conv1(f1)
        return self.compress1(s1), self.compress2(self.conv2(s1))


class SpatialAttention(nn.Module):  # claims 6–7
    def __init__(self, c1):
        super().__init__()
        self.pw7 = CBA(c1, c1, 1)
        self.conv3d = conv(c1, 1, 3, bias=True)

    def forward(self, x1):
        return x1 * torch.sigmoid(self.conv3d(self.pw7(x1)))


def upsample_to(x, h, w):
    if x.shape[2] == h and x.shape[3] == w:
        return x
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)


class FusionDecoder(nn.Module):  # C1.7–C1.11
    def __init__(self, c0, c1, c2, k, attention):
        super().__init__()
        self.dw3 = CBA(c0, c0, 3, 2, g=c0)
        self.pw3 = CBA(c0, c1, 1)
        self.dw4 = CBA(c1, c1, 3, g=c1)
        self.pw4 = CBA(c1, c1, 1)
        self.pw5 = CBA(c2, c1, 1)
        self.attention = SpatialAttention(c1) if attention else None
        self.pw6 = conv(c1, k, 1, bias=True)

    def forward(self, f1, a1, a2, h, w):
        x1 = self.pw3(self.dw3(f1))
        x2 = self.pw4(self.dw4(a1))
        x3 = upsample_to(self.pw5(a2), a1.shape[2], a1.shape[3])
        if self.attention is not None:
            f = self.attention(x1) + x1 + x2 + x3  # C6.1
        else:
            f = x1 + x2 + x3  # C1.10
        return upsample_to(self.pw6(f), h, w)


class Network(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = dict(DEFAULTS, **cfg)
        self.init = InitModule(c["in_channels"], c["c0"])
        self.spatial = SpatialBranch(c["c0"])
        self.semantic1 = SemanticBranch(c["c0"], c["c1"], c["stage1"], c["feb_ratio"])
        self.semantic2 = SemanticBranch(c["c1"], c["c2"], c["stage2"], c["feb_ratio"])
        self.decoder = FusionDecoder(c["c0"], c["c1"], c["c2"], c["num_classes"], c["spatial_attention"])

    def forward(self, x):
        f1 = self.init(x)
        s1, s2 = self.spatial(f1)
        a1 = self.semantic1(f1) + s1  # C1.4
        a2 = self.semantic2(a1) + s2  # C1.6
        return self.decoder(f1, a1, a2, x.shape[2], x.shape[3])


def read_lsw(path):
    """Reads a lightseg weights file: (config, meta, {name: tensor})."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"LSEGWTS1":
        raise SystemExit(f"error: '{path}' is not a lightseg weights file")
    (n,) = struct.unpack("<Q", data[8:16])
    h = json.loads(data[16:16 + n])
    base = 16 + n
    tensors = {}
    for t in h["tensors"]:
        dt = {"f32": torch.float32, "i64": torch.int64}[t["dtype"]]
        raw = bytearray(data[base + t["offset"]: base + t["offset"] + t["bytes"]])
        tensors[t["name"]] = torch.frombuffer(raw, dtype=dt).reshape(t["shape"]).clone()
    cfg = h["config"].get("network", h["config"])
    return cfg, h.get("meta", {}), tensors


def parse_size(s):
    h, w = s.lower().split("x")
    return int(h), int(w)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def bench_inference(net, args, mean, std):
    h, w = parse_size(args.size)
    cuda = args.device == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    if cuda and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: this torch sees no CUDA GPU")
    if not cuda and dtype != torch.float32:
        raise SystemExit("error: --precision fp16/bf16 is for --device cuda")
    dev = torch.device(args.device)
    if cuda:
        torch.backends.cudnn.benchmark = True
    net.eval()
    net = net.to(device=dev, dtype=dtype, memory_format=torch.channels_last)
    mean = torch.tensor(mean, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(std, device=dev).view(1, 3, 1, 1)
    torch.manual_seed(0)
    x = (torch.rand(args.batch, 3, h, w) * 255).to(dev)

    def run():
        with torch.no_grad():
            y = ((x - mean) / std).to(dtype).contiguous(memory_format=torch.channels_last)
            return net(y)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    graph = None
    if args.cuda_graph:
        if not cuda:
            raise SystemExit("error: --cuda-graph needs --device cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (cuDNN's autotuning) outside the capture
            for _ in range(max(3, args.warmup)):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = run()

        def call():
            graph.replay()
            return static_out
    else:
        call = run
    for _ in range(args.warmup):
        call()
    sync()
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        out = call()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    if args.save_logits:
        import numpy as np
        np.save(args.save_logits, out.float().cpu().contiguous().numpy())
    if args.labels:
        with open(args.labels[0], "rb") as f:
            img = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).view(1, 3, h, w).to(dev)
        with torch.no_grad():
            labels = net(((img - mean) / std).to(dtype).contiguous(memory_format=torch.channels_last)).argmax(1)
        with open(args.labels[1], "wb") as f:
            f.write(labels.to(torch.uint8).cpu().contiguous().numpy().tobytes())
    p50 = statistics.median(times)
    backend = "pytorch-" + ("cuda-graph" if graph is not None else "eager")
    r = {"size": [h, w], "batch": args.batch, "threads": torch.get_num_threads(), "p50_ms": round(p50, 3),
         "p90_ms": round(percentile(times, 0.9), 3), "p99_ms": round(percentile(times, 0.99), 3),
         "fps": round(1e3 / p50, 2), "images_per_s": round(args.batch * 1e3 / p50, 2),
         "backend": backend, "device": args.device, "precision": args.precision, "torch": torch.__version__}
    if cuda:
        r["gpu"] = torch.cuda.get_device_name(0)
    print(f"pytorch {torch.__version__} {backend} on {args.device} ({args.precision}), channels_last, no_grad, "
          f"{r['threads']} threads, batch {args.batch}, {h}x{w}: median {r['p50_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms, "
          f"p99 {r['p99_ms']:.3f} ms, {r['fps']:.1f} FPS, {r['images_per_s']:.1f} images/s")
    return r


def bench_train(net, args, num_classes):
    h, w = parse_size(args.size)
    net.train()
    net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    torch.manual_seed(0)
    x = (torch.randn(args.batch, 3, h, w)).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, num_classes, (args.batch, h, w))
    y[:, :8] = 255  # a few ignored pixels, as in CamVid's void class

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y, ignore_index=255)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    r = {"mode": "train", "size": [h, w], "batch": args.batch, "threads": torch.get_num_threads(),
         "step_ms": round(med * 1e3, 1), "images_per_s": round(args.batch / med, 3),
         "optimizer": "adam", "backend": "pytorch-eager", "torch": torch.__version__}
    print(f"pytorch {torch.__version__} training, channels_last, Adam, {r['threads']} threads, batch "
          f"{args.batch}, {h}x{w}: median step {r['step_ms']:.0f} ms, {r['images_per_s']:.2f} images/s")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="360x480", help="HxW")
    ap.add_argument("--batch", type=int, default=None, help="batch (default 1; 8 with --train)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (default 50; 5 with --train)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed iterations (default 5; 2 with --train)")
    ap.add_argument("--config", help="configuration JSON (lightseg format)")
    ap.add_argument("--weights", help="lightseg weights file (.lsw) to load")
    ap.add_argument("--save-logits", help="write the last logits as .npy (numpy needed)")
    ap.add_argument("--labels", nargs=2, metavar=("INPUT.f32", "LABELS.u8"),
                    help="also run INPUT (float32 1x3xHxW, RGB 0..255) and write its argmax labels (HxW uint8)")
    ap.add_argument("--train", action="store_true", help="measure training images/s instead")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="inference device")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                    help="weights and activations (fp16/bf16: cuda only)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="capture the call (normalisation + network) once as a CUDA graph and time its replays")
    args = ap.parse_args()
    args.batch = args.batch or (8 if args.train else 1)
    args.iters = args.iters or (5 if args.train else 50)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.train else 5)
    torch.set_num_threads(args.threads)

    cfg, mean, std = {}, MEAN, STD
    if args.config:
        with open(args.config) as f:
            j = json.load(f)
        cfg = j.get("network", j)
    tensors = None
    if args.weights:
        cfg, meta, tensors = read_lsw(args.weights)
        mean, std = tuple(meta.get("mean", MEAN)), tuple(meta.get("std", STD))
    torch.manual_seed(0)
    net = Network(cfg)
    if tensors is not None:
        missing = set(net.state_dict()) ^ set(tensors)
        if missing:
            raise SystemExit(f"error: weights do not fit the model: {sorted(missing)[:5]}")
        net.load_state_dict(tensors)
    r = bench_train(net, args, dict(DEFAULTS, **cfg)["num_classes"]) if args.train else \
        bench_inference(net, args, mean, std)
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    sys.exit(main())
