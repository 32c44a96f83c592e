"""Bzlmod (MODULE.bazel, Bazel >= 7) wrapper around the `local_python` repository rule."""

load("//tools/bazel:local_python.bzl", _local_python = "local_python")

def _local_python_extension_impl(_module_ctx):
    _local_python(name = "local_python")

local_python = module_extension(implementation = _local_python_extension_impl)
