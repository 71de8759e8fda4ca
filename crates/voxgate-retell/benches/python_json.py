"""Times Python's json.loads on the same bytes the Rust benchmark `parse` decodes.

Run from anywhere: python3 crates/voxgate-retell/benches/python_json.py
Prints the median time per parse in microseconds (best of several timeit repeats).
"""
import json
import pathlib
import statistics
import timeit

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "response_required_10_utterances.json"
raw = DATA.read_bytes()
text = raw.decode("utf-8")

number = 2000
for label, payload in (("bytes", raw), ("str", text)):
    runs = timeit.repeat(lambda: json.loads(payload), number=number, repeat=7)
    per_call = [r / number * 1e6 for r in runs]
    print(f"json.loads({label}) {len(raw)} B: median {statistics.median(per_call):.2f} us, "
          f"best {min(per_call):.2f} us")
