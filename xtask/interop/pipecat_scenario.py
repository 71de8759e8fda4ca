"""The Deepslate Pipecat plugin (`deepslate-pipecat`, DeepslateRealtimeLLMService) against a
running voxgate server, driven as its users drive it: a Pipecat pipeline `[llm, sink]` run by
a PipelineRunner, frames queued into the pipeline task, everything the service pushes
collected by a sink processor. No transport or audio device: a task queues 20 ms
InputAudioRawFrames at real time (silence, or the WAV when the user speaks), as an input
transport does.

Needs the server to run the demo agent, to accept the bearer key given with --api-key, and to
use the interop fake recognizer (fake_asr.py) for speech.

Two sessions, one without TTS (text replies: LLMTextFrames) and one with the server's hosted
TTS (OutputAudioRawFrames and playback-paced DeepslateModelTranscriptionFrames), each:
  a spoken turn (the WAV through the microphone: VAD state frames, the user transcription,
  the reply); a reply request 2 s after that reply finished playing
  (LLMMessagesAppendFrame(system message, run_llm=True): TriggerInference with instructions;
  the demo agent greets); a text turn (TextFrame); a tool call through Pipecat's function
  calling (LLMSetToolsFrame with a ToolsSchema, a handler registered with register_function
  whose result_callback answers the call; the model continues with the result); a history
  export (DeepslateExportChatHistoryFrame -> DeepslateChatHistoryFrame) holding all of it.
A failed reply request is reported and the session goes on; the script fails at the end with
every failure.
"""

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from typing import Optional

# Pipecat's text utilities import NLTK, which downloads its `punkt_tab` sentence data on import
# when no data folder has it. Nothing here splits sentences (RTVI, which would, is off): an
# empty one in a folder NLTK searches (`<venv>/nltk_data`) keeps it from going to the network.
os.makedirs(os.path.join(sys.prefix, "nltk_data", "tokenizers", "punkt_tab"), exist_ok=True)

from loguru import logger  # noqa: E402
from pipecat.adapters.schemas.function_schema import FunctionSchema  # noqa: E402
from pipecat.adapters.schemas.tools_schema import ToolsSchema  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMSetToolsFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    TextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
from pipecat.pipeline.task import PipelineParams, PipelineTask  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.llm_service import FunctionCallParams  # noqa: E402

from common import Events, ScenarioError, check, read_wav_pcm16, run  # noqa: E402
from deepslate.pipecat import (  # noqa: E402
    DeepslateChatHistoryFrame,
    DeepslateExportChatHistoryFrame,
    DeepslateModelTranscriptionFrame,
    DeepslateOptions,
    DeepslateRealtimeLLMService,
    DeepslateSessionInitializedFrame,
    DeepslateUserTranscriptionFrame,
    DeepslateVadStateEventFrame,
    HostedTtsConfig,
)
from plugin_common import (  # noqa: E402
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


class Sink(FrameProcessor):
    """The pipeline's last processor: records every frame that reaches it, in order."""

    def __init__(self, events: Events) -> None:
        super().__init__()
        self.events = events

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        self.events.add(type(frame).__name__, frame)
        await self.push_frame(frame, direction)


class Session:
    """One Pipecat pipeline around a DeepslateRealtimeLLMService, running until `close`."""

    def __init__(self, args, name: str, tts: bool) -> None:
        self.name = name
        self.tts = tts
        self.events = Events()
        self.tool_calls: list[FunctionCallParams] = []
        options = DeepslateOptions(
            vendor_id="interop",
            organization_id="interop",
            api_key=args.api_key,
            ws_url=f"ws://{args.server}/realtime",
            # A failure must show up, not be papered over by a reconnect.
            max_retries=0,
        )
        self.llm = DeepslateRealtimeLLMService(
            options=options, tts_config=HostedTtsConfig(voice_id="default") if tts else None
        )
        self.llm.register_function(TOOL_NAME, self._get_weather)
        self.task = PipelineTask(
            Pipeline([self.llm, Sink(self.events)]),
            params=PipelineParams(audio_in_sample_rate=16000, audio_out_sample_rate=24000),
            # RTVI serves a client UI through a transport; there is none here.
            enable_rtvi=False,
        )
        self.runner = PipelineRunner(handle_sigint=False)
        self.mic = Mic(self._send_audio)
        self._run: asyncio.Task | None = None

    async def _send_audio(self, pcm: bytes) -> None:
        await self.task.queue_frame(InputAudioRawFrame(audio=pcm, sample_rate=self.mic.rate, num_channels=1))

    async def _get_weather(self, params: FunctionCallParams) -> None:
        self.tool_calls.append(params)
        await params.result_callback(TOOL_RESULT)

    async def start(self) -> None:
        self._run = asyncio.create_task(self.runner.run(self.task), name=f"pipeline {self.name}")
        tools = ToolsSchema(
            standard_tools=[
                FunctionSchema(
                    name=TOOL_NAME,
                    description=TOOL_DESCRIPTION,
                    properties={"city": {"type": "string"}},
                    required=["city"],
                )
            ]
        )
        await self.task.queue_frame(LLMSetToolsFrame(tools=tools))
        # The first audio frame initializes the plugin's session (tools follow the init).
        self.mic.start()
        await self.wait(
            "DeepslateSessionInitializedFrame (SessionReady)", lambda: self.since(0, DeepslateSessionInitializedFrame)
        )

    async def close(self) -> None:
        await self.mic.stop()
        if self._run is not None:
            if not self._run.done():
                await self.task.queue_frame(EndFrame())
                try:
                    await asyncio.wait_for(asyncio.shield(self._run), 10)
                except asyncio.TimeoutError:
                    await self.task.cancel()
                    await self._run
            self._run = None

    def since(self, mark: int, kind: type) -> list:
        return self.events.since(mark, kind.__name__)

    def index(self, mark: int, kind: type) -> Optional[int]:
        """The position of the first frame of `kind` at or after `mark`."""
        return next((i for i, (k, _) in enumerate(self.events.items) if i >= mark and k == kind.__name__), None)

    async def wait(self, what: str, predicate, timeout: float = 15.0):
        """Waits for `predicate()`; an ErrorFrame from the service fails the wait at once."""

        def ready():
            errors = self.since(0, ErrorFrame)
            if errors:
                raise ScenarioError(f"waiting for {what}, the service pushed ErrorFrame {errors[0].error!r}")
            return predicate()

        return await self.events.wait(what, ready, timeout)

    def no_errors(self) -> None:
        errors = [f.error for f in self.since(0, ErrorFrame)]
        check(not errors, f"the service pushed ErrorFrames: {errors}")

    async def reply(self, mark: int, what: str, timeout: float = 15.0) -> tuple[str, bytes, int]:
        """Waits for the first whole reply after `mark`: LLMFullResponseStartFrame, its text
        (LLMTextFrames, or with TTS the DeepslateModelTranscriptionFrames pushed as it plays)
        and audio, then LLMFullResponseEndFrame (with TTS: once it has been played). Returns
        (text, audio, the position after its end frame)."""
        start = await self.wait(
            f"LLMFullResponseStartFrame ({what})",
            lambda: (i := self.index(mark, LLMFullResponseStartFrame)) is not None and i + 1,
            timeout,
        )
        end = await self.wait(
            f"LLMFullResponseEndFrame ({what})",
            lambda: (i := self.index(start, LLMFullResponseEndFrame)) is not None and i,
            timeout,
        )
        frames = self.events.items[start:end]
        text_frames = [f.text for k, f in frames if k == LLMTextFrame.__name__]
        spoken = [f.text for k, f in frames if k == DeepslateModelTranscriptionFrame.__name__]
        audio = b"".join(f.audio for k, f in frames if k == OutputAudioRawFrame.__name__)
        if self.tts:
            check(not text_frames, f"{what}: a session with TTS got LLMTextFrames {text_frames}")
            check_spoken_audio(audio, what)
            text = "".join(spoken)
        else:
            check(not audio and not spoken, f"{what}: a session without TTS got audio or spoken text")
            text = "".join(text_frames)
        check(text.strip(), f"{what}: the reply has no text")
        return text.strip(), audio, end + 1


async def session(args, name: str, tts: bool, report: Report) -> None:
    pcm, rate, channels = read_wav_pcm16(args.wav)
    check((rate, channels) == (16000, 1), f"{args.wav}: expected 16 kHz mono")
    wav_seconds = len(pcm) / 2 / rate
    s = Session(args, name, tts)
    try:
        t = time.monotonic()
        await s.start()
        step_log(name, t, "DeepslateSessionInitializedFrame after the first microphone frame")

        # A spoken turn.
        t = time.monotonic()
        m = s.events.mark()
        await s.mic.speak(pcm)
        (stt,) = (await s.wait("DeepslateUserTranscriptionFrame", lambda: s.since(m, DeepslateUserTranscriptionFrame)))[:1]
        check_transcript(stt.text, wav_seconds)
        vad = [(f.from_state, f.to_state) for f in s.since(m, DeepslateVadStateEventFrame)]
        check(any(to == "SPEECH" for _, to in vad), f"VAD state frames {vad}")
        text, audio, _ = await s.reply(m, "spoken turn")
        check(text == f"You said: {stt.text}", f"spoken turn reply {text!r}")
        step_log(
            name,
            t,
            f"spoken turn: {len(vad)} VAD frames, transcription {stt.text!r}, reply {text!r}"
            + (f" ({len(audio) / 48000:.2f} s of audio)" if tts else ""),
        )

        # A reply request a moment after that reply finished playing.
        await asyncio.sleep(REPLY_REQUEST_DELAY)
        t = time.monotonic()
        m = s.events.mark()

        async def reply_request() -> None:
            await s.task.queue_frame(
                LLMMessagesAppendFrame(messages=[{"role": "system", "content": REPLY_INSTRUCTIONS}], run_llm=True)
            )
            try:
                text, _, _ = await s.reply(m, "reply to LLMMessagesAppendFrame(run_llm=True)", REPLY_TIMEOUT)
            except ScenarioError:
                kinds = Counter(k for k, _ in s.events.items[m:])
                raise ScenarioError(
                    f"LLMMessagesAppendFrame(run_llm=True) {REPLY_REQUEST_DELAY:.0f} s after the spoken reply "
                    f"finished playing (TriggerInference with instructions) got no LLMFullResponseStartFrame "
                    f"within {REPLY_TIMEOUT:.0f} s; frames since the request: {dict(kinds) or 'none'}"
                ) from None
            check(text.startswith(GREETING_START), f"reply to the reply request {text!r}")
            step_log(name, t, f"reply request (LLMMessagesAppendFrame, run_llm=True): {text[:40]!r}...")

        answered = await report.soft_step(f"{name}: reply request after a spoken reply", reply_request())

        # A text turn.
        t = time.monotonic()
        m = s.events.mark()
        await s.task.queue_frame(TextFrame(TEXT))
        text, _, _ = await s.reply(m, "text turn")
        check(text == TEXT_REPLY, f"text turn reply {text!r}")
        step_log(name, t, f"text turn (TextFrame): {text!r}")

        # A tool call through Pipecat's function calling.
        t = time.monotonic()
        m = s.events.mark()
        await s.task.queue_frame(TextFrame(TOOL_REQUEST))
        await s.wait("the function handler's call", lambda: s.tool_calls)
        call = s.tool_calls[0]
        check(call.function_name == TOOL_NAME, f"function handler called for {call.function_name!r}")
        check(dict(call.arguments) == TOOL_ARGS, f"function arguments {call.arguments!r}")
        _, _, after = await s.reply(m, "tool call announcement")
        text, _, _ = await s.reply(after, "continuation after the tool result")
        check(text == TOOL_REPLY, f"continuation after the tool result {text!r}")
        step_log(name, t, f"tool call {call.function_name}({dict(call.arguments)}) id={call.tool_call_id}; then {text!r}")

        # History export.
        t = time.monotonic()
        m = s.events.mark()
        await s.task.queue_frame(DeepslateExportChatHistoryFrame(await_pending=True, exclude_audio=True))
        (history,) = (await s.wait("DeepslateChatHistoryFrame", lambda: s.since(m, DeepslateChatHistoryFrame)))[:1]
        summary = check_history(history.messages, stt.text, answered)
        step_log(name, t, f"history export (DeepslateExportChatHistoryFrame): {summary}")
        s.no_errors()
    finally:
        await s.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="host:port of the voxgate server")
    ap.add_argument("--api-key", required=True, help="a bearer key the server accepts")
    ap.add_argument("--wav", required=True, help="16 kHz mono WAV with speech")
    args = ap.parse_args()
    # Pipecat logs every frame processor's start at DEBUG; warnings and errors are what matter.
    logger.remove()
    logger.add(lambda m: print(m, end="", flush=True), level="WARNING")
    report = Report("deepslate-pipecat")
    await report.session("text", lambda: session(args, "text", False, report))
    await report.session("tts", lambda: session(args, "tts", True, report))
    report.finish()


if __name__ == "__main__":
    run(main)
