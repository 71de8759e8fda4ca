"""The published realtime client, `deepslate-core` (DeepslateSession with `ws_url` set), against
a running voxgate server, unchanged: only its public API and listener callbacks are used, plus
one read of `session._ws` to know when the socket is up (see `connect`).

Needs the server to run the demo agent, to accept the bearer key given with --api-key, and to
use the interop fake recognizer (fake_asr.py) for speech.

Session A on `/realtime`, bearer key, one client tool declared before connecting:
  initialize -> SessionReady; a text turn ("You said: ..." with one turn id from ResponseBegin
  to ResponseEnd); a client tool round trip (ToolCallRequest with the arguments, ToolCallResponse,
  the model continues with the result); ReconfigureSessionRequest of the system prompt (the
  session keeps serving); an audio turn from a 16 kHz WAV after a 24 kHz initialization (the
  client reconfigures the input line by itself; VAD state events, the user transcription, the
  reply; the transcript length proves the server decoded the audio at the new rate);
  DirectSpeech without history; a ConversationQuery; history export with and without audio;
  close, after which the server reports no open realtime session.
Session B on the hosted path with a model suffix: a "speak first" TriggerInference queued
  before connecting makes the client initialize by itself; the greeting arrives.
Session C with a wrong key: the client gets its HandshakeRejectedError (HTTP 401).
Session D with the client's own hosted URL layout (`base_url` + model) and hosted TTS: a spoken
  reply (ModelAudioChunks of audible 24 kHz PCM, no text fragments, ModelSpeechProgress with the
  reply text); then barge-in: the user speaks during a long reply, PlaybackClearBuffer arrives,
  and the exported history has the reply cut to what was played, DELIVERY_INTERRUPTED, followed
  by the user's speech.
Session E: long text turns under the server's default context budget (32,000 characters): once
  the conversation outgrows it, ContextTruncated names the oldest turns and the response
  generated without them, and the exported history marks exactly those messages with
  truncated_at_response_turn_id.
"""

import argparse
import asyncio
import json
import re
import urllib.request

import numpy as np

from common import Events, ScenarioError, check, log, read_wav_pcm16, run
from deepslate.core import (
    DeepslateOptions,
    DeepslateSession,
    DeepslateSessionListener,
    HandshakeRejectedError,
    HostedTtsConfig,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Recorder(DeepslateSessionListener):
    """Records every callback the client makes into an Events log."""

    def __init__(self, events: Events) -> None:
        self.events = events

    async def on_session_initialized(self):
        self.events.add("ready")

    async def on_response_begin(self, turn_id=0):
        self.events.add("begin", turn_id)

    async def on_response_end(self, turn_id=0):
        self.events.add("end", turn_id)

    async def on_text_fragment(self, text, turn_id=None):
        self.events.add("text", (text, turn_id))

    async def on_audio_chunk(self, audio, sample_rate, channels, transcript=None, turn_id=None):
        self.events.add("audio", (len(audio), turn_id))
        self.events.add("audio_pcm", bytes(audio))

    async def on_tool_call(self, call_id, name, params, turn_id=None):
        self.events.add("tool_call", (call_id, name, params, turn_id))

    async def on_user_transcription(self, text, language=None, turn_id=0):
        self.events.add("transcription", (text, turn_id))

    async def on_vad_state_event(self, from_state, to_state, session_time_ms, packet_id):
        self.events.add("vad", (from_state, to_state, session_time_ms, packet_id))

    async def on_playback_buffer_clear(self):
        self.events.add("clear")

    async def on_chat_history(self, messages):
        self.events.add("history", messages)

    async def on_conversation_query_result(self, query_id, text):
        self.events.add("query_result", (query_id, text))

    async def on_model_speech_progress(self, turn_id, text, audio_bytes_played, exact):
        self.events.add("progress", (turn_id, text, audio_bytes_played, exact))

    async def on_error(self, category, message, trace_id=None):
        self.events.add("error", (category, message, trace_id))

    async def on_fatal_error(self, e):
        self.events.add("fatal", e)

    async def on_context_truncated(self, truncated_turn_ids, response_turn_id):
        self.events.add("truncated", (list(truncated_turn_ids), response_turn_id))


def options(ws_url: str, api_key: str) -> DeepslateOptions:
    # max_retries=0: a failure must show up, not be papered over by a reconnect.
    return DeepslateOptions(
        vendor_id="interop",
        organization_id="interop",
        api_key=api_key,
        ws_url=ws_url,
        max_retries=0,
    )


def no_errors(events: Events) -> None:
    errors = events.since(0, "error") + [repr(e) for e in events.since(0, "fatal")]
    check(not errors, f"the server reported errors: {errors}")


async def connect(session: DeepslateSession, events: Events, sample_rate: int = 24000) -> None:
    """Starts the session and initializes it as a text-only client does.

    DeepslateSession drops text input sent before its socket is up and only initializes once it
    has one, and it has no public "connected" signal: its own integrations either stream audio
    (which initializes on the first frame) or queue a control message. A text-only caller waits
    for `_ws` and then calls `initialize()`.
    """
    session.start()
    for _ in range(500):
        if session._ws is not None:
            break
        if events.since(0, "fatal"):
            raise ScenarioError(f"connection failed: {events.since(0, 'fatal')}")
        await asyncio.sleep(0.02)
    else:
        raise ScenarioError("the client's websocket did not connect within 10 s")
    await session.initialize(sample_rate, 1)
    await events.wait("SessionReady", lambda: events.since(0, "ready"))


async def turn(events: Events, mark: int, what: str, timeout: float = 10.0) -> tuple[int, str]:
    """Waits for the first complete response after `mark`; returns (turn id, its text)."""
    begin = await events.wait(f"ResponseBegin ({what})", lambda: events.since(mark, "begin"), timeout)
    turn_id = begin[0]
    await events.wait(
        f"ResponseEnd({turn_id}) ({what})",
        lambda: turn_id in events.since(mark, "end"),
        timeout,
    )
    fragments = [t for t, tid in events.since(mark, "text") if tid == turn_id]
    others = [tid for _, tid in events.since(mark, "text") if tid != turn_id]
    check(not others[:1] or others[0] > turn_id, f"fragments of turn {turn_id} carried turn ids {others}")
    check(fragments, f"turn {turn_id} ({what}) had no text fragments")
    return turn_id, "".join(fragments)


def open_realtime_sessions(http_base: str) -> int:
    with urllib.request.urlopen(f"{http_base}/health", timeout=5) as r:
        return json.load(r)["sessions"]["realtime"]


async def session_a(args) -> None:
    events = Events()
    s = DeepslateSession.create(options(f"{args.ws_base}/realtime", args.api_key), listener=Recorder(events))
    await s.update_tools([TOOL])
    try:
        await connect(s, events)
        log("A: SessionReady after InitializeSessionRequest (24 kHz, 1 tool declared)")

        m = events.mark()
        await s.send_text("hello voxgate")
        turn_id, text = await turn(events, m, "text turn")
        check(text.strip() == "You said: hello voxgate", f"text turn reply was {text!r}")
        log(f"A: text turn {turn_id}: {text!r}")

        m = events.mark()
        await s.send_text('call get_weather {"city": "Paris"}')
        call = await events.wait("ToolCallRequest", lambda: events.since(m, "tool_call"))
        call_id, name, params, call_turn = call[0]
        check(name == "get_weather", f"tool call named {name!r}")
        check(params == {"city": "Paris"}, f"tool call arguments {params!r}")
        log(f"A: ToolCallRequest id={call_id} name={name} params={params} turn={call_turn}")
        m2 = events.mark()
        await s.send_tool_response(call_id, {"temp_c": 21, "sky": "clear"})
        turn_id, text = await turn(events, m2, "continuation after ToolCallResponse")
        check(
            text.strip() == 'The tool get_weather returned: {"temp_c": 21, "sky": "clear"}',
            f"continuation after the tool result was {text!r}",
        )
        log(f"A: continuation turn {turn_id}: {text!r}")

        # No observable model behaviour changes with the demo agent; what is checked is that the
        # request is accepted (no error) and the session keeps serving.
        await s.reconfigure(system_prompt="You are the interop test assistant.", temperature=0.5)
        m = events.mark()
        await s.send_text("after reconfigure")
        turn_id, text = await turn(events, m, "turn after ReconfigureSessionRequest")
        check(text.strip() == "You said: after reconfigure", f"reply after reconfigure was {text!r}")
        no_errors(events)
        log("A: ReconfigureSessionRequest (system prompt, temperature) accepted; session serves on")

        pcm, rate, channels = read_wav_pcm16(args.wav)
        check((rate, channels) == (16000, 1), f"{args.wav}: expected 16 kHz mono")
        m = events.mark()
        # A few times faster than real time; the VAD counts samples.
        await send_speech(s, pcm, rate, channels, 0.005)
        total = len(pcm) / 2 / rate
        (stt_text, stt_turn) = (
            await events.wait("UserTranscriptionResult", lambda: events.since(m, "transcription"), 15)
        )[0]
        vad = events.since(m, "vad")
        check(
            any(v[1] == "SPEECH" for v in vad) and vad and vad[-1][1] in ("SILENCE", "SPEECH_ENDING"),
            f"VAD state events were {vad}",
        )
        found = re.fullmatch(r"interop transcript of ([0-9.]+) seconds", stt_text)
        check(found is not None, f"user transcription {stt_text!r} is not the fake recognizer's")
        heard = float(found.group(1))
        # The utterance is the WAV (after up to a second of backbuffer) plus the VAD's stop time
        # of the silence; read at the 24 kHz of the init it would be 2/3 of that.
        check(
            0.9 * total <= heard <= total + 1.1,
            f"the recognizer got {heard} s of audio (the WAV is {total:.1f} s)",
        )
        turn_id, text = await turn(events, m, "audio turn", 15)
        check(text.strip() == f"You said: {stt_text}", f"audio turn reply was {text!r}")
        log(
            f"A: audio turn ({total:.1f} s WAV at 16 kHz after a 24 kHz init): {len(vad)} VAD events, "
            f"transcription {stt_text!r} (turn {stt_turn}), reply turn {turn_id}"
        )

        m = events.mark()
        await s.send_direct_speech("This is direct speech.", include_in_history=False)
        turn_id, text = await turn(events, m, "DirectSpeech")
        check(text.strip() == "This is direct speech.", f"direct speech came back as {text!r}")
        log(f"A: DirectSpeech turn {turn_id}")

        m = events.mark()
        await s.send_conversation_query("q-1", prompt="Summarize the conversation.")
        (qid, qtext) = (await events.wait("ConversationQueryResult", lambda: events.since(m, "query_result")))[0]
        check(qid == "q-1", f"query result matched to {qid!r}")
        check("tool calls" in qtext and "messages so far" in qtext, f"query result {qtext!r}")
        log(f"A: ConversationQueryResult: {qtext!r}")

        history = await asyncio.wait_for(s.export_chat_history(await_pending=True, exclude_audio=True), 10)
        check_history(history, stt_text, with_audio=False)
        full = await asyncio.wait_for(s.export_chat_history(await_pending=True, exclude_audio=False), 10)
        check_history(full, stt_text, with_audio=True)
        log(f"A: history export: {len(history)} messages (exclude_audio and with audio)")
        no_errors(events)
    finally:
        await s.close()
    for _ in range(50):
        if open_realtime_sessions(args.http_base) == 0:
            break
        await asyncio.sleep(0.1)
    else:
        raise ScenarioError("the server still counts an open realtime session 5 s after close")
    log("A: closed; the server counts no open realtime session")


def texts(message) -> list[str]:
    return [c["text"] for c in message["content"] if c["type"] == "text"]


def check_history(history, stt_text: str, with_audio: bool) -> None:
    roles = [(m["role"], texts(m)) for m in history]
    user = [t for r, ts in roles if r == "user" for t in ts]
    assistant = [t.strip() for r, ts in roles if r == "assistant" for t in ts]
    for said in ("hello voxgate", 'call get_weather {"city": "Paris"}', "after reconfigure"):
        check(said in user, f"history lacks the user message {said!r}: {roles}")
    for reply in ("You said: hello voxgate", "You said: after reconfigure", f"You said: {stt_text}"):
        check(reply in assistant, f"history lacks the reply {reply!r}: {roles}")
    calls = [c for m in history for c in m["content"] if c["type"] == "tool_call"]
    results = [c for m in history for c in m["content"] if c["type"] == "tool_result"]
    check(
        [(c["name"], c["parameters"]) for c in calls] == [("get_weather", {"city": "Paris"})],
        f"history tool calls: {calls}",
    )
    check(
        len(results) == 1 and results[0]["id"] == calls[0]["id"] and json.loads(results[0]["result"])["temp_c"] == 21,
        f"history tool results: {results}",
    )
    direct = [m for m in history if "This is direct speech." in [t.strip() for t in texts(m)]]
    check(len(direct) == 1 and direct[0]["ephemeral"], f"direct speech in history: {direct}")
    audio = [c for m in history if m["role"] == "user" for c in m["content"] if c["type"] == "input_audio"]
    check(len(audio) == 1, f"history has {len(audio)} user audio items, expected 1")
    check(audio[0]["transcription"] == stt_text, f"history audio transcription {audio[0]['transcription']!r}")
    if with_audio:
        check(len(audio[0]["audio"]) > 16000, f"history audio has {len(audio[0]['audio'])} bytes")
    else:
        check(not audio[0]["audio"], "exclude_audio still returned audio bytes")
    statuses = {m["delivery_status"] for m in history}
    check(statuses == {"DELIVERY_COMPLETE"}, f"delivery statuses {statuses}")


async def session_b(args) -> None:
    events = Events()
    url = f"{args.ws_base}/api/v1/vendors/interop-vendor/organizations/interop-org/realtime/opal-v2.1"
    s = DeepslateSession.create(options(url, args.api_key), listener=Recorder(events))
    try:
        await s.trigger_inference()  # queued before the socket exists: the client self-initializes
        s.start()
        await events.wait("SessionReady", lambda: events.since(0, "ready"))
        turn_id, text = await turn(events, 0, "greeting from TriggerInference")
        check("Hello" in text, f"greeting was {text!r}")
        no_errors(events)
        log(f"B: hosted path with model suffix; TriggerInference greeting turn {turn_id}: {text[:40]!r}...")
    finally:
        await s.close()


async def session_c(args) -> None:
    events = Events()
    s = DeepslateSession.create(options(f"{args.ws_base}/realtime", "wrong-key"), listener=Recorder(events))
    try:
        s.start()
        (fatal,) = await events.wait("the client's fatal error", lambda: events.since(0, "fatal"))
        check(
            isinstance(fatal, HandshakeRejectedError) and fatal.status == 401,
            f"wrong key gave {fatal!r}",
        )
        check(not events.since(0, "ready"), "a session with a wrong key became ready")
        log("C: wrong bearer key -> HandshakeRejectedError(401)")
    finally:
        await s.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="host:port of the voxgate server")
    ap.add_argument("--api-key", required=True, help="a bearer key the server accepts")
    ap.add_argument("--wav", required=True, help="16 kHz mono WAV with speech")
    args = ap.parse_args()
    args.ws_base = f"ws://{args.server}"
    args.http_base = f"http://{args.server}"
    await session_a(args)
    await session_b(args)
    await session_c(args)
    await session_d(args)
    await session_e(args)


async def session_d(args) -> None:
    events = Events()
    opts = DeepslateOptions(
        vendor_id="interop-vendor",
        organization_id="interop-org",
        api_key=args.api_key,
        base_url=args.http_base,  # the client builds the hosted path itself
        model="opal-v2.1",
        max_retries=0,
    )
    s = DeepslateSession.create(opts, listener=Recorder(events), tts_config=HostedTtsConfig(voice_id="default"))
    try:
        await connect(s, events)
        m = events.mark()
        await s.send_text("hello voxgate")
        turn_id = await audio_turn(events, m, "spoken reply")
        chunks = [n for n, tid in events.since(m, "audio") if tid == turn_id]
        pcm = b"".join(events.since(m, "audio_pcm"))
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        rms = float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0
        check(len(pcm) >= 24000, f"spoken reply: {len(pcm)} bytes of 24 kHz audio")
        check(rms > 100, f"spoken reply audio is silent (rms {rms:.1f})")
        check(not events.since(m, "text"), "a session with TTS got text fragments")
        progress = await events.wait(
            "ModelSpeechProgress with the whole reply",
            lambda: [p for p in events.since(m, "progress") if p[0] == turn_id and p[1].strip() == "You said: hello voxgate"],
        )
        log(
            f"D: hosted TTS via base_url: turn {turn_id}, {len(chunks)} ModelAudioChunks, "
            f"{len(pcm) / 48000:.2f} s of 24 kHz audio (rms {rms:.0f}), speech progress {progress[-1][2]} bytes"
        )

        # Barge-in: the user speaks while a long reply plays.
        m = events.mark()
        long_text = "please listen " + "to this long sentence that keeps going " * 8
        await s.send_text(long_text)
        await events.wait("the long reply's audio", lambda: events.since(m, "audio"), 10)
        pcm_in, rate, channels = read_wav_pcm16(args.wav)
        # Some of the reply is heard before the user cuts in.
        await asyncio.sleep(1.0)
        await send_speech(s, pcm_in, rate, channels, 0.02)
        await events.wait("PlaybackClearBuffer on user speech", lambda: events.since(m, "clear"), 10)
        (stt_text, _) = (await events.wait("the barge-in transcription", lambda: events.since(m, "transcription"), 15))[0]
        history = await asyncio.wait_for(s.export_chat_history(await_pending=True, exclude_audio=True), 15)
        interrupted = [h for h in history if h["role"] == "assistant" and h["delivery_status"] == "DELIVERY_INTERRUPTED"]
        check(len(interrupted) == 1, f"history after barge-in: {[(h['role'], h['delivery_status']) for h in history]}")
        heard = " ".join(texts(interrupted[0]))
        full = f"You said: {long_text.strip()}"
        check(
            heard.strip() and full.startswith(heard.strip()) and len(heard.strip()) < len(full),
            f"the interrupted reply was not truncated to what was heard: {heard!r}",
        )
        spoken = [c.get("transcription") for h in history if h["role"] == "user" for c in h["content"] if c["type"] == "input_audio"]
        check(stt_text in spoken, f"the barge-in speech is not in history: {spoken}")
        no_errors(events)
        log(f"D: barge-in: PlaybackClearBuffer, reply cut to {heard!r} (DELIVERY_INTERRUPTED), then {stt_text!r}")
    finally:
        await s.close()


# Under the server's default budget of 32,000 characters, each exchange (the question and the
# demo agent's "You said: ..." echo) costs about 12,000: the fourth response has to drop the first.
LONG_TURN_CHARS = 6000


async def send_speech(s, pcm: bytes, rate: int, channels: int, pace: float) -> None:
    """Sends the WAV in 20 ms chunks `pace` seconds apart, then a second of silence (a
    microphone goes on sending) so the VAD hears the end of the speech."""
    chunk = rate // 50 * 2 * channels
    for i in range(0, len(pcm), chunk):
        await s.send_audio(pcm[i : i + chunk], rate, channels)
        await asyncio.sleep(pace)
    for _ in range(50):
        await s.send_audio(bytes(chunk), rate, channels)
        await asyncio.sleep(pace)


async def session_e(args) -> None:
    events = Events()
    s = DeepslateSession.create(options(f"{args.ws_base}/realtime", args.api_key), listener=Recorder(events))
    try:
        await connect(s, events)
        responses = []
        for i in range(1, 5):
            mark = events.mark()
            await s.send_text(f"question {i} " + "lorem ipsum " * (LONG_TURN_CHARS // 12))
            turn_id, _ = await turn(events, mark, f"long text turn {i}")
            responses.append(turn_id)
        truncs = events.since(0, "truncated")
        check(truncs, f"no ContextTruncated after {len(responses)} long turns")
        dropped, response = truncs[0]
        check(response in responses[2:], f"ContextTruncated response turn {response}, responses {responses}")
        check(dropped and min(dropped) < responses[0] < response, f"ContextTruncated dropped {dropped}")
        history = await asyncio.wait_for(s.export_chat_history(await_pending=True, exclude_audio=True), 10)
        marked = {m["turn_id"] for m in history if m["truncated_at_response_turn_id"] == response}
        check(marked == set(dropped), f"history marks {marked} for response {response}, ContextTruncated said {dropped}")
        no_errors(events)
        log(f"E: context budget: ContextTruncated({dropped}, response {response}); history marks match")
    finally:
        await s.close()


async def audio_turn(events: Events, mark: int, what: str) -> int:
    """Waits for the first complete response after `mark` with audio; returns its turn id."""
    begin = await events.wait(f"ResponseBegin ({what})", lambda: events.since(mark, "begin"))
    turn_id = begin[0]
    await events.wait(f"ResponseEnd({turn_id}) ({what})", lambda: turn_id in events.since(mark, "end"), 15)
    await events.wait(f"audio of turn {turn_id}", lambda: [a for a in events.since(mark, "audio") if a[1] == turn_id])
    return turn_id


if __name__ == "__main__":
    run(main)
