import definitely_not_installed_pkg  # noqa: F401
