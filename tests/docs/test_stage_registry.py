"""The stage pages say what the attention registry says: which stage folders have entries
(and so run under `flashstep validate`) and what each entry supports.

scripts/stage_registry.py reads the registry from the sources on any machine, and from
`flashstep validate --list` where the command was built with the CUDA stages
(FLASHSTEP_CLI, which CTest sets): there the two must agree, entry for entry."""
import os
import re
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import docs_stage_pages  # noqa: E402
import stage_registry  # noqa: E402

STAGES = os.path.join(SOURCE, "stages")
HAVE_REGISTRY = os.path.isfile(os.path.join(STAGES, "registry.cpp"))
pytestmark = pytest.mark.skipif(not HAVE_REGISTRY, reason="no stages/registry.cpp in this tree")


def folders():
    return sorted(d for d in os.listdir(STAGES)
                  if re.match(r"\d\d_", d) and os.path.isfile(os.path.join(STAGES, d, "README.md")))


def test_the_sources_give_every_entry_of_registry_cpp_in_order():
    entries = stage_registry.from_sources(SOURCE)
    with open(os.path.join(STAGES, "registry.cpp"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("registry()"):]
    table = table[:table.index("};")]
    calls = re.findall(r"^\s*(\w+)::(\w+)\(\),", table, re.M)
    assert len(entries) == len(calls) >= 1
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), names
    for e in entries:
        assert re.match(r"^\d\d_\w+$", e["name"]) and e["summary"] and e["capabilities"], e
        assert os.path.isdir(os.path.join(STAGES, e["folder"])) and e["name"].startswith(e["folder"][:3])


def test_a_statement_the_reader_does_not_know_is_an_error_not_a_guess(tmp_path):
    stages = tmp_path / "stages" / "01_naive"
    stages.mkdir(parents=True)
    (tmp_path / "stages" / "registry.cpp").write_text(
        '#include "01_naive/naive.hpp"\nconst std::vector<StageInfo>& registry() {\n'
        "  static const std::vector<StageInfo> stages = {\n      naive::stage_info(),\n  };\n  return stages;\n}\n")
    (stages / "naive.hpp").write_text("namespace flashstep::stages::naive {\nStageInfo stage_info();\n}\n")
    (stages / "naive.cu").write_text('StageInfo stage_info() {\n  StageInfo s;\n  s.name = "01_naive";\n'
                                     "  s.head_dims = compute_dims();\n  return s;\n}\n")
    with pytest.raises(stage_registry.RegistryError, match=r"naive.cu: cannot read .*s.head_dims = compute_dims\(\)"):
        stage_registry.from_sources(str(tmp_path))


def test_the_sources_agree_with_the_command_where_it_has_the_stages():
    cli = os.environ.get("FLASHSTEP_CLI")
    listed = stage_registry.from_cli(cli) if cli and os.path.exists(cli) else None
    if listed is None:
        pytest.skip("no flashstep command with the CUDA stages here (FLASHSTEP_CLI): the sources alone were read")
    parsed = stage_registry.from_sources(SOURCE)
    assert [(e["name"], e["capabilities"]) for e in listed] == [(e["name"], e["capabilities"]) for e in parsed]


def generated_pages(tmp_path):
    out = tmp_path / "gen"
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "docs_stage_pages.py"),
                          "--source-dir", SOURCE, "--results-dir", str(tmp_path / "no-results"),
                          "--out", str(out), "--stamp", str(tmp_path / "stamp")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return {f: (out / "pages" / f"stage_{f}.md").read_text(encoding="utf-8") for f in folders()}


def test_every_stage_page_says_what_the_registry_says(tmp_path):
    (tmp_path / "no-results").mkdir()
    entries = stage_registry.from_sources(SOURCE)
    for folder, page in generated_pages(tmp_path).items():
        footer = page[page.index("## Validating it (generated)"):]
        mine = stage_registry.for_folder(entries, folder)
        if mine:
            assert "not an attention stage" not in footer, folder
            for e in mine:
                assert f"- `{e['name']}`: {e['capabilities']}." in footer, (folder, e["name"])
                assert f"`flashstep validate --stage {e['name']}`" in footer, (folder, e["name"])
            others = [e["name"] for e in entries if e not in mine]
            assert not any(f"- `{n}`:" in footer for n in others), folder
        else:
            assert "It is not an attention stage of the registry" in footer, folder
            assert "flashstep validate --stage" not in footer, folder


def test_doxygen_reads_a_number_inside_a_paragraph_as_text_and_dollar_math_as_math():
    text = ("at 349 / 396 / 400 /\n404. The ratio moved\n\n1. a list item\n2. another,\n   continued\n3. third\n\n"
            "Costs $P_{j-1} V_{j-1}$ here, $5 and $6 stay, `$x$` in code stays.\n")
    out = docs_stage_pages.github_to_doxygen(text)
    assert "\n404\\. The ratio" in out
    assert "\n2. another," in out and "\n3. third" in out
    assert "\\f$P_{j-1} V_{j-1}\\f$" in out and "$5 and $6 stay" in out and "`$x$`" in out
