"""tools/device_profile.py: the trace summary (synthetic device plane) and a CPU run."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import device_profile  # noqa: E402

# Two calls on one GPU: an op line and two streams; the second stream's kernel overlaps the
# first's by 1 us, and a 5 us gap separates the calls.
XSPACE = """
planes {
  id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "XLA Ops" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 4000000 }
    events { metadata_id: 2 offset_ps: 4000000 duration_ps: 2000000 }
    events { metadata_id: 1 offset_ps: 11000000 duration_ps: 4000000 } }
  lines { id: 2 name: "Stream #13(compute)" timestamp_ns: 0
    events { metadata_id: 3 offset_ps: 0 duration_ps: 4000000 }
    events { metadata_id: 3 offset_ps: 11000000 duration_ps: 4000000 } }
  lines { id: 3 name: "Stream #14(comm)" timestamp_ns: 0
    events { metadata_id: 4 offset_ps: 3000000 duration_ps: 3000000 } }
  event_metadata { key: 1 value { id: 1 name: "custom-call.3" } }
  event_metadata { key: 2 value { id: 2 name: "fusion.7" } }
  event_metadata { key: 3 value { id: 3
    name: "void mok::cuda::wgmma_gemm_kernel<(Mode)1, (Epi)2>(GemmParams)" } }
  event_metadata { key: 4 value { id: 4 name: "exchange_kernel<bf16, true>(Exchange)" } }
}
planes { id: 2 name: "/host:CPU" }
"""


def test_summary_of_a_synthetic_trace():
    pd = jax.profiler.ProfileData
    profile = pd.from_serialized_xspace(pd.text_proto_to_serialized_xspace(XSPACE))
    (gpu,) = device_profile.summarize(profile, calls=2)
    assert gpu["device"] == "/device:GPU:0"
    assert gpu["ops"] == [("custom-call.3", pytest.approx(0.004)),
                          ("fusion.7", pytest.approx(0.001))]
    assert dict(gpu["kernels"]) == {"mok::cuda::wgmma_gemm_kernel<>": pytest.approx(0.004),
                                    "exchange_kernel<>": pytest.approx(0.0015)}
    # kernels cover [0, 6) and [11, 15) us: busy 10 us over 2 calls; span 15 us over 2 calls
    assert gpu["busy_ms"] == pytest.approx(0.005)
    assert gpu["span_ms"] == pytest.approx(0.0075)
    text = device_profile.format_summary([gpu], top=1)
    assert "busy 0.005 ms" in text and "(1 more)" in text


def test_cpu_run_says_there_is_no_device_plane():
    f = jax.jit(lambda x: (x @ x).sum())
    summary = device_profile.profile_calls(f, jnp.ones((64, 64)), calls=2)
    if jax.default_backend() == "cpu":
        assert summary == []
        assert "no device planes" in device_profile.format_summary(summary)
    else:
        assert summary and summary[0]["busy_ms"] > 0
