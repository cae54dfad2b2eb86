"""{{ cookiecutter.project_name | docstring }}.

Your network and data, trained by lit_ddp: ``python -m`` this package (README: Usage).
"""

__version__ = "0.1.0"
