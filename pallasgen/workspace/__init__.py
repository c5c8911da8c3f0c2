"""The workspace: `pallasgen build` and `check` over spec folders, the configuration in pyproject.toml, and the cache of generated modules."""
