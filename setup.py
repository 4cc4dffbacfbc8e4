"""Build of the optional C accelerator ``replaybank._lane`` (metadata is in pyproject.toml).

``optional=True``: where no C compiler or Python headers exist the package installs
without it and ``LaneWriter`` runs its pure-Python path (same results, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("replaybank._lane", ["replaybank/_lane.c"], optional=True)])
