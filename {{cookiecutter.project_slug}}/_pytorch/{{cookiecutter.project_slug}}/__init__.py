# {{ cookiecutter.project_name }}
"""Distributed training package, baked by dist-template: run.py drives it, README.md explains it."""
