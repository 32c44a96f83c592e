"""Offline stand-in for `@rules_java//java:defs.bzl` on Bazel 4.x: the native Java rules.

jax_mok has no Java, but Bazel 4 parses @bazel_tools//tools/jdk (which loads these names from
@rules_java) while registering its default toolchains, and would download rules_java for that.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_package_configuration = native.java_package_configuration
java_plugin = native.java_plugin
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
