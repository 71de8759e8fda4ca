"""A local stand-in for an OpenAI-compatible `POST {base}/audio/transcriptions` endpoint.

`cargo xtask interop` points the server at it (VOXGATE_ASR_BASE_URL) so audio turns get a
transcript without a cloud service. It speaks the real wire format: a multipart/form-data
request with a `file` part (a WAV file) and a `model` field in, `{"text": ...}` out. It checks
what it receives, because the point is to prove that the server sends a real recording:

* the `file` part must be a RIFF/WAVE file, PCM 16-bit mono at 16 kHz, with some samples;
* the `model` field must be present.

Anything else is answered with HTTP 400 and an OpenAI-style error body. The transcript names
the length of the audio it got (`"interop transcript of 3.2 seconds"`), so a scenario can check
that the recording reached the recognizer in full. Under the base URL `/question/v1` (the
same port) the transcript asks instead (`"interop transcript of 3.2 seconds, is that right?"`):
a server pointed there answers each spoken turn with a reply that ends with a question, after
which a server with TTS waits for the user's answer (the Deepslate plugins' scenarios).

Usage: python fake_asr.py [--port 0]. Prints `listening on http://127.0.0.1:PORT/v1` on
stdout once it accepts connections, then serves until killed. Every request is logged on
stderr.
"""

import argparse
import json
import struct
import sys
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "interop transcript of"
QUESTION_SUFFIX = ", is that right?"
QUESTION_BASE = "/question/"


def parse_wav(data: bytes) -> tuple[int, int, int, int]:
    """(sample_rate, channels, bits, frames) of a PCM WAV file, or ValueError."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("file is not a RIFF/WAVE file")
    pos = 12
    fmt = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        body = data[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            if len(body) < 16:
                raise ValueError("fmt chunk too short")
            tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", body[:16])
            if tag != 1:
                raise ValueError(f"WAV format tag {tag} is not PCM")
            fmt = (rate, channels, bits, block)
        elif chunk_id == b"data":
            if fmt is None:
                raise ValueError("data chunk before fmt chunk")
            rate, channels, bits, block = fmt
            return rate, channels, bits, len(body) // max(block, 1)
        pos += 8 + size + (size & 1)
    raise ValueError("no data chunk")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        sys.stderr.write("fake_asr: " + (fmt % args) + "\n")

    def reply(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def fail(self, message: str) -> None:
        sys.stderr.write(f"fake_asr: rejecting request: {message}\n")
        self.reply(400, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self):  # noqa: N802
        self.reply(404, {"error": {"message": "only POST /v1/audio/transcriptions"}})

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/audio/transcriptions"):
            self.reply(404, {"error": {"message": f"unknown path {self.path}"}})
            return
        ctype = self.headers.get("Content-Type", "")
        if not ctype.startswith("multipart/form-data"):
            self.fail(f"expected multipart/form-data, got {ctype!r}")
            return
        msg = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
        )
        fields = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")
        if "model" not in fields:
            self.fail("missing `model` field")
            return
        if "file" not in fields:
            self.fail("missing `file` part")
            return
        filename, wav = fields["file"]
        try:
            rate, channels, bits, frames = parse_wav(wav)
        except ValueError as e:
            self.fail(f"bad `file` part ({filename}): {e}")
            return
        if (rate, channels, bits) != (16000, 1, 16):
            self.fail(f"expected 16 kHz mono 16-bit WAV, got {rate} Hz, {channels} ch, {bits} bit")
            return
        if frames == 0:
            self.fail("the WAV file has no samples")
            return
        seconds = frames / rate
        model = fields["model"][1].decode(errors="replace")
        sys.stderr.write(
            f"fake_asr: {filename} {seconds:.2f} s, model={model}, "
            f"fields={sorted(fields)}\n"
        )
        suffix = QUESTION_SUFFIX if self.path.startswith(QUESTION_BASE) else ""
        self.reply(200, {"text": f"{PREFIX} {seconds:.1f} seconds{suffix}"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
