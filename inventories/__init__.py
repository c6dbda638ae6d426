"""Inventories, run as files by pyinfra (``pyinfra inventories/X.py DEPLOY``); a package so that
the import contracts of pyproject.toml see them."""
