"""Repository rule `local_python`: the pip-installed Python, jaxlib's XLA FFI headers and nanobind.

Nothing is downloaded: the rule runs the interpreter named by $JAX_MOK_PYTHON (else `python3` on
PATH) once, asks it where its headers, `jax.ffi.include_dir()` and nanobind live, and symlinks
those directories into an external repository with cc_library targets:

  @local_python//:python_headers   Python.h of that interpreter
  @local_python//:xla_ffi          xla/ffi/api/*.h shipped with jaxlib
  @local_python//:nanobind         nanobind (its sources compiled statically, like NB_STATIC)
  @local_python//:py_toolchain     a Python toolchain for that interpreter (py_test uses it)
"""

_PROBE = """
import json, os, sys, sysconfig
import jax, nanobind
print(json.dumps({
    "python": sys.executable,
    "python_include": sysconfig.get_paths()["include"],
    "xla_ffi_include": jax.ffi.include_dir(),
    "nanobind_root": os.path.dirname(nanobind.include_dir()),
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
}))
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "xla_ffi",
    hdrs = glob(["xla_ffi_include/xla/ffi/api/*.h"]),
    includes = ["xla_ffi_include"],
)

cc_library(
    name = "nanobind",
    srcs = glob(
        ["nanobind/src/*.cpp", "nanobind/src/*.h"],
        # The list nanobind's CMake compiles for a static libnanobind (nb_ft.cpp: free-threaded
        # builds only; nb_backend.cpp: nanobind_add_backend() only).
        exclude = [
            "nanobind/src/nb_combined.cpp",
            "nanobind/src/nb_backend.cpp",
            "nanobind/src/nb_ft.cpp",
        ],
    ),
    hdrs = glob([
        "nanobind/include/**/*.h",
        "nanobind/ext/robin_map/include/**/*.h",
    ]),
    copts = ["-std=c++17", "-fno-strict-aliasing", "-fvisibility=hidden", "-O2"],
    defines = ["NB_COMPACT_ASSERTIONS"],
    includes = ["nanobind/include", "nanobind/ext/robin_map/include"],
    deps = [":python_headers"],
)

load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "python",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

exports_files(["ext_suffix.txt"])
"""

def _local_python_impl(ctx):
    python = ctx.os.environ.get("JAX_MOK_PYTHON") or ctx.which("python3")
    if not python:
        fail("local_python: set JAX_MOK_PYTHON to the Python that has jax and nanobind installed")
    result = ctx.execute([str(python), "-c", _PROBE])
    if result.return_code != 0:
        fail("local_python: {} could not import jax and nanobind:\n{}".format(python, result.stderr))
    info = json.decode(result.stdout.strip().splitlines()[-1])
    ctx.symlink(info["python_include"], "python_include")
    ctx.symlink(info["xla_ffi_include"], "xla_ffi_include")
    ctx.symlink(info["nanobind_root"], "nanobind")
    ctx.file("ext_suffix.txt", info["ext_suffix"] + "\n")
    ctx.file("WORKSPACE", "workspace(name = \"{}\")\n".format(ctx.name))
    ctx.file("BUILD.bazel", _BUILD.replace("{python}", info["python"]))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["JAX_MOK_PYTHON", "PATH"],
    local = True,
)
