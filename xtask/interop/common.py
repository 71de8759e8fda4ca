"""Helpers shared by the interop scenarios: step logging, an event log with waits, WAV reading.

The scenarios drive the published clients unchanged; these helpers only observe what the
clients report through their own callbacks.
"""

import asyncio
import sys
import time
import wave
from typing import Any, Callable, Optional

_started = time.monotonic()


def log(message: str) -> None:
    """One progress line, prefixed with the seconds since the scenario started."""
    print(f"[{time.monotonic() - _started:6.2f}s] {message}", flush=True)


class ScenarioError(Exception):
    """A check failed: the message says what was expected and what happened."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioError(message)


class Events:
    """An append-only log of (kind, payload) the client callbacks record, with waits on it."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self._changed = asyncio.Event()

    def add(self, kind: str, payload: Any = None) -> None:
        self.items.append((kind, payload))
        self._changed.set()

    def mark(self) -> int:
        """The current position, to look only at events after it."""
        return len(self.items)

    def since(self, mark: int, kind: Optional[str] = None) -> list[Any]:
        return [p for k, p in self.items[mark:] if kind is None or k == kind]

    async def wait(self, what: str, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Waits until `predicate()` is truthy and returns its value; fails with the recent
        events after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                recent = "\n    ".join(f"{k}: {p!r}"[:300] for k, p in self.items[-25:])
                raise ScenarioError(
                    f"timed out after {timeout:.0f} s waiting for {what}; last events:\n    {recent}"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.5))
            except asyncio.TimeoutError:
                pass


def read_wav_pcm16(path: str) -> tuple[bytes, int, int]:
    """(little-endian 16-bit PCM, sample rate, channels) of a WAV file."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise ScenarioError(f"{path}: expected 16-bit samples")
        return w.readframes(w.getnframes()), w.getframerate(), w.getnchannels()


def run(main) -> None:
    """Runs an async scenario; exit status 0 on success, 1 with the reason on failure."""
    try:
        asyncio.run(main())
    except ScenarioError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 (report anything the client raised)
        import traceback

        traceback.print_exc()
        log(f"FAILED with {type(e).__name__}: {e}")
        sys.exit(1)
    log("PASSED")
