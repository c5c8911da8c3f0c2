"""Draws a kernel's `KernelTiles` as an SVG picture, written as text.

Each array is a rectangle cut into the blocks the kernel reads or writes, drawn to
one scale per dimension (stretched where a block would be too small to see), with the
highlighted step's block, the hatched overhang of edge blocks, and the order of steps
along a dimension the steps accumulate over (or a GPU program loops over).
"""

from __future__ import annotations

from math import inf, prod
from xml.sax.saxutils import escape, quoteattr

from pallasgen.frontend.text import format_bytes
from pallasgen.show.tilemap import ArrayTiles, Axis, KernelTiles

MARGIN = 24
MAX_EXTENT = 260  # pixels of the longest dimension
MIN_CELL = 22  # no block is drawn smaller than this
THIN = 14  # a broadcast dimension: one element
STRIP = 28  # the height of a one-dimensional array (and the side of a scalar)
GUTTER = 64  # left of an array: its rows' label and block numbers
STACK_STEP = 7  # offset of each slice drawn behind a batched array
STACKED_SLICES = 2
PANEL_GAP = 44
ROW_WIDTH = 1180
NOTE_LINE = 15
TEXT_LINE = 19
CHAR_WIDTH = {11: 6.7, 12.5: 7.6, 13: 8.0, 19: 11.6}  # monospace advance per font size

STYLE = """
text { font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 11px; fill: #222; }
.title { font-size: 19px; font-weight: bold; }
.line { font-size: 12.5px; }
.name { font-size: 13px; font-weight: bold; }
.tick { font-size: 10px; fill: #555; }
.block { stroke-width: 1; }
.input { fill: #e4edfb; stroke: #7d9bcc; }
.output { fill: #e2f2e5; stroke: #67a276; }
.overhang { fill: url(#hatch); stroke: #9a9a9a; stroke-dasharray: 4 3; }
.outline { fill: none; stroke: #333; stroke-width: 1.5; }
.slice { fill: #f3f3f3; stroke: #a8a8a8; }
.highlight { fill: #f6a800; fill-opacity: 0.42; stroke: #d35400; stroke-width: 3; }
.badge { fill: #fff; stroke: #d35400; stroke-width: 1.5; }
.badge-number { font-size: 10px; font-weight: bold; fill: #d35400; }
.arrow { stroke: #d35400; stroke-width: 2; fill: none; marker-end: url(#arrowhead); }
"""

DEFS = """<defs>
<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#f7f7f7"/><line x1="0" y1="0" x2="0" y2="6" stroke="#b0b0b0" stroke-width="2.5"/>
</pattern>
<marker id="arrowhead" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto" markerUnits="userSpaceOnUse">
<path d="M0,0 L8,4 L0,8 z" fill="#d35400"/>
</marker>
</defs>"""


def render_svg(tiles: KernelTiles) -> str:
    """The whole picture: title, grid, VMEM, legend, then one panel per array."""
    scale = _scales(tiles)
    header = _header_lines(tiles)
    legend_top = MARGIN + TEXT_LINE * len(header) + 8
    legend = _legend(tiles, MARGIN, legend_top)
    y = legend_top + legend.height + 22
    panels = {array.name: _panel(tiles, array, scale) for array in tiles.arrays}
    body: list[str] = []
    width = 0.0
    for row in _rows(tiles, panels):
        for x, array in row:
            body.append(f'<g class="array" data-name={quoteattr(array.name)} transform="translate({_n(x)},{_n(y)})">')
            body += panels[array.name].elements
            body.append("</g>")
            width = max(width, x + panels[array.name].width)
        y += max(panels[array.name].height for _, array in row) + PANEL_GAP
    texts = [
        _text(_indent(line), MARGIN + 14 + TEXT_LINE * n, line.strip(), cls, attrs)
        for n, (line, cls, attrs) in enumerate(header)
    ]
    width = max([width, legend.width + MARGIN] + [_indent(line) + _width(line, cls) for line, cls, _ in header])
    width += MARGIN
    height = y - PANEL_GAP + MARGIN
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(width)}" height="{_n(height)}"'
            f' viewBox="0 0 {_n(width)} {_n(height)}">',
            f"<title>{escape(header[0][0])}</title>",
            f"<style>{STYLE}</style>",
            DEFS,
            f'<rect width="{_n(width)}" height="{_n(height)}" fill="#fff"/>',
            *texts,
            *legend.elements,
            *body,
            "</svg>",
            "",
        ]
    )


def _rows(tiles: KernelTiles, panels: dict[str, _Drawing]) -> list[list[tuple[float, ArrayTiles]]]:
    """Where each array goes: (x, array) in rows. A product is laid out as on paper, its
    right operand above the output and its left operand beside it, so that their blocks
    line up along M and N; otherwise inputs fill rows and outputs start a row of their own."""
    by_name = {array.name: array for array in tiles.arrays}
    if tiles.operands:
        lhs, rhs = (by_name[name] for name in tiles.operands)
        others = [a for a in tiles.arrays if not a.is_output and a.name not in tiles.operands]
        outputs = [a for a in tiles.arrays if a.is_output]
        beside = MARGIN + panels[lhs.name].width + PANEL_GAP
        return [_row(beside, [rhs, *others], panels), [(MARGIN, lhs), *_row(beside, outputs, panels)]]
    rows: list[list[tuple[float, ArrayTiles]]] = []
    for group in ([a for a in tiles.arrays if not a.is_output], [a for a in tiles.arrays if a.is_output]):
        x = inf  # each group starts a row
        for array in group:
            if x + panels[array.name].width > ROW_WIDTH:
                x = MARGIN
                rows.append([])
            rows[-1].append((x, array))
            x += panels[array.name].width + PANEL_GAP
    return rows


def _row(x: float, arrays: list[ArrayTiles], panels: dict[str, _Drawing]) -> list[tuple[float, ArrayTiles]]:
    """Arrays side by side from x."""
    placed = []
    for array in arrays:
        placed.append((x, array))
        x += panels[array.name].width + PANEL_GAP
    return placed


def _indent(line: str) -> float:
    """Where a header line starts: lines written with leading spaces are set in."""
    return MARGIN + 8 * (len(line) - len(line.lstrip()))


class _Drawing:
    """SVG elements with the size they take."""

    def __init__(self, elements: list[str], width: float, height: float):
        self.elements, self.width, self.height = elements, width, height


def _header_lines(tiles: KernelTiles) -> list[tuple[str, str, str]]:
    """(text, class, extra attributes) of the lines above the legend."""
    target = "GPU (Triton)" if tiles.gpu else "TPU"
    sizes = ", ".join(f"{d} = {n}" for d, n in tiles.sizes.items())
    whole = [d for d in tiles.sizes if d not in tiles.blocks]
    blocks = ", ".join(f"{d} = {b}" for d, b in tiles.blocks.items())
    blocks_line = "; ".join(filter(None, [f"blocks {blocks}" if blocks else "", _whole(whole)]))
    lines = [(f"{tiles.kernel}: {target} tiling at {sizes}", "title", ""), (blocks_line, "line", "")]
    lines += [(line, "line", "") for line in _grid_lines(tiles)]
    if tiles.step_skipped:
        skips = ", ".join(a.name for a in tiles.arrays if a.skips)
        lines.append(
            (
                f"{_step_text(tiles)} is skipped ({tiles.live} is false): it computes nothing and reads no block of {skips}",
                "line skipped",
                "",
            )
        )
    if tiles.gpu:
        options = ", ".join(f"num_{name} = {value}" for name, value in tiles.gpu_options.items())
        lines.append((f"Triton options: {options}", "line", ""))
    else:
        total, parts = _vmem_lines(tiles)
        lines += [(total, "line vmem", f' data-bytes="{tiles.vmem_bytes}"'), (parts, "line", "")]
    return lines


def _whole(dims: list[str]) -> str:
    return f"{', '.join(dims)} taken whole" if dims else ""


def _grid_lines(tiles: KernelTiles) -> list[str]:
    lines = ["grid (): a single step"]
    if tiles.grid:
        indices = ", ".join(g.index for g in tiles.grid)
        steps = ", ".join(str(g.steps) for g in tiles.grid)
        total = prod(g.steps for g in tiles.grid)
        order = "programs, run concurrently" if tiles.gpu else "steps, run in order, the last index fastest"
        lines = [f"grid ({indices}) = ({steps}): {total} {order}"]
    for g in tiles.grid:
        role = "arbitrary: each output tile accumulates over it in order" if g.semantics == "arbitrary" else g.semantics
        lines.append(f"  {g.index}: {g.steps} blocks of {g.dim} = {tiles.sizes[g.dim]}, {role}")
    if tiles.contracted and tiles.contracted not in tiles.blocks:
        lines.append(f"  {tiles.contracted} is contracted whole inside each step: no grid axis, no accumulator")
    if tiles.looped:
        lines.append(
            f"  {tiles.looped} is no grid axis: each program loops over it in slices of {tiles.blocks[tiles.looped]}"
        )
    walked = {g.dim for g in tiles.grid} | {tiles.looped}
    for dim in (d for d in tiles.blocks if d not in walked):
        lines.append(f"  {dim} is no grid axis: each program holds all of it in one block of {tiles.blocks[dim]}")
    lines += [f"  scratch {line}" for line in tiles.scratch]
    return lines


def _vmem_lines(tiles: KernelTiles) -> tuple[str, str]:
    """The VMEM the blocks need, then every part of it."""
    return (
        f"VMEM {format_bytes(tiles.vmem_bytes)} of the {format_bytes(tiles.vmem_limit)} a launcher may ask of a TPU v5e or v6e:",
        f"  {tiles.vmem_formula}",
    )


def _step_text(tiles: KernelTiles) -> str:
    """The highlighted step: `step (i, j) = (1, 0)`, or a program on the GPU."""
    step = "program" if tiles.gpu else "step"
    if not tiles.grid:
        return f"the single {step}"
    indices = ", ".join(g.index for g in tiles.grid)
    chosen = ", ".join(str(g.chosen) for g in tiles.grid)
    return f"{step} ({indices}) = ({chosen})"


def _legend(tiles: KernelTiles, x: float, y: float) -> _Drawing:
    entries = [("highlight", f"the blocks that {_step_text(tiles)} reads and writes")]
    if tiles.live:
        entries.append(
            ("skipped", f"a skipped step: {tiles.live} is false, so it computes nothing and fetches no block")
        )
    stepped = tiles.accumulated or tiles.looped
    if any(a.ragged for array in tiles.arrays for a in array.axes):
        stepped_ragged = any(a.ragged and a.dim == stepped for array in tiles.arrays for a in array.axes)
        fill = "zeros" if stepped == tiles.contracted else "each reduction's identity"
        along = f" ({fill} along {stepped})" if stepped_ragged else ""
        reads = "Triton masks reads there" if tiles.gpu else "reads there see unspecified padding"
        entries.append(("overhang", f"past the array's end: {reads}{along}; writes there are dropped"))
    if stepped:
        if tiles.gpu:
            entries.append(("badge", f"slices of {stepped} in the order each program loops over them"))
        else:
            k = next(g.index for g in tiles.grid if g.dim == stepped)
            entries.append(("badge", f"the order of {k} steps: accumulates over {stepped} (arbitrary axis)"))
    elements, width = [], 0.0
    for n, (kind, words) in enumerate(entries):
        top = y + n * TEXT_LINE
        if kind == "badge":
            elements += _badge(x + 9, top + 6, 0)
        elif kind == "skipped":
            elements += _badge(x + 9, top + 6, 0, skipped=True)
        else:
            elements.append(_rect(x, top, 18, 12, kind))
        elements.append(_text(x + 26, top + 10, words, "line"))
        width = max(width, 26 + _width(words, "line"))
    return _Drawing(elements, width, len(entries) * TEXT_LINE)


def _scales(tiles: KernelTiles) -> dict[str, float]:
    """Pixels per element of each dimension: one scale for all, unless a block would be
    smaller than MIN_CELL, so that every dimension is the same length in every array."""
    axes = {a.dim: a for array in tiles.arrays for a in array.axes[-2:] if a.dim is not None}
    if not axes:
        return {}
    common = MAX_EXTENT / max(a.blocks * a.block for a in axes.values())
    return {d: max(common, MIN_CELL / a.block) for d, a in axes.items()}


def _extent(axis: Axis | None, scale: dict[str, float]) -> float:
    """Pixels that an axis's blocks span, overhang included."""
    if axis is None:
        return STRIP
    if axis.dim is None:
        return THIN
    return axis.blocks * axis.block * scale[axis.dim]


def _spans(axis: Axis | None, scale: dict[str, float]) -> list[tuple[float, float, float]]:
    """(start, full length, length inside the array) of each block along an axis."""
    if axis is None or axis.dim is None:
        side = _extent(axis, scale)
        return [(0.0, side, side)]
    unit = scale[axis.dim]
    return [
        (b * axis.block * unit, axis.block * unit, min(axis.block, axis.size - b * axis.block) * unit)
        for b in range(axis.blocks)
    ]


def _panel(tiles: KernelTiles, array: ArrayTiles, scale: dict[str, float]) -> _Drawing:
    """One array: name, rows and columns of blocks, highlight, overhang, notes."""
    drawn = list(array.axes[-2:])
    rows, cols = ([None] * (2 - len(drawn)) + drawn)[-2:]
    stacked = array.axes[:-2]
    stack_room = STACK_STEP * STACKED_SLICES if any(a.dim for a in stacked) else 0
    left, top = GUTTER, 50 + stack_room
    width, height = _extent(cols, scale), _extent(rows, scale)
    kind = "output" if array.is_output else "input"
    name = f"{array.name}: {array.dtype}[{', '.join(array.dims)}]"
    elements = [_text(0, 13, name, "name")]
    for n in range(STACKED_SLICES, 0, -1) if stack_room else ():
        offset = n * STACK_STEP
        elements.append(_rect(left + offset, top - offset, width, height, "slice"))
    elements += _axis_labels(cols, rows, left, top - stack_room, height, scale)
    row_spans, col_spans = _spans(rows, scale), _spans(cols, scale)
    last_row, last_col = len(row_spans) - 1, len(col_spans) - 1
    for r, (y0, full_h, inside_h) in enumerate(row_spans):
        for c, (x0, full_w, inside_w) in enumerate(col_spans):
            ragged = (r == last_row and rows is not None and rows.ragged) or (
                c == last_col and cols is not None and cols.ragged
            )
            if ragged:
                elements.append(_rect(left + x0, top + y0, full_w, full_h, "overhang"))
            classes = f"block {kind}{' ragged' if ragged else ''}"
            elements.append(_rect(left + x0, top + y0, inside_w, inside_h, classes))
    real_w = col_spans[-1][0] + col_spans[-1][2]
    real_h = row_spans[-1][0] + row_spans[-1][2]
    elements.append(_rect(left, top, real_w, real_h, "outline"))
    if not (tiles.step_skipped and array.skips):
        elements.append(_rect(*_highlight_box(rows, cols, scale, left, top), "highlight"))
    if array.accumulated:
        skipped = tiles.skipped if array.skips else ()
        elements += _accumulated_path(array, rows, cols, scale, left, top, skipped)
    notes = _notes(tiles, array)
    # A column of few blocks is shorter than its rotated label.
    label = _width(_axis_title(rows), "tick") if rows is not None and rows.dim is not None else 0
    y = top + max(height, label) + 20
    for n, (note, attrs) in enumerate(notes):
        elements.append(_text(0, y + n * NOTE_LINE, note, "note", attrs))
    panel_width = max([left + width + stack_room, _width(name, "name")] + [_width(note, "note") for note, _ in notes])
    return _Drawing(elements, panel_width, y + NOTE_LINE * (len(notes) - 1) + 6)


def _axis_labels(cols, rows, left, top, height, scale) -> list[str]:
    """Dimension names with their sizes and grid index, and each block's number."""
    elements = []
    if cols is not None:
        elements.append(_text(left, top - 20, _axis_title(cols), "tick"))
        elements += _block_numbers(cols, scale, lambda mid: (left + mid, top - 6), "middle")
    if rows is not None and rows.dim is None:
        elements.append(_text(left - 6, top + THIN / 2 + 3.5, "1 row", "tick", ' text-anchor="end"'))
    elif rows is not None:
        middle = top + height / 2
        label = _axis_title(rows)
        elements.append(
            f'<text x="12" y="{_n(middle)}" class="tick" text-anchor="middle"'
            f' transform="rotate(-90 12 {_n(middle)})">{escape(label)}</text>'
        )
        elements += _block_numbers(rows, scale, lambda mid: (left - 6, top + mid + 3.5), "end")
    return elements


def _axis_title(axis: Axis) -> str:
    if axis.dim is None:
        return "1 column"
    if axis.looped:
        return f"{axis.dim} = {axis.size}, looped"
    return f"{axis.dim} = {axis.size}" + (f", index {axis.index}" if axis.index else ", whole")


def _block_numbers(axis: Axis, scale, place, anchor) -> list[str]:
    if axis.dim is None or axis.blocks == 1:
        return []
    elements = []
    for number, (start, _, inside) in enumerate(_spans(axis, scale)):
        x, y = place(start + inside / 2)
        elements.append(f'<text x="{_n(x)}" y="{_n(y)}" class="tick" text-anchor="{anchor}">{number}</text>')
    return elements


def _chosen_span(axis: Axis | None, scale: dict[str, float]) -> tuple[float, float]:
    """(start, length) in pixels of the block the highlighted step takes along an axis."""
    if axis is None or axis.dim is None or axis.looped:
        return 0.0, _extent(axis, scale)
    unit = axis.block * scale[axis.dim]
    return axis.chosen * unit, unit


def _highlight_box(rows, cols, scale, left, top) -> tuple[float, float, float, float]:
    (x, w), (y, h) = _chosen_span(cols, scale), _chosen_span(rows, scale)
    return left + x, top + y, w, h


def _accumulated_path(array: ArrayTiles, rows, cols, scale, left, top, skipped=()) -> list[str]:
    """Numbered badges on the accumulated dimension's blocks, in the highlighted row or
    column, joined by an arrow in the order the steps (or a program's loop) take them;
    the steps in `skipped` are marked as such (grey, dashed)."""
    along_cols = cols is not None and cols.dim == array.accumulated
    k_axis, other = (cols, rows) if along_cols else (rows, cols)
    start, length = _chosen_span(other, scale)
    across = start + length / 2
    centres = [start + inside / 2 for start, _, inside in _spans(k_axis, scale)]

    def point(along: float) -> tuple[float, float]:
        return (left + along, top + across) if along_cols else (left + across, top + along)

    elements = []
    if len(centres) > 1:
        (x1, y1), (x2, y2) = point(centres[0]), point(centres[-1] - 11)
        elements.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" class="arrow"/>')
    for number, centre in enumerate(centres):
        elements += _badge(*point(centre), number, number in skipped)
    return elements


# A skipped step's badge; styled inline, so that pictures without one keep their stylesheet.
SKIPPED_BADGE = ' style="fill: #eee; stroke: #999; stroke-dasharray: 2 2"'
SKIPPED_NUMBER = ' style="fill: #999"'


def _badge(x: float, y: float, number: int, skipped: bool = False) -> list[str]:
    kind, circle, text = (" skipped", SKIPPED_BADGE, SKIPPED_NUMBER) if skipped else ("", "", "")
    return [
        f'<circle cx="{_n(x)}" cy="{_n(y)}" r="8" class="badge{kind}"{circle}/>',
        f'<text x="{_n(x)}" y="{_n(y + 3.5)}" class="badge-number{kind}" text-anchor="middle"{text}>{number}</text>',
    ]


def _notes(tiles: KernelTiles, array: ArrayTiles) -> list[tuple[str, str]]:
    """(text, extra attributes) of the lines under an array."""
    grid_indices = ", ".join(g.index for g in tiles.grid)
    shape = ", ".join(_block_text(a) for a in array.axes)
    index = ", ".join(a.index_code for a in array.axes)
    chosen = ", ".join(str(a.chosen) for a in array.axes)
    verb = "writes" if array.is_output else "reads"
    notes = [(f"block ({shape}), index map ({grid_indices}) -> ({index})", "")]
    if tiles.step_skipped and array.skips:
        notes.append((f"{_step_text(tiles)} is skipped: it reads no block of {array.name}", ""))
    else:
        notes.append((f"{_step_text(tiles)} {verb} block ({chosen})", ""))
    if array.skips:
        skipped = ", ".join(map(str, tiles.skipped)) or "none"
        notes.append((f"skipped steps ({tiles.live} false) fetch no block of it; along this row: {skipped}", ""))
    size = format_bytes(array.block_bytes)
    bytes_attrs = f' data-bytes="{array.block_bytes}"'
    if tiles.gpu:
        notes.append((f"{size} a load", bytes_attrs))
    else:
        notes.append((f"{size} a block, {format_bytes(2 * array.block_bytes)} double-buffered", bytes_attrs))
    if array.missing:
        indices = [g.index for g in tiles.grid if g.dim in array.missing]
        every = f": the same block for every {', '.join(indices)}" if indices else ""
        verb = "reduced over" if array.is_output else "broadcast over"
        notes.append((f"{verb} {', '.join(array.missing)}{every}", ""))
    if array.transposed:
        notes.append(("read transposed (.T) by the product", ""))
    notes += [(_stack_note(axis, tiles.gpu), "") for axis in array.axes[:-2] if axis.dim is not None]
    if array.accumulated and tiles.gpu:
        notes.append(
            (f"each program loops over {array.accumulated} in slices of {tiles.blocks[array.accumulated]}", "")
        )
    elif array.accumulated:
        notes.append((f"accumulates over {array.accumulated} (arbitrary axis)", ""))
    if array.is_output and tiles.accumulated:
        last = next(g for g in tiles.grid if g.dim == tiles.accumulated)
        notes.append((f"accumulated in VMEM scratch over {last.index}, written at {last.index} = {last.steps - 1}", ""))
    return notes


def _stack_note(axis: Axis, gpu: bool) -> str:
    """What the slices drawn behind an array stand for."""
    if axis.index is None:
        return f"per {axis.dim}: all {axis.size} taken whole in each block"
    blocks = f"{axis.size} slices" if axis.block == 1 else f"{axis.blocks} blocks of {axis.block}"
    return (
        f"per {axis.dim}: one of {blocks} drawn; this {'program' if gpu else 'step'} takes {axis.index} = {axis.chosen}"
    )


def _block_text(axis: Axis) -> str:
    if axis.dim is None:
        return "1"
    return axis.dim if axis.looped else str(axis.block)


def _rect(x: float, y: float, w: float, h: float, classes: str) -> str:
    return f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" class="{classes}"/>'


def _text(x: float, y: float, words: str, classes: str, attrs: str = "") -> str:
    return f'<text x="{_n(x)}" y="{_n(y)}" class="{classes}"{attrs}>{escape(words)}</text>'


def _width(words: str, classes: str) -> float:
    size = {"title": 19, "line": 12.5, "name": 13}.get(classes.split()[0], 11)
    return len(words) * CHAR_WIDTH[size]


def _n(value: float) -> str:
    """A coordinate with at most one decimal, the same text on every machine."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text
