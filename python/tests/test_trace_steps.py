"""bench/trace_steps.py (the per-step summary of a CUPTI timeline) on random synthetic traces, against a
rasterised reference: every microsecond the GPU runs something is counted once."""
import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
spec = importlib.util.spec_from_file_location("trace_steps", os.path.join(ROOT, "bench", "trace_steps.py"))
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)


def synth(rng, n_steps):
    """n_steps forwards of random kernels (integer us, some overlapping, gaps between) and host calls."""
    ev, t, starts = [], 0, []
    for _ in range(n_steps):
        starts.append(t)
        ev.append({"name": "void embed_kernel<bf16>(float *)", "cat": "kernel", "ph": "X", "ts": t, "dur": 3, "pid": 0, "tid": 7})
        t += 3
        for _ in range(rng.integers(3, 12)):
            t += int(rng.integers(0, 6))          # a gap, or none
            d = int(rng.integers(1, 20))
            back = int(rng.integers(0, 3)) if rng.random() < 0.3 else 0  # sometimes overlaps the previous
            ev.append({"name": f"k{rng.integers(0, 5)}", "cat": "kernel", "ph": "X", "ts": t - back, "dur": d, "pid": 0, "tid": 7})
            t = max(t, t - back + d)
        ev.append({"name": "cudaGraphLaunch", "cat": "runtime", "ph": "X", "ts": starts[-1] + 1, "dur": 2, "pid": 1, "tid": 1})
        t += int(rng.integers(1, 30))             # the host's turn
    starts.append(t)
    ev.append({"name": "void embed_kernel<bf16>(float *)", "cat": "kernel", "ph": "X", "ts": t, "dur": 3, "pid": 0, "tid": 7})
    return ev, starts


def test_steps_match_raster_reference():
    rng = np.random.default_rng()
    ev, starts = synth(rng, int(rng.integers(5, 12)))
    steps = ts.steps_of(ev)
    assert len(steps) == len(starts) - 1
    for s, a, b in zip(steps, starts, starts[1:]):
        busy = np.zeros(b - a, bool)
        for e in ev:
            if e["pid"] == 0 and a <= e["ts"] < b:
                busy[e["ts"] - a:min(e["ts"] + e["dur"], b) - a] = True
        assert s["period"] == b - a
        assert s["busy"] == pytest.approx(busy.sum())
        assert s["kernels"] == sum(1 for e in ev if e["pid"] == 0 and a <= e["ts"] < b)
        assert s["api"] == {"cudaGraphLaunch": 2}


def test_report_and_slice(tmp_path):
    rng = np.random.default_rng()
    ev, starts = synth(rng, 9)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    out, sl = tmp_path / "t.md", tmp_path / "s.json"
    import sys
    argv, sys.argv = sys.argv, ["trace_steps.py", str(path), "--skip", "2", "--out", str(out), "--slice", str(sl)]
    try:
        ts.main()
    finally:
        sys.argv = argv
    periods = sorted(b - a for a, b in zip(starts[2:-1], starts[3:]))
    text = out.read_text()
    assert f"{len(periods)} steps (forwards) after the first 2" in text
    assert f"period **{float(np.median(periods)):.1f} us**" in text
    kept = json.loads(sl.read_text())["traceEvents"]
    assert 0 < len(kept) < len(ev)


def test_no_events_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(SystemExit, match="no events"):
        ts.load(str(path))
