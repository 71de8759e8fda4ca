#!/usr/bin/env python3
"""Interop check: a published MCP bridge connects a stdio MCP server to voxgate's `/mcp`.

Starts BRIDGE (`mcp2xiaozhi` or `xiaozhi-mcp`, from the same environment as this interpreter)
with `echo_server.py` against a running voxgate server, then checks through the server's HTTP
API that the server's tools appear (`GET /admin/mcp/tools`), that a direct call works
(`POST /admin/mcp/call`), and that an `/api/message` turn makes the model (the demo agent)
call the tool. Exits 0 on success, 1 with a message otherwise. Standard library only, apart from
the bridge packages themselves.

    python tests/interop/mcp_bridge.py --base http://127.0.0.1:8080 --token T --bridge mcp2xiaozhi

The server must run with the demo agent (no [llm] section) for the `/api/message` step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "echo_server.py")


def request(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def bridge_command(bridge: str, endpoint: str, workdir: str) -> tuple[list[str], dict]:
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, MCP_ENDPOINT=endpoint, PYTHONUNBUFFERED="1")
    if bridge == "xiaozhi-mcp":
        # `xiaozhi-mcp script.py` runs the script with its own interpreter.
        return [os.path.join(bindir, "xiaozhi-mcp"), SERVER], env
    if bridge == "mcp2xiaozhi":
        config = {
            "mcpServers": {
                "interop": {"type": "stdio", "command": sys.executable, "args": [SERVER]}
            }
        }
        path = os.path.join(workdir, "mcp_config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        cmd = [os.path.join(bindir, "mcp2xiaozhi"), "--config", path, "run", "interop",
               "--endpoint", endpoint]
        return cmd, env
    raise SystemExit(f"unknown bridge {bridge!r}")


def wait_for(what: str, timeout: float, check):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise SystemExit(f"FAIL: {what} (last: {last!r})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--base", required=True, help="voxgate HTTP base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--token", default="interop", help="MCP endpoint token (?token=)")
    p.add_argument("--bridge", required=True, choices=["mcp2xiaozhi", "xiaozhi-mcp"])
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()

    base = args.base.rstrip("/")
    endpoint = base.replace("http://", "ws://").replace("https://", "wss://")
    endpoint += f"/mcp/?token={args.token}"
    workdir = tempfile.mkdtemp(prefix="voxgate-interop-")
    cmd, env = bridge_command(args.bridge, endpoint, workdir)
    print(f"starting {' '.join(cmd)} -> {endpoint}", flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, start_new_session=True)
    try:
        def tools():
            status, body = request(base, "GET", "/admin/mcp/tools")
            names = sorted(t["name"] for t in body.get("tools", [])) if status == 200 else []
            if proc.poll() is not None:
                raise SystemExit(f"FAIL: the bridge exited with {proc.returncode}")
            return names if {"echo", "add"} <= set(names) else None

        names = wait_for("the stdio server's tools appear", args.timeout, tools)
        print(f"tools: {names}", flush=True)

        status, body = request(base, "POST", "/admin/mcp/call",
                               {"name": "add", "arguments": {"a": 2, "b": 40}})
        text = "".join(c.get("text", "") for c in body.get("result", {}).get("content", []))
        if status != 200 or text.strip() != "42":
            raise SystemExit(f"FAIL: add(2, 40) -> {status} {body}")
        print("add(2, 40) = 42", flush=True)

        status, body = request(base, "POST", "/api/message",
                               {"content": 'call echo {"text": "interop"}', "channel": "web",
                                "session_id": f"interop-{args.bridge}"})
        reply = body.get("response", "")
        if status != 200 or "echo: interop" not in reply or body.get("tools_called") != ["echo"]:
            raise SystemExit(f"FAIL: /api/message -> {status} {body}")
        print(f"/api/message: {reply}", flush=True)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    def gone():
        status, body = request(base, "GET", "/admin/mcp/tools")
        return status == 200 and not body.get("tools")

    wait_for("the tools disappear after the bridge stops", 15, gone)
    print(f"OK: {args.bridge}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
