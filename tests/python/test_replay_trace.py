"""benchmarks/pipeline/replay_trace.py: a trace's spans replayed in each rank's order with
their own durations and free communication. On a hand-made GPipe trace of 2 stages x 2
micro-batches whose ops all take 1 ms but start late (waits added), the replay gives the
schedule's bubble exactly - (p-1)/(M+p-1) = 1/3 - while the measured bubble includes the waits."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "benchmarks", "pipeline", "replay_trace.py")


def span(rank, cat, micro, t_ms):
    return {"ph": "X", "pid": rank, "tid": 0, "cat": cat, "name": f"{cat} {micro}", "ts": t_ms * 1e3, "dur": 1e3,
            "args": {"micro": micro, "chunk": 0, "step": 0}}


def test_replay_removes_the_waits(tmp_path):
    ev = [{"ph": "M", "pid": r, "name": "process_name", "args": {"name": f"rank {r} (pp stage {r})"}}
          for r in (0, 1)]
    # stage 0: F0 F1 ... B0 B1; stage 1: F0 B0 F1 B1 - every start 0.5 ms after its data was there
    ev += [span(0, "forward", 0, 0), span(0, "forward", 1, 1.5),
           span(1, "forward", 0, 1.5), span(1, "backward", 0, 3), span(1, "forward", 1, 4.5),
           span(1, "backward", 1, 6), span(0, "backward", 0, 4.5), span(0, "backward", 1, 7.5)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    out = subprocess.run([sys.executable, SCRIPT, str(path), "--skip-steps", "0"], capture_output=True, text=True,
                         check=True).stdout
    line = out.strip().splitlines()[0]
    # replayed: makespan 6 ms, 4 ms busy per stage -> 1 - 4/6 = 1/3; measured: 8.5 ms -> 1 - 4/8.5
    assert "replayed with free communication 0.333" in line, out
    assert f"measured bubble {1 - 4 / 8.5:.3f}" in line, out
