#!/usr/bin/python3
"""OpenCV DNN (CPU) on a lightseg ONNX export, for scripts/bench_peers.py.

  /usr/bin/python3 bench/peers/opencv_bench.py MODEL.onnx HxW ITERS THREADS [INPUT.f32 LABELS.u8]

Times ITERS forward passes at batch 1 after 5 warm-up ones (random RGB 0..255 input); with
INPUT (float32 1x3xHxW, RGB 0..255) also writes the argmax labels (HxW uint8). Prints one
JSON line: {"p50_ms", "min_ms", "version"}. Needs Debian's python3-opencv.
"""
import json
import sys
import time

import cv2
import numpy as np

model, size, iters, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h, w = (int(v) for v in size.split("x"))
cv2.setNumThreads(threads)
net = cv2.dnn.readNetFromONNX(model)
net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
x = (np.random.rand(1, 3, h, w) * 255).astype(np.float32)
for _ in range(5):
    net.setInput(x)
    net.forward()
ms = []
for _ in range(iters):
    t0 = time.perf_counter()
    net.setInput(x)
    net.forward()
    ms.append((time.perf_counter() - t0) * 1e3)
ms.sort()
if len(sys.argv) > 6:
    img = np.fromfile(sys.argv[5], dtype=np.float32).reshape(1, 3, h, w)
    net.setInput(img)
    np.argmax(net.forward()[0], axis=0).astype(np.uint8).tofile(sys.argv[6])
print(json.dumps({"p50_ms": ms[len(ms) // 2], "min_ms": ms[0], "version": cv2.__version__}))
