// ONNX Runtime (CPU execution provider) on a lightseg ONNX export, for scripts/bench_peers.py.
//   node bench/peers/ort_bench.mjs MODEL.onnx HxW ITERS THREADS [INPUT.f32 LABELS.u8]
// Times ITERS calls at batch 1 after 5 warm-up ones (random RGB 0..255 input, as `lightseg
// bench`); with INPUT (float32 1×3×H×W, RGB 0..255) also writes the argmax labels (H×W
// uint8) to LABELS. Prints one JSON line: {"p50_ms", "min_ms", "version"}.
// onnxruntime-node lives in bench/peers/node_modules (npm install --prefix bench/peers
// --ignore-scripts onnxruntime-node: its install script fetches a CUDA provider, which fails
// offline; the CPU library is inside the package).
import { createRequire } from 'module';
import fs from 'fs';

const require = createRequire(import.meta.url);
const ort = require('onnxruntime-node');
const [model, size, itersText, threadsText, inputPath, labelsPath] = process.argv.slice(2);
const [H, W] = size.split('x').map(Number);
const iters = Number(itersText), threads = Number(threadsText);
const session = await ort.InferenceSession.create(model, {
  executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
});
const input = session.inputNames[0];
const random = new Float32Array(3 * H * W).map(() => Math.random() * 255);
const feeds = { [input]: new ort.Tensor('float32', random, [1, 3, H, W]) };
for (let i = 0; i < 5; ++i) await session.run(feeds);
const ms = [];
for (let i = 0; i < iters; ++i) {
  const t0 = process.hrtime.bigint();
  await session.run(feeds);
  ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
}
ms.sort((a, b) => a - b);
if (inputPath) {
  const buf = fs.readFileSync(inputPath);
  const x = new Float32Array(buf.buffer, buf.byteOffset, 3 * H * W);
  const out = (await session.run({ [input]: new ort.Tensor('float32', x, [1, 3, H, W]) }))[session.outputNames[0]];
  const K = out.dims[1], n = H * W, labels = new Uint8Array(n);
  for (let p = 0; p < n; ++p) {
    let best = 0;
    for (let k = 1; k < K; ++k) if (out.data[k * n + p] > out.data[best * n + p]) best = k;
    labels[p] = best;
  }
  fs.writeFileSync(labelsPath, labels);
}
console.log(JSON.stringify({ p50_ms: ms[Math.floor(ms.length / 2)], min_ms: ms[0], version: ort.env.versions?.common ?? '' }));
