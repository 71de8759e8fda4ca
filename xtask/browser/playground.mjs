// `cargo xtask browser`: the playground page against the real voxgate server, in headless
// Chromium with a fake microphone that plays a WAV file.
//
// Loads `/`, connects (WebRTC: POST /webrtc/offer, data channel `vip`), then:
//   1. a spoken turn: the fake mic plays the question; expects transcript.user, reply.text and
//      turn.latency (the default server has no recognizer, so the transcript may be a
//      placeholder; the demo agent answers anyway);
//   2. a typed turn ("hello"): expects a reply.text;
//   3. a typed request that runs one of the page's actions ("switch to dark mode"): expects
//      action.invoke set_theme {theme: "dark"}, the page's action.result success, and
//      body[data-theme="dark"];
//   4. screenshots (desktop and 360x640) in the artifacts directory, then Hang up.
// Environment: VOXGATE_PLAYWRIGHT, VOXGATE_URL (the server's base URL), VOXGATE_WAV (the mic
// input), VOXGATE_ARTIFACTS.

import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { assert, fail, launch, timeLimit, watchErrors } from "./common.mjs";

timeLimit(110_000, "the playground end-to-end run");

const base = (process.env.VOXGATE_URL || fail("VOXGATE_URL is not set")).replace(/\/+$/, "");
const wavIn = process.env.VOXGATE_WAV || fail("VOXGATE_WAV is not set");
const artifacts = process.env.VOXGATE_ARTIFACTS || fail("VOXGATE_ARTIFACTS is not set");
mkdirSync(artifacts, { recursive: true });

/** Seconds of silence before the question: the fake mic starts playing at getUserMedia, before
 * the session is up. And after it, long enough that Chromium's looping never replays it. */
const LEAD_S = 4, TAIL_S = 100;

/** The WAV with silence around it (16-bit PCM of any rate and channel count). */
function padWav(src, dst) {
  const buf = readFileSync(src);
  if (buf.toString("ascii", 0, 4) !== "RIFF" || buf.toString("ascii", 8, 12) !== "WAVE") fail(`${src} is not a WAV file`);
  let off = 12, fmt = null, data = null;
  while (off + 8 <= buf.length) {
    const id = buf.toString("ascii", off, off + 4);
    let size = buf.readUInt32LE(off + 4);
    if (id === "data" && (size === 0 || size === 0xffffffff || off + 8 + size > buf.length)) size = buf.length - off - 8; // streamed WAV (espeak-ng to a pipe)
    if (id === "fmt ") fmt = buf.subarray(off + 8, off + 8 + size);
    if (id === "data") { data = buf.subarray(off + 8, off + 8 + size); break; }
    off += 8 + size + (size & 1);
  }
  if (!fmt || !data) fail(`${src}: no fmt or data chunk`);
  const format = fmt.readUInt16LE(0), channels = fmt.readUInt16LE(2), rate = fmt.readUInt32LE(4), bits = fmt.readUInt16LE(14);
  if (format !== 1 || bits !== 16) fail(`${src}: want 16-bit PCM, got format ${format} with ${bits} bits`);
  const frame = channels * 2;
  const lead = Buffer.alloc(LEAD_S * rate * frame), tail = Buffer.alloc(TAIL_S * rate * frame);
  const body = Buffer.concat([lead, data.subarray(0, data.length - (data.length % frame)), tail]);
  const header = Buffer.alloc(44);
  header.write("RIFF", 0); header.writeUInt32LE(36 + body.length, 4); header.write("WAVE", 8);
  header.write("fmt ", 12); header.writeUInt32LE(16, 16); header.writeUInt16LE(1, 20);
  header.writeUInt16LE(channels, 22); header.writeUInt32LE(rate, 24); header.writeUInt32LE(rate * frame, 28);
  header.writeUInt16LE(frame, 32); header.writeUInt16LE(16, 34);
  header.write("data", 36); header.writeUInt32LE(body.length, 40);
  writeFileSync(dst, Buffer.concat([header, body]));
  return { seconds: data.length / frame / rate, rate, channels };
}

const wav = `${artifacts}/mic.wav`;
const info = padWav(wavIn, wav);
console.log(`mic: ${wavIn} (${info.seconds.toFixed(1)} s at ${info.rate} Hz) after ${LEAD_S} s of silence`);

const step = (name) => console.log(`-- ${name}`);
const browser = await launch({ wav });
let page;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  page = await context.newPage();
  const errors = watchErrors(page);
  const events = (dir, type) => page.evaluate(([d, t]) => window.vip.events.filter((e) => e.dir === d && e.type === t).map((e) => e.msg), [dir, type]);
  // `match`: fields the message must have, with a value or {re: "regex"}. No eval in the page,
  // so a Content-Security-Policy without 'unsafe-eval' does not break the test.
  const waitEvent = (dir, type, timeout, match = {}) =>
    page.waitForFunction(([d, t, m]) => window.vip.events.some((e) => e.dir === d && e.type === t &&
      Object.entries(m).every(([k, v]) => (v && typeof v === "object" && "re" in v) ? new RegExp(v.re).test(String(e.msg[k])) : e.msg[k] === v)),
    [dir, type, match], { timeout })
      .catch(() => { throw new Error(`no ${dir === "in" ? "server" : "page"} message ${type}${Object.keys(match).length ? ` with ${JSON.stringify(match)}` : ""} within ${timeout / 1000} s`); });
  const countIn = async (type) => (await events("in", type)).length;
  const waitIdle = (timeout) => page.waitForFunction(() => window.vip.state === "idle", null, { timeout })
    .catch(async () => { throw new Error(`state did not return to idle within ${timeout / 1000} s (it is ${await page.evaluate(() => window.vip.state)})`); });

  step(`load ${base}/`);
  const res = await page.goto(`${base}/`, { waitUntil: "load", timeout: 15_000 }).catch((e) => {
    throw new Error(`GET ${base}/ did not serve the playground page (${e.message.split("\n")[0]})`);
  });
  assert(res && res.ok(), `GET / answered ${res && res.status()}`);
  assert(await page.evaluate(() => typeof window.vip === "object"), "the page at / is not the playground (no window.vip)");

  step("connect");
  await page.click("#connect");
  await waitEvent("in", "session.connected", 15_000).catch(async (e) => {
    const banner = await page.textContent("#error");
    throw new Error(`${e.message}${banner ? `; the page says: ${banner}` : ""}`);
  });
  await waitIdle(5_000);
  await waitEvent("out", "actions.declare", 2_000);
  await waitEvent("out", "state.narrate", 2_000);
  assert((await page.textContent("#status")) === "connected", `status: ${await page.textContent("#status")}`);

  step("spoken turn (the fake mic plays the question)");
  await waitEvent("in", "transcript.user", 30_000);
  await waitEvent("in", "reply.text", 20_000);
  await waitEvent("in", "turn.latency", 20_000);
  await page.waitForSelector('#log li[data-kind="transcript.user"]', { timeout: 2_000 });
  await page.waitForSelector('#log li[data-kind="reply.text"]', { timeout: 2_000 });
  const latency = Number(await page.getAttribute("#latency", "data-last"));
  assert(Number.isFinite(latency) && latency >= 0, `no latency figure in #latency (${await page.textContent("#latency")})`);
  console.log(`   transcript: ${JSON.stringify((await events("in", "transcript.user"))[0].text)}; latency ${latency} ms`);
  await waitIdle(45_000);

  step("typed turn: hello");
  let replies = await countIn("reply.text");
  await page.fill("#text-input", "hello");
  await page.click("#send");
  await page.waitForFunction((n) => window.vip.events.filter((e) => e.dir === "in" && e.type === "reply.text").length > n, replies, { timeout: 20_000 })
    .catch(() => { throw new Error("no reply.text to the typed \"hello\" within 20 s"); });
  await waitIdle(45_000);

  step("typed turn that runs a page action: switch to dark mode");
  replies = await countIn("reply.text");
  await page.fill("#text-input", "switch to dark mode");
  await page.click("#send");
  await waitEvent("in", "action.invoke", 20_000, { action_id: "set_theme" });
  await waitEvent("out", "action.result", 5_000, { status: "success" });
  await page.waitForSelector('body[data-theme="dark"]', { timeout: 2_000 });
  await page.waitForSelector('#log li[data-kind="action.invoke"]', { timeout: 2_000 });
  await page.waitForSelector('#log li[data-kind="action.result"]', { timeout: 2_000 });
  const invoke = (await events("in", "action.invoke")).find((m) => m.action_id === "set_theme");
  assert(invoke.parameters && invoke.parameters.theme === "dark", `set_theme parameters: ${JSON.stringify(invoke.parameters)}`);
  await waitEvent("out", "state.narrate", 3_000, { text: { re: "Theme: dark" } });
  await waitIdle(45_000);

  step("screenshots");
  await page.screenshot({ path: `${artifacts}/playground.png`, fullPage: true });
  await page.setViewportSize({ width: 360, height: 640 });
  await page.waitForTimeout(200);
  await page.screenshot({ path: `${artifacts}/playground-phone.png` });
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  assert(wide <= 360, `at 360x640 the page is ${wide}px wide`);

  step("hang up");
  await page.click("#hangup");
  await waitEvent("out", "session.end", 2_000);
  await page.waitForFunction(() => document.body.dataset.connection === "disconnected", null, { timeout: 5_000 });

  const fatal = await events("in", "error.fatal");
  assert(fatal.length === 0, `the server sent error.fatal: ${JSON.stringify(fatal)}`);
  const refused = await events("in", "error");
  assert(refused.length === 0, `the server refused page messages: ${JSON.stringify(refused)}`);
  assert(errors.length === 0, `JS errors in the page: ${errors.join("; ")}`);
  console.log(`playground end-to-end: passed; screenshots in ${artifacts}`);
} catch (e) {
  if (page) {
    await page.screenshot({ path: `${artifacts}/playground-failure.png`, fullPage: true }).catch(() => {});
    const log = await page.evaluate(() => window.vip && window.vip.events.map((e) => `${e.dir} ${JSON.stringify(e.msg)}`).join("\n")).catch(() => "");
    if (log) writeFileSync(`${artifacts}/vip-events.log`, log);
    console.error(`messages so far (${artifacts}/vip-events.log):\n${(log || "").split("\n").slice(-30).join("\n")}`);
  }
  await browser.close().catch(() => {});
  fail(e.message);
}
await browser.close();
process.exit(0);
