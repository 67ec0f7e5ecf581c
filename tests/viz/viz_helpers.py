"""Helpers shared by the viz tests: a well-formed PNG check and a tiny saved model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, *, min_width: int = 200, min_height: int = 150) -> np.ndarray:
    """The file is a PNG that decodes to an RGB(A) image of at least the given size, not a blank one."""
    import matplotlib.image

    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4), image.shape
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, (width, height)
    assert float(image[..., :3].std()) > 0.01, "the image is blank"
    return image
