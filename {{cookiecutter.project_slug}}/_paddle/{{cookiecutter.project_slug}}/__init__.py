# {{ cookiecutter.project_name }}
"""Distributed training package, baked by dist-template: run.py drives it, README.md explains it.

Quiet start, before any module of the package imports paddle: paddle's import warns that
ccache, used only to compile C++ extensions, is missing, and its C++ core logs each
connection at INFO level.
"""

import os
import warnings

warnings.filterwarnings("ignore", "No ccache found")
os.environ.setdefault("GLOG_minloglevel", "1")
