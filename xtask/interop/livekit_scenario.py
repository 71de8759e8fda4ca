"""The Deepslate LiveKit plugin (`deepslate-livekit`) against a running voxgate server: its
realtime session (`RealtimeModel(ws_url=...).session()`) driven directly, as livekit-agents'
AgentSession drives it, with no LiveKit server or room: 20 ms rtc.AudioFrames pushed at real
time with `push_audio` (silence, or the WAV when the user speaks), as a room's microphone
track does; every `generation_created` event's message, text, audio and function streams
read to their end; user text and tool results handed over with `update_chat_ctx`, replies
asked for with `generate_reply`.

Needs the server to run the demo agent, to accept the bearer key given with --api-key, and to
use the interop fake recognizer (fake_asr.py) for speech.

Two sessions, one without TTS (text streams) and one with the server's hosted TTS (audio
streams, text streams paced by ModelSpeechProgress), each:
  a spoken turn (input_speech_started/stopped, input_audio_transcription_completed, a
  generation with the reply); a reply request 2 s after that reply finished playing
  (`generate_reply(instructions=...)`: TriggerInference with instructions; the demo agent
  greets; the plugin's own timeout, 20 s here, fails it); a text turn (a user message through
  `update_chat_ctx`, then `generate_reply()`); a tool call through LiveKit's function calling
  (`update_tools` with a `function_tool`, the FunctionCall from the generation's function
  stream run with `execute_function_call`, its output handed back with `update_chat_ctx`; the
  model continues with the result); a history export (`export_chat_history`) holding all of it.
A failed reply request is reported and the session goes on; the script fails at the end with
every failure.
"""

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

from livekit import rtc
from livekit.agents import function_tool, llm
from livekit.agents.llm import FunctionToolCall
from livekit.agents.llm.utils import execute_function_call

from common import Events, ScenarioError, check, read_wav_pcm16, run
from deepslate.livekit import HostedTtsConfig
from deepslate.livekit.realtime import RealtimeModel
from plugin_common import (
    GREETING_START,
    REPLY_INSTRUCTIONS,
    REPLY_REQUEST_DELAY,
    REPLY_TIMEOUT,
    TEXT,
    TEXT_REPLY,
    TOOL_ARGS,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_REPLY,
    TOOL_REQUEST,
    TOOL_RESULT,
    Mic,
    Report,
    check_history,
    check_spoken_audio,
    check_transcript,
    step_log,
)


@function_tool(name=TOOL_NAME, description=TOOL_DESCRIPTION)
async def get_weather(city: str) -> str:
    """The client tool: answers for any city."""
    return json.dumps(TOOL_RESULT)


@dataclass
class Generation:
    """What one `generation_created` event delivered, read to the end of its streams."""

    response_id: str
    user_initiated: bool
    text: list[str] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    calls: list[llm.FunctionCall] = field(default_factory=list)
    done: bool = False


class Session:
    """One plugin realtime session with everything it emits recorded."""

    def __init__(self, args, name: str, tts: bool) -> None:
        self.name = name
        self.tts = tts
        self.events = Events()
        self.generations: list[Generation] = []
        self.model = RealtimeModel(
            api_key=args.api_key,
            ws_url=f"ws://{args.server}/realtime",
            tts_config=HostedTtsConfig(voice_id="default") if tts else None,
            generate_reply_timeout=REPLY_TIMEOUT,
        )
        self.rt = None
        self.mic = Mic(self._send_audio)
        self._readers: set[asyncio.Task] = set()

    async def _send_audio(self, pcm: bytes) -> None:
        self.rt.push_audio(
            rtc.AudioFrame(data=pcm, sample_rate=self.mic.rate, num_channels=1, samples_per_channel=len(pcm) // 2)
        )

    def start(self) -> None:
        self.rt = self.model.session()
        rt = self.rt
        rt.on("session_initialized", lambda _: self.events.add("ready"))
        rt.on("input_speech_started", lambda ev: self.events.add("speech_started", ev))
        rt.on("input_speech_stopped", lambda ev: self.events.add("speech_stopped", ev))
        rt.on("input_audio_transcription_completed", lambda ev: self.events.add("transcription", ev.transcript))
        rt.on("error", lambda ev: self.events.add("error", ev))
        rt.on("model_text_fragment", lambda ev: self.events.add("fragment", ev.text))
        rt.on("generation_created", self._on_generation)

    def _on_generation(self, ev: llm.GenerationCreatedEvent) -> None:
        gen = Generation(response_id=ev.response_id, user_initiated=ev.user_initiated)
        self.generations.append(gen)
        self.events.add("generation", gen)
        task = asyncio.create_task(self._read(ev, gen))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _read(self, ev: llm.GenerationCreatedEvent, gen: Generation) -> None:
        """Reads a generation's streams to their end, as AgentActivity does."""

        async def text(stream) -> None:
            async for piece in stream:
                gen.text.append(str(piece))
                self.events.add("text", gen)

        async def audio(stream) -> None:
            async for frame in stream:
                gen.audio += frame.data.tobytes()

        async def calls() -> None:
            async for call in ev.function_stream:
                gen.calls.append(call)
                self.events.add("function_call", (gen, call))

        readers = [asyncio.create_task(calls())]
        async for message in ev.message_stream:
            readers.append(asyncio.create_task(text(message.text_stream)))
            readers.append(asyncio.create_task(audio(message.audio_stream)))
        await asyncio.gather(*readers)
        gen.done = True
        self.events.add("generation_done", gen)

    async def close(self) -> None:
        await self.mic.stop()
        if self.rt is not None:
            await self.rt.aclose()
        await self.model.aclose()
        for task in list(self._readers):
            task.cancel()

    async def wait(self, what: str, predicate, timeout: float = 15.0):
        """Waits for `predicate()`; an `error` event fails the wait at once."""

        def ready():
            errors = self.events.since(0, "error")
            if errors:
                raise ScenarioError(f"waiting for {what}, the session emitted error {errors[0].error!r}")
            return predicate()

        return await self.events.wait(what, ready, timeout)

    def no_errors(self) -> None:
        errors = [repr(e.error) for e in self.events.since(0, "error")]
        check(not errors, f"the session emitted errors: {errors}")
        if self.tts:
            fragments = self.events.since(0, "fragment")
            check(not fragments, f"a session with TTS got text fragments: {fragments}")

    async def finished(self, gen: Generation, what: str, timeout: float = 15.0) -> str:
        """Waits until `gen`'s streams end (with TTS: once its audio has been played) and
        checks its content; returns its text."""
        await self.wait(f"the end of the generation ({what})", lambda: gen.done, timeout)
        text = "".join(gen.text).strip()
        if self.tts:
            check_spoken_audio(bytes(gen.audio), what)
        else:
            check(not gen.audio, f"{what}: a session without TTS got audio")
        check(text, f"{what}: the generation has no text")
        return text

    async def next_generation(self, mark: int, what: str, timeout: float = 15.0) -> Generation:
        return (await self.wait(f"generation_created ({what})", lambda: self.events.since(mark, "generation"), timeout))[0]

    async def say(self, text: str) -> Generation:
        """A typed user turn as AgentSession.generate_reply(user_input=...) hands it over."""
        ctx = self.rt.chat_ctx.copy()
        ctx.add_message(role="user", content=text)
        await self.rt.update_chat_ctx(ctx)
        ev = await self.rt.generate_reply()
        return next(g for g in self.generations if g.response_id == ev.response_id)


async def session(args, name: str, tts: bool, report: Report) -> None:
    pcm, rate, channels = read_wav_pcm16(args.wav)
    check((rate, channels) == (16000, 1), f"{args.wav}: expected 16 kHz mono")
    wav_seconds = len(pcm) / 2 / rate
    s = Session(args, name, tts)
    try:
        t = time.monotonic()
        s.start()
        await s.rt.update_tools([get_weather])
        # The first audio frame initializes the plugin's session (tools follow the init).
        s.mic.start()
        await s.wait("session_initialized (SessionReady)", lambda: s.events.since(0, "ready"))
        step_log(name, t, "session_initialized after the first microphone frame")

        # A spoken turn.
        t = time.monotonic()
        m = s.events.mark()
        await s.mic.speak(pcm)
        (stt,) = (await s.wait("input_audio_transcription_completed", lambda: s.events.since(m, "transcription")))[:1]
        check_transcript(stt, wav_seconds)
        check(s.events.since(m, "speech_started"), "no input_speech_started")
        check(s.events.since(m, "speech_stopped"), "no input_speech_stopped")
        gen = await s.next_generation(m, "spoken turn")
        text = await s.finished(gen, "spoken turn")
        check(text == f"You said: {stt}", f"spoken turn reply {text!r}")
        step_log(
            name,
            t,
            f"spoken turn: transcription {stt!r}, reply {text!r}"
            + (f" ({len(gen.audio) / 48000:.2f} s of audio)" if tts else ""),
        )

        # A reply request a moment after that reply finished playing.
        await asyncio.sleep(REPLY_REQUEST_DELAY)
        t = time.monotonic()

        async def reply_request() -> None:
            try:
                ev = await s.rt.generate_reply(instructions=REPLY_INSTRUCTIONS)
            except TimeoutError as e:
                raise ScenarioError(
                    f"generate_reply(instructions=...) {REPLY_REQUEST_DELAY:.0f} s after the spoken reply finished "
                    f"playing (TriggerInference with instructions) got no reply: {e}"
                ) from None
            gen = next(g for g in s.generations if g.response_id == ev.response_id)
            check(gen.user_initiated, "the reply request's generation is not user_initiated")
            text = await s.finished(gen, "reply to generate_reply(instructions=...)", REPLY_TIMEOUT)
            check(text.startswith(GREETING_START), f"reply to the reply request {text!r}")
            step_log(name, t, f"reply request (generate_reply(instructions=...)): {text[:40]!r}...")

        answered = await report.soft_step(f"{name}: reply request after a spoken reply", reply_request())

        # A text turn.
        t = time.monotonic()
        gen = await s.say(TEXT)
        text = await s.finished(gen, "text turn")
        check(text == TEXT_REPLY, f"text turn reply {text!r}")
        step_log(name, t, f"text turn (update_chat_ctx + generate_reply()): {text!r}")

        # A tool call through LiveKit's function calling.
        t = time.monotonic()
        m = s.events.mark()
        gen = await s.say(TOOL_REQUEST)
        (_, call), = (await s.wait("a FunctionCall on the function stream", lambda: s.events.since(m, "function_call")))[:1]
        check(call.name == TOOL_NAME, f"function call named {call.name!r}")
        check(json.loads(call.arguments) == TOOL_ARGS, f"function call arguments {call.arguments!r}")
        result = await execute_function_call(
            FunctionToolCall(name=call.name, arguments=call.arguments, call_id=call.call_id), s.rt.tools
        )
        check(not result.fnc_call_out.is_error, f"the tool failed: {result.fnc_call_out.output}")
        await s.finished(gen, "tool call announcement")
        m = s.events.mark()
        ctx = s.rt.chat_ctx.copy()
        ctx.items.append(result.fnc_call_out)
        await s.rt.update_chat_ctx(ctx)
        gen = await s.next_generation(m, "continuation after the tool result")
        text = await s.finished(gen, "continuation after the tool result")
        check(text == TOOL_REPLY, f"continuation after the tool result {text!r}")
        step_log(name, t, f"tool call {call.name}({call.arguments}) id={call.call_id}; then {text!r}")

        # History export.
        t = time.monotonic()
        history = await asyncio.wait_for(s.rt.export_chat_history(await_pending=True, exclude_audio=True), 15)
        summary = check_history(history, stt, answered)
        step_log(name, t, f"history export (export_chat_history): {summary}")
        s.no_errors()
    finally:
        await s.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="host:port of the voxgate server")
    ap.add_argument("--api-key", required=True, help="a bearer key the server accepts")
    ap.add_argument("--wav", required=True, help="16 kHz mono WAV with speech")
    args = ap.parse_args()
    report = Report("deepslate-livekit")
    await report.session("text", lambda: session(args, "text", False, report))
    await report.session("tts", lambda: session(args, "tts", True, report))
    report.finish()


if __name__ == "__main__":
    run(main)
