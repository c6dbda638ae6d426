"""Entry points, run as files by pyinfra (``pyinfra INVENTORY deploy/X.py``); a package so that
the import contracts of pyproject.toml see them."""
