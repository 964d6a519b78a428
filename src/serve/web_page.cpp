// The web page of `lightseg serve` (GET /): one self-contained document — no downloads, no
// external scripts or styles — so the binary works offline and from any folder.
#include <string>

#include "serve/web_page.h"

namespace lightseg {

const std::string& web_page_html() {
  static const std::string page = R"lightseg(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lightseg</title>
<link rel="icon" href="data:,">
<style>
  :root { --bg: #f6f7f9; --fg: #1d2330; --muted: #687082; --card: #fff; --line: #dde1e8; --accent: #2f6fde; --err: #b3261e; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background: var(--bg); color: var(--fg); }
  header { padding: 14px 24px; background: var(--card); border-bottom: 1px solid var(--line); display: flex; gap: 16px; align-items: baseline; flex-wrap: wrap; }
  header h1 { margin: 0; font-size: 20px; }
  header #model { color: var(--muted); font-size: 13px; }
  main { padding: 20px 24px; display: grid; grid-template-columns: minmax(0, 1fr) 260px; gap: 20px; max-width: 1400px; }
  @media (max-width: 900px) { main { grid-template-columns: 1fr; } }
  #drop { border: 2px dashed var(--line); border-radius: 10px; background: var(--card); padding: 22px; text-align: center; cursor: pointer; transition: border-color .15s, background .15s; }
  #drop.over { border-color: var(--accent); background: #eef3fd; }
  #drop p { margin: 0 0 10px; }
  #controls { display: flex; gap: 18px; align-items: center; flex-wrap: wrap; margin: 14px 0; color: var(--muted); font-size: 14px; }
  #controls label { display: flex; gap: 8px; align-items: center; }
  #views { display: grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: 14px; }
  figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 10px; }
  figure img { width: 100%; height: auto; display: block; border-radius: 6px; image-rendering: auto; background: #eceff3; min-height: 60px; }
  figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
  aside { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 14px; align-self: start; }
  aside h2 { font-size: 15px; margin: 0 0 8px; }
  #legend { list-style: none; margin: 0; padding: 0; }
  #legend li { display: grid; grid-template-columns: 18px 1fr auto; gap: 8px; align-items: center; padding: 3px 0; font-size: 14px; }
  #legend li.absent { color: #a3a9b6; }
  #legend .sw { width: 18px; height: 18px; border-radius: 4px; border: 1px solid rgba(0,0,0,.15); }
  #legend .pct { font-variant-numeric: tabular-nums; color: var(--muted); }
  #latency { font-variant-numeric: tabular-nums; margin-top: 12px; font-size: 14px; }
  #error { color: var(--err); background: #fcebea; border: 1px solid #f3c4c0; border-radius: 8px; padding: 10px 12px; margin: 12px 0 0; }
  #status { color: var(--muted); }
  #downloads { display: flex; gap: 14px; flex-wrap: wrap; margin-top: 10px; font-size: 14px; }
  #downloads a { color: var(--accent); }
  [hidden] { display: none !important; }
</style>
</head>
<body>
<header>
  <h1>lightseg</h1>
  <span id="model">loading model…</span>
</header>
<main>
  <section>
    <div id="drop" tabindex="0" role="button" aria-label="Choose or drop an image">
      <p><strong>Drop an image here</strong> or choose one (PNG or JPEG)</p>
      <input id="file" type="file" accept="image/png,image/jpeg">
    </div>
    <div id="controls">
      <label>Opacity <input id="alpha" type="range" min="0" max="1" step="0.05" value="0.5"> <span id="alphaval">0.50</span></label>
      <label title="Test-time augmentation: the predictions at these input scales are averaged (one forward pass each)">Scales
        <select id="scales">
          <option value="1">1 (plain)</option>
          <option value="1,1.25">1, 1.25</option>
          <option value="1,1.25,1.5">1, 1.25, 1.5</option>
          <option value="0.75,1,1.25">0.75, 1, 1.25</option>
        </select></label>
      <label title="Test-time augmentation: also average each scale mirrored left-right (twice the passes)"><input id="flip" type="checkbox"> Mirror</label>
      <span id="status"></span>
    </div>
    <div id="error" role="alert" hidden></div>
    <div id="views">
      <figure id="inputfig" hidden><img id="input" alt="input image"><figcaption id="inputcap">input</figcaption></figure>
      <figure id="overlayfig" hidden><img id="overlay" alt="segmentation overlay"><figcaption id="overlaycap">overlay</figcaption></figure>
    </div>
    <div id="downloads" hidden>
      <a id="dl-overlay" href="#" download="overlay.png">Download overlay</a>
      <a id="dl-color" href="#" data-format="color">Download colour mask</a>
      <a id="dl-ids" href="#" data-format="ids">Download label ids (8-bit PNG)</a>
    </div>
  </section>
  <aside>
    <h2>Classes</h2>
    <ul id="legend"></ul>
    <div id="latency"></div>
  </aside>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let model = null, current = null, busy = false, again = false;

function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }

function showLegend(classes) {
  const ul = $("legend");
  ul.textContent = "";
  const rows = classes.slice().sort((a, b) => (b.share || 0) - (a.share || 0) || a.id - b.id);
  for (const c of rows) {
    const li = document.createElement("li");
    if (c.share === 0) li.className = "absent";
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = rgb(c.color);
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = c.name;
    const pct = document.createElement("span");
    pct.className = "pct";
    pct.textContent = c.share === undefined ? "" : c.share > 0 && c.share < 0.0005 ? "<0.1%" : (100 * c.share).toFixed(1) + "%";
    li.append(sw, name, pct);
    ul.append(li);
  }
}

// After a failed request nothing of the previous result stays: no overlay, shares, latency or downloads.
function clearResult() {
  $("status").textContent = "";
  $("overlay").removeAttribute("src");
  $("overlay").dataset.ready = "";
  $("overlayfig").hidden = true;
  $("latency").textContent = "";
  $("downloads").hidden = true;
  $("dl-overlay").href = "#";
  if (model) showLegend(model.classes.map((name, id) => ({ id, name, color: model.palette[id] })));
  else $("legend").textContent = "";
}

function stem() { return current && current.name ? current.name.replace(/\.[^.]*$/, "") : "image"; }

function query() {
  return "&scales=" + $("scales").value + "&flip=" + ($("flip").checked ? 1 : 0);
}

// The colour mask and the label ids: one more request each, on click, saved as NAME_color.png / NAME.png.
async function download(e) {
  e.preventDefault();
  if (!current) return;
  const fmt = e.currentTarget.dataset.format;
  try {
    const r = await fetch("/v1/segment?format=" + fmt + query(), {
      method: "POST",
      headers: { "Content-Type": current.type || "application/octet-stream" },
      body: current,
    });
    if (!r.ok) { let j = null; try { j = await r.json(); } catch (x) {} showError((j && j.error) || ("HTTP " + r.status)); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url;
    a.download = stem() + (fmt === "ids" ? ".png" : "_" + fmt + ".png");
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (x) {
    showError("download failed: " + x);
  }
}

function showError(msg) {
  $("error").textContent = msg;
  $("error").hidden = !msg;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/model");
    model = await r.json();
    $("model").textContent = (model.dataset || model.arch) + " · " + model.num_classes + " classes · " +
      (model.parameters / 1e6).toFixed(2) + " M parameters · " + model.backend + " on " + model.device +
      (model.weights ? " · " + model.weights : "");
    showLegend(model.classes.map((name, id) => ({ id, name, color: model.palette[id] })));
    const aug = model.augmentation;
    if (aug) {  // the server's default augmentation
      const sel = $("scales"), v = aug.scales.join(",");
      if (![...sel.options].some((o) => o.value === v)) sel.add(new Option(aug.scales.join(", "), v));
      sel.value = v;
      $("flip").checked = !!aug.flip;
    }
  } catch (e) {
    $("model").textContent = "model information unavailable (" + e + ")";
  }
}

async function segment() {
  if (!current) return;
  if (busy) { again = true; return; }
  busy = true;
  showError("");
  $("status").textContent = "segmenting…";
  const alpha = $("alpha").value;
  const t0 = performance.now();
  try {
    const r = await fetch("/v1/segment?format=json&image=overlay&alpha=" + alpha + query(), {
      method: "POST",
      headers: { "Content-Type": current.type || "application/octet-stream" },
      body: current,
    });
    const roundTrip = performance.now() - t0;
    let j = null;
    try { j = await r.json(); } catch (e) { j = { error: "HTTP " + r.status + " (no JSON body)" }; }
    if (!r.ok) {
      showError(j.error || ("HTTP " + r.status));
      clearResult();
      return;
    }
    const img = $("overlay");
    img.onload = () => { img.dataset.ready = "1"; $("overlayfig").hidden = false; };
    img.dataset.ready = "";
    img.src = j.image;
    $("dl-overlay").href = j.image;
    $("dl-overlay").download = stem() + "_overlay.png";
    $("downloads").hidden = false;
    $("overlaycap").textContent = "overlay · " + j.width + "×" + j.height;
    showLegend(j.classes);
    const L = j.latency_ms;
    $("latency").innerHTML = "";
    const lines = [
      ["server", L.total], ["queue", L.queue || 0], ["network", L.inference], ["decode", L.decode], ["encode", L.encode], ["round trip", roundTrip]];
    for (const [k, v] of lines) {
      const d = document.createElement("div");
      d.textContent = k + ": " + v.toFixed(1) + " ms";
      $("latency").append(d);
    }
    const d = document.createElement("div");
    d.id = "augmentation";
    d.textContent = "augmentation: " + j.augmentation;
    $("latency").append(d);
    $("status").textContent = "done in " + roundTrip.toFixed(0) + " ms";
  } catch (e) {
    showError("request failed: " + e);
    clearResult();
  } finally {
    busy = false;
    if (again) { again = false; segment(); }
  }
}

function choose(file) {
  if (!file) return;
  current = file;
  const url = URL.createObjectURL(file);
  const inp = $("input");
  inp.onload = () => {
    $("inputfig").hidden = false;
    $("inputcap").textContent = "input · " + file.name + " · " + inp.naturalWidth + "×" + inp.naturalHeight;
  };
  inp.onerror = () => { $("inputfig").hidden = true; };  // not an image the browser shows: the server's error says why
  inp.src = url;
  segment();
}

$("file").addEventListener("change", (e) => choose(e.target.files[0]));
const drop = $("drop");
drop.addEventListener("click", (e) => { if (e.target !== $("file")) $("file").click(); });
drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") $("file").click(); });
for (const ev of ["dragenter", "dragover"])
  drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.add("over"); });
for (const ev of ["dragleave", "drop"])
  drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.remove("over"); });
drop.addEventListener("drop", (e) => { $("file").value = ""; choose(e.dataTransfer.files[0]); });
$("alpha").addEventListener("input", () => { $("alphaval").textContent = Number($("alpha").value).toFixed(2); });
$("alpha").addEventListener("change", segment);
$("scales").addEventListener("change", segment);
$("flip").addEventListener("change", segment);
$("dl-color").addEventListener("click", download);
$("dl-ids").addEventListener("click", download);
loadModel();
</script>
</body>
</html>
)lightseg";
  return page;
}

}  // namespace lightseg
