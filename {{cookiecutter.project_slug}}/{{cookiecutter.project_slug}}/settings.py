"""The answers this project was baked with; the code reads them from here only."""

FRAMEWORK = {{ cookiecutter.framework | tojson }}
LAUNCHER = {{ cookiecutter.launcher | tojson }}
NODES = {{ cookiecutter.nodes | tojson }}
DATASET = {{ cookiecutter.dataset | tojson }}
