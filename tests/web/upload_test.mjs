// Drives lightseg's web page in headless Debian chromium (playwright-core, no browser download):
// before any upload no image box shows (no broken-image icons); choose an image → the overlay,
// legend, latency and download links appear; the colour mask downloads as NAME_color.png; scales and
// mirror → the server runs and names that augmentation; a non-image → an error message and
// nothing of the previous result (overlay, shares, latency, downloads); /favicon.ico is an icon, not a 404;
// drop an image → the overlay again. Run by tests/test_serve.cpp (WebPage.*) against a test
// server, or by hand against any running `lightseg serve`:
//   npm ci --prefix tests/web      # once (playwright-core, pinned in package-lock.json)
//   node tests/web/upload_test.mjs --url http://127.0.0.1:8080/ --image examples/0016E5_07959.png \
//        [--bad some.txt] [--screenshot web.png] [--chromium /usr/bin/chromium]
// Exit code 0: passed; 1: failed; 77: skipped (no chromium or playwright-core).
import { existsSync, readFileSync } from "node:fs";
import { basename } from "node:path";
import { createRequire } from "node:module";

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const url = args.url, image = args.image;
const chromiumPath = args.chromium || process.env.LIGHTSEG_CHROMIUM || "/usr/bin/chromium";
if (!url || !image) {
  console.error("usage: node upload_test.mjs --url URL --image FILE [--bad FILE] [--screenshot PNG] [--chromium PATH]");
  process.exit(2);
}
if (!existsSync(chromiumPath)) {
  console.log(`SKIP: no chromium at ${chromiumPath} (apt-get install chromium)`);
  process.exit(77);
}
let chromium;
try {
  const require = createRequire(import.meta.url);
  ({ chromium } = require("playwright-core"));
} catch (e) {
  console.log("SKIP: playwright-core is not installed (npm ci --prefix tests/web)");
  process.exit(77);
}

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exitCode = 1;
  throw new Error(msg);
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 820 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // Everything must come from the server itself: refuse any other host.
  const origin = new URL(url).origin;
  await page.route("**/*", (route) => {
    const u = route.request().url();
    if (u.startsWith(origin) || u.startsWith("data:") || u.startsWith("blob:")) return route.continue();
    pageErrors.push("request to another host: " + u);
    return route.abort();
  });

  await page.goto(url);
  await page.waitForFunction(() => !document.getElementById("model").textContent.startsWith("loading"));
  const modelText = await page.textContent("#model");
  if (!/classes/.test(modelText)) fail("model line did not load: " + modelText);
  const nClasses = await page.locator("#legend li").count();
  if (nClasses < 2) fail("legend not shown before upload (" + nClasses + " entries)");
  for (const id of ["#input", "#overlay", "#downloads"])
    if (await page.isVisible(id)) fail(id + " visible before any upload (a broken-image icon or a dead link)");
  // from node, not the page: playwright's routing (above) fails every fetch of /favicon.ico
  const favicon = await fetch(new URL("/favicon.ico", url));
  if (favicon.status !== 200 || !(favicon.headers.get("content-type") || "").startsWith("image/"))
    fail("/favicon.ico answered " + favicon.status + " " + favicon.headers.get("content-type"));

  // 1. choose a file
  const overlayReady = () => page.waitForSelector('#overlay[data-ready="1"]', { timeout: 60000 });
  await page.setInputFiles("#file", image);
  await overlayReady();
  const sizes = await page.evaluate(() => {
    const o = document.getElementById("overlay"), i = document.getElementById("input");
    return { ow: o.naturalWidth, oh: o.naturalHeight, iw: i.naturalWidth, ih: i.naturalHeight };
  });
  if (!(sizes.ow > 0 && sizes.ow === sizes.iw && sizes.oh === sizes.ih))
    fail("overlay size differs from the input: " + JSON.stringify(sizes));
  const shares = await page.$$eval("#legend li .pct", (els) => els.map((e) => parseFloat(e.textContent.replace("<", ""))));
  const total = shares.reduce((a, b) => a + (isNaN(b) ? 0 : b), 0);
  if (shares.length !== nClasses || Math.abs(total - 100) > 1)
    fail(`legend shares do not add up: ${shares.length} entries, ${total.toFixed(1)} %`);
  const latency = await page.textContent("#latency");
  if (!/server: \d+(\.\d)? ms/.test(latency) || !/network: /.test(latency)) fail("no latency shown: " + latency);
  if (await page.isVisible("#error")) fail("error box visible after a good upload: " + (await page.textContent("#error")));
  if (!(await page.isVisible("#input")) || !(await page.isVisible("#overlay"))) fail("input or overlay not shown after an upload");
  if (!(await page.isVisible("#downloads"))) fail("no download links after an upload");
  const stem = basename(image).replace(/\.[^.]*$/, "");
  const overlayLink = await page.getAttribute("#dl-overlay", "href");
  if (!overlayLink.startsWith("data:image/png;base64,")) fail("overlay download is not the PNG: " + overlayLink.slice(0, 40));
  if ((await page.getAttribute("#dl-overlay", "download")) !== stem + "_overlay.png") fail("overlay download name");
  const [dl] = await Promise.all([page.waitForEvent("download", { timeout: 60000 }), page.click("#dl-color")]);
  if (dl.suggestedFilename() !== stem + "_color.png") fail("colour mask download named " + dl.suggestedFilename());
  // the overlay really is a picture with colour in it (not blank)
  const distinct = await page.evaluate(() => {
    const o = document.getElementById("overlay");
    const c = document.createElement("canvas");
    c.width = o.naturalWidth; c.height = o.naturalHeight;
    const g = c.getContext("2d");
    g.drawImage(o, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let k = 0; k < d.length; k += 4 * 97) seen.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
    return seen.size;
  });
  if (distinct < 10) fail("overlay looks blank (" + distinct + " distinct colours)");

  // 2. test-time augmentation: the controls reach the server, which names what it ran
  const defaultAug = await page.evaluate(async () => (await (await fetch("/v1/model")).json()).augmentation.text);
  if (!latency.includes("augmentation: " + defaultAug))
    fail("the first request should run the server's default augmentation (" + defaultAug + "): " + latency);
  const augShown = (re) => page.waitForFunction(
      (src) => new RegExp(src).test(document.getElementById("augmentation")?.textContent || ""), re.source,
      { timeout: 60000 });
  await page.uncheck("#flip");
  await page.selectOption("#scales", "1");
  await augShown(/augmentation: none$/);
  await page.selectOption("#scales", "1,1.25");
  await augShown(/augmentation: scales 1,1.25$/);
  await page.evaluate(() => { document.getElementById("overlay").dataset.ready = ""; });
  await page.check("#flip");
  await augShown(/augmentation: scales 1,1.25 \+ flip$/);
  await overlayReady();
  if (await page.isVisible("#error")) fail("error box visible after an augmented request: " + (await page.textContent("#error")));

  // 3. a file that is not an image: a clear error, no crash
  if (args.bad) {
    await page.setInputFiles("#file", args.bad);
    await page.waitForSelector("#error:not([hidden])", { timeout: 30000 });
    const err = await page.textContent("#error");
    if (!/not an image|unsupported|corrupt|empty/.test(err)) fail("unexpected error text: " + err);
    console.log("error shown for a non-image: " + err);
    if ((await page.textContent("#latency")) !== "") fail("the previous latency stays after a failed upload");
    const left = await page.$$eval("#legend li .pct", (els) => els.filter((e) => e.textContent !== "").length);
    if (left) fail("the previous legend shares stay after a failed upload (" + left + " entries)");
    if (await page.isVisible("#overlay")) fail("the previous overlay stays after a failed upload");
    if (await page.isVisible("#downloads")) fail("download links stay after a failed upload");
  }

  // 4. drop the image onto the drop zone
  const b64 = readFileSync(image).toString("base64");
  await page.evaluate(([data, name]) => {
    const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([bytes], name, { type: name.endsWith(".png") ? "image/png" : "image/jpeg" }));
    document.getElementById("drop").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, [b64, basename(image)]);
  await overlayReady();
  if (await page.isVisible("#error")) fail("error box still visible after dropping a good image");

  if (args.screenshot) await page.screenshot({ path: args.screenshot, fullPage: true });
  if (pageErrors.length) fail("page errors: " + pageErrors.join("; "));
  const present = shares.filter((s) => s > 0).length;
  console.log(`overlay shown: ${sizes.ow}x${sizes.oh}, ${present} of ${nClasses} classes present, ${latency.split("ms")[0]}ms` +
              (args.screenshot ? `; screenshot ${args.screenshot}` : ""));
} catch (e) {
  if (!process.exitCode) {
    console.error("FAIL: " + (e && e.stack ? e.stack : e));
    process.exitCode = 1;
  }
} finally {
  await browser.close();
}
