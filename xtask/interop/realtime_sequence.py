"""The reference event sequence of a scripted realtime session, as the published client
`deepslate-core` receives it from a voxgate server's WebSocket door.

`cargo xtask interop --only sequence` runs this and `voxgate-client realtime` with the same
arguments against the same server and requires the same sequence, so the Rust client is held to
what the published client sees. The arguments are the CLI's:

    realtime_sequence.py URL --text T [--text T2 ...] --tool-result NAME=RESULT ... \
        --kinds-out FILE [--api-key K]

The session: initialize (text only, 24 kHz s16 mono in and out) with a client tool declared for
each --tool-result (an object schema with one string property `city`); each --text as a user
turn, every call of a tool answered with its result; then
ExportChatHistoryRequest(await_pending, exclude_audio), whose ChatHistory ends the recording.
What is recorded is the oneof field name (`WhichOneof("payload")`) of every ClientBoundMessage
received, in order, from the first message after connecting to the ChatHistory.

A turn is done at a ResponseEnd when every ToolCallRequest seen since its text was sent has been
answered and a ResponseBegin arrived after the last answer (the continuation's reply ended); the
next text is sent only then.

Writes the names as a JSON array to the --kinds-out file.
"""

import argparse
import asyncio
import json

from common import Events, ScenarioError, check, log, run
from deepslate.core import DeepslateOptions, DeepslateSession, DeepslateSessionListener



def tool(name: str) -> dict:
    """A client tool taking {"city": string}, in deepslate-core's function-tool form."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The client tool {name}.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }


class RecordingSession(DeepslateSession):
    """DeepslateSession, unchanged, plus a record of the kind of every message it receives.

    deepslate-core's public API gives listener callbacks, not messages: several kinds reach no
    callback (Pong, VadAnalysisFrame) and some callbacks do not say which message caused them.
    So the narrowest point that sees every decoded ClientBoundMessage is hooked: its receive
    loop parses each binary frame and hands it to `_handle_server_message`, which this override
    observes before the client handles the message as usual.
    """

    kinds: list[str]
    recording: bool

    async def _handle_server_message(self, msg) -> None:
        if self.recording:
            self.kinds.append(msg.WhichOneof("payload") or "<no payload>")
        await super()._handle_server_message(msg)


class Turns(DeepslateSessionListener):
    """Answers the tool calls and decides, from the client's callbacks, when a turn is done."""

    def __init__(self, events: Events, results: dict[str, str]) -> None:
        self.events = events
        self.results = results
        self.session: DeepslateSession | None = None
        self.reset()

    def reset(self) -> None:
        """A text was just sent: a new turn starts."""
        self.unanswered: set[str] = set()
        self.begin_since_answer = False
        self.done = False

    async def on_session_initialized(self):
        self.events.add("ready")

    async def on_response_begin(self, turn_id=0):
        self.begin_since_answer = True

    async def on_tool_call(self, call_id, name, params, turn_id=None):
        self.events.add("tool_call", (call_id, name, params))
        if name not in self.results or self.session is None:
            self.events.add("fatal", f"a call of the undeclared tool {name!r}")
            return
        self.unanswered.add(call_id)
        await self.session.send_tool_response(call_id, self.results[name])
        self.unanswered.discard(call_id)
        self.begin_since_answer = False

    async def on_response_end(self, turn_id=0):
        if not self.unanswered and self.begin_since_answer and not self.done:
            self.done = True
            self.events.add("turn_done", turn_id)

    async def on_error(self, category, message, trace_id=None):
        self.events.add("error", (category, message))

    async def on_fatal_error(self, e):
        self.events.add("fatal", e)


async def record(url: str, api_key: str, texts: list[str], results: dict[str, str]) -> list[str]:
    events = Events()
    listener = Turns(events, results)
    opts = DeepslateOptions(vendor_id="interop", organization_id="interop", api_key=api_key, ws_url=url, max_retries=0)
    session = RecordingSession.create(opts, listener=listener)
    session.kinds = []
    session.recording = True
    listener.session = session
    # Declared before initialization: the client sends them right after InitializeSessionRequest.
    await session.update_tools([tool(name) for name in results])

    def failed():
        fatal = events.since(0, "fatal")
        if fatal:
            raise ScenarioError(f"the client failed: {fatal}")

    try:
        session.start()
        # The client drops text sent before its socket is up and has no public "connected"
        # signal; a text-only caller waits for it, then initializes (see realtime_scenario.py).
        for _ in range(500):
            failed()
            if session._ws is not None:
                break
            await asyncio.sleep(0.02)
        else:
            raise ScenarioError("the client's websocket did not connect within 10 s")
        await session.initialize(24000, 1)
        await events.wait("SessionReady", lambda: failed() or events.since(0, "ready"))
        log(f"SessionReady (24 kHz s16 mono in and out, tools declared: {list(results)})")
        for text in texts:
            listener.reset()
            mark = events.mark()
            await session.send_text(text)
            await events.wait(f"the turn {text!r} to be done", lambda: failed() or events.since(mark, "turn_done"), 15)
            calls = events.since(mark, "tool_call")
            log(f"turn {text!r} done; tool calls answered: {[(n, p) for _, n, p in calls]}")
        history = await asyncio.wait_for(session.export_chat_history(await_pending=True, exclude_audio=True), 10)
        session.recording = False
        log(f"ChatHistory with {len(history)} messages")
        failed()
    finally:
        await session.close()
    return session.kinds


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url", help="WebSocket URL of the realtime door (ws://host:port/realtime)")
    ap.add_argument("--text", action="append", required=True, help="a user turn, in order")
    ap.add_argument("--tool-result", action="append", default=[], metavar="NAME=RESULT", help="declare NAME, answer its calls with RESULT")
    ap.add_argument("--kinds-out", required=True, help="file to write the JSON array of message kinds to")
    ap.add_argument("--api-key", default="", help="bearer key")
    args = ap.parse_args()
    results = {}
    for item in args.tool_result:
        name, sep, result = item.partition("=")
        if not sep or not name:
            ap.error(f"--tool-result {item!r}: expected NAME=RESULT")
        results[name] = result
    kinds = await record(args.url, args.api_key, args.text, results)
    with open(args.kinds_out, "w") as f:
        json.dump(kinds, f, indent=1)
        f.write("\n")
    log(f"{len(kinds)} messages: {' '.join(kinds)}")
    check(kinds[:1] == ["session_ready"], f"the sequence does not start with session_ready: {kinds}")
    check(kinds[-1:] == ["chat_history"], f"the sequence does not end with chat_history: {kinds}")
    check("error" not in kinds, f"the server reported an error: {kinds}")


if __name__ == "__main__":
    run(main)
