"""Smoke test of the benchmark harness: a tiny CPU run of ``python -m benchmarks.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not os.path.isdir(os.path.join(REPO_ROOT, "benchmarks")),
                    reason="benchmarks/ is not part of this checkout")
def test_quick_cpu_run_writes_checked_results(tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable, "-m", "benchmarks.run", "--quick", "--shapes", "S6",
        "--impls", "jax_mok,B1,B2", "--routing", "balanced", "--passes", "fwd,fwdbwd",
        "--scale-tokens", "0.008", "--scale-model", "0.0625", "--iters", "2",
        "--budget-s", "120", "--out", str(out),
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    for name in ("results.json", "results.md", "results.png"):
        assert (out / name).is_file(), f"{name} missing; stdout:\n{proc.stdout[-2000:]}"

    result = json.loads((out / "results.json").read_text())
    records = result["records"]
    keys = {(r["impl"], r["pass"]) for r in records}
    assert keys == {(i, p) for i in ("jax_mok", "B1", "B2") for p in ("fwd", "fwdbwd")}, keys
    for r in records:
        assert r["status"] == "ok", f"{r['key']}: {r['status']} {r.get('reason')}"
        assert r["check"]["passed"] and r["check"]["max_error"] <= r["check"]["tolerance"]
        assert len(r["times_ms"]) == 2 and r["tflops"] > 0
        assert r["tokens"] == round(8192 * 0.008) and r["hidden"] == 128
    assert set(records[0]["check"]["errors"]) >= {"y"}
    fwdbwd = next(r for r in records if r["pass"] == "fwdbwd")
    assert set(fwdbwd["check"]["errors"]) == {"y", "dx", "d_topk_weights", "d_w_gate_up",
                                              "d_w_down"}
    assert result["ceilings"]["matmul_tflops"] > 0 and result["ceilings"]["hbm_gbps"] > 0
    assert result["meta"]["machine"]["platform"] == "cpu"
    assert {s["peer"] for s in result["speedups"]} == {"B1", "B2"}

    for r in records:  # XLA's buffer assignment of the timed program (the memory table)
        b = r["program_bytes"]
        assert b["arguments"] > 0 and b["outputs"] > 0 and b["temporaries"] >= 0, r["key"]
        assert b["arguments_xla"] > 0, r["key"]
        assert b["peak"] == b["arguments"] + b["outputs"] - b["aliased"] + b["temporaries"]
    table = (out / "results.md").read_text()
    assert "| S6 | balanced | fwdbwd |" in table and "vs B2" in table
    assert "Device memory of each timed JAX program" in table and "| S6 | fwdbwd | B2 |" in table


def test_each_finished_shape_is_on_disk_before_the_next_runs(tmp_path, monkeypatch):
    """An outer kill (a device call's time limit) after some shapes leaves their records in
    results.partial.json; a finished run leaves results.json only."""
    from benchmarks import report, run

    seen_on_disk = []

    def fake_shape(self, shape, shapes_left=1):
        partial = tmp_path / "results.partial.json"
        seen_on_disk.append(json.loads(partial.read_text())["records"] if partial.exists()
                            else None)
        return [{"key": f"{shape}/balanced/fwd/jax_mok", "shape": shape, "impl": "jax_mok",
                 "pass": "fwd", "status": "skipped", "reason": "test"}]

    monkeypatch.setattr(run.Orchestrator, "shape", fake_shape)
    md = tmp_path / "results.md"
    md.write_text("")
    monkeypatch.setattr(report, "write", lambda out_dir, result: {"md": str(md)})
    assert run.main(["--quick", "--shapes", "S6,S1,S2", "--impls", "jax_mok", "--no-ceilings",
                     "--out", str(tmp_path)]) in (0, None)
    assert seen_on_disk[0] is None
    assert [r["shape"] for r in seen_on_disk[1]] == ["S6"]
    assert [r["shape"] for r in seen_on_disk[2]] == ["S6", "S1"]
    assert not (tmp_path / "results.partial.json").exists()


def test_an_oom_after_other_items_is_retried_alone_in_a_fresh_worker(tmp_path, monkeypatch):
    """A worker's earlier items can leave the device heap taken (S4's FP8 fwd+bwd and B6 ran
    out of memory after the shape's other rows, not alone): such an item runs once more alone
    in a fresh worker and its record replaces the first; an OOM as a worker's first item is the
    item's own and is not retried."""
    from benchmarks import run
    from benchmarks.worker import shape_items

    args = run.parse_args(["--quick", "--shapes", "S6", "--impls", "jax_mok,B2",
                           "--passes", "fwd", "--no-ceilings", "--out", str(tmp_path)])
    orch = run.Orchestrator(args, str(tmp_path))
    items = shape_items("S6", args.routing, args.passes, args.impls)[:2]
    first, second = (i["key"] for i in items)
    records = {
        first: {**items[0], "status": "OOM", "reason": "own", "process_items_before": 0},
        second: {**items[1], "status": "OOM", "reason": "heap", "process_items_before": 1},
    }
    launched = []

    class Done:
        pid = 0

    def fake_launch(self, name, spec, attempt):
        launched.append((attempt, spec["skip"], spec["ceilings"]))
        with open(spec["events"], "w") as f:
            f.write(json.dumps({"event": "record", "key": second, "status": "ok",
                                "median_ms": 1.0, "process_items_before": 0}) + "\n")
        return Done(), open(os.path.join(str(tmp_path), "retry.log"), "w")

    monkeypatch.setattr(run.Orchestrator, "_launch", fake_launch)
    monkeypatch.setattr(run.Orchestrator, "_watch", lambda self, proc, path: (0, None))
    orch._retry_oom_fresh("S6", items, records, deadline=float("inf"))
    assert launched == [("retry0", [first], False)]  # only the second item, alone
    assert records[first]["reason"] == "own" and "retried_fresh" not in records[first]
    assert records[second]["status"] == "ok" and records[second]["retried_fresh"]
    assert records[second]["first_reason"] == "heap"


def test_oom_not_retried_for_lack_of_time_says_so(tmp_path, monkeypatch):
    """An item that ran out of memory beside other items and was not retried alone (the budget
    was spent) keeps status OOM, but its reason and the table say it was not tried alone."""
    from benchmarks import report, run
    from benchmarks.worker import shape_items

    args = run.parse_args(["--quick", "--shapes", "S6", "--impls", "jax_mok", "--passes", "fwd",
                           "--no-ceilings", "--out", str(tmp_path)])
    orch = run.Orchestrator(args, str(tmp_path))
    item = shape_items("S6", args.routing, args.passes, args.impls)[0]
    records = {item["key"]: {**item, "status": "OOM", "reason": "RESOURCE_EXHAUSTED: heap",
                             "process_items_before": 3}}
    monkeypatch.setattr(run.Orchestrator, "_launch",
                        lambda *a, **k: pytest.fail("no worker may start past the deadline"))
    orch._retry_oom_fresh("S6", [item], records, deadline=0.0)
    record = records[item["key"]]
    assert record["status"] == "OOM" and record["not_retried"]
    assert record["reason"].startswith("after 3 other items in its worker; not retried alone")
    assert record["reason"].endswith("RESOURCE_EXHAUSTED: heap")
    table = report.markdown({"meta": {}, "records": [record], "ceilings": None})
    assert "| OOM (not alone) |" in table


def test_recover_rebuilds_a_cut_run_from_its_workers_logs(tmp_path):
    """A run killed by an outer limit inside its last shape: ``--recover`` keeps the finished
    shapes' records, takes the last shape's from its worker logs (a fresh-process retry's record
    replacing the first), and names the item it was cut in and those never started."""
    from benchmarks import run
    from benchmarks.worker import shape_items

    logs = tmp_path / "logs"
    logs.mkdir()
    done = {"key": "S6/balanced/fwd/jax_mok", "shape": "S6", "routing": "balanced",
            "pass": "fwd", "impl": "jax_mok", "status": "error", "reason": "test"}
    (tmp_path / "results.partial.json").write_text(json.dumps(
        {"meta": {"git_commit": "abc1234"}, "ceilings": {"matmul_tflops": 1.0},
         "records": [done]}))
    items = shape_items("S1", ["balanced"], ["fwd", "fwdbwd"], ["jax_mok", "B2"])
    assert len(items) == 4
    spec = {"routings": ["balanced"], "passes": ["fwd", "fwdbwd"], "impls": ["jax_mok", "B2"]}
    for name in ("S1-0", "S1-1", "S1-retry0"):
        (logs / f"{name}.spec.json").write_text(json.dumps(spec))

    def rec(item, status):
        return {"event": "record", **item, "status": status, "reason": "test"}

    events = [{"event": "machine", "device_kind": "NVIDIA H200", "jax": "0.11.2"},
              {"event": "start", "key": items[0]["key"]}, rec(items[0], "OOM"),
              {"event": "start", "key": items[1]["key"]}]  # its worker killed inside it
    (logs / "S1-0.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    events = [{"event": "start", "key": items[2]["key"]}]  # the restarted worker, then the cut
    (logs / "S1-1.jsonl").write_text("\n".join(json.dumps(e) for e in events) + '\n{"cut')
    (logs / "S1-retry0.jsonl").write_text(json.dumps(rec(items[0], "unsupported")) + "\n")

    result = run.recover(str(tmp_path))
    by_key = {r["key"]: r for r in result["records"]}
    assert list(by_key) == [done["key"]] + [i["key"] for i in items]
    assert by_key[done["key"]]["status"] == "error"  # the finished shape's own record
    assert [by_key[i["key"]]["status"] for i in items] == ["unsupported", "lost", "timeout",
                                                           "skipped"]
    assert "logs/S1-0.log" in by_key[items[1]["key"]]["reason"]
    assert result["ceilings"] == {"matmul_tflops": 1.0}
    assert by_key[items[0]["key"]]["git_commit"] == "abc1234"
    assert by_key[items[0]["key"]]["device_kind"] == "NVIDIA H200"
    assert "3 items cut, lost or not started" in result["meta"]["recovered"]
    with pytest.raises(SystemExit, match="no worker logs"):
        run.recover(str(tmp_path / "logs"))
