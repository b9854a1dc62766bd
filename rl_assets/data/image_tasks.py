"""Visual tasks rendered with PIL: seeded python sources whose rows carry an image (PNG bytes) with the question.

    raw_data:
      sources:
        - {kind: python, function: rl_assets.data.image_tasks:count_shapes, count: 600, columns: {image: image}}

`count_shapes`: "How many shapes are in the picture?" over 1-6 circles, squares and triangles of assorted colours,
each in its own cell of a 3x3 grid (never touching), on a 96x96 canvas. The answer is the count; `shapes` and `colors`
go to `extra` when listed. The same (count, seed) renders the same bytes, so image ids are stable from run to run.
"""

from __future__ import annotations

import io
import random

SIZE, GRID = 96, 3
CELL = SIZE // GRID
COLORS = {"red": (220, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 220), "orange": (240, 150, 20), "purple": (140, 60, 180),
          "black": (20, 20, 20)}
KINDS = ("circle", "square", "triangle")


def _draw(draw, kind: str, cell: int, margin: int, color: tuple[int, int, int]) -> None:
    """One shape inside grid cell `cell`, `margin` pixels in from each side (so neighbours never touch)."""
    left, top = (cell % GRID) * CELL + margin, (cell // GRID) * CELL + margin
    right, bottom = left + CELL - 2 * margin - 1, top + CELL - 2 * margin - 1
    if kind == "circle":
        draw.ellipse((left, top, right, bottom), fill=color)
    elif kind == "square":
        draw.rectangle((left, top, right, bottom), fill=color)
    else:
        draw.polygon([((left + right) // 2, top), (right, bottom), (left, bottom)], fill=color)


def render_shapes(shapes: list[tuple[str, int, int, str]]) -> bytes:
    """PNG bytes of a white canvas with each (kind, grid cell, margin, colour name)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for kind, cell, margin, color in shapes:
        _draw(draw, kind, cell, margin, COLORS[color])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def count_shapes(count: int, seed: int, most: int = 6) -> list[dict]:
    """`count` rows {prompt, answer, image, shapes, colors}: how many shapes (1..`most`) a rendered picture shows.

    >>> rows = count_shapes(count=2, seed=0)
    >>> [(row["prompt"], row["answer"], row["image"][:4]) for row in rows][0]
    ('How many shapes are in the picture? Reply with just the number.', '6', b'\\x89PNG')
    >>> count_shapes(count=2, seed=0) == rows
    True
    """
    rng = random.Random(f"count_shapes:{seed}")
    rows = []
    for _ in range(count):
        n = rng.randint(1, most)
        cells = rng.sample(range(GRID * GRID), n)
        shapes = [(rng.choice(KINDS), cell, rng.randint(3, 8), rng.choice(list(COLORS))) for cell in cells]
        rows.append({"prompt": "How many shapes are in the picture? Reply with just the number.", "answer": str(n),
                     "image": render_shapes(shapes), "shapes": [kind for kind, *_ in shapes], "colors": [color for *_, color in shapes]})
    return rows
