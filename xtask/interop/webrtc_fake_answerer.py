"""A stand-in for voxgate's WebRTC doors, made with aiortc, to check webrtc_peer.py by itself.

Serves, on 127.0.0.1:
  POST /webrtc/offer   the VIP door's JSON signalling (docs/doors/vip.md), events on the `vip`
                       data channel;
  GET  /gemini         the Gemini bridge's WebSocket with WEBRTC_OFFER / WEBRTC_ANSWER /
                       WEBRTC_ICE_CANDIDATE (nested candidates, sent as messages as well as in the
                       answer; `?trickle=1`: only as messages; `?webrtc=off`: GEMINI_ERROR as a
                       server without WebRTC answers); a text `ping` on a data channel gets
                       `pong`.
Each session runs a tiny energy VAD on the incoming track; at the end of an utterance it plays
the utterance back on its own track as "the reply" and sends a scripted event sequence around
it (VIP: state transitions, transcript.user, action.invoke of set_theme when declared, reply.text,
reply.done; Gemini: CONTENT_MESSAGEs with transcriptions, TURN_COMPLETE). A typed VIP turn
(`input.text`) gets a short tone as its reply. Messages the doc does not define are answered with
`error` (VIP) / `GEMINI_ERROR`, so a peer that sends them fails its run.

Prints `listening on http://127.0.0.1:PORT` as its first stdout line. Test fixture only.
"""

import argparse
import asyncio
import json
import math
import sys
from array import array
from typing import Any, Optional

from aiohttp import WSMsgType, web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from webrtc_peer import (
    FRAME_SAMPLES,
    RATE,
    PacedTrack,
    PeerError,
    Resampler,
    parse_candidate,
    sdp_candidates,
)

SPEECH_RMS = 300.0
END_OF_SPEECH_FRAMES = 30  # 0.6 s of quiet ends an utterance


def log(message: str) -> None:
    print(f"fake: {message}", file=sys.stderr, flush=True)


def rms(pcm: bytes) -> float:
    samples = array("h")
    samples.frombytes(pcm)
    return math.sqrt(sum(s * s for s in samples) / max(len(samples), 1))


def tone(seconds: float, hz: float = 440.0) -> bytes:
    samples = array("h", (int(8000 * math.sin(2 * math.pi * hz * i / RATE)) for i in range(int(seconds * RATE))))
    return samples.tobytes()


class Conversation:
    """One peer connection: a VAD on the incoming track and a reply track going out."""

    def __init__(self, on_speech_start, on_utterance) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.reply = PacedTrack()
        self._on_speech_start = on_speech_start
        self._on_utterance = on_utterance
        self._tasks: list[asyncio.Task] = []

        @self.pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":
                self.pc.addTrack(self.reply)
                self._tasks.append(asyncio.ensure_future(self._listen(track)))

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            log(f"connection {self.pc.connectionState}")

    async def _listen(self, track) -> None:
        resampler = Resampler()
        pending = bytearray()
        utterance = bytearray()
        quiet = 0
        in_speech = False
        size = FRAME_SAMPLES * 2
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pending += resampler.convert(frame)
            while len(pending) >= size:
                chunk = bytes(pending[:size])
                del pending[:size]
                loud = rms(chunk) > SPEECH_RMS
                if not in_speech:
                    if loud:
                        in_speech, quiet = True, 0
                        utterance = bytearray(chunk)
                        await self._on_speech_start()
                    continue
                utterance += chunk
                quiet = 0 if loud else quiet + 1
                if quiet >= END_OF_SPEECH_FRAMES:
                    in_speech = False
                    # Drop the trailing quiet from the reply.
                    speech = bytes(utterance[: len(utterance) - quiet * size])
                    self._tasks.append(asyncio.ensure_future(self._on_utterance(speech)))

    async def answer(self, offer_sdp: str) -> str:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription.sdp

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.reply.stop()
        await self.pc.close()


class VipSession:
    """The scripted VIP door: events on the `vip` data channel around the echo reply."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.conv = Conversation(self.speech_start, self.utterance)
        self.channel = None
        self.actions: dict[str, Any] = {}
        self.state = "idle"
        self.turn = 0
        self.results: dict[str, asyncio.Future] = {}
        self.invocations = 0

        @self.conv.pc.on("datachannel")
        def on_channel(channel) -> None:
            log(f"data channel {channel.label!r}")
            if channel.label != "vip":
                return
            self.channel = channel
            channel.on("message", self.on_message)
            self.send(
                {
                    "type": "session.connected",
                    "session_id": session_id,
                    "protocol": "vip/1",
                    "audio": {"codec": "opus", "sample_rate": 48000, "channels": 1},
                    "limits": {
                        "max_actions": 64,
                        "max_narrated_state_bytes": 8192,
                        "max_action_result_bytes": 16384,
                        "max_message_bytes": 65536,
                    },
                }
            )

    def send(self, message: dict[str, Any]) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps(message))

    def go(self, state: str) -> None:
        self.send({"type": "state", "state": state, "previous": self.state, "turn": self.turn or None})
        self.state = state

    def error(self, code: str, message: str) -> None:
        log(f"error to the peer: {code}: {message}")
        self.send({"type": "error", "code": code, "message": message})

    def on_message(self, raw: Any) -> None:
        try:
            msg = json.loads(raw)
            kind = msg["type"]
        except (ValueError, KeyError, TypeError):
            self.error("bad_message", "not a JSON object with a type")
            return
        log(f"<- {kind}")
        if kind == "actions.declare" and isinstance(msg.get("actions"), dict):
            self.actions = msg["actions"]
        elif kind == "state.narrate" and isinstance(msg.get("text"), str):
            pass
        elif kind == "action.result" and msg.get("status") in ("success", "error"):
            done = self.results.pop(str(msg.get("invocation_id")), None)
            if done is None:
                self.error("unknown_invocation", f"no invocation {msg.get('invocation_id')!r}")
            else:
                done.set_result(msg)
        elif kind == "input.text" and isinstance(msg.get("text"), str):
            self.turn += 1
            self.go("processing")
            asyncio.ensure_future(self.respond(msg["text"], tone(0.5)))
        elif kind == "session.end":
            asyncio.ensure_future(self.conv.close())
        else:
            self.error("unknown_type", f"not understood: {kind}")

    async def speech_start(self) -> None:
        self.turn += 1
        self.send({"type": "input.detected", "source": "server"})
        self.go("listening")

    async def utterance(self, pcm: bytes) -> None:
        seconds = len(pcm) / 2 / RATE
        self.go("processing")
        self.send({"type": "transcript.user", "turn": self.turn, "text": f"({seconds:.1f} s of speech)"})
        await self.respond("switch to dark mode", pcm)

    async def respond(self, said: str, audio: bytes) -> None:
        if "set_theme" in self.actions and "dark" in said:
            self.invocations += 1
            invocation = f"inv-{self.invocations}"
            done = asyncio.get_running_loop().create_future()
            self.results[invocation] = done
            self.go("action")
            self.send(
                {
                    "type": "action.invoke",
                    "invocation_id": invocation,
                    "action_id": "set_theme",
                    "parameters": {"theme": "dark"},
                }
            )
            try:
                result = await asyncio.wait_for(done, 5)
                log(f"action.result {result}")
            except asyncio.TimeoutError:
                self.results.pop(invocation, None)
                self.send(
                    {
                        "type": "action.cancelled",
                        "invocation_id": invocation,
                        "error": {"code": "timeout", "message": "no result within 5 s"},
                    }
                )
            self.go("processing")
        self.go("speaking")
        self.send({"type": "reply.text", "turn": self.turn, "text": f"You said: {said}"})
        await self.conv.reply.play(audio)
        self.send({"type": "reply.done", "turn": self.turn, "interrupted": False})
        self.go("idle")


async def vip_offer(request: web.Request) -> web.Response:
    try:
        body = await request.json()
        sdp = body["sdp"]
        if body.get("type") != "offer" or not isinstance(sdp, str):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": {"code": "bad_offer", "message": "expected {sdp, type: offer}"}}, status=400)
    app = request.app
    app["count"][0] += 1
    session = VipSession(f"fake-{app['count'][0]}")
    app["sessions"].append(session.conv)
    answer = await session.conv.answer(sdp)
    return web.json_response({"sdp": answer, "type": "answer", "session_id": session.session_id})


async def gemini(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=16 << 20)
    await ws.prepare(request)
    conv: Optional[Conversation] = None
    connected = False
    stats = {"candidates": 0, "ignored": 0}

    async def send(kind: str, payload: Any = None) -> None:
        frame: dict[str, Any] = {"type": kind}
        if payload is not None:
            frame["payload"] = payload
        if not ws.closed:
            await ws.send_str(json.dumps(frame))

    async def content(server_content: dict[str, Any]) -> None:
        await send("CONTENT_MESSAGE", {"serverContent": server_content})

    async def speech_start() -> None:
        pass

    async def utterance(pcm: bytes) -> None:
        seconds = len(pcm) / 2 / RATE
        await content({"inputTranscription": {"text": f"({seconds:.1f} s of speech)"}})
        await send("ASSISTANT_SPEAKING", {"speaking": True})
        await content({"outputTranscription": {"text": "Here is your echo."}})
        await conv.reply.play(pcm)
        await send("ASSISTANT_SPEAKING", {"speaking": False})
        await content({"turnComplete": True})
        await send("TURN_COMPLETE")

    async for message in ws:
        if message.type != WSMsgType.TEXT:
            break
        try:
            msg = json.loads(message.data)
            kind, payload = msg["type"], msg.get("payload") or {}
        except (ValueError, KeyError, TypeError):
            await send("GEMINI_ERROR", {"message": "Invalid JSON message received."})
            continue
        log(f"<- {kind}")
        if kind == "CONNECT_GEMINI":
            connected = True
            await send("GEMINI_CONNECTED")
            await send("SETUP_COMPLETE", {"setupComplete": {"success": True}})
        elif not connected:
            await send("GEMINI_ERROR", {"message": "Gemini not connected. Send CONNECT_GEMINI first."})
        elif kind in ("WEBRTC_OFFER", "WEBRTC_ICE_CANDIDATE") and request.query.get("webrtc") == "off":
            # `?webrtc=off`: what a server without WebRTC answers.
            await send("GEMINI_ERROR", {"message": "WebRTC is not served: stream audio with SEND_REALTIME_INPUT"})
        elif kind == "WEBRTC_OFFER" and isinstance(payload.get("sdp"), str):
            conv = Conversation(speech_start, utterance)
            request.app["sessions"].append(conv)

            @conv.pc.on("datachannel")
            def on_channel(channel) -> None:
                # The bridge's data channels answer a text `ping` with `pong`, nothing else.
                @channel.on("message")
                def on_message(raw: Any) -> None:
                    if raw == "ping":
                        channel.send("pong")

            answer = await conv.answer(payload["sdp"])
            # Keep the candidates in the answer but drop end-of-candidates, so the same
            # candidates sent as messages can still be added; `?trickle=1` sends them only as
            # messages (as a server that trickles would).
            trickle = request.query.get("trickle") == "1"
            answer = "".join(
                line
                for line in answer.splitlines(keepends=True)
                if not line.startswith("a=end-of-candidates") and not (trickle and line.startswith("a=candidate:"))
            )
            candidates = sdp_candidates(conv.pc.localDescription.sdp)
            await send("WEBRTC_ANSWER", {"sdp": answer, "type": "answer"})
            for c in candidates:
                await send("WEBRTC_ICE_CANDIDATE", {"candidate": c})
        elif kind == "WEBRTC_ICE_CANDIDATE":
            if conv is None:
                await send("GEMINI_ERROR", {"message": "WEBRTC_ICE_CANDIDATE before WEBRTC_OFFER"})
                continue
            try:
                candidate = parse_candidate(payload)
            except (PeerError, ValueError) as e:
                await send("GEMINI_ERROR", {"message": f"bad candidate: {e}"})
                continue
            stats["candidates"] += 1
            try:
                await conv.pc.addIceCandidate(candidate)
            except ValueError:
                # The offer already signalled end-of-candidates (aiortc gathers before offering).
                stats["ignored"] += 1
        elif kind == "DISCONNECT_GEMINI":
            await send("GEMINI_DISCONNECTED", {"reason": "client disconnected"})
        else:
            await send("GEMINI_ERROR", {"message": f"Unknown message type: {kind}"})
    log(f"gemini socket closed; client candidates {stats}")
    if conv is not None:
        await conv.close()
    return ws


async def main(port: int) -> None:
    app = web.Application()
    app["count"] = [0]
    app["sessions"] = []
    app.router.add_post("/webrtc/offer", vip_offer)
    app.router.add_get("/gemini", gemini)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for conv in app["sessions"]:
            await conv.close()
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="aiortc stand-in for the WebRTC doors (test fixture)")
    parser.add_argument("--port", type=int, default=0)
    try:
        asyncio.run(main(parser.parse_args().port))
    except KeyboardInterrupt:
        pass
