#!/usr/bin/env python3
"""An ACP echo agent built with the official Python SDK (`pip install agent-client-protocol`).

voxgate's ACP brain tests run it (see tests/acp.rs); it also serves as a copy-paste agent to
try the brain (docs/acp.md). Behaviour by prompt text, the same as tests/acp/rust_agent.rs:

* ``whoami``: ``session=<id> cwd=<cwd> pid=<pid> turn=<n> env=<VOXGATE_ACP_TEST_ENV>``
* ``slow <n>``: streams ``tick0 tick1 ...`` every 30 ms and honours ``session/cancel``
* ``perm <kind> <title>``: reports a tool call, asks permission, says ``outcome=<optionId>``
* ``lateperm``: streams until cancelled, then asks permission and remembers the outcome
* ``last``: ``last=<outcome of the last permission request> cancels=<n>``
* ``crash``: streams ``dying`` and exits with status 3
* ``garbage``: writes a non-JSON line, calls ``fs/read_text_file``, says ``fs=<error code>``
* ``recall``: ``recall=<the context blocks received so far>`` (``recall=none`` without), its
  lines joined with `` | ``
* anything else: ``You said: <text>``, word by word

The command is the prompt's last text block; earlier blocks are context (voxgate sends the
conversation so far there when this process replaces an earlier one).
"""

import asyncio
import os
import sys
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    update_agent_message,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    Implementation,
    PermissionOption,
    ToolCallUpdate,
)


class EchoAgent(Agent):
    _conn: Client

    def __init__(self) -> None:
        self.sessions: dict[str, str] = {}
        self.cancels: dict[str, asyncio.Event] = {}
        self.turns = 0
        self.cancel_count = 0
        self.last_permission = ""
        self.context: list[str] = []

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities=None,
                         client_info=None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),
            agent_info=Implementation(name="python-echo-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, mcp_servers=None, **kwargs: Any) -> NewSessionResponse:
        sid = f"sess_{len(self.sessions) + 1}"
        self.sessions[sid] = cwd
        return NewSessionResponse(session_id=sid)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancel_count += 1
        if ev := self.cancels.get(session_id):
            ev.set()

    async def say(self, sid: str, text: str) -> None:
        await self._conn.session_update(session_id=sid, update=update_agent_message(text_block(text)))

    async def ask(self, sid: str, call_id: str) -> str:
        resp = await self._conn.request_permission(
            session_id=sid,
            tool_call=ToolCallUpdate(tool_call_id=call_id),
            options=[
                PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                PermissionOption(option_id="always", name="Always allow", kind="allow_always"),
                PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
            ],
        )
        outcome = resp.outcome
        self.last_permission = outcome.option_id if outcome.outcome == "selected" else "cancelled"
        return self.last_permission

    async def prompt(self, prompt, session_id: str, **kwargs: Any) -> PromptResponse:
        sid = session_id
        self.turns += 1
        cancel = self.cancels[sid] = asyncio.Event()
        blocks = [getattr(b, "text", "") for b in prompt]
        text = blocks[-1] if blocks else ""
        self.context.extend(blocks[:-1])
        words = text.split()
        head = words[0] if words else ""
        if head == "whoami":
            env = os.environ.get("VOXGATE_ACP_TEST_ENV", "")
            await self.say(sid, f"session={sid} cwd={self.sessions.get(sid)} pid={os.getpid()} "
                                f"turn={self.turns} env={env}")
        elif head == "slow":
            n = int(words[1]) if len(words) > 1 else 100
            for i in range(n):
                await self.say(sid, f"tick{i} ")
                try:
                    await asyncio.wait_for(cancel.wait(), 0.03)
                    return PromptResponse(stop_reason="cancelled")
                except asyncio.TimeoutError:
                    pass
        elif head == "perm":
            kind = words[1] if len(words) > 1 else "other"
            title = " ".join(words[2:])
            call_id = f"call_{self.turns}"
            await self._conn.session_update(
                session_id=sid,
                update=start_tool_call(call_id, title, kind=kind, status="pending"),
            )
            await self.say(sid, f"outcome={await self.ask(sid, call_id)}")
        elif head == "lateperm":
            await self.say(sid, "waiting ")
            await cancel.wait()
            await self.ask(sid, "late_call")
            return PromptResponse(stop_reason="cancelled")
        elif head == "recall":
            lines = [line for c in self.context for line in c.splitlines() if line.strip()]
            await self.say(sid, "recall=" + (" | ".join(lines) if lines else "none"))
        elif head == "last":
            await self.say(sid, f"last={self.last_permission} cancels={self.cancel_count}")
        elif head == "crash":
            await self.say(sid, "dying")
            await asyncio.sleep(0.05)
            os._exit(3)
        elif head == "garbage":
            sys.stdout.write("this line is not JSON\n")
            sys.stdout.flush()
            try:
                await self._conn.read_text_file(session_id=sid, path="/etc/passwd")
                code = 0
            except RequestError as e:
                code = e.code
            await self.say(sid, f"fs={code}")
        else:
            reply = f"You said: {text}"
            parts = reply.split(" ")
            for i, w in enumerate(parts):
                await self.say(sid, w + (" " if i + 1 < len(parts) else ""))
                await asyncio.sleep(0.005)
        return PromptResponse(stop_reason="cancelled" if cancel.is_set() else "end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(EchoAgent()))
