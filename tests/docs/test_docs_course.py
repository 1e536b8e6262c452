"""scripts/docs_course.py on a small synthetic course: the reading order is the main
page's \\subpage tree, titles "N. ..." are escaped for Doxygen, every page gets its
previous / up / next bar, and the layout gets the course menu."""
import os
import subprocess
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "scripts", "docs_course.py")
LAYOUT = """<doxygenlayout version="1.0">
  <navindex>
    <!-- flashstep: the course menu (scripts/docs_course.py) -->
  </navindex>
</doxygenlayout>
"""


def run(tmp_path, pages, index):
    (tmp_path / "index.md").write_text(index)
    (tmp_path / "pages").mkdir()
    for name, text in pages.items():
        (tmp_path / "pages" / name).write_text(text)
    (tmp_path / "layout.xml").write_text(LAYOUT)
    return subprocess.run([sys.executable, SCRIPT, "--index", str(tmp_path / "index.md"),
                           "--pages", str(tmp_path / "pages"), "--out", str(tmp_path / "course"),
                           "--layout-in", str(tmp_path / "layout.xml"),
                           "--layout-out", str(tmp_path / "out.xml")],
                          capture_output=True, text=True)


PAGES = {
    "a.md": "# 1. First & foremost {#ch_a}\n\nText.\n",
    "b.md": "# 2. Second {#ch_b}\n\nText.\n",
    "part.md": "# Part {#part}\n\n- \\subpage leaf_x\n- \\subpage leaf_y\n",
    "x.md": "# X {#leaf_x}\n",
    "y.md": "# Y {#leaf_y}\n",
}
INDEX = "# Main\n\n1. \\subpage ch_a\n2. \\subpage ch_b\n\n- \\subpage part\n"


def test_order_titles_and_bars(tmp_path):
    r = run(tmp_path, PAGES, INDEX)
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "course" / "ch_a.md").read_text()
    assert a.startswith("# 1.&nbsp;First & foremost {#ch_a}"), a
    assert "Previous: \\ref index" in a and "Next: \\ref ch_b" in a and "Up:" not in a, a
    x = (tmp_path / "course" / "leaf_x.md").read_text()
    assert "Previous: \\ref part" in x and "Up: \\ref part" in x and "Next: \\ref leaf_y" in x, x
    y = (tmp_path / "course" / "leaf_y.md").read_text()
    assert "Next:" not in y, y
    layout = (tmp_path / "out.xml").read_text()
    order = [layout.index(f'url="@ref {label}"') for label in ("ch_a", "ch_b", "part", "leaf_x", "leaf_y")]
    assert order == sorted(order), layout
    assert 'title="1. First &amp; foremost"' in layout, layout


def test_a_page_outside_the_tree_is_an_error(tmp_path):
    pages = dict(PAGES, **{"z.md": "# Lost {#lost}\n"})
    r = run(tmp_path, pages, INDEX)
    assert r.returncode == 1 and "lost" in r.stderr, r.stderr


def test_a_subpage_with_no_page_is_an_error(tmp_path):
    r = run(tmp_path, PAGES, INDEX + "- \\subpage missing_one\n")
    assert r.returncode == 1 and "missing_one" in r.stderr, r.stderr
