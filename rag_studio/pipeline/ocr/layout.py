"""Recognised lines to a page's text, in reading order, with the structure the layout shows.

The lines come straightened (the page's skew taken out), as boxes in pixels. `h` is the page's usual line height
(the median of its lines'). Reading order:
- columns: a blank vertical band at least GUTTER_WIDTH·h wide with at least MIN_COLUMN_LINES lines wholly on each
  side, on average COLUMN_LINE_WIDTH·h long or more (text, not table cells), is a gutter. The columns run from the
  first long line beside it to the last; lines across its middle (a title, a full-width paragraph) and lines above
  or below the columns (a table under them) are read across the page, in their place. Between them the left column
  is read before the right, each column again looked at for gutters of its own;
- rows: the pieces of a line side by side; a gap of CELL_GAP row heights or more between pieces separates cells;
- blocks: consecutive rows of one kind, split where the gap to the next row passes the column's usual gap (its
  lower quartile) by PARAGRAPH_GAP·h, or where the text height changes by a quarter or more. A block of rows with
  several cells is a table (rows of " | "-joined cells, as the other parsers write tables); a block of one or two
  rows at least HEADING_HEIGHT times h, not ending a sentence, is a Markdown heading ("#" from the first height,
  "##" from the second: boxes grow less than the type, 18-point over 10-point boxes measure 1.2 to 1.35); anything
  else is a paragraph, its lines joined (without a space inside Chinese text).
"""

import re
import statistics
from dataclasses import dataclass

import numpy as np

GUTTER_WIDTH = 0.8
MIN_COLUMN_LINES = 3
COLUMN_LINE_WIDTH = 5
# Only lines narrower than this share of their region can stand in a column; a wider one spans the columns.
NARROW_SHARE = 0.6
# A gutter may be crossed by this share of the narrow lines: a centred title, a short caption.
GUTTER_CROSSINGS = 0.1
CELL_GAP = 1.5
PARAGRAPH_GAP = 0.5
HEADING_HEIGHT = (1.6, 1.2)
HEADING_MAX_ROWS = 2
HEIGHT_CHANGE = 1.25
_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_ENDS_CJK = re.compile(f"[{_CJK}]$")
_STARTS_CJK = re.compile(f"^[{_CJK}]")
_SENTENCE_END = re.compile(r"[.。!！?？]$")


@dataclass(frozen=True)
class Line:
    text: str
    left: float
    top: float
    right: float
    bottom: float

    @property
    def height(self) -> float:
        return self.bottom - self.top

    @property
    def width(self) -> float:
        return self.right - self.left

    @property
    def middle(self) -> float:
        return (self.top + self.bottom) / 2


@dataclass
class _Row:
    lines: list[Line]

    @property
    def top(self) -> float:
        return min(line.top for line in self.lines)

    @property
    def bottom(self) -> float:
        return max(line.bottom for line in self.lines)

    @property
    def height(self) -> float:
        return statistics.median(line.height for line in self.lines)

    def cells(self) -> list[str]:
        ordered = sorted(self.lines, key=lambda line: line.left)
        cells = [[ordered[0]]]
        for previous, line in zip(ordered, ordered[1:]):
            if line.left - previous.right >= CELL_GAP * self.height:
                cells.append([line])
            else:
                cells[-1].append(line)
        return [_joined(line.text for line in cell) for cell in cells]


def page_text(lines: list[Line]) -> str:
    if not lines:
        return ""
    usual_height = statistics.median(line.height for line in lines)
    return "\n\n".join(block for block in _blocks(lines, usual_height) if block)


def _blocks(lines: list[Line], h: float) -> list[str]:
    gutter = _gutter(lines, h)
    if gutter is None:
        return _column_blocks(lines, h)
    start, end = gutter
    middle = (start + end) / 2
    # A column's line may reach into the band (the few lines a gutter allows); one across its middle spans it.
    crossing = {id(line) for line in lines if line.left < middle < line.right}
    # The columns run from their first long line to their last: a table or a caption below them is read across.
    long_lines = [line for line in lines if id(line) not in crossing and line.width >= COLUMN_LINE_WIDTH * h]
    top, bottom = min(line.top for line in long_lines), max(line.bottom for line in long_lines)
    blocks, columns, across = [], [], []
    for line in sorted(lines, key=lambda line: line.middle):
        if id(line) not in crossing and top <= line.middle <= bottom:
            if across:
                blocks += _column_blocks(across, h)
                across = []
            columns.append(line)
        else:
            if columns:
                blocks += _side_by_side(columns, middle, h)
                columns = []
            across.append(line)
    if columns:
        blocks += _side_by_side(columns, middle, h)
    if across:
        blocks += _column_blocks(across, h)
    return blocks


def _side_by_side(lines: list[Line], gutter_middle: float, h: float) -> list[str]:
    left = [line for line in lines if line.right <= gutter_middle]
    right = [line for line in lines if line.right > gutter_middle]
    return (_blocks(left, h) if left else []) + (_blocks(right, h) if right else [])


def _gutter(lines: list[Line], h: float) -> tuple[float, float] | None:
    """The widest blank band between text columns, as (start, end) in pixels; None for a single column."""
    if len(lines) < 2 * MIN_COLUMN_LINES:
        return None
    start, end = min(line.left for line in lines), max(line.right for line in lines)
    narrow = [line for line in lines if line.width < NARROW_SHARE * (end - start)]
    step = max(h / 4, 1.0)
    coverage = np.zeros(int((end - start) / step) + 2, dtype=int)
    for line in narrow:
        coverage[int((line.left - start) / step):int((line.right - start) / step) + 1] += 1
    blank = np.flatnonzero(coverage <= GUTTER_CROSSINGS * len(narrow))
    best, best_lines = None, 0
    for run in np.split(blank, np.flatnonzero(np.diff(blank) > 1) + 1):
        if not len(run) or run[0] == 0 or run[-1] >= len(coverage) - 2:
            continue  # a margin, not a gutter
        band = (start + run[0] * step, start + (run[-1] + 1) * step)
        if band[1] - band[0] < GUTTER_WIDTH * h:
            continue
        sides = ([line for line in narrow if line.right <= band[0] + step],
                 [line for line in narrow if line.left >= band[1] - step])
        if all(len(side) >= MIN_COLUMN_LINES and statistics.median(line.width for line in side)
               >= COLUMN_LINE_WIDTH * h for side in sides) and min(map(len, sides)) > best_lines:
            best, best_lines = band, min(map(len, sides))
    return best


def _rows(lines: list[Line]) -> list[_Row]:
    """Lines side by side (overlapping by half the lower one's height) as rows, top to bottom."""
    rows: list[_Row] = []
    for line in sorted(lines, key=lambda line: line.middle):
        row = rows[-1] if rows else None
        if row is not None and min(line.bottom, row.bottom) - max(line.top, row.top) >= 0.5 * min(
                line.height, row.height):
            row.lines.append(line)
        else:
            rows.append(_Row([line]))
    return rows


def _column_blocks(lines: list[Line], h: float) -> list[str]:
    rows = _rows(lines)
    gaps = [below.top - above.bottom for above, below in zip(rows, rows[1:])]
    # The gap between the lines of a paragraph: a low quantile, since paragraph breaks and headings may be many.
    usual_gap = float(np.percentile(gaps, 25)) if gaps else 0.0
    blocks = [[rows[0]]]
    for above, below, gap in zip(rows, rows[1:], gaps):
        same_kind = (len(above.cells()) > 1) == (len(below.cells()) > 1)
        same_size = 1 / HEIGHT_CHANGE < below.height / above.height < HEIGHT_CHANGE
        if gap <= usual_gap + PARAGRAPH_GAP * h and same_kind and same_size:
            blocks[-1].append(below)
        else:
            blocks.append([below])
    return [_block_text(block, h) for block in blocks]


def _block_text(rows: list[_Row], h: float) -> str:
    cells = [row.cells() for row in rows]
    if all(len(row) > 1 for row in cells):
        return "\n".join(" | ".join(row) for row in cells)
    text = _joined(" ".join(row) for row in cells)
    height = statistics.median(row.height for row in rows)
    if len(rows) <= HEADING_MAX_ROWS and height >= HEADING_HEIGHT[1] * h and not _SENTENCE_END.search(text):
        return f"{'#' if height >= HEADING_HEIGHT[0] * h else '##'} {text}"
    return text


def _joined(pieces) -> str:
    """Pieces of one line, or the lines of one paragraph, as one line: no space inside Chinese text, none after a
    word broken by a hyphen."""
    text = ""
    for piece in pieces:
        piece = piece.strip()
        if not text or (_ENDS_CJK.search(text) and _STARTS_CJK.match(piece)) or re.search(r"\w-$", text):
            text += piece
        elif piece:
            text += f" {piece}"
    return text
