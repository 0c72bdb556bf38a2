"""The compiled hot paths (nsqpy._speedups._hot): everything else is in pyproject.toml.

An optional extension: when it cannot be built (no C compiler, no Python headers) setuptools
warns and the install goes on; nsqpy then runs the pure-Python hot paths (and says so with a
warning at import).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nsqpy._speedups._hot",
            sources=["src/nsqpy/_speedups/_hot.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
