"""Images named by data files, opened and checked before training: one-line errors naming the row
(file:line) and field for a missing, unreadable, huge or odd-mode image. Images from a file rlvr
did not write are hostile input: the size is checked from the header before any pixel is decoded."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from rlvr.errors import ConfigError

CONVERTIBLE = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
"""Pillow modes that convert to 8-bit RGB without losing their meaning; 16-bit, 32-bit integer and
float images (medical, depth maps) would be clipped, so they are refused with the fix."""


def load_image(path: str, *, base: Path, where: str, field: str, max_pixels: int) -> Image.Image:
    """The RGB image at `path` (relative to `base`, the data file's folder); ConfigError otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: field {field!r} must be an image path (a string), got {type(path).__name__}")
    file = base / path
    if not file.is_file():
        raise ConfigError(f"{where}: field {field!r}: image {path!r} not found (paths are relative to the data "
                          f"file's folder {str(base)!r})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(file) as im:
                width, height = im.size
                if width * height > max_pixels:
                    raise ConfigError(f"{where}: field {field!r}: image {path!r} is {width}x{height} pixels, over "
                                      f"the limit of {max_pixels}; downscale it or raise the task's max_pixels")
                if im.mode not in CONVERTIBLE:
                    raise ConfigError(f"{where}: field {field!r}: image {path!r} has mode {im.mode!r}, which does not "
                                      f"convert to 8-bit RGB faithfully; save it as 8-bit RGB or grayscale")
                im.load()
                return im.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise ConfigError(f"{where}: field {field!r}: image {path!r} is not a readable image ({reason})") from None
