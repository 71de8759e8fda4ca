// Shared by the browser scripts: loading playwright-core from where xtask installed it, the
// Chromium flags, small assertion helpers and a hard time limit.

import { createRequire } from "node:module";

/** playwright-core, installed by `cargo xtask browser` under the target directory (not the repo). */
export function playwright() {
  const dir = process.env.VOXGATE_PLAYWRIGHT;
  if (!dir) fail("VOXGATE_PLAYWRIGHT is not set (run this through `cargo xtask browser`)");
  return createRequire(import.meta.url)(dir);
}

/** The Chromium flags: headless, no network of its own, fake mic and camera permission. */
export function chromiumArgs({ wav }) {
  const args = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    // The server's candidates are on 127.0.0.1: Chromium skips loopback unless told, and would
    // hide its own host addresses behind mDNS names.
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
  ];
  if (wav) args.push(`--use-file-for-fake-audio-capture=${wav}`);
  return args;
}

export async function launch({ wav } = {}) {
  const { chromium } = playwright();
  const executablePath = process.env.VOXGATE_CHROMIUM || "/usr/bin/chromium";
  // No --user-data-dir here: Playwright refuses it in `args` and gives every launch a fresh,
  // empty temporary profile of its own, which is what we want.
  return chromium.launch({ executablePath, args: chromiumArgs({ wav }), timeout: 30_000 });
}

export function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

export function assert(cond, message) {
  if (!cond) throw new Error(message);
}

/** Ends the process if the run takes longer than `ms` (a hung browser must not hang CI). */
export function timeLimit(ms, what) {
  const t = setTimeout(() => fail(`${what} did not finish within ${ms / 1000} s`), ms);
  t.unref();
}

/** Collects uncaught page errors and console errors, so a run can assert there were none. */
export function watchErrors(page, ignore = []) {
  const errors = [];
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !ignore.some((re) => re.test(m.text()))) errors.push(`console.error: ${m.text()}`);
  });
  return errors;
}
