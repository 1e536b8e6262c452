"""Help texts quoted by the docs fit the page: scripts/docs_capture.py --wrap re-flows an
option's description at its own column, and leaves what fits as the command wrote it."""
import os
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import docs_capture  # noqa: E402

HELP = """Usage: flashstep serve [OPTIONS]

Options:
  -h,--help                   Print this help message and exit
  --json TEXT                 Measure (each variant without and with CUDA events, the read ceiling and the launch floor) and write the results JSON here
  tour                        Walk the course's story on its example ("The cat sat", "The cat ran fast"): tokens,
                              radix tree, page tables.
A line of plain text that is much longer than the page is wide, wrapped at its own indent, word by word.
"""


def test_long_descriptions_wrap_at_their_column_and_short_lines_stay():
    out = docs_capture.wrap_help(HELP, 70).splitlines()
    assert max(len(l) for l in out) <= 70
    assert out[:4] == HELP.splitlines()[:4]  # fits: as the command wrote it
    at = next(i for i, l in enumerate(out) if l.startswith("  --json TEXT"))
    assert out[at + 1].startswith(" " * 30) and not out[at + 1][30].isspace()  # continued at its column
    # "tour" and its continuation line are one paragraph, re-flowed together
    at = next(i for i, l in enumerate(out) if l.startswith("  tour"))
    paragraph = " ".join(l[30:] for l in out[at:at + 4] if l.startswith("  tour") or l.startswith(" " * 30))
    assert "tokens, radix tree, page tables." in paragraph
    assert out[-2].startswith("A line of plain text") and len(out[-2]) <= 70
