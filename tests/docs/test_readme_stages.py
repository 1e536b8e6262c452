"""README.md says which stages exist and which are coming, and that list is true: it is
the one scripts/docs_readme_stages.py writes from the stage folders and the registry."""
import os
import subprocess
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "scripts", "docs_readme_stages.py")


def test_readme_lists_the_stages_of_this_tree():
    r = subprocess.run([sys.executable, SCRIPT, "--source-dir", SOURCE, "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_stage_folder_is_named_and_no_missing_one_is_promised_as_present():
    with open(os.path.join(SOURCE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    present_part, _, coming_part = readme.partition("Coming (planned, no folder yet):")
    folders = sorted(d for d in os.listdir(os.path.join(SOURCE, "stages"))
                     if d[:2].isdigit() and os.path.isfile(os.path.join(SOURCE, "stages", d, "README.md")))
    for d in folders:
        assert f"`{d}`" in present_part, d
        assert f"`{d}`" not in coming_part.split("<!-- stages:end -->")[0], d
