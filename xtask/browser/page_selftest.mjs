// `cargo xtask browser --selftest`: the playground page alone, no voxgate server.
//
// Serves crates/voxgate-server/src/playground/index.html from a tiny HTTP server on 127.0.0.1
// (which also answers POST /webrtc/offer with a 503 error, to see the page report it), loads it
// in headless Chromium and checks: no JS errors, the stable ids, the JSON Schema validator, the
// action handlers and the messages the page sends (by injecting server messages through
// window.vip._handle), the log, the latency figure, the typed turn, the connect path up to the
// signalling error, and the layout at 360x640 and on a desktop (screenshots in the artifacts
// directory). Environment: VOXGATE_PLAYWRIGHT, VOXGATE_PAGE (the HTML file), VOXGATE_ARTIFACTS.

import http from "node:http";
import { readFileSync, mkdirSync } from "node:fs";
import { assert, fail, launch, timeLimit, watchErrors } from "./common.mjs";

timeLimit(90_000, "the page self-test");

const pagePath = process.env.VOXGATE_PAGE || fail("VOXGATE_PAGE is not set");
const artifacts = process.env.VOXGATE_ARTIFACTS || fail("VOXGATE_ARTIFACTS is not set");
mkdirSync(artifacts, { recursive: true });
const html = readFileSync(pagePath);

const offers = [];
const server = http.createServer((req, res) => {
  if (req.method === "GET" && (req.url === "/" || req.url === "/index.html")) {
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end(html);
  } else if (req.method === "POST" && req.url === "/webrtc/offer") {
    let body = "";
    req.on("data", (c) => { body += c; if (body.length > 70_000) req.destroy(); });
    req.on("end", () => {
      offers.push({ contentType: req.headers["content-type"], body });
      res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "7" });
      res.end(JSON.stringify({ error: { code: "busy", message: "the door is full (self-test)" } }));
    });
  } else {
    res.writeHead(404, { "Content-Type": "text/plain" });
    res.end("not found");
  }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}/`;

const results = [];
async function check(name, fn) {
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name}`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e.message}`);
  }
}

const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  // The connect check provokes a 503 on purpose; Chromium logs failed fetches as console errors.
  const errors = watchErrors(page, [/Failed to load resource.*503/]);
  await page.goto(url, { waitUntil: "load" });

  const outOfType = (type) => page.evaluate((t) => window.vip.events.filter((e) => e.dir === "out" && e.type === t).map((e) => e.msg), type);
  const inject = (msg) => page.evaluate((m) => window.vip._handle(m), msg);
  const invoke = async (id, action_id, parameters) => {
    await inject({ type: "action.invoke", invocation_id: id, action_id, parameters });
    await page.waitForFunction((i) => window.vip.events.some((e) => e.dir === "out" && e.type === "action.result" && e.msg.invocation_id === i), id, { timeout: 5000 });
    return (await outOfType("action.result")).find((m) => m.invocation_id === id);
  };

  await check("stable ids exist", async () => {
    const ids = ["connect", "hangup", "mute", "interrupt", "status", "state", "log", "text-input", "send", "latency", "level", "error", "theme", "settings-toggle", "settings-panel", "server-url", "stun-url", "form", "name", "email", "note", "remote-audio"];
    const missing = await page.evaluate((ids) => ids.filter((id) => !document.getElementById(id)), ids);
    assert(missing.length === 0, `missing ids: ${missing.join(", ")}`);
    assert(await page.evaluate(() => typeof window.vip === "object" && typeof window.vip._handle === "function"), "window.vip hook missing");
    assert((await page.getAttribute("body", "data-theme")) === "light", "initial theme is not light");
    assert((await page.inputValue("#server-url")) === url.replace(/\/$/, ""), "server URL does not default to the page's origin");
    assert(await page.isDisabled("#hangup"), "hang up enabled before connecting");
  });

  await check("nothing is fetched from another origin", async () => {
    const external = await page.evaluate(() => [...document.querySelectorAll("[src],[href]")].map((e) => e.getAttribute("src") || e.getAttribute("href")).filter((u) => /^(https?:)?\/\//.test(u)));
    assert(external.length === 0, `external references: ${external.join(", ")}`);
  });

  await check("JSON Schema subset validator", async () => {
    const cases = await page.evaluate(() => {
      const v = window.vip.validate;
      const s = { type: "object", properties: { theme: { type: "string", enum: ["light", "dark"] }, n: { type: "integer", minimum: 1 }, x: { type: "number" }, b: { type: "boolean" }, o: { type: "object", properties: { s: { type: "string", maxLength: 3 } }, required: ["s"] } }, required: ["theme"], additionalProperties: false };
      return {
        ok: v(s, { theme: "dark", n: 2, x: 1.5, b: false, o: { s: "abc" } }),
        notObject: v(s, "dark"),
        array: v(s, []),
        missing: v(s, {}),
        badEnum: v(s, { theme: "blue" }),
        extra: v(s, { theme: "dark", colour: 1 }),
        notInteger: v(s, { theme: "dark", n: 1.5 }),
        belowMin: v(s, { theme: "dark", n: 0 }),
        nan: v(s, { theme: "dark", x: "1" }),
        notBool: v(s, { theme: "dark", b: "true" }),
        nested: v(s, { theme: "dark", o: { s: "abcd" } }),
        nestedMissing: v(s, { theme: "dark", o: {} }),
        escaped: v({ type: "object", properties: { "a/b": { type: "string" } } }, { "a/b": 1 }),
      };
    });
    const paths = (errs) => errs.map((e) => e.path);
    assert(cases.ok.length === 0, `valid value refused: ${JSON.stringify(cases.ok)}`);
    assert(cases.notObject.length === 1 && cases.notObject[0].path === "", "string accepted as object");
    assert(cases.array.length === 1, "array accepted as object");
    assert(cases.missing.length === 1 && cases.missing[0].path === "" && /theme/.test(cases.missing[0].message), `missing required: ${JSON.stringify(cases.missing)}`);
    assert(JSON.stringify(paths(cases.badEnum)) === '["/theme"]', `enum: ${JSON.stringify(cases.badEnum)}`);
    assert(cases.extra.length === 1 && /colour/.test(cases.extra[0].message), `additionalProperties: ${JSON.stringify(cases.extra)}`);
    assert(JSON.stringify(paths(cases.notInteger)) === '["/n"]', "1.5 accepted as integer");
    assert(JSON.stringify(paths(cases.belowMin)) === '["/n"]', "minimum not checked");
    assert(JSON.stringify(paths(cases.nan)) === '["/x"]', "string accepted as number");
    assert(JSON.stringify(paths(cases.notBool)) === '["/b"]', "string accepted as boolean");
    assert(JSON.stringify(paths(cases.nested)) === '["/o/s"]', `nested maxLength: ${JSON.stringify(cases.nested)}`);
    assert(JSON.stringify(paths(cases.nestedMissing)) === '["/o"]', "nested required");
    assert(JSON.stringify(paths(cases.escaped)) === '["/a~1b"]', "JSON Pointer escaping");
  });

  await check("session.connected: declares actions and narrates", async () => {
    await inject({ type: "session.connected", session_id: "s-test", protocol: "vip/1", audio: { codec: "opus", sample_rate: 48000, channels: 1 }, limits: { max_actions: 32, max_narrated_state_bytes: 4096, max_action_result_bytes: 16384, max_message_bytes: 65536 } });
    const declares = await outOfType("actions.declare");
    assert(declares.length === 1, "no actions.declare");
    const acts = declares[0].actions;
    for (const id of ["set_theme", "open_settings", "fill_field"]) {
      assert(acts[id] && typeof acts[id].description === "string" && acts[id].parameters.type === "object", `action ${id} not declared properly`);
    }
    assert(JSON.stringify(acts.fill_field.parameters.properties.field.enum) === '["name","email","note"]', "fill_field enum");
    const narr = await outOfType("state.narrate");
    assert(narr.length === 1 && /Theme: light/.test(narr[0].text) && /Settings panel: closed/.test(narr[0].text), `narration: ${JSON.stringify(narr)}`);
    const events = await page.evaluate(() => window.vip.events.filter((e) => e.dir === "out").map((e) => e.type));
    assert(events.indexOf("actions.declare") < events.indexOf("state.narrate"), "narration before the declaration");
    assert((await page.textContent("#state")) === "idle", "state not idle after session.connected");
    assert((await page.textContent("#status")) === "connected", "status not connected");
  });

  await check("state messages are mirrored", async () => {
    for (const s of ["listening", "processing", "action", "speaking", "idle"]) {
      await inject({ type: "state", state: s, previous: null, turn: 1 });
      assert((await page.textContent("#state")) === s, `#state is not ${s}`);
      assert((await page.getAttribute("body", "data-state")) === s, `body[data-state] is not ${s}`);
    }
  });

  await check("set_theme dark: page turns dark, success result, narration", async () => {
    const before = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const r = await invoke("inv-1", "set_theme", { theme: "dark" });
    assert(r.status === "success" && r.data && r.data.theme === "dark", `result: ${JSON.stringify(r)}`);
    assert((await page.getAttribute("body", "data-theme")) === "dark", "body[data-theme] not dark");
    assert((await page.getAttribute("#theme", "aria-pressed")) === "true", "#theme not pressed");
    await page.waitForTimeout(300); // the colour transition
    const after = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert(before !== after, `background did not change (${before})`);
    await page.waitForFunction(() => window.vip.events.some((e) => e.dir === "out" && e.type === "state.narrate" && /Theme: dark/.test(e.msg.text)), null, { timeout: 3000 });
    assert(await page.locator('#log li[data-kind="action.invoke"]').count() === 1, "no action.invoke entry in the log");
    assert(/set_theme: success/.test(await page.locator('#log li[data-kind="action.result"]').last().textContent()), "no action.result entry");
  });

  await check("invalid parameters are refused in the page", async () => {
    const r = await invoke("inv-2", "set_theme", { theme: "blue" });
    assert(r.status === "error" && r.error.code === "invalid_parameters", `result: ${JSON.stringify(r)}`);
    assert(Array.isArray(r.error.details) && r.error.details[0].path === "/theme" && typeof r.error.details[0].message === "string", `details: ${JSON.stringify(r.error.details)}`);
    assert((await page.getAttribute("body", "data-theme")) === "dark", "the theme changed on invalid parameters");
    const r2 = await invoke("inv-3", "fill_field", { field: "name" });
    assert(r2.status === "error" && r2.error.code === "invalid_parameters" && r2.error.details.some((d) => /value/.test(d.message)), `missing value: ${JSON.stringify(r2)}`);
    const r3 = await invoke("inv-4", "fill_field", { field: "password", value: "x" });
    assert(r3.error && r3.error.code === "invalid_parameters" && r3.error.details[0].path === "/field", `field enum: ${JSON.stringify(r3)}`);
    const r4 = await invoke("inv-5", "open_settings", { open: true, evil: 1 });
    assert(r4.error && r4.error.code === "invalid_parameters", `additionalProperties: ${JSON.stringify(r4)}`);
    const r5 = await invoke("inv-6", "set_theme", "dark");
    assert(r5.error && r5.error.code === "invalid_parameters" && r5.error.details[0].path === "", `non-object: ${JSON.stringify(r5)}`);
    assert(await page.isHidden("#settings-panel"), "settings opened on invalid parameters");
  });

  await check("unknown action", async () => {
    const r = await invoke("inv-7", "format_disk", {});
    assert(r.status === "error" && r.error.code === "unknown_action" && !("details" in r.error), `result: ${JSON.stringify(r)}`);
  });

  await check("open_settings opens the panel (no parameters)", async () => {
    const r = await invoke("inv-8", "open_settings", {});
    assert(r.status === "success", JSON.stringify(r));
    assert(await page.isVisible("#settings-panel"), "settings panel not visible");
    assert((await page.getAttribute("#settings-toggle", "aria-expanded")) === "true", "aria-expanded not true");
    const r2 = await invoke("inv-9", "open_settings", { open: false });
    assert(r2.status === "success" && await page.isHidden("#settings-panel"), "open=false did not close");
    await invoke("inv-10", "open_settings", { open: true });
    await page.waitForFunction(() => window.vip.events.some((e) => e.dir === "out" && e.type === "state.narrate" && /Settings panel: open/.test(e.msg.text)), null, { timeout: 3000 });
  });

  await check("fill_field fills the form and narrates it", async () => {
    const r = await invoke("inv-11", "fill_field", { field: "email", value: "ada@example.org" });
    assert(r.status === "success", JSON.stringify(r));
    assert((await page.inputValue("#email")) === "ada@example.org", "email not filled");
    await invoke("inv-12", "fill_field", { field: "note", value: "call me \"later\"" });
    assert((await page.inputValue("#note")) === 'call me "later"', "note not filled");
    await page.waitForFunction(() => window.vip.events.some((e) => e.dir === "out" && e.type === "state.narrate" && e.msg.text.includes("ada@example.org") && e.msg.text.includes("later")), null, { timeout: 3000 });
    // A person typing is narrated too (debounced).
    await page.fill("#name", "Ada");
    await page.waitForFunction(() => window.vip.events.some((e) => e.dir === "out" && e.type === "state.narrate" && e.msg.text.includes('name = "Ada"')), null, { timeout: 3000 });
  });

  await check("action.cancelled is logged", async () => {
    await inject({ type: "action.invoke", invocation_id: "inv-13", action_id: "set_theme", parameters: { theme: "light" } });
    await inject({ type: "action.cancelled", invocation_id: "inv-13", error: { code: "timeout", message: "no result in time" } });
    const t = await page.locator('#log li[data-kind="action.cancelled"]').last().textContent();
    assert(/set_theme/.test(t) && /timeout/.test(t), `entry: ${t}`);
  });

  await check("spoken turn: transcript, reply per turn, latency", async () => {
    await inject({ type: "transcript.user", turn: 7, text: "what time is it" });
    await inject({ type: "reply.text", turn: 7, text: "It is noon." });
    await inject({ type: "reply.text", turn: 7, text: "Anything else?" });
    await inject({ type: "turn.latency", turn: 7, end_of_speech_to_first_audio_ms: 412.4, end_of_speech_to_transcript_ms: 120 });
    await inject({ type: "reply.done", turn: 7, interrupted: false });
    await inject({ type: "turn.latency", turn: 8, end_of_speech_to_first_audio_ms: 300, end_of_speech_to_transcript_ms: null });
    await inject({ type: "turn.latency", turn: 9, end_of_speech_to_first_audio_ms: 900, end_of_speech_to_transcript_ms: null });
    assert((await page.locator('#log li[data-kind="transcript.user"]').last().textContent()).includes("what time is it"), "transcript missing");
    const replies = page.locator('#log li[data-kind="reply.text"][data-turn="7"]');
    assert(await replies.count() === 1, "one reply entry per turn");
    assert((await replies.textContent()).includes("It is noon. Anything else?"), `reply text: ${await replies.textContent()}`);
    assert((await page.getAttribute("#latency", "data-last")) === "900", "last latency");
    assert((await page.getAttribute("#latency", "data-median")) === "412", "median latency");
    assert((await page.getAttribute("#latency", "data-count")) === "3", "latency count");
    assert(/median 412 ms/.test(await page.textContent("#latency")), "latency text");
    assert(await page.locator('#log li[data-kind="turn.latency"]').count() === 3, "per-turn latency entries");
  });

  await check("text fragments are concatenated; interrupted replies marked", async () => {
    await inject({ type: "reply.text", turn: 10, text: "Hel" });
    await inject({ type: "reply.text", turn: 10, text: "lo there" });
    await inject({ type: "reply.done", turn: 10, interrupted: true });
    const li = page.locator('#log li[data-kind="reply.text"][data-turn="10"]');
    assert((await li.locator(".text").textContent()) === "Hello there", `fragments: ${await li.textContent()}`);
    assert((await li.getAttribute("data-interrupted")) === "true", "not marked interrupted");
  });

  await check("typed turn sends input.text", async () => {
    await page.fill("#text-input", "hello");
    await page.click("#send");
    const sent = await outOfType("input.text");
    assert(sent.length === 1 && sent[0].text === "hello", JSON.stringify(sent));
    assert((await page.inputValue("#text-input")) === "", "input not cleared");
    assert((await page.locator('#log li[data-kind="input.text"]').last().textContent()).includes("hello"), "typed turn not logged");
    await page.fill("#text-input", "   ");
    await page.press("#text-input", "Enter");
    assert((await outOfType("input.text")).length === 1, "blank text sent");
  });

  await check("errors are shown; server text is not HTML", async () => {
    await inject({ type: "error", code: "unknown_type", message: "<img src=x onerror=alert(1)>", details: [{ path: "", message: "x" }] });
    await inject({ type: "error.fatal", code: "shutdown", message: "server going away" });
    assert(await page.locator("#log img").count() === 0, "server text rendered as HTML");
    assert((await page.locator('#log li[data-kind="error"]').last().textContent()).includes("unknown_type"), "error not logged");
    assert(await page.isVisible("#error") && /shutdown/.test(await page.textContent("#error")), "fatal error not shown");
    assert(await page.evaluate(() => window.vip.events.filter((e) => e.dir === "in").length) > 10, "incoming events not recorded");
  });

  await check("desktop screenshot, no horizontal overflow", async () => {
    await page.screenshot({ path: `${artifacts}/selftest-desktop.png`, fullPage: true });
    const w = await page.evaluate(() => document.documentElement.scrollWidth);
    assert(w <= 1280, `page is ${w}px wide`);
  });

  await check("phone 360x640: fits, big touch targets", async () => {
    await page.setViewportSize({ width: 360, height: 640 });
    await page.waitForTimeout(100);
    const w = await page.evaluate(() => document.documentElement.scrollWidth);
    assert(w <= 360, `page is ${w}px wide at 360`);
    const small = await page.evaluate(() => [...document.querySelectorAll("button, input, textarea")]
      .filter((e) => e.offsetParent !== null)
      .map((e) => ({ id: e.id, r: e.getBoundingClientRect() }))
      .filter(({ r }) => r.height < 44 || r.width < 44).map(({ id, r }) => `${id} ${Math.round(r.width)}x${Math.round(r.height)}`));
    assert(small.length === 0, `small targets: ${small.join(", ")}`);
    await page.screenshot({ path: `${artifacts}/selftest-phone.png` });
    await page.screenshot({ path: `${artifacts}/selftest-phone-full.png`, fullPage: true });
    await invoke("inv-14", "set_theme", { theme: "dark" });
    await page.waitForTimeout(300);
    await page.screenshot({ path: `${artifacts}/selftest-phone-dark.png` });
  });

  await check("every form control has a label", async () => {
    const unlabelled = await page.evaluate(() => [...document.querySelectorAll("input, textarea, meter")]
      .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")).map((e) => e.id));
    assert(unlabelled.length === 0, `unlabelled: ${unlabelled.join(", ")}`);
    assert((await page.getAttribute("#log", "aria-live")) === "polite", "#log is not aria-live");
  });

  // A fresh page for the connect path: fake mic, offer, ICE gathering, POST, the error shown.
  await check("connect: offer with audio + data channel, POST error shown", async () => {
    const p2 = await context.newPage();
    const errs2 = watchErrors(p2, [/Failed to load resource.*503/]);
    await p2.goto(url);
    await p2.click("#connect");
    await p2.waitForSelector("#error:not([hidden])", { timeout: 10_000 });
    const text = await p2.textContent("#error");
    assert(/503/.test(text) && /busy/.test(text) && /retry after 7/.test(text), `error banner: ${text}`);
    assert(offers.length === 1, `${offers.length} offers posted`);
    assert(offers[0].contentType === "application/json", `content type ${offers[0].contentType}`);
    const body = JSON.parse(offers[0].body);
    assert(body.type === "offer" && typeof body.sdp === "string", "offer body shape");
    assert(/^m=audio /m.test(body.sdp) && /^m=application .*webrtc-datachannel/m.test(body.sdp), "offer lacks audio or data channel m-line");
    assert(/a=sendrecv/.test(body.sdp) && /opus\/48000/i.test(body.sdp), "audio not sendrecv Opus");
    assert(/a=candidate:/.test(body.sdp), "no ICE candidates in the offer (gathering not awaited)");
    assert((await p2.textContent("#status")) === "failed", "status not failed");
    assert(await p2.isEnabled("#connect") && await p2.isDisabled("#hangup"), "buttons not reset after the failure");
    assert(errs2.length === 0, errs2.join("; "));
    await p2.close();
  });

  await check("no JS errors", async () => {
    assert(errors.length === 0, errors.join("; "));
  });
} finally {
  await browser.close();
  server.close();
}

const failed = results.filter(([, ok]) => !ok).length;
console.log(`page self-test: ${results.length - failed} passed, ${failed} failed; screenshots in ${artifacts}`);
process.exit(failed ? 1 : 0);
