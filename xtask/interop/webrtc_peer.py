"""A WebRTC peer made with aiortc (a third-party WebRTC stack) for voxgate's WebRTC doors.

Two modes, one per signalling path:

  webrtc_peer.py vip --url http://127.0.0.1:PORT --wav IN.wav --save-reply OUT.wav [--text T]
                    [--api-key KEY]
      The VIP browser door (docs/doors/vip.md): a data channel labelled `vip` is created before
      the offer, ICE gathering completes, the offer is posted as JSON to `/webrtc/offer`. After
      `session.connected` it declares one action (`set_theme`), answers every `action.invoke`
      with a successful `action.result`, streams the WAV as the spoken turn and, with --text,
      sends a typed turn once the spoken reply is done. Ends after the last `reply.done`.

  webrtc_peer.py gemini --url ws://127.0.0.1:PORT/gemini --wav IN.wav --save-reply OUT.wav
      The Gemini bridge door (docs/doors/gemini.md) as the Android app uses it: CONNECT_GEMINI,
      SETUP_COMPLETE, WEBRTC_OFFER with a microphone track, WEBRTC_ANSWER, ICE candidates both
      ways as WEBRTC_ICE_CANDIDATE in the app's nested form (ours are in the offer too, and are
      also sent as messages to exercise that path). Like the original bridge's WebRTC test
      client, the offer also has a data channel `test` that sends `ping` once open. Ends at
      TURN_COMPLETE (or a CONTENT_MESSAGE with serverContent.turnComplete).

The WAV is sent in real time as 20 ms frames (s16 mono 48 kHz, resampled as needed) once the
session is up, then silence, so the server's VAD hears the end of speech. The remote track is
recorded to --save-reply (48 kHz mono). A JSON summary goes to stdout (progress to stderr); the
exit status is non-zero when the reply did not finish within --timeout seconds, signalling
failed, or the server reported an error.

The summary (one JSON object):
  mode, ok (bool), failure (string or null)
  reply_seconds            length of everything received on the remote track (the whole call)
  reply_rms, reply_rms_dbfs, reply_peak   of that audio (s16 scale; dBFS null when silent)
  reply_nonsilent_seconds  total of its 20 ms windows above about -50 dBFS
  frames_received          decoded frames read from the remote track
  events                   message types received, in order (VIP data channel / bridge frames)
  transcripts              [{kind: user|reply|reply_text, text}] from transcript.user/reply.text or
                           inputTranscription/outputTranscription/modelTurn text
  errors                   error / error.fatal / GEMINI_ERROR / malformed messages received
  elapsed_seconds
  VIP also: session_id (from the answer), session_id_dc (from session.connected), states (the
  `state` values in order), actions_invoked [{action_id, parameters}], answer_received.
  Gemini also: answer_received, ice_candidates_sent, ice_candidates_received,
  ice_candidates_not_added (refused by aiortc after the answer's end-of-candidates),
  inline_audio_bytes (audio that came in CONTENT_MESSAGE inlineData instead of the track),
  data_channel_replies (the messages received on the `test` channel after its `ping`, binary
  ones as "<binary N bytes>").
"""

import argparse
import asyncio
import fractions
import json
import math
import sys
import time
import wave
from array import array
from typing import Any, Optional

import aiohttp
import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from aiortc.sdp import candidate_from_sdp

RATE = 48000
FRAME_SAMPLES = RATE // 50  # 20 ms
# A 20 ms window counts as sound above this RMS (about -50 dBFS).
SILENCE_RMS = 100.0

_started = time.monotonic()


def log(message: str) -> None:
    """One progress line on stderr (stdout carries only the JSON summary)."""
    print(f"[{time.monotonic() - _started:6.2f}s] {message}", file=sys.stderr, flush=True)


class PeerError(Exception):
    """The session failed: the message says how."""


def read_wav_48k_mono(path: str) -> bytes:
    """The WAV's samples as s16le mono at 48 kHz (resampled and downmixed with libav)."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise PeerError(f"{path}: expected 16-bit samples")
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = w.readframes(w.getnframes())
    if rate == RATE and channels == 1:
        return pcm
    return Resampler().convert_raw(pcm, rate, channels)


class Resampler:
    """Converts libav audio frames of any layout/rate to s16le mono 48 kHz bytes."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)

    def convert(self, frame: Optional[av.AudioFrame]) -> bytes:
        out = bytearray()
        for f in self._resampler.resample(frame):
            # Plane buffers can be padded: take exactly samples * 2 bytes.
            out += bytes(f.planes[0])[: f.samples * 2]
        return bytes(out)

    def convert_raw(self, pcm: bytes, rate: int, channels: int) -> bytes:
        layout = "mono" if channels == 1 else "stereo"
        if channels > 2:
            raise PeerError(f"unsupported channel count {channels}")
        samples = len(pcm) // (2 * channels)
        frame = av.AudioFrame(format="s16", layout=layout, samples=samples)
        frame.planes[0].update(pcm[: samples * 2 * channels])
        frame.sample_rate = rate
        frame.pts = 0
        frame.time_base = fractions.Fraction(1, rate)
        return self.convert(frame) + self.convert(None)


def pcm_frame(pcm: bytes, pts: int) -> av.AudioFrame:
    """A 20 ms s16 mono 48 kHz frame from exactly FRAME_SAMPLES * 2 bytes."""
    frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
    frame.planes[0].update(pcm)
    frame.pts = pts
    frame.sample_rate = RATE
    frame.time_base = fractions.Fraction(1, RATE)
    return frame


class PacedTrack(MediaStreamTrack):
    """An audio track paced in real time: queued PCM (s16 mono 48 kHz), silence when none.

    aiortc's sender calls `recv()` once per frame from the moment the connection is up; frames
    carry consecutive timestamps and are released at wall-clock pace, as a microphone would.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = bytearray()
        self._pts = 0
        self._start: Optional[float] = None
        self._on_drained: list[asyncio.Future] = []

    def play(self, pcm: bytes) -> "asyncio.Future[None]":
        """Queues `pcm`; the returned future completes when its last frame was handed out."""
        self._queue += pcm
        # Pad to whole frames so the tail is not held back.
        self._queue += bytes(-len(self._queue) % (FRAME_SAMPLES * 2))
        done = asyncio.get_running_loop().create_future()
        self._on_drained.append(done)
        return done

    def clear(self) -> None:
        self._queue.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            wait = self._start + self._pts / RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
        size = FRAME_SAMPLES * 2
        if self._queue:
            chunk = bytes(self._queue[:size])
            del self._queue[:size]
        else:
            chunk = bytes(size)
        if not self._queue:
            for done in self._on_drained:
                if not done.done():
                    done.set_result(None)
            self._on_drained.clear()
        return pcm_frame(chunk, self._pts)


class Recorder:
    """Reads a remote audio track to the end and keeps it as s16 mono 48 kHz."""

    def __init__(self) -> None:
        self.pcm = bytearray()
        self.frames = 0
        self._resampler = Resampler()
        self._task: Optional[asyncio.Task] = None

    def start(self, track: MediaStreamTrack) -> None:
        self._task = asyncio.ensure_future(self._run(track))

    async def _run(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.frames += 1
            self.pcm += self._resampler.convert(frame)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def save(self, path: str) -> None:
        with wave.open(path, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(bytes(self.pcm))

    def stats(self) -> dict[str, Any]:
        samples = array("h")
        samples.frombytes(bytes(self.pcm[: len(self.pcm) // 2 * 2]))
        if sys.byteorder == "big":
            samples.byteswap()
        n = len(samples)
        total = sum(s * s for s in samples)
        peak = max((abs(s) for s in samples), default=0)
        loud_windows = 0
        for i in range(0, n - FRAME_SAMPLES + 1, FRAME_SAMPLES):
            w = samples[i : i + FRAME_SAMPLES]
            if math.sqrt(sum(s * s for s in w) / FRAME_SAMPLES) > SILENCE_RMS:
                loud_windows += 1
        rms = math.sqrt(total / n) if n else 0.0
        return {
            "reply_seconds": round(n / RATE, 3),
            "reply_rms": round(rms, 1),
            "reply_rms_dbfs": round(20 * math.log10(rms / 32768), 1) if rms > 0 else None,
            "reply_peak": peak,
            "reply_nonsilent_seconds": round(loud_windows * FRAME_SAMPLES / RATE, 3),
            "frames_received": self.frames,
        }


def sdp_candidates(sdp: str) -> list[dict[str, Any]]:
    """The `a=candidate` lines of an SDP as browser-style candidate dicts (mid and m-line index)."""
    sections: list[list[str]] = []
    for line in sdp.splitlines():
        if line.startswith("m="):
            sections.append([])
        elif sections:
            sections[-1].append(line.strip())
    out = []
    for index, lines in enumerate(sections):
        mid = next((l[len("a=mid:") :] for l in lines if l.startswith("a=mid:")), None)
        for l in lines:
            if l.startswith("a=candidate:"):
                out.append({"candidate": l[2:], "sdpMid": mid, "sdpMLineIndex": index})
    return out


def merge_candidates(sdp: str, payloads: list[Any]) -> str:
    """`sdp` with the candidates of WEBRTC_ICE_CANDIDATE payloads added to their m-sections
    (by sdpMLineIndex, else sdpMid, else the first)."""
    lines = sdp.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("m=")]
    if not starts:
        return sdp
    mids: dict[str, int] = {}
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(lines)
        for line in lines[start:end]:
            if line.startswith("a=mid:"):
                mids[line[len("a=mid:") :].strip()] = index
    extra: list[list[str]] = [[] for _ in starts]
    for payload in payloads:
        inner = payload.get("candidate") if isinstance(payload, dict) else None
        c = inner if isinstance(inner, dict) else payload
        text = c.get("candidate") if isinstance(c, dict) else None
        if not isinstance(text, str) or not text:
            continue
        index = c.get("sdpMLineIndex")
        if not isinstance(index, int) or not 0 <= index < len(starts):
            index = mids.get(str(c.get("sdpMid")), 0)
        line = text if text.startswith("candidate:") else "candidate:" + text
        extra[index].append("a=" + line)
    out: list[str] = []
    for index, start in enumerate(starts):
        if index == 0:
            out += lines[:start]
        end = starts[index + 1] if index + 1 < len(starts) else len(lines)
        out += lines[start:end] + extra[index]
    return "\r\n".join(out) + "\r\n"


def parse_candidate(payload: Any):
    """An aiortc candidate from a WEBRTC_ICE_CANDIDATE payload, nested (`{candidate:{...}}`, the
    Android app) or flat (`{candidate: "candidate:...", sdpMid, sdpMLineIndex}`); None for the
    end-of-candidates marker (an empty candidate)."""
    if not isinstance(payload, dict):
        raise PeerError(f"WEBRTC_ICE_CANDIDATE payload is not an object: {payload!r}")
    inner = payload.get("candidate")
    if isinstance(inner, dict):
        payload = inner
        inner = payload.get("candidate")
    if not inner:
        return None
    if not isinstance(inner, str):
        raise PeerError(f"WEBRTC_ICE_CANDIDATE candidate is not a string: {inner!r}")
    text = inner[len("candidate:") :] if inner.startswith("candidate:") else inner
    candidate = candidate_from_sdp(text)
    candidate.sdpMid = payload.get("sdpMid")
    candidate.sdpMLineIndex = payload.get("sdpMLineIndex")
    if candidate.sdpMid is None and candidate.sdpMLineIndex is None:
        candidate.sdpMLineIndex = 0
    return candidate


class Session:
    """State shared by both modes: the peer connection, tracks, and what the summary reports."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = PacedTrack()
        self.recorder = Recorder()
        self.events: list[str] = []
        self.transcripts: list[dict[str, str]] = []
        self.errors: list[str] = []
        self.extra: dict[str, Any] = {}
        self.finished = asyncio.Event()
        self.failed: Optional[str] = None
        self.connected = asyncio.Event()
        self.speech = read_wav_48k_mono(args.wav) if args.wav else b""
        self.speech_sent: Optional[asyncio.Future] = None

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            log(f"remote {track.kind} track")
            if track.kind == "audio":
                self.recorder.start(track)

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            state = self.pc.connectionState
            log(f"connection {state}")
            if state == "connected":
                self.connected.set()
            elif state == "failed":
                self.fail("the peer connection failed (ICE or DTLS)")

        @self.pc.on("iceconnectionstatechange")
        async def on_ice() -> None:
            log(f"ICE {self.pc.iceConnectionState}")

    def fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
            log(f"failure: {reason}")
        self.finished.set()

    def speak(self) -> None:
        """Starts streaming the WAV (once)."""
        if self.speech_sent is None:
            log(f"speaking {len(self.speech) / 2 / RATE:.2f} s of audio")
            self.speech_sent = self.mic.play(self.speech)

    async def close(self) -> None:
        await self.recorder.stop()
        self.mic.stop()
        await self.pc.close()


async def run_vip(s: Session) -> None:
    args = s.args
    channel = s.pc.createDataChannel("vip")
    s.pc.addTransceiver(s.mic, direction="sendrecv")
    replies_wanted = (1 if s.speech else 0) + (1 if args.text else 0)
    if replies_wanted == 0:
        raise PeerError("vip mode needs --wav or --text")
    state = {"replies": 0, "text_sent": False}

    def send(message: dict[str, Any]) -> None:
        log(f"-> {message['type']}")
        channel.send(json.dumps(message))

    def send_text() -> None:
        state["text_sent"] = True
        send({"type": "input.text", "text": args.text})

    @channel.on("open")
    def on_open() -> None:
        log("data channel open")

    @channel.on("message")
    def on_message(raw: Any) -> None:
        if not isinstance(raw, str):
            s.errors.append("binary data channel message")
            return
        log(f"<- {raw[:300]}")
        try:
            msg = json.loads(raw)
            kind = msg["type"]
        except (ValueError, KeyError, TypeError):
            s.errors.append(f"not a JSON event: {raw[:200]}")
            return
        s.events.append(kind)
        if kind == "session.connected":
            s.extra["session_id_dc"] = msg.get("session_id")
            send(
                {
                    "type": "actions.declare",
                    "actions": {
                        "set_theme": {
                            "description": "Switch the page between the light and dark theme.",
                            "parameters": {
                                "type": "object",
                                "properties": {
                                    "theme": {"type": "string", "enum": ["light", "dark"]}
                                },
                                "required": ["theme"],
                            },
                        }
                    },
                }
            )
            send({"type": "state.narrate", "text": "A settings page in the light theme."})
            if s.speech:
                s.speak()
            else:
                send_text()
        elif kind == "state":
            s.extra.setdefault("states", []).append(msg.get("state"))
        elif kind == "action.invoke":
            s.extra.setdefault("actions_invoked", []).append(
                {"action_id": msg.get("action_id"), "parameters": msg.get("parameters")}
            )
            send(
                {
                    "type": "action.result",
                    "invocation_id": msg.get("invocation_id"),
                    "status": "success",
                    "data": {"theme": (msg.get("parameters") or {}).get("theme")},
                }
            )
        elif kind in ("transcript.user", "reply.text"):
            who = "user" if kind == "transcript.user" else "reply"
            s.transcripts.append({"kind": who, "text": str(msg.get("text"))})
        elif kind == "reply.done":
            state["replies"] += 1
            if state["replies"] >= replies_wanted:
                s.finished.set()
            elif args.text and not state["text_sent"]:
                send_text()
        elif kind == "error":
            s.errors.append(f"error: {msg.get('code')}: {msg.get('message')}")
        elif kind == "error.fatal":
            s.errors.append(f"error.fatal: {msg.get('code')}: {msg.get('message')}")
            s.fail(f"the server ended the session: {msg.get('code')}: {msg.get('message')}")

    # aiortc gathers every candidate inside setLocalDescription: the offer is complete.
    await s.pc.setLocalDescription(await s.pc.createOffer())
    offer = s.pc.localDescription
    url = args.url.rstrip("/") + "/webrtc/offer"
    log(f"POST {url}")
    async with aiohttp.ClientSession() as http:
        async with http.post(
            url,
            json={"sdp": offer.sdp, "type": "offer"},
            headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else None,
            timeout=aiohttp.ClientTimeout(total=15),
        ) as response:
            body = await response.text()
            if response.status != 200:
                raise PeerError(f"POST /webrtc/offer answered {response.status}: {body[:500]}")
    try:
        answer = json.loads(body)
        sdp, kind = answer["sdp"], answer.get("type")
    except (ValueError, KeyError, TypeError):
        raise PeerError(f"POST /webrtc/offer: not a JSON answer: {body[:500]}")
    if kind != "answer":
        raise PeerError(f"POST /webrtc/offer: type is {kind!r}, not 'answer'")
    s.extra["session_id"] = answer.get("session_id")
    s.extra["answer_received"] = True
    await s.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
    await wait_finished(s)
    if not s.failed and channel.readyState == "open":
        send({"type": "session.end"})
        await asyncio.sleep(0.1)


async def run_gemini(s: Session) -> None:
    args = s.args
    if not s.speech:
        raise PeerError("gemini mode needs --wav")
    s.pc.addTransceiver(s.mic, direction="sendrecv")
    s.extra["data_channel_replies"] = []
    channel = s.pc.createDataChannel("test")

    @channel.on("open")
    def on_open() -> None:
        log("data channel open: -> ping")
        channel.send("ping")

    @channel.on("message")
    def on_message(raw: Any) -> None:
        reply = raw if isinstance(raw, str) else f"<binary {len(raw)} bytes>"
        log(f"data channel <- {reply[:100]}")
        s.extra["data_channel_replies"].append(reply)

    setup = asyncio.Event()
    offered = asyncio.Event()
    answered = asyncio.Event()
    pending: list[Any] = []
    counts = {"sent": 0, "received": 0, "ignored": 0}
    tasks: list[asyncio.Task] = []
    s.extra["answer_received"] = False
    s.extra["inline_audio_bytes"] = 0

    async with aiohttp.ClientSession() as http:
        log(f"connecting {args.url}")
        ws = await asyncio.wait_for(http.ws_connect(args.url, max_msg_size=0), 15)

        async def send(kind: str, payload: Any = None) -> None:
            log(f"-> {kind}")
            frame: dict[str, Any] = {"type": kind}
            if payload is not None:
                frame["payload"] = payload
            await ws.send_str(json.dumps(frame))

        async def add_candidate(payload: Any) -> None:
            candidate = parse_candidate(payload)
            try:
                await s.pc.addIceCandidate(candidate)
            except ValueError as e:
                # The answer signalled end-of-candidates already: aiortc refuses more, which
                # is fine when they were in the answer too.
                counts["ignored"] += 1
                log(f"candidate not added: {e}")

        async def apply_answer(sdp: str) -> None:
            s.extra["answer_had_candidates"] = "a=candidate:" in sdp
            if not s.extra["answer_had_candidates"]:
                # aiortc starts ICE when the answer is set and fails at once without any remote
                # candidate: wait for the first trickled ones and put them into the answer.
                deadline = time.monotonic() + 5
                while not pending and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.2)  # the rest of the burst
                sdp = merge_candidates(sdp, pending)
                s.extra["candidates_merged_into_answer"] = len(pending)
                pending.clear()
            try:
                await s.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
            except ValueError as e:
                s.fail(f"WEBRTC_ANSWER refused by aiortc: {e}")
                return
            answered.set()
            while pending:
                await add_candidate(pending.pop(0))

        async def reader() -> None:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    if message.type == aiohttp.WSMsgType.BINARY:
                        data = message.data.decode("utf-8", "replace")
                    else:
                        break
                else:
                    data = message.data
                try:
                    msg = json.loads(data)
                    kind = msg["type"]
                except (ValueError, KeyError, TypeError):
                    s.errors.append(f"not a JSON frame: {data[:200]}")
                    continue
                payload = msg.get("payload") or {}
                s.events.append(kind)
                log(f"<- {kind} {json.dumps(payload)[:200] if kind != 'CONTENT_MESSAGE' else ''}")
                if kind == "SETUP_COMPLETE":
                    ok = (payload.get("setupComplete") or {}).get("success")
                    if ok is False:
                        s.fail(f"SETUP_COMPLETE without success: {payload}")
                    setup.set()
                elif kind == "WEBRTC_ANSWER":
                    sdp = payload.get("sdp") if isinstance(payload, dict) else None
                    if not isinstance(sdp, str):
                        s.fail(f"WEBRTC_ANSWER without sdp: {payload!r}"[:300])
                        continue
                    s.extra["answer_received"] = True
                    tasks.append(asyncio.ensure_future(apply_answer(sdp)))
                elif kind == "WEBRTC_ICE_CANDIDATE":
                    counts["received"] += 1
                    if answered.is_set():
                        await add_candidate(payload)
                    else:
                        pending.append(payload)
                elif kind == "CONTENT_MESSAGE":
                    content = payload.get("serverContent") or {}
                    for key, who in (("inputTranscription", "user"), ("outputTranscription", "reply")):
                        text = (content.get(key) or {}).get("text")
                        if text:
                            s.transcripts.append({"kind": who, "text": text})
                    for part in (content.get("modelTurn") or {}).get("parts") or []:
                        if part.get("text"):
                            s.transcripts.append({"kind": "reply_text", "text": part["text"]})
                        data64 = (part.get("inlineData") or {}).get("data")
                        if data64:
                            s.extra["inline_audio_bytes"] += len(data64) * 3 // 4
                    if content.get("turnComplete"):
                        s.finished.set()
                elif kind == "TURN_COMPLETE":
                    s.finished.set()
                elif kind == "GEMINI_ERROR":
                    s.errors.append(f"GEMINI_ERROR: {json.dumps(payload)[:300]}")
                    if offered.is_set() and not s.extra["answer_received"]:
                        # A server without WebRTC answers the offer with this: no point waiting.
                        s.fail(f"GEMINI_ERROR instead of WEBRTC_ANSWER: {json.dumps(payload)[:300]}")
                elif kind == "GEMINI_DISCONNECTED":
                    s.fail(f"GEMINI_DISCONNECTED: {payload}")
            if not s.finished.is_set():
                s.fail(f"the WebSocket closed (code {ws.close_code})")

        reading = asyncio.ensure_future(reader())
        try:
            await send(
                "CONNECT_GEMINI",
                {
                    "initialConfig": {
                        "model": "x",
                        "generationConfig": {"responseModalities": ["AUDIO"]},
                    }
                },
            )
            await wait_for(s, setup, "SETUP_COMPLETE", 10)
            await s.pc.setLocalDescription(await s.pc.createOffer())
            offer = s.pc.localDescription
            offered.set()
            await send("WEBRTC_OFFER", {"sdp": offer.sdp, "type": "offer"})
            for c in sdp_candidates(offer.sdp):
                await send("WEBRTC_ICE_CANDIDATE", {"candidate": c})
                counts["sent"] += 1
            await wait_for(s, answered, "WEBRTC_ANSWER", 10)
            await wait_for(s, s.connected, "the peer connection", 10)
            s.speak()
            await wait_finished(s)
        finally:
            s.extra["ice_candidates_sent"] = counts["sent"]
            s.extra["ice_candidates_received"] = counts["received"]
            s.extra["ice_candidates_not_added"] = counts["ignored"]
            if not ws.closed:
                await send("DISCONNECT_GEMINI")
                await ws.close()
            for task in [reading, *tasks]:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 (closing anyway)
                    pass


async def wait_for(s: Session, event: asyncio.Event, what: str, timeout: float) -> None:
    """Waits for `event`, failing early when the session failed."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if s.failed:
            raise PeerError(s.failed)
        if time.monotonic() > deadline:
            raise PeerError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def wait_finished(s: Session) -> None:
    """Waits for the end of the reply (or failure or the overall timeout), then the tail."""
    remaining = s.args.timeout - (time.monotonic() - _started)
    try:
        await asyncio.wait_for(s.finished.wait(), timeout=max(remaining, 0.1))
    except asyncio.TimeoutError:
        s.fail(f"the reply did not finish within {s.args.timeout:.0f} s")
        return
    if not s.failed:
        log(f"reply finished; recording {s.args.tail:.1f} s more")
        await asyncio.sleep(s.args.tail)


async def main(args: argparse.Namespace) -> int:
    s = Session(args)
    try:
        if args.mode == "vip":
            await run_vip(s)
        else:
            await run_gemini(s)
    except PeerError as e:
        s.fail(str(e))
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        s.fail(f"{type(e).__name__}: {e}")
    finally:
        await s.close()
    if args.save_reply:
        s.recorder.save(args.save_reply)
    if s.errors and not s.failed:
        s.fail(f"the server reported errors: {s.errors}")
    summary = {
        "mode": args.mode,
        "ok": s.failed is None,
        "failure": s.failed,
        **s.recorder.stats(),
        "events": s.events,
        "transcripts": s.transcripts,
        "errors": s.errors,
        **s.extra,
        "elapsed_seconds": round(time.monotonic() - _started, 2),
    }
    print(json.dumps(summary, indent=2))
    if s.failed:
        log(f"FAILED: {s.failed}")
        return 1
    log("PASSED")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode, url_help in (
        ("vip", "the server's base URL (http://127.0.0.1:PORT); the offer goes to /webrtc/offer"),
        ("gemini", "the bridge's WebSocket URL (ws://127.0.0.1:PORT/gemini)"),
    ):
        p = sub.add_parser(mode)
        p.add_argument("--url", required=True, help=url_help)
        p.add_argument("--wav", help="speech to stream (16-bit WAV, any rate, mono or stereo)")
        p.add_argument("--save-reply", help="write the received audio here (48 kHz mono WAV)")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole run")
        p.add_argument("--tail", type=float, default=1.0, help="seconds recorded after the reply")
        if mode == "vip":
            p.add_argument("--text", help="a typed turn sent after the spoken reply")
            p.add_argument("--api-key", help="sent as `Authorization: Bearer` with the offer")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
