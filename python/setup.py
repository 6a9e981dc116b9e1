# SPDX-License-Identifier: Apache-2.0
"""Build tensorbroker._native with setuptools alone: no CMake, no prior build.

    pip install --no-build-isolation ./python       (from the source tree)
    pip wheel --no-build-isolation -w dist ./python

The extension is compiled from the tree this file sits in: python/src/native.c,
the client library (client/**/*.c) and the shared protocol code
(proto/*.c plus tensorbroker.pb-c.c, which protoc-c generates here at build
time, as CMake does; <tensorbroker/version.h> is made from the VERSION file
here too). It links only libprotobuf-c and libc, and exports
nothing but PyInit__native, so the library's tb_* symbols cannot clash with a
libtensorbroker the process also loads. It is built for CPython's stable ABI
(Py_LIMITED_API 3.11, set in native.c): one cp311-abi3 wheel serves every
CPython >= 3.11.

Debian 12 needs: python3-dev python3-setuptools python3-wheel pkg-config
protobuf-c-compiler libprotobuf-c-dev libdlpack-dev uthash-dev (and gcc).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def need_tree():
    """The C sources live outside python/: an sdist alone cannot build."""
    for sub in ("client", "proto", "include"):
        if not os.path.isdir(os.path.join(ROOT, sub)):
            sys.exit("tensorbroker: %s/ not found next to python/; build from a "
                     "tensorbroker source tree (pip install ./python)" % sub)


def project_version():
    """The project's single version: the top-level VERSION file when there
    is one, else the VERSION of project() in the top-level CMakeLists.txt."""
    path = os.path.join(ROOT, "VERSION")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*tensorbroker\s+VERSION\s+([0-9][0-9A-Za-z.+-]*)",
                      f.read())
    if m is None:
        sys.exit("tensorbroker: no VERSION file and no project() version in "
                 "CMakeLists.txt")
    return m.group(1)


def pkg_config(*args):
    """pkg-config's words for libprotobuf-c, or None without pkg-config."""
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    r = subprocess.run([exe, *args, "libprotobuf-c"], capture_output=True,
                       text=True, check=False)
    return r.stdout.split() if r.returncode == 0 else None


class BuildExt(build_ext):
    """Generates what CMake generates (the protocol code, with protoc-c, and
    the configured headers), then builds as usual."""

    def run(self):
        gen = os.path.join(os.path.abspath(self.build_temp), "tb-gen")
        os.makedirs(gen, exist_ok=True)
        protoc = os.environ.get("PROTOC_C") or shutil.which("protoc-c")
        if protoc is None:
            sys.exit("tensorbroker: protoc-c not found (Debian: apt-get install "
                     "protobuf-c-compiler libprotobuf-c-dev)")
        subprocess.run([protoc, "--c_out=" + gen,
                        "--proto_path=" + os.path.join(ROOT, "proto"),
                        "tensorbroker.proto"], check=True)
        self.configure_headers(gen)
        # Keep every tb_* symbol private, as CMake's --exclude-libs does.
        script = os.path.join(gen, "native.map")
        with open(script, "w", encoding="utf-8") as f:
            f.write("{ global: PyInit__native; local: *; };\n")
        for ext in self.extensions:
            # Absolute paths: object files then land inside build_temp, not
            # in a ../client folder next to it. (setup() itself must be
            # given relative paths.)
            ext.sources = [os.path.normpath(os.path.join(HERE, p))
                           for p in ext.sources]
            ext.sources.append(os.path.join(gen, "tensorbroker.pb-c.c"))
            ext.include_dirs[:0] = [gen, os.path.join(gen, "include")]
            ext.extra_link_args.append("-Wl,--version-script=" + script)
        super().run()

    @staticmethod
    def configure_headers(gen):
        """Headers CMake makes with configure_file (@VAR@ replaced) from
        include/**/*.h.in, such as <tensorbroker/version.h>, made here the
        same way into gen/include."""
        major, minor, patch = (project_version().split(".") + ["0", "0"])[:3]
        values = {"PROJECT_VERSION": project_version(),
                  "PROJECT_VERSION_MAJOR": major,
                  "PROJECT_VERSION_MINOR": minor,
                  "PROJECT_VERSION_PATCH": patch}
        inc = os.path.join(ROOT, "include")
        for tpl in glob.glob(os.path.join(inc, "**", "*.h.in"), recursive=True):
            with open(tpl, encoding="utf-8") as f:
                text = f.read()
            unknown = set(re.findall(r"@(\w+)@", text)) - set(values)
            if unknown:
                sys.exit("tensorbroker: setup.py cannot fill %s in %s"
                         % (", ".join(sorted(unknown)), tpl))
            text = re.sub(r"@(\w+)@", lambda m: values[m.group(1)], text)
            out = os.path.join(gen, "include", os.path.relpath(tpl, inc)[:-3])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)


def native_extension():
    def sources(sub, skip=()):
        # recursive: the client's CUDA layer is in client/cuda/
        found = sorted(glob.glob(os.path.join(ROOT, sub, "**", "*.c"),
                                 recursive=True))
        return [os.path.relpath(p, HERE) for p in found
                if os.path.basename(p) not in skip]
    cflags = pkg_config("--cflags-only-I") or []
    libs = pkg_config("--libs") or ["-lprotobuf-c"]
    return Extension(
        "tensorbroker._native",
        sources=["src/native.c"] + sources("client") + sources("proto"),
        include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "proto"),
                      os.path.join(ROOT, "client")] + [w[2:] for w in cflags],
        define_macros=[("_GNU_SOURCE", None), ("TB_BUILDING_LIBRARY", None)],
        extra_compile_args=["-std=c11", "-fvisibility=hidden"],
        extra_link_args=libs + ["-ldl", "-lpthread"],
        py_limited_api=True,
    )


need_tree()
setup(
    version=project_version(),
    packages=["tensorbroker"],
    ext_modules=[native_extension()],
    cmdclass={"build_ext": BuildExt},
    # cp311-abi3: the wheel's tag says what the extension's name already does.
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
