"""OpenWhisk entry points of faasdl's actions: each ``<name>/__main__.py`` is one action's code."""
