"""Project scaffolding: ``python -m lit_ddp new`` and the cookiecutter hooks.

Stdlib only, so the cookiecutter hooks can import it from a bare template checkout.
"""
