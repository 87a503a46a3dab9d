"""An image-text encoder whose encode of one sample does not return: the sample key in the
environment variable ``HANG_KEY`` (as the loader names it) sleeps for ``HANG_SECONDS`` (default
600) instead; the key in ``FAIL_KEY`` raises, as a corrupt sample does. Importable from a config
(``module: tests.helpers.hang_encoder`` with the repository on ``PYTHONPATH``), so trainer
subprocesses hang the same way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from task_encoders.image_text import ImageTextTaskEncoder
from task_encoders.registry import register

NAME = "image_text_hang_on_key"


@register(NAME)
class HangOnKeyTaskEncoder(ImageTextTaskEncoder):
    def encode(self, sample: Any) -> Any:
        if sample.__key__ == os.environ.get("FAIL_KEY"):
            raise ValueError(f"sample {sample.__key__} cannot be decoded")
        if sample.__key__ == os.environ.get("HANG_KEY"):
            time.sleep(float(os.environ.get("HANG_SECONDS", "600")))
        return super().encode(sample)


def encoder_yaml(folder: Path, base: Path) -> Path:
    """An encoder config that is ``base`` (an image_text config file) with this encoder."""
    import yaml

    config = yaml.safe_load(base.read_text())
    path = folder / "hang_encoder.yaml"
    path.write_text(
        yaml.safe_dump({**config, "module": "tests.helpers.hang_encoder", "encoder": NAME})
    )
    return path
