"""One look for every plot the reports and the docs site draw: each series (a stage or a
peer) gets a colour AND a marker (a hatch for bars) that no other series of the same plot
has, so a plot reads in grey print and for colour-blind readers, and a stage keeps the same
colour and marker from plot to plot wherever it can.

    from plot_style import series_styles
    styles = series_styles(["02_paged", "03_split_kv", "peer_torch_sdpa_cudnn"])
    ax.plot(xs, ys, linestyle="none", label=name, **styles[name].line)   # color, marker
    ax.bar(xs, ys, width, label=name, **styles[name].bar)                # color, hatch

Grey and black are kept for ceilings and goal lines, which no series uses.
"""
import re

# Colours far apart in hue and lightness (no grey, no near-black), and markers and hatches
# that differ in shape, in the order a series asks for them.
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
          "#000080", "#aa6e28", "#3cb44b", "#f032e6", "#808000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p", "d", "8"]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--", "||", "**", "OO", "/.", "x.", "-\\"]

# The peers, in a fixed order after the stages, so each keeps its look across plots.
PEERS = ["peer_torch_sdpa_cudnn", "peer_torch_sdpa_flash", "peer_flashinfer_fa2", "peer_flashinfer_fa3",
         "peer_flashinfer_cuda_core_decode", "peer_flashinfer_tc_decode", "peer_flashinfer_cascade",
         "peer_flashinfer", "peer_torch_multinomial", "peer_torch_sort_top_p", "peer_torch_topk_top_p",
         "peer_torch_sort_top_k_top_p", "peer_torch_topk", "peer_torch_min_p"]


class Style:
    """A series' look: `line` for ax.plot/ax.scatter (color, marker), `bar` for ax.bar
    (color, hatch, with an edge so the hatch shows)."""

    def __init__(self, color, marker, hatch):
        self.color, self.marker, self.hatch = color, marker, hatch
        self.line = {"color": color, "marker": marker}
        self.bar = {"color": color, "hatch": hatch, "edgecolor": "white" if not hatch else "#333333",
                    "linewidth": 0.4}


def preferred_slot(name):
    """The slot a series asks for first: stage NN's number (its variants next to it), then
    the peers in PEERS' order, then a slot from the name itself."""
    m = re.match(r"^(\d\d)_(\w+?)(_ragged)?(\[.*\])?$", name)
    if m:
        return (int(m.group(1)) - 1) * 2 % len(COLORS) + (1 if m.group(3) or m.group(4) else 0)
    base = re.sub(r"^peer_clean_l2_", "peer_", name)
    if base in PEERS:
        return (9 + PEERS.index(base)) % len(COLORS)
    return sum(map(ord, name)) % len(COLORS)


def series_styles(names):
    """{name: Style} for the series of one plot: each colour and each marker used once
    (up to len(COLORS) series; beyond that they repeat, in pairs that still differ)."""
    taken_color, taken_marker, styles = set(), set(), {}
    for name in names:
        slot = preferred_slot(name)
        c = next((i % len(COLORS) for i in range(slot, slot + len(COLORS)) if i % len(COLORS) not in taken_color),
                 slot % len(COLORS))
        m = next((i % len(MARKERS) for i in range(slot, slot + len(MARKERS)) if i % len(MARKERS) not in taken_marker),
                 (slot + 1) % len(MARKERS))
        taken_color.add(c)
        taken_marker.add(m)
        styles[name] = Style(COLORS[c], MARKERS[m], HATCHES[m % len(HATCHES)])
    return styles
