"""Build of the optional C writer ``replaybank._lane`` (metadata is in pyproject.toml).

``optional=True``: where no C compiler or Python headers exist the package installs
without it and the Python writer serves every call (same results, slower). The same
source is built a second time with ``REPLAYBANK_KILLPOINTS`` as
``replaybank._lane_killpoints``, the crash tests' build, which counts every durable store
(see replaybank/storage/writers/killpoint.py); the production module pays nothing for it.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("replaybank._lane", ["replaybank/_lane.c"], optional=True),
    Extension("replaybank._lane_killpoints", ["replaybank/_lane.c"], optional=True,
              define_macros=[("REPLAYBANK_KILLPOINTS", "1")]),
])
