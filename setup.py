"""Build the optional C accelerator; everything else is declared in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and Logbus uses the
pure-Python record scanner (slower produce validation, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("core_log._recordscan", ["core_log/_recordscan.c"], optional=True),
        Extension("core_log._recordjson", ["core_log/_recordjson.c"], optional=True),
    ]
)
