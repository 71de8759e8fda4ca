"""Times Python's json.loads on the same bytes the Rust benchmark `parse` decodes.

Run from anywhere: python3 crates/voxgate-retell/benches/python_json.py
Prints median and best microseconds per parse over 200 short timeit repeats, in CPU time (not
inflated by other processes on a shared machine) and wall time.
"""
import json
import pathlib
import statistics
import time
import timeit

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "response_required_10_utterances.json"
raw = DATA.read_bytes()
text = raw.decode("utf-8")

number = 100
# CPU time is what other processes on a shared machine cannot inflate; wall time for reference.
for timer_name, timer in (("cpu", time.process_time), ("wall", time.perf_counter)):
    for label, payload in (("str", text), ("bytes", raw)):
        runs = timeit.repeat(lambda: json.loads(payload), number=number, repeat=200, timer=timer)
        per_call = [r / number * 1e6 for r in runs]
        print(f"json.loads({label}) {len(raw)} B, {timer_name} time: "
              f"median {statistics.median(per_call):.2f} us, best {min(per_call):.2f} us")
