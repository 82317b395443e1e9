"""Packages python/kdt with a copy of libkdt.so, so the installed package needs no source tree.

`make && pip install ./python` copies ../build/libkdt.so (or the file $KDT_LIB names) into the
package. The wheel is tagged for this platform since it carries a native library."""
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    path = os.environ.get("KDT_LIB") or os.path.join(HERE, os.pardir, "build", "libkdt.so")
    return os.path.normpath(path)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = _library()
        if os.path.isfile(lib):
            dest = os.path.join(self.build_lib, "kdt", "libkdt.so")
            shutil.copyfile(lib, dest)
            print(f"kdt: packaged {lib}", file=sys.stderr)
        else:
            print(f"kdt: WARNING: {lib} not found (run `make` first, or set KDT_LIB); the installed "
                  f"package will need KDT_LIB at run time", file=sys.stderr)


class NativeDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: the package carries libkdt.so
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=NativeDistribution)
