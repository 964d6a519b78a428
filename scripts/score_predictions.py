#!/usr/bin/env python3
"""Independent check of `lightseg eval --save`: scores saved label-id PNGs against CamVid's
annotations with numpy alone (one confusion matrix over the split, void = 11 ignored).
  scripts/score_predictions.py PRED_DIR ../shared/data/camvid val"""
import sys, numpy as np
from PIL import Image
pred_dir, root, split = sys.argv[1], sys.argv[2], sys.argv[3]
K = 11
cm = np.zeros((K, K), np.int64)
for line in open(f"{root}/{split}.txt"):
    img, lab = line.split()
    gt = np.array(Image.open(f"{root}/{lab}")).astype(np.int64).ravel()
    pr = np.array(Image.open(f"{pred_dir}/{img.split('/')[-1]}")).astype(np.int64).ravel()
    keep = gt < K
    cm += np.bincount(gt[keep] * K + pr[keep], minlength=K * K).reshape(K, K)
iou = np.diag(cm) / (cm.sum(0) + cm.sum(1) - np.diag(cm))
print(f"miou {np.nanmean(iou):.10f} pixel_acc {np.diag(cm).sum() / cm.sum():.10f}")
