"""What the Deepslate plugin scenarios (pipecat_scenario.py, livekit_scenario.py) share: the
client tool, a microphone that streams like a real one, the checks of a reply and of the
exported history, and a report that lets one session fail without hiding the others.

Standard library and numpy only, so both plugins' venvs can import it.
"""

import asyncio
import re
import time
import traceback
from typing import Awaitable, Callable, Optional

import numpy as np

from common import ScenarioError, check, log

# The client tool both plugins declare through their own function-calling API.
TOOL_NAME = "get_weather"
TOOL_DESCRIPTION = "The current weather in a city."
TOOL_ARGS = {"city": "Paris"}
TOOL_RESULT = {"temp_c": 21, "sky": "clear"}
# What the demo agent answers (the realtime door drops its emoji).
TOOL_REQUEST = 'call get_weather {"city": "Paris"}'
TOOL_REPLY = 'The tool get_weather returned: {"temp_c": 21, "sky": "clear"}'
TEXT = "hello voxgate"
TEXT_REPLY = "You said: hello voxgate"
# The demo agent answers a reply request with nothing new to answer with its greeting.
GREETING_START = "Hello! I am the voxgate demo agent."
# What a reply request asks for (the demo agent ignores it; the history keeps it).
REPLY_INSTRUCTIONS = "Ask the user whether there is anything else you can do."
# A reply request comes this long after the spoken reply finished playing: the 1 to 5 s an
# agent waits before it speaks up again.
REPLY_REQUEST_DELAY = 2.0
# How long a reply may take to begin (LiveKit's generate_reply timeout in these scenarios).
REPLY_TIMEOUT = 20.0

FRAME_MS = 20


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


def check_transcript(stt_text: str, wav_seconds: float) -> None:
    """The fake recognizer's transcript names how much audio it got: the whole utterance. The
    plugins' server asks it under `/question/v1`, so the transcript, and the demo agent's echo
    of it, end with a question (as an agent's spoken reply often does)."""
    found = re.fullmatch(r"interop transcript of ([0-9.]+) seconds, is that right\?", stt_text)
    check(found is not None, f"user transcription {stt_text!r} is not the fake recognizer's question")
    heard = float(found.group(1))
    # The WAV plus the VAD's stop time of the silence after it.
    check(
        0.9 * wav_seconds <= heard <= wav_seconds + 1.1,
        f"the recognizer got {heard} s of audio (the WAV is {wav_seconds:.1f} s)",
    )


def check_spoken_audio(pcm: bytes, what: str) -> None:
    """Audible 24 kHz 16-bit reply audio of at least 0.2 s (the shortest reply, "Calling get_weather.", is about 0.45 s)."""
    level = rms(pcm)
    check(len(pcm) >= 9600, f"{what}: {len(pcm)} bytes of 24 kHz audio (under 0.2 s)")
    check(level > 100, f"{what}: the audio is silent (rms {level:.1f})")


def text_of(message) -> str:
    """A message's text: with TTS a reply's text comes in one part a sentence."""
    return " ".join(c["text"].strip() for c in message["content"] if c["type"] == "text")


def check_history(history, stt_text: str, reply_request_answered: bool) -> str:
    """Checks the exported history of a plugin session (text turn, tool round trip, spoken turn,
    reply request) and returns a one-line summary."""
    roles = [(m["role"], text_of(m)) for m in history]
    user = [t for r, t in roles if r == "user"]
    assistant = [t for r, t in roles if r == "assistant"]
    for said in (TEXT, TOOL_REQUEST):
        check(said in user, f"history lacks the user message {said!r}: {roles}")
    for reply in (TEXT_REPLY, f"You said: {stt_text}", TOOL_REPLY):
        check(reply in assistant, f"history lacks the reply {reply!r}: {roles}")
    calls = [c for m in history for c in m["content"] if c["type"] == "tool_call"]
    results = [c for m in history for c in m["content"] if c["type"] == "tool_result"]
    check(
        [(c["name"], c["parameters"]) for c in calls] == [(TOOL_NAME, TOOL_ARGS)],
        f"history tool calls: {calls}",
    )
    check(
        len(results) == 1 and results[0]["id"] == calls[0]["id"],
        f"history tool results: {results} (calls {calls})",
    )
    audio = [c for m in history if m["role"] == "user" for c in m["content"] if c["type"] == "input_audio"]
    check(
        [a["transcription"] for a in audio] == [stt_text],
        f"history user audio: {[a['transcription'] for a in audio]}",
    )
    check(all(not a.get("audio") for a in audio), "exclude_audio still returned audio bytes")
    if reply_request_answered:
        check(
            any(t.startswith(GREETING_START) for t in assistant),
            f"history lacks the reply to the reply request: {roles}",
        )
        instructions = [c["text"] for m in history for c in m["content"] if c["type"] == "instructions"]
        check(
            REPLY_INSTRUCTIONS in instructions,
            f"history lacks the reply request's instructions: {instructions}",
        )
    statuses = {m["delivery_status"] for m in history}
    check(statuses == {"DELIVERY_COMPLETE"}, f"delivery statuses {statuses}")
    return f"{len(history)} messages, {len(calls)} tool call, {len(audio)} spoken user turn"


class Mic:
    """A microphone: one 20 ms frame of 16 kHz mono PCM every 20 ms, silence unless speech is
    queued, as a transport streams it to the plugin all session long. `send` hands one frame
    to the plugin the way its users' transports do."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]], rate: int = 16000) -> None:
        self._send = send
        self.rate = rate
        self._chunk = rate * FRAME_MS // 1000 * 2
        self._speech = bytearray()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mic")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def speak(self, pcm: bytes) -> None:
        """Queues speech and returns once its last frame went out (silence follows)."""
        self._speech += pcm
        self._drained.clear()
        await self._drained.wait()

    async def _run(self) -> None:
        started = time.monotonic()
        sent = 0
        while True:
            if self._speech:
                frame = bytes(self._speech[: self._chunk]).ljust(self._chunk, b"\0")
                del self._speech[: self._chunk]
            else:
                frame = bytes(self._chunk)
                self._drained.set()
            await self._send(frame)
            sent += 1
            # Paced by the wall clock, not by sleeps, so a slow moment does not stretch time.
            delay = started + sent * FRAME_MS / 1000 - time.monotonic()
            await asyncio.sleep(max(delay, 0))


class Report:
    """Runs each session and step, logs what passed, and keeps every failure so one failing
    session does not hide the others; `finish` raises with all of them."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.failures: list[str] = []

    async def session(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        started = time.monotonic()
        before = len(self.failures)
        log(f"{name}: start")
        try:
            await body()
        except ScenarioError as e:
            self.failures.append(f"{name}: {e}")
            log(f"{name}: FAILED after {time.monotonic() - started:.1f} s: {e}")
            return
        except Exception as e:  # noqa: BLE001 (anything the plugin raised)
            traceback.print_exc()
            self.failures.append(f"{name}: {type(e).__name__}: {e}")
            log(f"{name}: FAILED after {time.monotonic() - started:.1f} s with {type(e).__name__}: {e}")
            return
        failed = len(self.failures) - before
        outcome = f"done with {failed} failed step(s)" if failed else "passed"
        log(f"{name}: {outcome} in {time.monotonic() - started:.1f} s")

    async def soft_step(self, name: str, body: Awaitable) -> bool:
        """A step whose failure is recorded while the session goes on; True if it passed."""
        started = time.monotonic()
        try:
            await body
        except (ScenarioError, TimeoutError, asyncio.TimeoutError) as e:
            message = str(e) or type(e).__name__
            self.failures.append(f"{name}: {message}")
            log(f"{name}: FAILED after {time.monotonic() - started:.1f} s: {message}")
            return False
        return True

    def finish(self) -> None:
        if self.failures:
            raise ScenarioError(
                f"{len(self.failures)} {self.plugin} check(s) failed:\n  - " + "\n  - ".join(self.failures)
            )


def step_log(session: str, started: float, message: str) -> None:
    """One passed step with its duration."""
    log(f"{session}: {message} ({time.monotonic() - started:.1f} s)")
