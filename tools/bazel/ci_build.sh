#!/usr/bin/env bash
# CI step: build the CPU FFI library with Bazel (offline) and load it into jax.
#   tools/bazel/ci_build.sh [python]      (default: python3 on PATH; must have jax + nanobind)
# Needs a `bazel` binary; on Debian/Ubuntu: apt-get install bazel-bootstrap (Bazel 4.2, offline
# thanks to the stand-in repositories under tools/bazel/*_compat, see //:WORKSPACE).
set -euo pipefail
cd "$(dirname "$0")/../.."
export JAX_MOK_PYTHON="${1:-${JAX_MOK_PYTHON:-$(command -v python3)}}"
if ! command -v bazel >/dev/null; then
  echo "bazel not found; install it (Debian: apt-get install bazel-bootstrap)" >&2
  exit 2
fi
bazel --batch build //:_mok_cpu //:jax_mok
bazel --batch test //tools/bazel:bazel_smoke_test --test_output=all
