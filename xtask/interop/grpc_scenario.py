"""A third-party gRPC stack, Python's `grpcio` (C core, asyncio API), against a running voxgate
server's realtime service `voxgate.realtime.v1.RealtimeService/Session`
(proto/realtime_service.proto), served as plaintext HTTP/2 on the server's main port.

The stubs are not ours: `cargo xtask interop` generates them with grpcio-tools' protoc from
proto/realtime.proto and proto/realtime_service.proto into the directory given with --stubs.
Needs the server to run the demo agent, to accept the bearer key given with --api-key, and to
use the interop fake recognizer (fake_asr.py) for speech.

1. Authentication: a call without `authorization` metadata and one with a wrong key both end
   with UNAUTHENTICATED.
2. One session on one call, with the key:
   - a Ping before InitializeSessionRequest: SessionErrorNotification(ERROR_SESSION), the call
     goes on;
   - InitializeSessionRequest (16 kHz s16 mono in, 24 kHz out, text replies) -> SessionReady;
   - Ping -> Pong;
   - a text turn: ResponseBegin(n), ModelTextFragments of turn n, ResponseEnd(n), the demo
     agent's "You said: hello there";
   - a client tool: UpdateToolDefinitionsRequest(get_weather), the text
     `call get_weather {"city": "Paris"}`, ToolCallRequest(get_weather, {"city": "Paris"}),
     ToolCallResponse("sunny, 21 C"), a continuation with the result;
   - an audio turn: the WAV fixture as 20 ms UserInput audio packets (IMMEDIATE), then a second
     of silence: VAD state events, UserTranscriptionResult with the fake recognizer's text (whose
     length shows the whole utterance arrived), the reply to it;
   - the client closes its request stream: the call ends with OK.
3. A fresh call whose InitializeSessionRequest has sample_rate 0: SessionErrorNotification
   (ERROR_CONFIGURATION) and the call ends with FAILED_PRECONDITION.
"""

import argparse
import asyncio
import json
import re
import sys

import grpc
from google.protobuf import json_format, struct_pb2

from common import Events, check, log, read_wav_pcm16, run

TOOL_RESULT = "sunny, 21 C"


def load_stubs(directory: str):
    """Imports the generated modules (they import each other by their bare names)."""
    sys.path.insert(0, directory)
    import realtime_pb2
    import realtime_service_pb2_grpc

    return realtime_pb2, realtime_service_pb2_grpc


class Call:
    """One Session call. A reader task records every ClientBoundMessage as (oneof name, message)
    in an Events log, then the call's end as ("status", (code, details))."""

    def __init__(self, pb, stub, metadata) -> None:
        self.pb = pb
        self.call = stub.Session(metadata=metadata)
        self.events = Events()
        self.packet_id = 0
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    break
                self.events.add(msg.WhichOneof("payload"), msg)
        except grpc.aio.AioRpcError:
            pass  # the status is read below
        code = await self.call.code()
        details = await self.call.details()
        self.events.add("status", (code, details))

    async def send(self, **payload) -> None:
        await self.call.write(self.pb.ServiceBoundMessage(**payload))

    async def user_text(self, text: str) -> None:
        self.packet_id += 1
        await self.send(
            user_input=self.pb.UserInput(
                packet_id=self.packet_id,
                mode=self.pb.IMMEDIATE,
                text_data=self.pb.TextData(data=text),
            )
        )

    async def user_audio(self, pcm: bytes) -> None:
        self.packet_id += 1
        await self.send(
            user_input=self.pb.UserInput(
                packet_id=self.packet_id,
                mode=self.pb.IMMEDIATE,
                audio_data=self.pb.AudioData(data=pcm),
            )
        )

    async def status(self, what: str, timeout: float = 10.0):
        """Waits for the end of the call; returns (code, details)."""
        return (await self.events.wait(f"the call's status ({what})", lambda: self.events.since(0, "status"), timeout))[0]

    async def first(self, kind: str, mark: int, what: str, timeout: float = 10.0):
        """The first message of `kind` after `mark`."""
        return (await self.events.wait(what, lambda: self.events.since(mark, kind), timeout))[0]

    def errors(self, mark: int = 0) -> list[str]:
        return [f"{self.pb.SessionErrorCategory.Name(e.error.category)}: {e.error.message}" for e in self.events.since(mark, "error")]

    async def close(self) -> None:
        self.call.cancel()
        self.reader.cancel()


def audio_line(pb, rate: int):
    return pb.AudioLineConfiguration(sample_rate=rate, channel_count=1, sample_format=pb.SIGNED_16_BIT)


async def turn(c: Call, mark: int, what: str, timeout: float = 10.0) -> tuple[int, str]:
    """The first complete response after `mark`: checks its framing, returns (turn id, text)."""
    begin = await c.first("response_begin", mark, f"ResponseBegin ({what})", timeout)
    turn_id = begin.response_begin.turn_id
    await c.events.wait(
        f"ResponseEnd({turn_id}) ({what})",
        lambda: [m for m in c.events.since(mark, "response_end") if m.response_end.turn_id == turn_id],
        timeout,
    )
    kinds = [k for k, _ in c.events.items[mark:]]
    start = kinds.index("response_begin")
    end = next(
        i for i, (k, m) in enumerate(c.events.items[mark:]) if k == "response_end" and m.response_end.turn_id == turn_id
    )
    inside = c.events.items[mark + start + 1 : mark + end]
    fragments = [m.model_text_fragment for k, m in inside if k == "model_text_fragment"]
    check(fragments, f"turn {turn_id} ({what}) had no ModelTextFragment between ResponseBegin and ResponseEnd")
    strays = [f.turn_id for f in fragments if f.turn_id != turn_id]
    check(not strays, f"fragments of turn {turn_id} carried turn ids {strays}")
    return turn_id, "".join(f.text for f in fragments)


async def check_unauthenticated(pb, stub, metadata, what: str) -> None:
    c = Call(pb, stub, metadata)
    try:
        code, details = await c.status(what)
        check(code == grpc.StatusCode.UNAUTHENTICATED, f"{what}: the call ended with {code} ({details!r}), expected UNAUTHENTICATED")
        check(not c.events.since(0, "session_ready"), f"{what}: a session became ready")
        log(f"{what}: {code.name} ({details!r})")
    finally:
        await c.close()


async def main_session(pb, stub, args) -> None:
    c = Call(pb, stub, [("authorization", f"Bearer {args.api_key}")])
    try:
        # A message before InitializeSessionRequest is the client's error; the call goes on.
        await c.send(ping=pb.Ping())
        err = (await c.first("error", 0, "SessionErrorNotification for a Ping before initialization")).error
        check(
            err.category == pb.ERROR_SESSION,
            f"a Ping before initialization got {pb.SessionErrorCategory.Name(err.category)} ({err.message!r}), expected ERROR_SESSION",
        )
        check(not c.events.since(0, "pong"), "a Ping before initialization was answered with Pong")
        log(f"Ping before InitializeSessionRequest -> SessionErrorNotification(ERROR_SESSION, {err.message!r})")

        initialized = m = c.events.mark()
        await c.send(
            initialize_session_request=pb.InitializeSessionRequest(
                input_audio_line=audio_line(pb, 16000),
                output_audio_line=audio_line(pb, 24000),
                inference_configuration=pb.InferenceConfiguration(system_prompt="You are the gRPC interop test.", temperature=0.5),
            )
        )
        await c.first("session_ready", m, "SessionReady")
        check(not c.errors(m), f"errors after initialization: {c.errors(m)}")
        log("InitializeSessionRequest (16 kHz s16 mono in, 24 kHz out, text replies) -> SessionReady")

        m = c.events.mark()
        await c.send(ping=pb.Ping())
        await c.first("pong", m, "Pong")
        log("Ping -> Pong")

        m = c.events.mark()
        await c.user_text("hello there")
        turn_id, text = await turn(c, m, "text turn")
        check(text.strip() == "You said: hello there", f"the text turn's reply was {text!r}, expected 'You said: hello there'")
        log(f"text turn {turn_id}: ResponseBegin, {len(c.events.since(m, 'model_text_fragment'))} fragments, ResponseEnd: {text!r}")

        parameters = struct_pb2.Struct()
        parameters.update({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
        await c.send(
            update_tool_definitions_request=pb.UpdateToolDefinitionsRequest(
                tool_definitions=[
                    pb.ToolDefinition(name="get_weather", description="The current weather in a city.", parameters=parameters)
                ]
            )
        )
        m = c.events.mark()
        await c.user_text('call get_weather {"city": "Paris"}')
        call = (await c.first("tool_call_request", m, "ToolCallRequest")).tool_call_request
        params = json_format.MessageToDict(call.parameters)
        check(call.name == "get_weather", f"the tool call named {call.name!r}, expected get_weather")
        check(params == {"city": "Paris"}, f"the tool call's arguments were {params!r}")
        log(f"ToolCallRequest id={call.id} name={call.name} parameters={json.dumps(params)} turn={call.turn_id}")
        m2 = c.events.mark()
        await c.send(tool_call_response=pb.ToolCallResponse(id=call.id, result=TOOL_RESULT))
        turn_id, text = await turn(c, m2, "continuation after ToolCallResponse")
        expected = f"The tool get_weather returned: {TOOL_RESULT}"
        check(text.strip() == expected, f"the continuation after the tool result was {text!r}, expected {expected!r}")
        check(not c.errors(m), f"errors during the tool round trip: {c.errors(m)}")
        log(f"ToolCallResponse({TOOL_RESULT!r}) -> continuation turn {turn_id}: {text!r}")

        pcm, rate, channels = read_wav_pcm16(args.wav)
        check((rate, channels) == (16000, 1), f"{args.wav}: expected 16 kHz mono, got {rate} Hz x {channels}")
        total = len(pcm) / 2 / rate
        m = c.events.mark()
        chunk = rate // 50 * 2
        # Faster than real time (the VAD counts samples), paced so no packet is dropped, then
        # a second of silence so the VAD hears the end of speech.
        for i in range(0, len(pcm), chunk):
            await c.user_audio(pcm[i : i + chunk])
            await asyncio.sleep(0.004)
        for _ in range(50):
            await c.user_audio(bytes(chunk))
            await asyncio.sleep(0.004)
        stt = (await c.first("user_transcription_result", m, "UserTranscriptionResult", 15)).user_transcription_result
        states = [pb.VadState.Name(e.vad_state_event.to_state) for e in c.events.since(m, "vad_state_event")]
        check("SPEECH" in states, f"VAD state events after the audio: {states}")
        found = re.fullmatch(r"interop transcript of ([0-9.]+) seconds", stt.text)
        check(found is not None, f"the transcription {stt.text!r} is not the fake recognizer's")
        heard = float(found.group(1))
        check(0.9 * total <= heard <= total + 1.1, f"the recognizer got {heard} s of audio; the WAV is {total:.2f} s")
        turn_id, text = await turn(c, m, "audio turn", 15)
        check(text.strip() == f"You said: {stt.text}", f"the audio turn's reply was {text!r}")
        check(not c.errors(m), f"errors during the audio turn: {c.errors(m)}")
        log(
            f"audio turn ({total:.2f} s at 16 kHz in {c.packet_id} packets): VAD {' -> '.join(states)}, "
            f"UserTranscriptionResult {stt.text!r} (turn {stt.turn_id}), reply turn {turn_id}: {text!r}"
        )

        # Let the reply's last messages (TurnSnapshot) arrive, then say goodbye.
        await asyncio.sleep(0.2)
        m = c.events.mark()
        await c.call.done_writing()
        code, details = await c.status("after the client closed its request stream")
        check(code == grpc.StatusCode.OK, f"closing the request stream ended the call with {code} ({details!r}), expected OK")
        late = [k for k, _ in c.events.items[m:] if k not in ("status", "turn_snapshot")]
        check(not late, f"messages after the request stream was closed: {late}")
        check(not c.errors(initialized), f"unexpected errors in the session: {c.errors(initialized)}")
        log(f"done_writing -> the call ended with {code.name}")
    finally:
        await c.close()


async def bad_initialization(pb, stub, args) -> None:
    c = Call(pb, stub, [("authorization", f"Bearer {args.api_key}")])
    try:
        await c.send(
            initialize_session_request=pb.InitializeSessionRequest(
                input_audio_line=audio_line(pb, 0),
                output_audio_line=audio_line(pb, 24000),
            )
        )
        code, details = await c.status("after an InitializeSessionRequest with sample_rate 0")
        errors = c.events.since(0, "error")
        check(errors, f"no SessionErrorNotification before the call ended; messages: {[k for k, _ in c.events.items]}")
        err = errors[0].error
        check(
            err.category == pb.ERROR_CONFIGURATION and "sample_rate" in err.message,
            f"sample_rate 0 got {pb.SessionErrorCategory.Name(err.category)} ({err.message!r}), expected ERROR_CONFIGURATION naming sample_rate",
        )
        check(not c.events.since(0, "session_ready"), "a session with sample_rate 0 became ready")
        check(code == grpc.StatusCode.FAILED_PRECONDITION, f"the call ended with {code} ({details!r}), expected FAILED_PRECONDITION")
        log(f"sample_rate 0 -> SessionErrorNotification(ERROR_CONFIGURATION, {err.message!r}), then {code.name} ({details!r})")
    finally:
        await c.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="host:port of the voxgate server (h2c)")
    ap.add_argument("--api-key", required=True, help="a bearer key the server accepts")
    ap.add_argument("--wav", required=True, help="16 kHz mono WAV with speech")
    ap.add_argument("--stubs", required=True, help="directory of the generated realtime*_pb2*.py")
    args = ap.parse_args()
    pb, service = load_stubs(args.stubs)
    log(f"grpcio {grpc.__version__}, stubs from {args.stubs}")
    async with grpc.aio.insecure_channel(args.server) as channel:
        stub = service.RealtimeServiceStub(channel)
        await check_unauthenticated(pb, stub, [], "no authorization metadata")
        await check_unauthenticated(pb, stub, [("authorization", "Bearer wrong-key")], "a wrong key")
        await main_session(pb, stub, args)
        await bad_initialization(pb, stub, args)


if __name__ == "__main__":
    run(main)
