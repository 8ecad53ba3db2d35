"""The notebook's front doors: magics and commands over the plain Python API."""
