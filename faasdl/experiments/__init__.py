"""faasdl's experiments: the thesis' evaluations as commands (``faasdl experiment``)."""
