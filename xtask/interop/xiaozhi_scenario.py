"""The published Xiaozhi client, `xiaozhi-sdk` (XiaoZhiWebsocket), against a running voxgate
server, unchanged. The scenario registers device tools through the SDK's own `set_mcp_tool` and
observes through its message callback; a subclass only records the server's MCP requests and the
order of incoming frames before handing each to the SDK's own handler. Every error the SDK logs
(a frame it could not decode, a handler that raised) fails the scenario.

Needs the server to run the demo agent with the interop fake recognizer (fake_asr.py) and the
Xiaozhi door with token authentication on (`[xiaozhi] auth = true`) and `MAC` below on
`allowed_devices` (OTA issues tokens only to allowed or activated devices).

1. OTA: the SDK's OtaDevice posts its system info to /xiaozhi/ota/; the answer has the WebSocket
   URL of this server, a token and protocol version 1, and no mqtt section.
2. Without a token the upgrade is refused (auth is on).
3. init_connection: OTA, then the WebSocket with the issued token, hello both ways (session id,
   24 kHz 60 ms downlink), `listen start realtime`.
4. MCP: the server sends `initialize` with a vision URL and token, then `tools/list`; the tools
   offered to the model are the SDK's tools except the user-only one.
5. A text turn (`listen detect`): stt, tts start, llm emotion, sentence_start "You said: ...",
   Opus audio that the SDK decodes to sound, tts stop, in that order.
6. Device tool calls: the model calls the SDK's `set_volume`, and `take_photo` whose SDK
   implementation posts a JPEG to the vision URL the server gave; the results come back in the
   spoken reply.
7. An audio turn: a 16 kHz WAV streamed as 60 ms Opus frames at real time: stt with the fake
   recognizer's transcript, the reply, audio, tts stop.
8. Abort while speaking: tts stop at once, no audio after it; the next turn works.
9. Close: the server counts no open Xiaozhi session.
"""

import argparse
import asyncio
import json
import logging
import re
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import websockets
import xiaozhi_sdk
from common import Events, ScenarioError, check, log, read_wav_pcm16, run
from xiaozhi_sdk import XiaoZhiWebsocket
from xiaozhi_sdk.ota import OtaDevice

MAC = "02:00:00:1a:7e:01"
# The firmware's 21 emotion names (the door's default allowlist).
EMOTIONS = {
    "neutral", "happy", "laughing", "funny", "sad", "angry", "crying", "loving", "embarrassed",
    "surprised", "shocked", "thinking", "winking", "cool", "relaxed", "delicious", "kissy",
    "confident", "sleepy", "silly", "confused",
}


class SdkErrors(logging.Handler):
    """Collects the SDK's error log lines (it logs and swallows decode and handler failures)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Device(XiaoZhiWebsocket):
    """The SDK client; records what arrives, then lets the SDK handle it as usual."""

    def __init__(self, events: Events, **kwargs) -> None:
        async def on_message(data):
            events.add(data.get("type", "?"), data)

        super().__init__(on_message, **kwargs)
        self.events = events

    async def mcp(self, data):
        self.events.add("mcp_request", data.get("payload"))
        await super().mcp(data)

    async def _handle_websocket_message(self, message):
        before = len(self.output_audio_queue)
        await super()._handle_websocket_message(message)
        if isinstance(message, bytes):
            rows = list(self.output_audio_queue)[before:]
            pcm = np.concatenate([np.asarray(r).ravel() for r in rows]) if rows else np.zeros(0)
            rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0
            self.events.add("audio", {"bytes": len(message), "samples": int(pcm.size), "rms": rms})


def kinds(events: Events, mark: int) -> list[str]:
    """A compact trace: message types (tts with state), audio frames merged into runs."""
    out: list[str] = []
    for kind, p in events.items[mark:]:
        if kind == "audio":
            if out and out[-1].startswith("audio x"):
                out[-1] = f"audio x{int(out[-1][7:]) + 1}"
            else:
                out.append("audio x1")
        elif kind == "tts":
            out.append(f"tts {p.get('state')}")
        elif kind == "mcp_request":
            out.append(f"mcp {p.get('method')}")
        else:
            out.append(kind)
    return out


async def spoken_turn(
    events: Events, mark: int, what: str, timeout: float = 20.0, until: str = ""
) -> dict:
    """Waits for a reply after `mark` to finish (`tts stop` after a sentence containing
    `until`) and checks the reference order; returns its stt text, sentences, llm messages and
    audio frames."""

    def finished():
        items = events.items[mark:]
        seen_sentence = False
        for kind, p in items:
            if kind == "tts" and p.get("state") == "sentence_start" and until in p.get("text", ""):
                seen_sentence = True
            if seen_sentence and kind == "tts" and p.get("state") == "stop":
                return True
        return False

    await events.wait(f"tts stop after a sentence with {until!r} ({what})", finished, timeout)
    items = events.items[mark:]
    trace = kinds(events, mark)
    stop_at = max(i for i, (k, p) in enumerate(items) if k == "tts" and p.get("state") == "stop")
    stt = [p["text"] for k, p in items if k == "stt"]
    start_at = [i for i, (k, p) in enumerate(items) if k == "tts" and p.get("state") == "start"]
    check(start_at, f"{what}: no tts start; trace {trace}")
    sentences = [(i, p.get("text", "")) for i, (k, p) in enumerate(items) if k == "tts" and p.get("state") == "sentence_start"]
    audio = [(i, p) for i, (k, p) in enumerate(items) if k == "audio"]
    llm = [p for k, p in items if k == "llm"]
    stt_at = [i for i, (k, _) in enumerate(items) if k == "stt"]
    check(stt_at and stt_at[0] < start_at[0], f"{what}: stt must come before tts start; trace {trace}")
    check(llm, f"{what}: no llm (emotion) message; trace {trace}")
    for m in llm:
        check(m.get("emotion") in EMOTIONS, f"{what}: llm emotion {m!r} is not a firmware emotion")
    check(audio, f"{what}: no audio frames; trace {trace}")
    check(sentences[0][0] < audio[0][0], f"{what}: audio before the first sentence_start; trace {trace}")
    check(all(i < stop_at for i, _ in audio), f"{what}: audio after tts stop; trace {trace}")
    check(all(i > start_at[0] for i, _ in audio), f"{what}: audio before tts start; trace {trace}")
    frames = [p for _, p in audio]
    check(all(f["samples"] > 0 for f in frames), f"{what}: the SDK decoded no samples from some frames")
    loud = sum(1 for f in frames if f["rms"] > 100)
    check(loud >= len(frames) // 3, f"{what}: only {loud} of {len(frames)} frames carry sound")
    return {
        "stt": stt,
        "sentences": [t for _, t in sentences],
        "text": " ".join(t.strip() for _, t in sentences),
        "frames": len(frames),
        "llm": llm,
        "trace": trace,
    }


def open_sessions(server: str) -> int:
    with urllib.request.urlopen(f"http://{server}/health", timeout=5) as r:
        return json.load(r)["sessions"]["xiaozhi"]


def tools(photo_question: list, volume: dict, device_ref: list) -> list[dict]:
    """The device tools, in the SDK's tool format (name, description, inputSchema, tool_func)."""

    def set_volume(args):
        volume["value"] = args["volume"]
        return {"volume": args["volume"], "muted": False}, False

    def get_device_status(args):
        return {"audio_speaker": {"volume": volume["value"]}}, False

    async def take_photo(args):
        # The SDK's own vision upload to the URL and token the server gave in MCP initialize.
        photo_question.append(args.get("question"))
        jpeg = (Path(xiaozhi_sdk.__file__).parent / "file" / "image" / "leijun.jpg").read_bytes()
        return await device_ref[0].async_analyze_image(jpeg, args.get("question", ""))

    def reboot(args):
        raise ScenarioError("the model was able to call the user-only tool `reboot`")

    return [
        {
            "name": "set_volume",
            "description": "Set the volume of the audio speaker (0-100).",
            "inputSchema": {
                "type": "object",
                "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
                "required": ["volume"],
            },
            "tool_func": set_volume,
        },
        {
            "name": "get_device_status",
            "description": "The device's current status.",
            "inputSchema": {"type": "object", "properties": {}},
            "tool_func": get_device_status,
        },
        {
            "name": "take_photo",
            "description": "Take a photo and answer a question about it.",
            "inputSchema": {
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
            },
            "tool_func": take_photo,
            "is_async": True,
        },
        {
            "name": "reboot",
            "description": "Reboot the device (user only).",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"audience": ["user"]},
            "tool_func": reboot,
        },
    ]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="host:port of the voxgate server")
    ap.add_argument("--wav", required=True, help="16 kHz mono WAV with speech")
    args = ap.parse_args()
    ota_url = f"http://{args.server}/xiaozhi/ota/"
    ws_url = f"ws://{args.server}/xiaozhi/v1/"
    sdk_errors = SdkErrors()
    logging.getLogger("xiaozhi_sdk").addHandler(sdk_errors)

    # 1. OTA, as the SDK does it.
    client_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, MAC))
    ota = await asyncio.wait_for(OtaDevice(MAC, client_id, ota_url).activate_device(), 10)
    ws = ota.get("websocket", {})
    check(ws.get("url") == ws_url, f"OTA websocket.url {ws.get('url')!r}, expected {ws_url!r}")
    check(isinstance(ws.get("token"), str) and ws["token"], f"OTA websocket.token {ws.get('token')!r}")
    check(ws.get("version") == 1, f"OTA websocket.version {ws.get('version')!r}")
    check("mqtt" not in ota and "activation" not in ota, f"OTA answer has mqtt/activation: {ota}")
    check(isinstance(ota.get("server_time", {}).get("timestamp"), int), f"OTA server_time: {ota}")
    log(f"1 OTA: websocket {ws['url']} version {ws['version']}, token issued")

    # 2. Auth is on: the SDK without a token is refused at the upgrade.
    async def ignore(data):
        pass

    anonymous = XiaoZhiWebsocket(ignore, url=ws_url, audio_sample_rate=16000)
    try:
        connected = await asyncio.wait_for(anonymous.init_connection(MAC), 15)
    except asyncio.TimeoutError:
        connected = True
    finally:
        await anonymous.close()
    check(not connected, "the server accepted an upgrade without a token while auth is on")
    check(
        any("401" in line for line in sdk_errors.lines),
        f"the refused upgrade did not answer 401: {sdk_errors.lines}",
    )
    sdk_errors.lines.clear()
    log("2 auth: an upgrade without the OTA token is refused with 401")

    # 3. The real client: OTA, token, hello, listen start.
    events = Events()
    volume = {"value": 50}
    photo_question: list = []
    device_ref: list = []
    device = Device(events, ota_url=ota_url, audio_sample_rate=16000, audio_output_sample_rate=24000)
    device_ref.append(device)
    await device.set_mcp_tool(tools(photo_question, volume, device_ref))
    try:
        ok = await asyncio.wait_for(device.init_connection(MAC), 20)
        check(ok, f"init_connection failed: {sdk_errors.lines}")
        check(device.session_id, "the server hello carried no session_id")
        check(device.url == ws_url, f"the SDK connected to {device.url!r}")
        out_rate = device.audio_opus.xiaozhi_out_sample_rate
        check(out_rate == 24000, f"server hello announced {out_rate} Hz")
        log(f"3 hello: session {device.session_id}, downlink {out_rate} Hz; listen start {device.mode}")

        # 4. MCP: initialize (with vision), tools/list; tools offered to the model.
        init = (await events.wait("MCP initialize", lambda: [p for p in events.since(0, "mcp_request") if p.get("method") == "initialize"]))[0]
        check(isinstance(init.get("id"), int), f"MCP initialize id {init.get('id')!r} is not a number")
        vision = init.get("params", {}).get("capabilities", {}).get("vision", {})
        check(str(vision.get("url", "")).startswith("http"), f"MCP vision capability {vision!r}")
        listed = (await events.wait("MCP tools/list", lambda: [p for p in events.since(0, "mcp_request") if p.get("method") == "tools/list"]))[0]
        check(isinstance(listed.get("id"), int), f"MCP tools/list id {listed.get('id')!r}")
        log(f"4 MCP: initialize (vision {vision['url']}), tools/list params {listed.get('params')}")

        mark = events.mark()
        await device.send_text("call no_such_tool {}")
        turn = await spoken_turn(events, mark, "tools offered to the model")
        offered = re.search(r"Available tools: (.*?)\.?$", turn["text"])
        check(offered is not None, f"the demo agent did not list the tools: {turn['text']!r}")
        names = {n.strip() for n in offered.group(1).split(",")}
        check(
            {"set_volume", "get_device_status", "take_photo"} <= names and "reboot" not in names,
            f"tools offered to the model: {sorted(names)} (want the SDK's tools without the user-only reboot)",
        )
        log(f"4 MCP: the model is offered {sorted(names)} (user-only reboot withheld)")

        # 5. A text turn.
        mark = events.mark()
        await device.send_text("hello voxgate")
        turn = await spoken_turn(events, mark, "text turn")
        check(turn["stt"] == ["hello voxgate"], f"stt of the text turn: {turn['stt']}")
        check(turn["text"] == "You said: hello voxgate", f"text turn sentences: {turn['sentences']}")
        log(f"5 text turn: {turn['trace']}, emotion {turn['llm'][0].get('emotion')}")

        # 6. Device tools through MCP tools/call. The SDK answers at once, before the server
        # has finished saying that it calls the tool.
        mark = events.mark()
        await device.send_text('call set_volume {"volume": 42}')
        turn = await spoken_turn(events, mark, "set_volume call and result", until="returned")
        calls = [p for p in events.since(mark, "mcp_request") if p.get("method") == "tools/call"]
        check(
            [(c["params"]["name"], c["params"].get("arguments")) for c in calls] == [("set_volume", {"volume": 42})],
            f"tools/call requests: {calls}",
        )
        check(isinstance(calls[0].get("id"), int), f"tools/call id {calls[0].get('id')!r}")
        check(volume["value"] == 42, f"the SDK tool set the volume to {volume['value']}")
        check(
            turn["text"] == 'Calling set_volume. The tool set_volume returned: {"volume": 42, "muted": false}',
            f"the reply around the tool call: {turn['sentences']}",
        )
        log(f"6 tools/call set_volume {{volume: 42}}: {turn['trace']} -> {turn['text']!r}")

        mark = events.mark()
        await device.send_text('call take_photo {"question": "what is on the desk?"}')
        turn = await spoken_turn(events, mark, "take_photo call and result", until="returned")
        check(photo_question == ["what is on the desk?"], f"take_photo questions: {photo_question}")
        check("no vision model" in turn["text"], f"the vision endpoint's answer is not in the reply: {turn['text']!r}")
        log(f"6 tools/call take_photo: the SDK posted the photo to the server's vision URL -> {turn['text']!r}")

        # 7. An audio turn from a WAV, 60 ms frames at real time, then silence as a device sends.
        pcm, rate, channels = read_wav_pcm16(args.wav)
        check((rate, channels) == (16000, 1), f"{args.wav}: expected 16 kHz mono")
        frame = rate * 60 // 1000 * 2
        mark = events.mark()
        started = time.monotonic()
        sent = 0
        for i in range(0, len(pcm), frame):
            chunk = pcm[i : i + frame].ljust(frame, b"\0")
            check(await device.send_audio(chunk), "send_audio failed")
            sent += 1
            await asyncio.sleep(max(0.0, started + sent * 0.06 - time.monotonic()))
        await device.send_silence_audio(1.2)
        turn = await spoken_turn(events, mark, "audio turn", 20)
        check(len(turn["stt"]) == 1, f"stt messages of the audio turn: {turn['stt']}")
        # The door's VAD may cut the sentence at its pauses; the pieces' transcripts form one turn.
        pieces = re.findall(r"interop transcript of ([0-9.]+) seconds", turn["stt"][0])
        check(
            pieces and " ".join(f"interop transcript of {p} seconds" for p in pieces) == turn["stt"][0],
            f"stt {turn['stt'][0]!r} is not made of the fake recognizer's transcripts",
        )
        heard = sum(float(p) for p in pieces)
        # Each piece runs from the VAD's backbuffer before the speech to its stop after it.
        wav_s = len(pcm) / (2 * rate)
        check(
            0.6 * wav_s <= heard <= wav_s + 2.0,
            f"the recognizer got {heard:.1f} s of audio in all (the WAV is {wav_s:.1f} s)",
        )
        check(turn["text"] == f"You said: {turn['stt'][0]}", f"audio turn reply: {turn['sentences']}")
        log(
            f"7 audio turn: {sent} Opus frames sent; stt {turn['stt'][0]!r} ({len(pieces)} VAD "
            f"segment(s), {heard:.1f} s); {turn['frames']} reply frames"
        )

        # 8. Abort while speaking.
        mark = events.mark()
        long_text = " ".join(["This is a long sentence that takes a while to speak."] * 6)
        await device.send_text(long_text)
        await events.wait("reply audio to interrupt", lambda: len(events.since(mark, "audio")) >= 3, 20)
        before = len(events.since(mark, "audio"))
        abort_at = events.mark()
        t0 = time.monotonic()
        await device.send_abort()
        await events.wait(
            "tts stop answering abort",
            lambda: any(p.get("state") == "stop" for p in events.since(abort_at, "tts")),
            2,
        )
        latency = time.monotonic() - t0
        stop_index = next(i for i, (k, p) in enumerate(events.items) if i >= abort_at and k == "tts" and p.get("state") == "stop")
        await asyncio.sleep(1.0)
        after_stop = [k for k, _ in events.items[stop_index + 1 :] if k == "audio"]
        check(not after_stop, f"{len(after_stop)} audio frames arrived after tts stop")
        total = len(events.since(mark, "audio"))
        check(total < 40, f"{total} frames of a ~15 s reply arrived despite the abort")
        log(f"8 abort: tts stop {latency * 1000:.0f} ms after abort; {before}->{total} frames, none after stop")

        mark = events.mark()
        await device.send_text("still there?")
        turn = await spoken_turn(events, mark, "turn after abort")
        check(turn["text"] == "You said: still there?", f"turn after abort: {turn['sentences']}")
        log("8 the session serves a turn after the abort")

        check(not sdk_errors.lines, f"the SDK logged errors: {sdk_errors.lines}")
    finally:
        await device.close()

    # 9. Close.
    for _ in range(50):
        if open_sessions(args.server) == 0:
            break
        await asyncio.sleep(0.1)
    else:
        raise ScenarioError("the server still counts an open Xiaozhi session 5 s after close")
    log("9 closed; the server counts no open Xiaozhi session")


if __name__ == "__main__":
    run(main)
