"""Build of the optional C modules (metadata is in pyproject.toml): the writer
``replaybank._lane`` and the sampling kernels ``replaybank._sampling``.

``optional=True``: where no C compiler or Python headers exist the package installs
without them; the Python writer and the numba (or numpy) kernels then serve every call
(same results, slower). The same
source is built a second time with ``REPLAYBANK_KILLPOINTS`` as
``replaybank._lane_killpoints``, the crash tests' build, which counts every durable store
(see replaybank/storage/writers/killpoint.py); the production module pays nothing for it.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("replaybank._lane", ["replaybank/_lane.c"], optional=True),
    Extension("replaybank._sampling", ["replaybank/_sampling.c"], optional=True),
    Extension("replaybank._windows", ["replaybank/_windows.c"], optional=True),
    Extension("replaybank._lane_killpoints", ["replaybank/_lane.c"], optional=True,
              define_macros=[("REPLAYBANK_KILLPOINTS", "1")]),
])
