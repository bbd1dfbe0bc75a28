"""{{ cookiecutter.project_name }}: distributed training, baked by dist-template."""
