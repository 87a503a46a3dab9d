"""Tools built on the loader and the task encoders together (above both rooms).

* :mod:`~energon_platform.tools.preview`: what the model sees, as text or a contact sheet PNG
  (``energon-platform preview``).
"""
