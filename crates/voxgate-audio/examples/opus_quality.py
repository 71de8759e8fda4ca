#!/usr/bin/env python3
"""PESQ wideband score of each Opus complexity's decoded speech, from `opus_complexity`.

Why: lowering the Xiaozhi downlink encoder's complexity saves server CPU; this says what it
costs in perceived quality. The `opus_complexity` example writes, per configuration, a
directory `target/opus-quality/<backend>-<application>-<rate>k/` with `ref.wav` (the source
speech at 16 kHz) and `c0.wav`..`c10.wav` (decoded, aligned); this scores every `cN.wav` against
`ref.wav` with ITU-T P.862.2 (PESQ wideband, the `pesq` PyPI package, mode 'wb', 16 kHz) and
prints a Markdown table per directory.

    cargo run --release -p voxgate-audio --example opus_complexity
    python3 crates/voxgate-audio/examples/opus_quality.py [DIR ...]

With no DIR it scores every subdirectory of target/opus-quality holding a ref.wav. On first run
it creates a venv in target/opus-quality/venv and installs `pesq` and `numpy` into it (pesq
builds a C extension: needs a C compiler and Python headers); it then re-runs itself there. If
`pesq` cannot be installed it says why and exits non-zero: no score is ever made up.
"""

import os
import subprocess
import sys
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "target" / "opus-quality"
VENV = OUT / "venv"
PACKAGES = ["pesq", "numpy"]


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_venv() -> None:
    """Create the venv and install the scorer, then re-run this script inside it."""
    python = VENV / "bin" / "python"
    if not python.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = subprocess.run(
        [str(python), "-c", "import pesq, numpy"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PACKAGES],
            capture_output=True,
            text=True,
        )
        if pip.returncode != 0:
            sys.stderr.write(
                "cannot install pesq (no PESQ score is reported):\n"
                + pip.stdout[-4000:]
                + pip.stderr[-4000:]
            )
            sys.exit(1)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


def read_mono16k(path: Path):
    import numpy as np

    with wave.open(str(path), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2 or w.getframerate() != 16000:
            raise SystemExit(f"{path}: expected 16 kHz mono 16-bit PCM")
        data = w.readframes(w.getnframes())
    return np.frombuffer(data, dtype="<i2").astype(np.float64) / 32768.0


def score(directory: Path) -> None:
    from pesq import pesq

    ref = read_mono16k(directory / "ref.wav")
    print(f"\n### {directory.name}: PESQ WB (P.862.2, MOS-LQO) against ref.wav\n")
    print("| complexity | PESQ WB |")
    print("|---|---|")
    for c in range(11):
        path = directory / f"c{c}.wav"
        if not path.exists():
            continue
        deg = read_mono16k(path)
        n = min(len(ref), len(deg))
        print(f"| {c} | {pesq(16000, ref[:n], deg[:n], 'wb'):.3f} |")


def main() -> None:
    if not in_venv():
        ensure_venv()
    dirs = [Path(a) for a in sys.argv[1:]] or sorted(
        d for d in OUT.iterdir() if (d / "ref.wav").exists()
    )
    if not dirs:
        raise SystemExit(f"no ref.wav under {OUT}: run the opus_complexity example first")
    for d in dirs:
        score(d)


if __name__ == "__main__":
    main()
