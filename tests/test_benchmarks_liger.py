"""B6 at its best (issue 22): recording Liger-Kernel's autotune winners and timing with them.

Runs on the CPU without torch, Triton or Liger: Liger's autotuned kernels are fakes with the
attributes ``benchmarks.peers_liger`` reads from Triton's ``Autotuner`` (``configs``, ``keys``,
``cache``, ``best_config``), and their ``run`` makes Triton 3.6's choice: a search (here: the
cheapest candidate by a cost function) only with more than one candidate and a key not in
``cache``; with one candidate, that one whatever the key.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import types

import pytest

from benchmarks import peers_liger as pl

BF16, F32, I32 = "torch.bfloat16", "torch.float32", "torch.int32"
S6 = {"tokens": 8192, "hidden": 2048, "ffn": 2048, "experts": 32, "top_k": 2,
      "dtype": "bfloat16"}  # jax_mok.testing.SHAPES["S6"] in bfloat16
GEMMS = ("_fused_up_proj_swiglu_kernel", "_fused_down_proj_kernel", "_moe_bwd_down_proj_kernel",
         "_moe_bwd_dX_expanded_kernel")
DW = ("_moe_bwd_dW1_kernel", "_moe_bwd_dW2_kernel")
GATHER = "_token_gather_weighted_sum_kernel"


class FakeConfig:
    def __init__(self, kwargs, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None):
        self.kwargs = dict(kwargs)
        self.num_warps, self.num_stages = num_warps, num_stages
        self.num_ctas, self.maxnreg = num_ctas, maxnreg


class FakeAutotuner:
    def __init__(self, configs, keys, cost):
        self.configs, self.keys, self.cost = list(configs), list(keys), cost
        self.cache, self.best_config, self.searches = {}, None, 0

    def run(self, key: tuple):
        if len(self.configs) > 1:
            if key not in self.cache:
                self.searches += 1
                self.cache[key] = min(self.configs, key=lambda c: self.cost(c, key))
            config = self.cache[key]
        else:
            config = self.configs[0]
        self.best_config = config
        return config


def _gemm_configs():  # the candidate grids Liger's module docstring describes (32, 16, 40)
    return [FakeConfig({"BLOCK_N": n, "BLOCK_K": k}, w, s)
            for n, k, w, s in itertools.product((64, 128), (32, 64), (4, 8), (2, 3, 4, 5))]


def _dw_configs():
    return [FakeConfig({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, w, 2)
            for m, n, k, w in itertools.product((64, 128), (64, 128), (16, 32), (4, 8))]


def _gather_configs():
    return [FakeConfig({"BLOCK_H": h, "BLOCK_K": k}, w, 4)
            for h, k, w in itertools.product((64, 128, 256, 512), (1, 2, 4, 8, 16), (4, 8))]


def _gemm_cost(c, key):  # cheapest: BLOCK_N 64, BLOCK_K 64, 8 warps, 3 stages (not the first)
    return (abs(c.kwargs["BLOCK_N"] - 64) + abs(c.kwargs["BLOCK_K"] - 64)
            + abs(c.num_warps - 8) + abs(c.num_stages - 3))


def _dw_cost(c, key):
    return abs(c.kwargs["BLOCK_M"] - 128) + abs(c.kwargs["BLOCK_K"] - 32) + c.num_warps


def _gather_cost(c, key):  # the forward (weighted) and backward sums prefer different configs
    want_h = 256 if key[2] is False else 512
    return abs(c.kwargs["BLOCK_H"] - want_h) + abs(c.kwargs["BLOCK_K"] - 4) + c.num_warps


def fake_liger_module(gemm_cost=_gemm_cost):
    m = types.ModuleType("fake_fused_moe")
    for name in GEMMS:
        setattr(m, name, FakeAutotuner(_gemm_configs(), ["H_dim", "I_dim"], gemm_cost))
    for name in DW:
        setattr(m, name, FakeAutotuner(_dw_configs(), ["H_dim", "I_dim"], _dw_cost))
    setattr(m, GATHER, FakeAutotuner(_gather_configs(), ["H_dim", "K_dim", "w_is_None"],
                                     _gather_cost))
    m.torch = types.ModuleType("torch")  # what else such a module holds: not autotuners
    m.triton = types.ModuleType("triton")
    m.ensure_contiguous = lambda fn: fn
    m.LigerFusedMoEFunction = type("LigerFusedMoEFunction", (), {"configs": [], "cache": {},
                                                                  "keys": []})
    return m


def liger_call(tuners: dict, passname: str, H=2048, F=2048, k=2) -> None:
    """The autotuned launches of one LigerFusedMoEFunction call, with Triton's keys (the key
    arguments' values, then the dtype of every tensor argument)."""
    for name in GEMMS[:2]:
        tuners[name].run((H, F, BF16, BF16, I32, I32, I32, I32, BF16, BF16))
    tuners[GATHER].run((H, k, False, BF16, F32, I32, BF16))
    if passname == "fwdbwd":
        for name in (*GEMMS[2:], *DW):
            tuners[name].run((H, F, BF16, I32, I32, F32, BF16, BF16, I32, I32, I32, BF16))
        tuners[GATHER].run((H, k, True, BF16, BF16, I32, BF16))


def b6_record(tuners: dict, passname: str, mode: str = "full", status: str = "ok",
              shape: str = "S6", problem: dict = S6) -> dict:
    return {"impl": "B6", "shape": shape, "pass": passname, "routing": "balanced",
            "key": f"{shape}/balanced/{passname}/B6", "status": status, "b6_mode": mode,
            "b6_configs": pl.capture(tuners), **problem, "liger_kernel": "0.8.5",
            "triton": "3.6.0", "torch": "2.11.0", "gpu_name": "NVIDIA H200",
            "git_commit": "abc1234"}


def searched_run(path) -> dict:
    """A ``full`` run of S6 (fwd, then fwdbwd in the same process) recorded into ``path``."""
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwd")
    fwd = b6_record(tuners, "fwd")
    liger_call(tuners, "fwdbwd")
    fwdbwd = b6_record(tuners, "fwdbwd")
    keys = pl.record_results([{"meta": {"date": "2026-12-01T00:00:00+00:00"},
                               "records": [fwd, fwdbwd]}], str(path))
    assert keys == ["S6"]
    return tuners


def test_finds_liger_autotuners_among_the_module_attributes():
    found = pl.autotuned_kernels(fake_liger_module())
    assert sorted(found) == sorted((*GEMMS, *DW, GATHER))


def test_capture_names_each_kernels_search_winner_by_key():
    tuners = pl.autotuned_kernels(fake_liger_module())
    assert pl.capture(tuners) == {}  # nothing launched yet
    liger_call(tuners, "fwd")
    got = pl.capture(tuners)
    assert sorted(got) == sorted((*GEMMS[:2], GATHER))  # the backward kernels did not run
    up = got["_fused_up_proj_swiglu_kernel"]
    assert up["key_names"] == ["H_dim", "I_dim"] and up["candidates"] == 32
    assert up["winners"] == [{"key": [2048, 2048, BF16, BF16, I32, I32, I32, I32, BF16, BF16],
                              "config": {"kwargs": {"BLOCK_N": 64, "BLOCK_K": 64},
                                         "num_warps": 8, "num_stages": 3, "num_ctas": 1,
                                         "maxnreg": None}}]
    liger_call(tuners, "fwdbwd")
    got = pl.capture(tuners)
    assert got["_moe_bwd_dW1_kernel"]["candidates"] == 16
    gather = got[GATHER]
    assert gather["candidates"] == 40
    assert [(w["key"][2], w["config"]["kwargs"]["BLOCK_H"]) for w in gather["winners"]] == [
        (False, 256), (True, 512)]


def test_capture_of_a_single_candidate_has_no_key():
    tuner = FakeAutotuner([FakeConfig({"BLOCK_N": 128, "BLOCK_K": 64}, 8, 2)], ["H_dim"],
                          _gemm_cost)
    tuner.run((7168,))
    assert pl.capture({"k": tuner})["k"]["winners"] == [
        {"key": None, "config": {"kwargs": {"BLOCK_N": 128, "BLOCK_K": 64}, "num_warps": 8,
                                 "num_stages": 2, "num_ctas": 1, "maxnreg": None}}]


def test_json_round_trip_then_tuned_pins_every_kernel_and_nothing_searches(tmp_path):
    path = tmp_path / "b6_configs.json"
    searched = searched_run(path)
    data = json.loads(path.read_text())  # plain JSON on disk
    assert data["format"] == pl.CONFIGS_FORMAT and list(data["shapes"]) == ["S6"]
    entry = pl.load_configs(str(path))["shapes"]["S6"]
    assert entry["problem"] == S6 and entry["passes"] == ["fwd", "fwdbwd"]
    assert (entry["liger_kernel"], entry["triton"], entry["gpu"]) == ("0.8.5", "3.6.0",
                                                                      "NVIDIA H200")
    assert entry["items"] == ["S6/balanced/fwd/B6", "S6/balanced/fwdbwd/B6"]
    assert entry["date"].startswith("2026-12-01")
    assert sorted(entry["kernels"]) == sorted((*GEMMS, *DW, GATHER))
    assert len(entry["kernels"][GATHER]["winners"]) == 2

    # a fresh process: Liger's candidates, empty caches; tuned pins before the first call
    plan = pl.select_mode("tuned", "S6", S6, ["fwd", "fwdbwd"], path=str(path))
    assert (plan.mode, plan.warning) == ("tuned", None)
    tuners = pl.autotuned_kernels(fake_liger_module(gemm_cost=lambda c, key: 0.0))
    pool = list(tuners[GATHER].configs)
    assert pl.pin_recorded(tuners, plan.entry["kernels"]) is None
    before = pl.cache_keys(tuners)
    for passname in ("fwd", "fwdbwd"):
        liger_call(tuners, passname)
    assert pl.searched(tuners, before) == {}
    assert all(t.searches == 0 for t in tuners.values())
    for name, tuner in tuners.items():  # each launched the recorded winner, not its first config
        assert pl.config_dict(tuner.best_config) == pl.config_dict(searched[name].best_config)
    assert len(tuners[GEMMS[0]].configs) == 1 and len(tuners[GATHER].configs) == 2
    assert all(any(c is p for p in pool) for c in tuners[GATHER].configs)  # Liger's own objects
    # the capture after a tuned call names the same configs as the record
    assert pl.capture(tuners)[GATHER]["winners"] == entry["kernels"][GATHER]["winners"]


def test_tuned_launches_the_recorded_config_even_when_a_search_would_choose_another(tmp_path):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    entry = pl.load_configs(str(path))["shapes"]["S6"]
    # this process's search would prefer BLOCK_N 128, BLOCK_K 32
    other = lambda c, key: (c.kwargs["BLOCK_N"] != 128) + (c.kwargs["BLOCK_K"] != 32)  # noqa: E731
    tuners = pl.autotuned_kernels(fake_liger_module(gemm_cost=other))
    assert pl.pin_recorded(tuners, entry["kernels"]) is None
    liger_call(tuners, "fwd")
    assert tuners[GEMMS[0]].best_config.kwargs == {"BLOCK_N": 64, "BLOCK_K": 64}


def test_pin_refuses_a_config_liger_does_not_offer_and_changes_nothing(tmp_path):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    kernels = pl.load_configs(str(path))["shapes"]["S6"]["kernels"]
    kernels[GATHER]["winners"][1]["config"]["num_warps"] = 16  # not among the 40 candidates
    tuners = pl.autotuned_kernels(fake_liger_module())
    why = pl.pin_recorded(tuners, kernels)
    assert GATHER in why and "none of this liger-kernel's 40 candidates" in why
    assert all(len(t.configs) in (16, 32, 40) and not t.cache for t in tuners.values())

    del tuners["_moe_bwd_dW2_kernel"]
    kernels[GATHER]["winners"][1]["config"]["num_warps"] = 8
    assert "no autotuned kernel _moe_bwd_dW2_kernel" in pl.pin_recorded(tuners, kernels)


def _warning_of(plan) -> str:
    assert plan.mode == "full" and plan.entry is None and plan.requested == "tuned"
    assert "falling back to --b6-autotune full" in plan.warning
    assert "--b6-autotune record" in plan.warning and plan.key in plan.warning
    return plan.warning


def test_tuned_falls_back_to_full_with_a_warning_saying_why(tmp_path):
    path = tmp_path / "b6_configs.json"
    absent = pl.select_mode("tuned", "S6", S6, ["fwd"], path=str(path))  # no file at all
    assert "no recorded Liger configs for this shape" in _warning_of(absent)
    searched_run(path)
    other = pl.select_mode("tuned", "S1", {**S6, "tokens": 32768}, ["fwd"], path=str(path))
    assert "no recorded Liger configs" in _warning_of(other)
    data = pl.load_configs(str(path))
    data["shapes"]["S6"]["passes"] = ["fwd"]
    fwd_only = pl.select_mode("tuned", "S6", S6, ["fwd", "fwdbwd"], data=data, path=str(path))
    assert "not ['fwdbwd']" in _warning_of(fwd_only)
    assert pl.select_mode("tuned", "S6", S6, ["fwd"], data=data, path=str(path)).mode == "tuned"
    data["shapes"]["S6"]["passes"] = []  # a cut search's checkpoint alone
    cut = pl.select_mode("tuned", "S6", S6, ["fwd"], data=data, path=str(path))
    assert cut.mode == "full" and "only a cut search's winners" in _warning_of(cut)
    data["shapes"]["S6"]["passes"] = ["fwdbwd"]  # its first call searched the forward's kernels
    both = pl.select_mode("tuned", "S6", S6, ["fwd", "fwdbwd"], data=data, path=str(path))
    assert both.mode == "tuned" and both.entry is data["shapes"]["S6"]
    moved = pl.select_mode("tuned", "S6", {**S6, "tokens": 4096}, ["fwd"], path=str(path))
    assert "'tokens': 4096" in _warning_of(moved)
    path.write_text("{not json")
    broken = pl.select_mode("tuned", "S6", S6, ["fwd"], path=str(path))
    assert "unreadable" in _warning_of(broken)


def test_other_modes_are_taken_as_given():
    for mode in ("full", "record", "pinned"):
        plan = pl.select_mode(mode, "S6", S6, ["fwd"], data=pl.empty_configs())
        assert (plan.mode, plan.entry, plan.warning) == (mode, None, None)
    with pytest.raises(ValueError, match="b6 autotune must be one of"):
        pl.select_mode("best", "S6", S6, ["fwd"], data=pl.empty_configs())
    with pytest.raises(ValueError, match="b6 autotune must be one of"):
        pl.unavailable_reason("gpu", "best")
    assert pl.AUTOTUNE_MODES["pinned"] == "0"
    assert all(pl.AUTOTUNE_MODES[m] == "1" for m in ("tuned", "record", "full"))


def test_the_recorded_setting_names_every_kernels_config(tmp_path, monkeypatch):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    monkeypatch.setenv(pl.ENV, "1")
    plan = pl.select_mode("tuned", "S6", S6, ["fwd", "fwdbwd"], path=str(path))
    text = pl.autotune_setting(plan)
    assert text.startswith("tuned: ") and "no search" in text
    assert "liger-kernel 0.8.5, triton 3.6.0 on NVIDIA H200" in text
    assert "_fused_up_proj_swiglu_kernel BLOCK_N=64 BLOCK_K=64 num_warps=8 num_stages=3" in text
    assert "_moe_bwd_dW1_kernel BLOCK_M=128 BLOCK_N=64 BLOCK_K=32 num_warps=4 num_stages=2" in text
    for flag, block_h in (("False", 256), ("True", 512)):
        assert (f"{GATHER} [H_dim=2048 K_dim=2 w_is_None={flag}] BLOCK_H={block_h} BLOCK_K=4 "
                "num_warps=4 num_stages=4") in text
    assert all(name in text for name in (*GEMMS, *DW))

    fallback = pl.select_mode("tuned", "S2", S6, ["fwd"], path=str(path))
    text = pl.autotune_setting(fallback)
    assert text.startswith("full (tuned asked for; B6 S2: no recorded Liger configs")
    assert text.endswith("Triton autotune inside the first (untimed) call of each shape")
    assert pl.autotune_setting(pl.select_mode("record", "S6", S6, ["fwd"])).startswith(
        "record: LIGER_FUSED_MOE_AUTOTUNE=1")
    monkeypatch.setenv(pl.ENV, "0")
    assert pl.autotune_setting(pl.select_mode("pinned", "S6", S6, ["fwd"])) == (
        "pinned: LIGER_FUSED_MOE_AUTOTUNE=0: one pinned config per kernel, no search")


def test_only_searched_and_checked_records_are_recorded():
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwd")
    assert pl.recorded_entries([b6_record(tuners, "fwd", mode="tuned")]) == {}
    assert pl.recorded_entries([b6_record(tuners, "fwd", mode="pinned")]) == {}
    assert pl.recorded_entries([b6_record(tuners, "fwd", status="check_failed")]) == {}
    assert pl.recorded_entries([{**b6_record(tuners, "fwd"), "impl": "B3"}]) == {}
    assert list(pl.recorded_entries([b6_record(tuners, "fwd", mode="record")])) == ["S6"]
    # LIGER_FUSED_MOE_AUTOTUNE=0 forced under full: one candidate, no search, nothing to record
    single = {"k": FakeAutotuner([FakeConfig({"BLOCK_N": 128})], ["H_dim"], _gemm_cost)}
    single["k"].run((2048,))
    assert pl.recorded_entries([b6_record(single, "fwd")]) == {}


def test_scaled_and_float32_problems_get_their_own_key():
    assert pl.shape_key("S6", S6) == "S6"
    assert pl.shape_key("S6", {**S6, "dtype": "float32"}) == "S6@T8192-H2048-F2048-E32-k2-float32"
    small = {**S6, "tokens": 164, "hidden": 128, "ffn": 128}
    assert pl.shape_key("S6", small) == "S6@T164-H128-F128-E32-k2-bfloat16"
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwd")
    assert list(pl.recorded_entries([b6_record(tuners, "fwd", problem=small)])) == [
        "S6@T164-H128-F128-E32-k2-bfloat16"]


def test_merging_keeps_other_shapes_and_replaces_another_versions_record(tmp_path):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwd")
    s1 = {**S6, "tokens": 32768, "hidden": 2048, "ffn": 768, "experts": 128, "top_k": 8}
    pl.record_results([{"records": [b6_record(tuners, "fwd", shape="S1", problem=s1)]}],
                      str(path))
    shapes = pl.load_configs(str(path))["shapes"]
    assert sorted(shapes) == ["S1", "S6"] and shapes["S6"]["passes"] == ["fwd", "fwdbwd"]
    # the same versions: a forward-only record of S6 keeps its backward kernels
    pl.record_results([{"records": [b6_record(tuners, "fwd")]}], str(path))
    s6 = pl.load_configs(str(path))["shapes"]["S6"]
    assert s6["passes"] == ["fwd", "fwdbwd"] and "_moe_bwd_dW1_kernel" in s6["kernels"]
    # another Triton: the new record replaces the old one whole
    newer = {**b6_record(tuners, "fwd"), "triton": "3.8.0"}
    pl.record_results([{"records": [newer]}], str(path))
    s6 = pl.load_configs(str(path))["shapes"]["S6"]
    assert s6["triton"] == "3.8.0" and s6["passes"] == ["fwd"]
    assert "_moe_bwd_dW1_kernel" not in s6["kernels"]


def test_record_command_merges_results_files(tmp_path, capsys):
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwdbwd")
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"meta": {"date": "2026-12-01"},
                                   "records": [b6_record(tuners, "fwdbwd")]}))
    configs = tmp_path / "configs.json"
    assert pl.main(["record", str(results), "--configs", str(configs)]) == 0
    assert "S6" in capsys.readouterr().out
    assert pl.load_configs(str(configs))["shapes"]["S6"]["passes"] == ["fwdbwd"]
    results.write_text(json.dumps({"records": [b6_record(tuners, "fwdbwd", mode="tuned")]}))
    before = configs.read_text()
    assert pl.main(["record", str(results), "--configs", str(configs)]) == 1
    assert configs.read_text() == before


def test_the_committed_configs_file_is_valid():
    data = pl.load_configs(pl.CONFIGS_PATH)
    assert os.path.exists(pl.CONFIGS_PATH)
    for key, entry in data["shapes"].items():  # recorded on a GPU, never written by hand
        assert entry["liger_kernel"] and entry["triton"] and entry["gpu"], key
        assert entry["kernels"] and all(k["winners"] for k in entry["kernels"].values()), key
        # the passes the entry covers whole; none where every search of the shape was cut (a
        # checkpoint's winners, kept for the next record run to resume from)
        assert set(entry["passes"]) <= {"fwd", "fwdbwd"} and entry["items"], key
    with pytest.raises(ValueError):
        pl.validate({"format": 1, "shapes": {"S1": {"problem": S6, "passes": ["fwd"]}}})


class _FakeSR:
    """The part of worker.ShapeRunner that run_liger uses."""

    def __init__(self, spec):
        from jax_mok import testing

        self.spec = {"shape": "S6", "passes": ["fwd"], "iters": 2, "warmup": 1, **spec}
        self.platform = "gpu"
        self.machine = {"gpu_name": "NVIDIA H200"}
        self.shape = testing.SHAPES["S6"]
        self.dtype = types.SimpleNamespace(name="bfloat16")
        self.probes = {"balanced": None}

    def check(self, got, want, record, tolerances=None):
        record["check"] = {"passed": True}
        return True

    def timed(self, step, record):
        step(0)
        record["status"] = "ok"


def _fake_liger(monkeypatch, module, first_call=None, timed=None) -> dict:
    """run_liger's Liger replaced by ``module``'s fake autotuners: the first call launches the
    pass's kernels as ``liger_call`` does (``first_call(tuners, passname)`` instead where
    given), each timed call too (after ``timed()``). Returns the tuners."""
    tuners = pl.autotuned_kernels(module)

    class FakeLigerRunner:
        def __init__(self, problem, passname):
            self.passname = passname

        def check_outputs(self, probe):
            (first_call or liger_call)(tuners, self.passname)
            return {}

        def step(self):
            def step(i):
                if timed is not None:
                    timed()
                liger_call(tuners, self.passname)

            return step

        def release(self):
            pass

    monkeypatch.setattr(pl, "unavailable_reason", lambda platform, mode: None)
    monkeypatch.setattr(pl, "LigerRunner", FakeLigerRunner)
    monkeypatch.setattr(pl, "liger_autotuners", lambda: tuners)
    monkeypatch.setattr(pl, "liger_version", lambda: "0.8.5")
    monkeypatch.setattr(pl, "triton_version", lambda: "3.6.0")
    monkeypatch.setattr(pl, "_printed", set())
    monkeypatch.setenv(pl.ENV, "1")
    return tuners


def _b6_item(passname: str) -> dict:
    return {"key": f"S6/balanced/{passname}/B6", "shape": "S6", "routing": "balanced",
            "pass": passname, "impl": "B6"}


def _run_liger(monkeypatch, spec: dict, module, passname: str = "fwd", **fake) -> dict:
    """One B6 item through runners.run_liger; the record starts as the worker's would (the
    item and the problem: ShapeRunner.base_record's fields that B6's recording reads)."""
    from benchmarks import runners

    _fake_liger(monkeypatch, module, **fake)
    item = _b6_item(passname)
    record = {**item, **S6}
    runners.run_liger(_FakeSR(spec), item, None, {}, record)
    return record


def test_the_worker_resumes_a_record_run_from_the_file(tmp_path, monkeypatch):
    path = tmp_path / "b6_configs.json"
    _forward_searched_file(path)  # S6's forward, searched on an H200 (the fake worker's GPU)
    module = fake_liger_module()
    record = _run_liger(monkeypatch, {"b6_configs": str(path), "b6_autotune": "record",
                                      "passes": ["fwdbwd"]}, module, "fwdbwd")
    assert record["status"] == "ok" and record["b6_mode"] == "record"
    assert sorted(record["b6_resumed"]) == sorted((*GEMMS[:2], GATHER))
    assert "resumed: the keys of" in record["b6_autotune"]
    assert sorted(record["b6_searched"]) == sorted((*GEMMS[2:], *DW, GATHER))
    assert all(getattr(module, n).searches == 0 for n in GEMMS[:2])
    # the same file on another GPU: nothing resumed, everything searched
    monkeypatch.setattr(_FakeSR, "__init__", _other_gpu(_FakeSR.__init__))
    record = _run_liger(monkeypatch, {"b6_configs": str(path), "b6_autotune": "record",
                                      "passes": ["fwdbwd"]}, fake_liger_module(), "fwdbwd")
    assert "b6_resumed" not in record and "resumed" not in record["b6_autotune"]
    assert sorted(record["b6_searched"]) == sorted((*GEMMS, *DW, GATHER))


def _other_gpu(init):
    def wrapped(self, spec):
        init(self, spec)
        self.machine = {"gpu_name": "NVIDIA H100 80GB HBM3"}

    return wrapped


def test_the_worker_times_tuned_without_a_search_and_records_the_configs(tmp_path, monkeypatch,
                                                                         capsys):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    record = _run_liger(monkeypatch, {"b6_configs": str(path)}, fake_liger_module())
    assert record["status"] == "ok" and record["b6_mode"] == "tuned"
    assert record["b6_searched"] == {} and "b6_warning" not in record
    assert "_fused_up_proj_swiglu_kernel BLOCK_N=64 BLOCK_K=64" in record["b6_autotune"]
    want = pl.load_configs(str(path))["shapes"]["S6"]["kernels"]
    assert record["b6_configs"][GEMMS[0]]["winners"] == want[GEMMS[0]]["winners"]
    assert record["triton"] == "3.6.0" and "first_call_s" in record
    assert "B6 S6: tuned: " in capsys.readouterr().out


def test_the_worker_falls_back_to_full_prints_why_and_its_record_can_be_recorded(
        tmp_path, monkeypatch, capsys):
    path = tmp_path / "b6_configs.json"  # absent: no GPU session has recorded anything
    record = _run_liger(monkeypatch, {"b6_configs": str(path)}, fake_liger_module())
    assert record["status"] == "ok" and record["b6_mode"] == "full"
    assert "no recorded Liger configs" in record["b6_warning"]
    assert record["b6_warning"] in capsys.readouterr().out
    assert sorted(record["b6_searched"]) == sorted((*GEMMS[:2], GATHER))
    assert record["b6_autotune"].startswith("full (tuned asked for;")
    entries = pl.recorded_entries([{**record, "impl": "B6", "shape": "S6", "pass": "fwd",
                                    "key": "S6/balanced/fwd/B6", **S6}])
    assert sorted(entries["S6"]["kernels"]) == sorted((*GEMMS[:2], GATHER))


def test_the_worker_falls_back_when_this_liger_lacks_a_recorded_config(tmp_path, monkeypatch):
    path = tmp_path / "b6_configs.json"
    searched_run(path)
    module = fake_liger_module()
    up = getattr(module, GEMMS[0])
    up.configs = [c for c in up.configs if c.kwargs != {"BLOCK_N": 64, "BLOCK_K": 64}]
    record = _run_liger(monkeypatch, {"b6_configs": str(path)}, module)
    assert record["b6_mode"] == "full" and "none of this liger-kernel's" in record["b6_warning"]
    assert GEMMS[0] in record["b6_searched"]


def test_the_command_line_defaults_to_tuned():
    from benchmarks import run

    assert run.parse_args([]).b6_autotune == "tuned"
    args = run.parse_args(["--b6-autotune", "record", "--b6-configs", "x.json"])
    assert (args.b6_autotune, args.b6_configs) == ("record", "x.json")
    with pytest.raises(SystemExit):
        run.parse_args(["--b6-autotune", "best"])


def test_with_tritons_own_autotuner_pinning_launches_the_winner_without_benchmarking(tmp_path):
    """The same round trip on Triton's real ``Autotuner`` (where Triton is installed; the GPU
    machine's is 3.6): its launch and its benchmark of one config are stubbed, so no device is
    needed, and everything else is Triton's own choice. Two keys with different winners, as the
    gather kernel's forward and backward sums have."""
    triton = pytest.importorskip("triton")
    tl = triton.language

    class Tensor:  # what Triton reads of a tensor argument for its key
        dtype = BF16

    def cost(config, I_dim):  # I_dim 768 prefers BLOCK_N 64, 1536 prefers 128
        return _gemm_cost(config, None) + (config.kwargs["BLOCK_N"] != (64 if I_dim == 768
                                                                         else 128)) * 100

    def kernel():
        @triton.autotune(configs=[triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w,
                                                num_stages=s)
                                  for n, k, w, s in itertools.product((64, 128), (32, 64),
                                                                      (4, 8), (2, 3))],
                         key=["H_dim", "I_dim"])
        @triton.jit
        def _fused_up_proj_swiglu_kernel(x_ptr, H_dim: tl.constexpr, I_dim: tl.constexpr,
                                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
            pass

        tuner = _fused_up_proj_swiglu_kernel
        launched, benched = [], []
        tuner.fn.run = lambda *args, **kwargs: launched.append(kwargs)

        def bench(*args, config, **kwargs):
            benched.append(config)
            return [cost(config, kwargs["I_dim"]), 0.0, 0.0]

        tuner._bench = bench
        module = types.ModuleType("fused_moe")
        module._fused_up_proj_swiglu_kernel = tuner
        return pl.autotuned_kernels(module), launched, benched

    def launch(tuners, I_dim):
        tuners["_fused_up_proj_swiglu_kernel"].run(Tensor(), H_dim=2048, I_dim=I_dim, grid=(1,))

    tuners, launched, benched = kernel()
    assert list(tuners) == ["_fused_up_proj_swiglu_kernel"]
    launch(tuners, 768)
    launch(tuners, 1536)
    assert len(benched) == 32  # Triton searched every candidate, once per key
    got = pl.capture(tuners)["_fused_up_proj_swiglu_kernel"]
    config = {"kwargs": {"BLOCK_N": 64, "BLOCK_K": 64}, "num_warps": 8, "num_stages": 3,
              "num_ctas": 1, "maxnreg": None}
    assert got["winners"] == [
        {"key": [2048, 768, BF16], "config": config},
        {"key": [2048, 1536, BF16], "config": {**config, "kwargs": {"BLOCK_N": 128,
                                                                     "BLOCK_K": 64}}}]
    record = {**b6_record({}, "fwd"), "b6_configs": {"_fused_up_proj_swiglu_kernel": got}}
    path = tmp_path / "b6_configs.json"
    assert pl.record_results([{"records": [record]}], str(path)) == ["S6"]

    tuners, launched, benched = kernel()  # a fresh process
    plan = pl.select_mode("tuned", "S6", S6, ["fwd"], path=str(path))
    assert pl.pin_recorded(tuners, plan.entry["kernels"]) is None
    assert len(tuners["_fused_up_proj_swiglu_kernel"].configs) == 2
    before = pl.cache_keys(tuners)
    for I_dim, block_n in ((1536, 128), (768, 64)):
        launch(tuners, I_dim)
        assert {k: launched[-1][k] for k in ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
                } == {"BLOCK_N": block_n, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    assert benched == [] and pl.searched(tuners, before) == {}
    launch(tuners, 3072)  # a key not recorded: a search, but among the recorded winners only
    assert len(benched) == 2
    assert pl.searched(tuners, before) == {"_fused_up_proj_swiglu_kernel": 1}


def _forward_searched_file(path) -> dict:
    """A ``record`` run of S6's forward alone in the file at ``path``; returns its tuners."""
    tuners = pl.autotuned_kernels(fake_liger_module())
    liger_call(tuners, "fwd")
    assert pl.record_results([{"records": [b6_record(tuners, "fwd", mode="record")]}],
                             str(path)) == ["S6"]
    return tuners


def test_record_resumes_a_shape_searching_only_keys_without_a_winner(tmp_path):
    path = tmp_path / "b6_configs.json"
    first = _forward_searched_file(path)
    kernels = pl.resumable("S6", S6, "NVIDIA H200", "0.8.5", "3.6.0", path=str(path))
    assert sorted(kernels) == sorted((*GEMMS[:2], GATHER))

    tuners = pl.autotuned_kernels(fake_liger_module())  # a later process: empty caches
    resumed = pl.prefill(tuners, kernels)
    assert sorted(resumed) == sorted((*GEMMS[:2], GATHER)) and len(resumed[GATHER]) == 1
    assert all(len(t.configs) == len(first[n].configs) for n, t in tuners.items())  # whole lists
    before = pl.cache_keys(tuners)
    liger_call(tuners, "fwdbwd")
    assert all(tuners[n].searches == 0 for n in GEMMS[:2])  # the recorded forward GEMMs
    assert tuners[GATHER].searches == 1  # its backward key only
    assert pl.searched(tuners, before) == {n: 1 for n in (*GEMMS[2:], *DW, GATHER)}
    for name in GEMMS[:2]:
        assert pl.config_dict(tuners[name].best_config) == pl.config_dict(
            first[name].best_config)

    record = {**b6_record(tuners, "fwdbwd", mode="record"), "b6_resumed": resumed}
    entry = pl.recorded_entries([record])["S6"]
    # the keys given from the file are not this record's own winners
    assert sorted(entry["kernels"]) == sorted((*GEMMS[2:], *DW, GATHER))
    assert [w["key"][2] for w in entry["kernels"][GATHER]["winners"]] == [True]
    assert pl.record_results([{"records": [record]}], str(path)) == ["S6"]
    merged = pl.load_configs(str(path))["shapes"]["S6"]
    assert merged["passes"] == ["fwd", "fwdbwd"]
    assert sorted(merged["kernels"]) == sorted((*GEMMS, *DW, GATHER))
    assert merged["kernels"][GEMMS[0]]["candidates"] == 32
    assert [w["key"][2] for w in merged["kernels"][GATHER]["winners"]] == [False, True]
    # tuned now covers both passes without a search
    plan = pl.select_mode("tuned", "S6", S6, ["fwd", "fwdbwd"], path=str(path))
    assert (plan.mode, plan.warning) == ("tuned", None)


def test_record_resumes_only_from_the_same_gpu_versions_and_problem(tmp_path):
    path = tmp_path / "b6_configs.json"
    _forward_searched_file(path)
    assert pl.resumable("S6", S6, "NVIDIA H100 80GB HBM3", "0.8.5", "3.6.0", path=str(path)) == {}
    assert pl.resumable("S6", S6, "NVIDIA H200", "0.8.6", "3.6.0", path=str(path)) == {}
    assert pl.resumable("S6", S6, "NVIDIA H200", "0.8.5", "3.5.0", path=str(path)) == {}
    assert pl.resumable("S6", {**S6, "tokens": 4096}, "NVIDIA H200", "0.8.5", "3.6.0",
                        path=str(path)) == {}
    assert pl.resumable("S1", S6, "NVIDIA H200", "0.8.5", "3.6.0", path=str(path)) == {}
    assert pl.resumable("S6", S6, "NVIDIA H200", "0.8.5", "3.6.0",
                        path=str(tmp_path / "absent.json")) == {}
    # a recorded config that is none of this Liger's candidates is left to the search
    kernels = pl.resumable("S6", S6, "NVIDIA H200", "0.8.5", "3.6.0", path=str(path))
    kernels[GEMMS[0]]["winners"][0]["config"]["num_stages"] = 7
    tuners = pl.autotuned_kernels(fake_liger_module())
    assert GEMMS[0] not in pl.prefill(tuners, kernels)
    assert tuners[GEMMS[0]].cache == {}


# ---------------------------------------------------------------------------------------------
# A search cut short (the worker killed at --item-timeout-s, or crashed) keeps its winners
# ---------------------------------------------------------------------------------------------

FWD_KEY = [2048, 2048, BF16, BF16, I32, I32, I32, I32, BF16, BF16]  # liger_call's forward GEMMs
GATHER_FWD_KEY = [2048, 2, False, BF16, F32, I32, BF16]
GEMM_WINNER = {"kwargs": {"BLOCK_N": 64, "BLOCK_K": 64}, "num_warps": 8, "num_stages": 3,
               "num_ctas": 1, "maxnreg": None}  # the cheapest by _gemm_cost
FORWARD_KERNELS = {  # S6's forward search, as the configs file holds it
    GEMMS[0]: {"key_names": ["H_dim", "I_dim"], "candidates": 32,
               "winners": [{"key": FWD_KEY, "config": GEMM_WINNER}]},
    GEMMS[1]: {"key_names": ["H_dim", "I_dim"], "candidates": 32,
               "winners": [{"key": FWD_KEY, "config": GEMM_WINNER}]},
    GATHER: {"key_names": ["H_dim", "K_dim", "w_is_None"], "candidates": 40,
             "winners": [{"key": GATHER_FWD_KEY,
                          "config": {"kwargs": {"BLOCK_H": 256, "BLOCK_K": 4}, "num_warps": 4,
                                     "num_stages": 4, "num_ctas": 1, "maxnreg": None}}]},
}


def _wait_for_checkpoint(path, kernels, timeout_s: float = 10.0) -> dict:
    """The checkpoint's record once its searched kernels are ``kernels`` (its thread writes)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            record = json.loads(path.read_text())["records"][0]
        except (OSError, ValueError):
            record = None
        if record is not None and sorted(record["b6_searched"]) == sorted(kernels):
            return record
        time.sleep(0.005)
    pytest.fail(f"{path} never named the searched kernels {sorted(kernels)}")


def test_the_checkpoint_holds_each_winner_once_its_key_is_searched(tmp_path, monkeypatch):
    path = tmp_path / "logs" / "S6-0.b6.json"
    tuners = pl.autotuned_kernels(fake_liger_module())
    given = tuners[GEMMS[1]]  # a key given from the file before the call (resumed)
    given.cache[tuple(FWD_KEY)] = given.configs[0]
    base = {k: v for k, v in b6_record(tuners, "fwdbwd", mode="record").items()
            if k not in ("status", "b6_configs")}
    base["b6_resumed"] = {GEMMS[1]: [FWD_KEY]}
    checkpoint = pl.Checkpoint(str(path), tuners, base, pl.cache_keys(tuners))
    assert checkpoint.write() is False and not path.exists()  # nothing searched yet

    tuners[GEMMS[0]].run(tuple(FWD_KEY))
    assert checkpoint.write() is True
    data = json.loads(path.read_text())
    assert data["records"] == [{
        **base, "status": "running", "b6_partial": True, "b6_searched": {GEMMS[0]: 1},
        "b6_configs": {
            GEMMS[0]: FORWARD_KERNELS[GEMMS[0]],
            GEMMS[1]: {"key_names": ["H_dim", "I_dim"], "candidates": 32, "winners": [
                {"key": FWD_KEY, "config": {"kwargs": {"BLOCK_N": 64, "BLOCK_K": 32},
                                            "num_warps": 4, "num_stages": 2, "num_ctas": 1,
                                            "maxnreg": None}}]}}}]
    assert checkpoint.write() is False  # no new key: the file stays
    tuners[GATHER].run(tuple(GATHER_FWD_KEY))
    assert checkpoint.write() is True
    record = json.loads(path.read_text())["records"][0]
    assert record["b6_searched"] == {GEMMS[0]: 1, GATHER: 1}
    assert sorted(os.listdir(path.parent)) == ["S6-0.b6.json"]  # no temporary file left

    # what it records: the searched winners (not the resumed key), and no pass
    configs = tmp_path / "b6_configs.json"
    assert pl.main(["record", str(path), "--configs", str(configs)]) == 0
    entry = pl.load_configs(str(configs))["shapes"]["S6"]
    assert entry["passes"] == [] and entry["items"] == ["S6/balanced/fwdbwd/B6"]
    assert entry["kernels"] == {n: FORWARD_KERNELS[n] for n in (GEMMS[0], GATHER)}
    plan = pl.select_mode("tuned", "S6", S6, ["fwdbwd"], path=str(configs))
    assert plan.mode == "full" and "only a cut search's winners" in plan.warning
    # a partial record only counts while its item is unfinished, and only from a search
    assert pl.recorded_entries([{**record, "status": "check_failed"}]) == {}
    assert pl.recorded_entries([{**record, "b6_mode": "tuned"}]) == {}
    assert list(pl.recorded_entries([{**record, "status": "timeout"}])) == ["S6"]

    # the thread: writes as keys appear, stops before the timed calls, close removes the file
    monkeypatch.setattr(pl, "CHECKPOINT_INTERVAL_S", 0.01)
    later = pl.Checkpoint(str(path), tuners, base, pl.cache_keys(tuners)).start()
    assert pl.Checkpoint.THREAD_NAME in {t.name for t in threading.enumerate()}
    tuners[GEMMS[2]].run(tuple(FWD_KEY))
    assert _wait_for_checkpoint(path, [GEMMS[2]])["b6_configs"][GEMMS[2]]["winners"] == [
        {"key": FWD_KEY, "config": GEMM_WINNER}]
    later.stop()
    assert pl.Checkpoint.THREAD_NAME not in {t.name for t in threading.enumerate()}
    later.close()
    assert not path.exists()


def test_the_worker_checkpoints_its_search_during_the_first_call(tmp_path, monkeypatch):
    monkeypatch.setattr(pl, "CHECKPOINT_INTERVAL_S", 0.01)
    path = tmp_path / "logs" / "S6-0.b6.json"
    seen = []

    def first_call(tuners, passname):  # the forward kernels search, then the backward ones
        liger_call(tuners, "fwd")
        seen.append(_wait_for_checkpoint(path, (*GEMMS[:2], GATHER)))
        liger_call(tuners, "fwdbwd")
        seen.append(_wait_for_checkpoint(path, (*GEMMS, *DW, GATHER)))

    def timed():
        assert pl.Checkpoint.THREAD_NAME not in {t.name for t in threading.enumerate()}
        assert not path.exists() or json.loads(path.read_text())["records"][0] == seen[-1]

    record = _run_liger(monkeypatch, {"b6_configs": str(tmp_path / "absent.json"),
                                      "b6_autotune": "record", "passes": ["fwdbwd"],
                                      "b6_checkpoint": str(path), "git_commit": "abc1234"},
                        fake_liger_module(), "fwdbwd", first_call=first_call, timed=timed)
    assert record["status"] == "ok" and not path.exists()  # the record says it all now
    assert seen[0]["b6_configs"] == FORWARD_KERNELS
    assert (seen[0]["key"], seen[0]["status"], seen[0]["b6_mode"]) == (
        "S6/balanced/fwdbwd/B6", "running", "record")
    assert (seen[0]["gpu_name"], seen[0]["liger_kernel"], seen[0]["triton"],
            seen[0]["git_commit"]) == ("NVIDIA H200", "0.8.5", "3.6.0", "abc1234")
    assert seen[1]["b6_configs"] == record["b6_configs"]
    assert seen[1]["b6_searched"] == record["b6_searched"] == {
        **{n: 1 for n in (*GEMMS, *DW)}, GATHER: 2}


@pytest.mark.parametrize("mode,killed", [("record", True), ("record", False), ("full", True)])
def test_a_worker_dead_in_its_search_leaves_the_winners_to_the_next_call(tmp_path, monkeypatch,
                                                                         mode, killed):
    """The orchestrator kills the worker at --item-timeout-s (or it crashes) while the forward
    kernels of an S6 fwd+bwd have their winners and the backward ones search: the item's record
    gets the checkpoint's winners and, in record mode, both configs files at once, from which
    the next call on the same GPU and versions resumes."""
    from benchmarks import run, runners

    monkeypatch.setattr(pl, "CHECKPOINT_INTERVAL_S", 0.01)
    monkeypatch.setenv("JAX_MOK_GIT_COMMIT", "abc1234")
    configs, out = tmp_path / "b6_configs.json", tmp_path / "out"
    key = "S6/balanced/fwdbwd/B6"
    args = run.parse_args(["--b6-autotune", mode, "--b6-configs", str(configs), "--impls", "B6",
                           "--shapes", "S6", "--routing", "balanced", "--passes", "fwdbwd",
                           "--no-ceilings", "--out", str(out)])
    orch = run.Orchestrator(args, str(out))

    class Killed(BaseException):  # nothing of the worker runs after it
        pass

    def first_call(tuners, passname):
        liger_call(tuners, "fwd")
        _wait_for_checkpoint(out / "logs" / "S6-0.b6.json", (*GEMMS[:2], GATHER))
        raise Killed

    def fake_launch(self, name, spec, attempt):
        assert spec["b6_checkpoint"] == str(out / "logs" / f"{name}-{attempt}.b6.json")
        with open(spec["events"], "w") as f:
            for event in ({"event": "machine", "gpu_name": "NVIDIA H200"},
                          {"event": "start", "key": key, "time": time.time()}):
                f.write(json.dumps(event) + "\n")
        _fake_liger(monkeypatch, fake_liger_module(), first_call=first_call)
        with pytest.MonkeyPatch.context() as mp, pytest.raises(Killed):
            mp.setattr(pl.Checkpoint, "close", pl.Checkpoint.stop)  # a kill cleans nothing up
            runners.run_liger(_FakeSR(spec), _b6_item("fwdbwd"), None, {},
                              {**_b6_item("fwdbwd"), **S6})
        return types.SimpleNamespace(pid=0), open(out / "logs" / f"{name}-{attempt}.log", "w")

    monkeypatch.setattr(run.Orchestrator, "_launch", fake_launch)
    monkeypatch.setattr(run.Orchestrator, "_watch",
                        lambda self, proc, path: (-9, key) if killed else (-11, None))
    [record] = orch.shape("S6")
    assert record["status"] == ("timeout" if killed else "crash")
    assert record["b6_partial"] and record["b6_checkpoint"] == os.path.join("logs", "S6-0.b6.json")
    assert (record["b6_mode"], record["gpu_name"], record["git_commit"]) == (
        mode, "NVIDIA H200", "abc1234")
    assert record["b6_configs"] == FORWARD_KERNELS
    # the checkpoint file stands alone (a call cut from outside leaves only it): it names the
    # commit as the record does
    assert pl.read_checkpoint(str(out / "logs" / "S6-0.b6.json"), key)["git_commit"] == "abc1234"
    # results.json carries it: python -m benchmarks.peers_liger record takes it from there too
    assert pl.recorded_entries([record])["S6"]["kernels"] == FORWARD_KERNELS
    if mode == "full":  # full records nothing by itself
        assert not configs.exists() and not (out / "b6_configs.json").exists()
        return
    assert (out / "b6_configs.json").read_text() == configs.read_text()
    entry = pl.load_configs(str(configs))["shapes"]["S6"]
    assert (entry["passes"], entry["items"], entry["gpu"], entry["git_commit"]) == (
        [], [key], "NVIDIA H200", "abc1234")
    assert entry["kernels"] == FORWARD_KERNELS
    assert pl.resumable("S6", S6, "NVIDIA H200", "0.8.5", "3.6.0",
                        path=str(configs)) == FORWARD_KERNELS
    for other in (("NVIDIA H100 80GB HBM3", "0.8.5", "3.6.0"), ("NVIDIA H200", "0.8.6", "3.6.0"),
                  ("NVIDIA H200", "0.8.5", "3.5.0")):  # another GPU, liger-kernel or Triton
        assert pl.resumable("S6", S6, *other, path=str(configs)) == {}

    # the next call: the kept forward winners launch without a search, the backward searches
    module = fake_liger_module()
    spec = {"b6_configs": str(configs), "b6_autotune": "record", "passes": ["fwdbwd"]}
    resumed = _run_liger(monkeypatch, spec, module, "fwdbwd")
    assert resumed["b6_resumed"] == {GEMMS[0]: [FWD_KEY], GEMMS[1]: [FWD_KEY],
                                     GATHER: [GATHER_FWD_KEY]}
    assert resumed["b6_searched"] == {n: 1 for n in (*GEMMS[2:], *DW, GATHER)}
    assert [getattr(module, n).searches for n in GEMMS[:2]] == [0, 0]
    # on another GPU the checkpoint's winners are not resumed: everything searches
    monkeypatch.setattr(_FakeSR, "__init__", _other_gpu(_FakeSR.__init__))
    fresh = _run_liger(monkeypatch, spec, fake_liger_module(), "fwdbwd")
    assert "b6_resumed" not in fresh
    assert fresh["b6_searched"] == {**{n: 1 for n in (*GEMMS, *DW)}, GATHER: 2}


def test_with_tritons_own_autotuner_a_key_is_checkpointed_once_its_search_is_done(tmp_path):
    """Triton's ``Autotuner.run`` puts a key into ``cache`` after benchmarking its every
    candidate (launch and benchmark stubbed, as above): a checkpoint written mid-search has no
    winner for it, one written after names the winner."""
    triton = pytest.importorskip("triton")
    tl = triton.language

    class Tensor:
        dtype = BF16

    @triton.autotune(configs=[triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=3)
                              for n, w in itertools.product((64, 128), (4, 8))],
                     key=["H_dim"])
    @triton.jit
    def _fused_down_proj_kernel(x_ptr, H_dim: tl.constexpr, BLOCK_N: tl.constexpr):
        pass

    tuner = _fused_down_proj_kernel
    tuner.fn.run = lambda *args, **kwargs: None
    tuners = {"_fused_down_proj_kernel": tuner}
    path = tmp_path / "S6-0.b6.json"
    checkpoint = pl.Checkpoint(str(path), tuners, b6_record({}, "fwd"), pl.cache_keys(tuners))
    mid_search = []

    def bench(*args, config, **kwargs):
        mid_search.append(checkpoint.write())
        return [abs(config.kwargs["BLOCK_N"] - 128) + config.num_warps, 0.0, 0.0]

    tuner._bench = bench
    tuner.run(Tensor(), H_dim=2048, grid=(1,))
    assert mid_search == [False] * 4 and not path.exists()
    assert checkpoint.write() is True
    assert json.loads(path.read_text())["records"][0]["b6_configs"] == {
        "_fused_down_proj_kernel": {"key_names": ["H_dim"], "candidates": 4, "winners": [
            {"key": [2048, BF16], "config": {"kwargs": {"BLOCK_N": 128}, "num_warps": 4,
                                             "num_stages": 3, "num_ctas": 1,
                                             "maxnreg": None}}]}}
