"""Scans made by the tests: known text rendered with a Chinese font (it has Latin letters too) on small pages, with
the noise, skew, blur and uneven light of a scanner or a phone, saved as a PNG, JPEG, multi-page TIFF or an
image-only PDF (no text layer)."""

import io
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

# Debian's fonts-wqy-zenhei (scripts/system-deps.sh cjk-font, which `make test` runs), else any Chinese font.
WQY_ZENHEI = Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")


@cache
def chinese_font_path() -> str:
    if WQY_ZENHEI.exists():
        return str(WQY_ZENHEI)
    listed = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True).stdout.split()
    if not listed:
        raise RuntimeError("No Chinese font is installed: run scripts/system-deps.sh cjk-font")
    return listed[0].rstrip(":")


def page(lines: list[str], *, dpi: int = 150, width_in: float = 4.1, height_in: float = 5.8, point: float = 12,
         heading: str = "", skew: float = 0.0, noise: float = 0.0, blur: float = 0.0, shade: float = 0.0,
         turn: int = 0, seed: int = 0) -> Image.Image:
    """A grey page (A6 by default) with `lines` of text, an optional larger heading, then scanned: turned by `turn`
    degrees, skewed by `skew`, blurred, unevenly lit (`shade`: how much darker the right edge is) and noisy."""
    size = (int(width_in * dpi), int(height_in * dpi))
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    margin, pitch = dpi // 2, point * dpi / 72 * 1.5
    body = ImageFont.truetype(chinese_font_path(), round(point * dpi / 72))
    y = margin
    if heading:
        draw.text((margin, y), heading, font=ImageFont.truetype(chinese_font_path(), round(2 * point * dpi / 72)),
                  fill=0)
        y += 3 * pitch
    for line in lines:
        draw.text((margin, y), line, font=body, fill=0)
        y += pitch
    image = image.rotate(skew + turn, expand=True, fillcolor=255)
    if blur:
        image = image.filter(ImageFilter.GaussianBlur(blur))
    levels = np.asarray(image, dtype=np.float64)
    if shade:
        levels = levels * np.linspace(1.0, 1.0 - shade, levels.shape[1])[np.newaxis, :]
    if noise:
        levels = levels + np.random.default_rng(seed).normal(0, noise, levels.shape)
    return Image.fromarray(np.clip(levels, 0, 255).astype(np.uint8))


def encoded(image: Image.Image, format: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=format, **options)
    return out.getvalue()


def image_pdf(pages: list[Image.Image], dpi: int = 150) -> bytes:
    """An image-only PDF, as a scanner writes one: each page a picture, no text layer."""
    first, *rest = [image.convert("RGB") for image in pages]
    return encoded(first, "PDF", save_all=True, append_images=rest, resolution=dpi)


def tiff(pages: list[Image.Image]) -> bytes:
    first, *rest = pages
    return encoded(first, "TIFF", save_all=True, append_images=rest, compression="tiff_deflate")
