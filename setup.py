"""Build of the optional C modules (metadata is in pyproject.toml): the writer
``replaybank._lane``, the sampling kernels ``replaybank._sampling`` and the window gathers
``replaybank._windows``.

``optional=True``: where no C compiler or Python headers exist the package installs
without them; the Python writer and the numba (or numpy) kernels then serve every call
(same results, slower), and the build says so once, after the compiler's errors (pip shows
it with ``-v``; ``replaybank --version`` says it of an installed copy). The writer's
source is built a second time with ``REPLAYBANK_KILLPOINTS`` as
``replaybank._lane_killpoints`` (``replaybank/_lane_killpoints.c`` includes ``_lane.c``),
the crash tests' build, which counts every durable store (see
replaybank/storage/writers/killpoint.py); the production module pays nothing for it.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptimisedBuildExt(build_ext):
    """The C modules at ``-O3`` whatever the interpreter was built with (Debian's and
    other distributions' Pythons pass ``-O2``, where GCC leaves the strided copies and
    casts of the writer's kernels unvectorised: a 4-env extend of strided observations
    took 25 us against 19.5 at ``-O3``), unless ``CFLAGS`` names an optimisation level."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix" and "-O" not in os.environ.get("CFLAGS", ""):
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, "-O3"]
        self._failed: list[str] = []
        super().build_extensions()
        # setuptools warns once per optional module that failed, with the compiler's
        # command; this says once what that means for the install
        if self._failed:
            names = ", ".join(
                n for n in (e.name.rpartition(".")[2] for e in self.extensions) if n in self._failed
            )
            print(NOT_BUILT.format(names=names), file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:  # setuptools skips an optional module's failure, with a warning
            self._failed.append(ext.name.rpartition(".")[2])
            raise


#: Said once when optional C modules failed to build (no compiler or no Python headers).
NOT_BUILT = (
    "replaybank: the optional C modules {names} were not built (the compiler's errors are "
    "above). replaybank installs and works without them: pure Python and numba serve every "
    "call, with the same results, slower (a one-step add about 5x). For the C modules, "
    "install a C compiler and the Python headers (e.g. apt install build-essential "
    "python3-dev) and reinstall replaybank; `replaybank --version` says which modules an "
    "install has."
)


setup(
    cmdclass={"build_ext": OptimisedBuildExt},
    ext_modules=[
        Extension("replaybank._lane", ["replaybank/_lane.c"], optional=True),
        Extension(
            "replaybank._sampling",
            ["replaybank/_sampling.c"],
            optional=True,
            depends=["replaybank/_fastdiv.h"],
        ),
        Extension(
            "replaybank._windows",
            ["replaybank/_windows.c"],
            optional=True,
            depends=["replaybank/_fastdiv.h"],
        ),
        Extension(
            "replaybank._lane_killpoints",
            ["replaybank/_lane_killpoints.c"],
            optional=True,
            depends=["replaybank/_lane.c"],
        ),
    ],
)
