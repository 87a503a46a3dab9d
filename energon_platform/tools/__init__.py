"""Tools built on the loader and the task encoders together (above both rooms).

* `preview`: what the model sees, as text or a contact sheet PNG
  (``energon-platform preview``).
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "preview": "energon_platform.tools.preview",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
