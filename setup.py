"""Build the C record walk and the quota gate's step timer; everything else is declared in
pyproject.toml.

The two extensions share one record walk (``core_log/_recordwalk.h``). A failed build is an
error, not a silent fall back to the ~100x slower pure-Python walk: a compiler without the
checked-arithmetic builtins stops the build with ``#error``. A machine with no C compiler at
all can still install Logbus with ``LOGBUS_PURE_PYTHON=1`` (same results, slower).
"""

import os

from setuptools import Extension, setup

WALK = ["core_log/_recordwalk.h"]

setup(
    ext_modules=[]
    if os.environ.get("LOGBUS_PURE_PYTHON") == "1"
    else [
        Extension("core_log._recordscan", ["core_log/_recordscan.c"], depends=WALK),
        Extension("core_log._recordjson", ["core_log/_recordjson.c"], depends=WALK),
        Extension("api._steptimer", ["api/_steptimer.c"]),
    ]
)
