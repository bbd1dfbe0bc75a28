"""The answers this project was baked with; the code reads them from here only."""

FRAMEWORK = {{ cookiecutter.framework | tojson }}
LAUNCHER = {{ cookiecutter.launcher | tojson }}
NODES = {{ cookiecutter.nodes | tojson }}
DATASET = {{ cookiecutter.dataset | tojson }}
TASK = {{ cookiecutter.task | tojson }}
# The task's sample data: data/<SAMPLE>.zip, or data/<SAMPLE>/ unpacked.
SAMPLE = {{ {"classification": "digits", "regression": "diabetes", "text": "docstrings", "segmentation": "digit_masks"}[cookiecutter.task] | tojson }}
# The dist-template version baked from, or last updated to with cruft update (the template's CHANGELOG.md).
TEMPLATE_VERSION = {{ cookiecutter._template_version | tojson }}
