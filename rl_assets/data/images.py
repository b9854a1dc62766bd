"""Images of prompts: read from a source's column, checked with PIL, stored content-addressed next to the tables.

An image's id is the SHA-256 of its file's bytes; it is stored once as `<data>/images/<id>.<ext>`, and tables carry
the ids (`image_ids`), so the same image in two rows, sources or experiments' rounds is one file, and a row traces
back to the exact bytes it showed. A source's image column holds a path (relative to the source file's folder), the
file's bytes, or a `datasets` Image value (`{"bytes": ..., "path": ...}`). An image that is missing, unreadable,
cut off or too large stops the load naming the row and the file, like a bad text row.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from rl_assets.core.storage import atomic_path
from rl_assets.data.raw_files import BadRow

# Formats a vision processor reads; the stored file keeps its own format (its bytes are its id).
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}
MAX_PIXELS = 64_000_000  # far above any VLM's input; beyond it PIL's decompression-bomb check would warn, not stop


def image_id(data: bytes) -> str:
    """The content hash that names an image.

    >>> image_id(b"abc")[:12]
    'ba7816bf8f01'
    """
    return hashlib.sha256(data).hexdigest()


def checked_image(data: bytes, at: str, name: str) -> str:
    """The file extension of a readable image of a known format; `BadRow` naming the row (`at`) and the image otherwise."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in EXTENSIONS:
                raise BadRow(f"{at}: image {name}: format {image.format} is not one of {', '.join(EXTENSIONS)}")
            if image.width * image.height > MAX_PIXELS:
                raise BadRow(f"{at}: image {name}: {image.width}x{image.height} pixels, more than {MAX_PIXELS:,}")
            image.load()  # decodes every pixel: a cut-off file fails here, not in a later round
            return EXTENSIONS[image.format]
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise BadRow(f"{at}: image {name}: not a readable image ({type(error).__name__}: {str(error)[:160]})") from None


def read_image(value, base: Path, at: str) -> tuple[str, bytes, str]:
    """(id, bytes, extension) of the image a source's cell holds: a path (relative to `base`), bytes or {"bytes", "path"}."""
    if isinstance(value, dict):  # datasets' Image feature: bytes when embedded, else a path
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        data, name = bytes(value), f"({len(value)} bytes in the row)"
    elif isinstance(value, str) and value.strip():
        path = base / value
        name = repr(value)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BadRow(f"{at}: image file not found: {path}") from None
        except OSError as error:
            raise BadRow(f"{at}: image {name}: cannot read {path} ({error.strerror or error})") from None
    else:
        raise BadRow(f"{at}: the image column must hold a path or bytes, got {type(value).__name__}")
    if not data:
        raise BadRow(f"{at}: image {name}: empty file")
    return image_id(data), data, checked_image(data, at, name)


def stored_image(folder: Path, identifier: str) -> Path | None:
    """The stored file of an image id (None: not stored)."""
    found = sorted(folder.glob(f"{identifier}.*"))
    return found[0] if found else None


def open_images(image_ids: list[list[str]], folder: Path) -> list[list]:
    """Each row's PIL images (RGB) from the store, each file checked against its id: a missing or changed image stops, naming it.

    A prompt shows the exact bytes its id names, or nothing is sampled or trained: the tables would say otherwise.
    """
    from PIL import Image

    opened: dict[str, object] = {}
    for identifier in {i for ids in image_ids for i in ids}:
        path = stored_image(folder, identifier)
        if path is None:
            raise FileNotFoundError(f"{folder}: image {identifier} is not stored; rerun raw_data to store the sources' images again")
        data = path.read_bytes()
        if image_id(data) != identifier:
            raise ValueError(f"{path}: its bytes no longer hash to its name (edited or damaged); rerun raw_data to store it again")
        with Image.open(io.BytesIO(data)) as image:
            opened[identifier] = image.convert("RGB")
    return [[opened[i] for i in ids] for ids in image_ids]


def decoded_image(data: bytes, name: str):
    """A PIL RGB image of an image file's bytes given outside a source (a request, a command line), checked as a source's
    are (format, size, complete); ValueError naming it otherwise."""
    from PIL import Image

    try:
        checked_image(data, "input", name)
    except BadRow as error:
        raise ValueError(str(error)) from None
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


IMAGES_URL = "http://127.0.0.1:8000/images"  # where `rl-assets serve` answers for <data>/images (RL_ASSETS_IMAGES_URL overrides)


def image_markdown(folder: Path, identifier: str, base_url: str) -> str:
    """A markdown image of a stored picture, by URL: the Dagster UI's markdown keeps http(s) image sources only (it strips
    data: URLs), so its materializations show what `rl-assets serve` answers at `base_url`/<file>; the alt text is the id.

    >>> image_markdown(Path("nowhere"), "ab" * 32, "http://127.0.0.1:8000/images")
    '![abababababab](http://127.0.0.1:8000/images/abababababababababababababababababababababababababababababababab)'
    """
    path = stored_image(folder, identifier)
    return f"![{identifier[:12]}]({base_url.rstrip('/')}/{path.name if path else identifier})"


def store_images(images: dict[str, tuple[bytes, str]], folder: Path) -> int:
    """Write each {id: (bytes, extension)} not already stored intact, each file atomically; returns how many were written.

    A stored file whose bytes no longer hash to its id (edited, cut off) is written again: never taken as up to date.
    """
    written = 0
    for identifier, (data, extension) in images.items():
        path = folder / f"{identifier}.{extension}"
        if path.is_file() and image_id(path.read_bytes()) == identifier:
            continue
        with atomic_path(path) as tmp:
            Path(tmp).write_bytes(data)
        written += 1
    return written
