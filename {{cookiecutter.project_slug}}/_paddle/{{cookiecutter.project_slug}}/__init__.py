# {{ cookiecutter.project_name }}
"""Distributed training package, baked by dist-template: run.py drives it, README.md explains it.

Quiet start: paddle is imported here, before any module of the package, without what its import says to no purpose:
that ccache, used only to compile C++ extensions, is missing; that OMP_NUM_THREADS is over 1 (a risk to builds on
OpenBlas; paddle's wheels are built on MKL), which run.sh sets to the cores per process on purpose; and, from its
C++ core, each connection at INFO level.
"""

import contextlib
import io
import os
import sys
import warnings

from .errors import ended_quietly_by_ctrl_c

warnings.filterwarnings("ignore", "No ccache found")
os.environ.setdefault("GLOG_minloglevel", "1")
_THREADS_WARNING = ("WARNING: OMP_NUM_THREADS set to ", "PLEASE USE OMP_NUM_THREADS WISELY.")

with ended_quietly_by_ctrl_c(), contextlib.redirect_stderr(io.StringIO()) as _said:
    import paddle  # noqa: F401
sys.stderr.write("".join(line for line in _said.getvalue().splitlines(True) if not line.startswith(_THREADS_WARNING)))
