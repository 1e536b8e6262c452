"""Sharing goes forward only: every #include, and every link of the CLI and the C API,
follows ARCHITECTURE.md's "Which way data flows":

    reference -> kernels -> stages -> tests, bench, cli, capi -> python, docs

- The reference includes only itself (and kernels/'s philox.cuh, the one header both
  the CPU and the GPU compile); kernels/ only itself and the reference.
- A stage (stages/NN_name/) includes kernels/, the reference, the stages library
  (stage.hpp, registry.hpp, harness/, the feature folders rope/ and sinks/) and files of its own or an earlier stage,
  never a later stage's. A later stage's kernel reaches an earlier stage only through the
  registry (stage 07 lends stage 05 its kernel: registry.hpp's level_kernels()).
- The stages library includes no stage, except registry.*, which lists them all.
- tests/, bench/, cli/ and capi/ include the layers to their left and their own folder,
  not each other. Two libraries of bench/ are shared: bench/ceilings/ (flashstep::ceilings:
  the read ceiling and the launch floor), which includes only kernels/ and the reference;
  and bench/serve/ (flashstep::serve_measure and flashstep::serve_measure_gpu: stage 09's
  engine measured, its step floor, results file and phase timer), which includes the
  stages and the layers left of them, and which tests/, bench/ and cli/ use, not capi/.
- Nothing includes python/.
- cli/'s and capi/'s CMake link no target of tests/ or bench/ but flashstep::ceilings (and
  cli/ bench/serve/'s), and take neither sources nor include folders from tests/ or bench/.

An include is found as the compiler would: beside the file first, then in the include
folders the targets add (reference/include, kernels, stages, ...). Headers of other
projects (<cuda.h>, <doctest/doctest.h>) are left alone.

`python3 tests/docs/test_sharing_goes_forward.py [ROOT]` checks another tree (an older
commit, checked out with `git worktree add`) and prints every breach, file:line first.
"""
import os
import re
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

SCANNED = ("reference", "kernels", "stages", "capi", "cli", "bench", "tests", "python")
SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".cu", ".cc", ".cpp", ".inl")
# Where a quoted include that is not beside its file is looked for: the include folders
# the CMake targets add, the layers' own first.
INCLUDE_ROOTS = ("reference/include", "kernels", "stages", "tests", "tests/stages", "bench/stages",
                 "bench/ceilings", "bench/serve", "capi", "cli", "python/src")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(flashstep/[^>]+)>)')
# The one header of kernels/ the reference compiles: the Philox stream both draw from.
REFERENCE_MAY_INCLUDE = {"kernels/flashstep/kernels/philox.cuh"}
# tests/, bench/, cli/ and capi/ are one layer; each includes only its own folder of it.
PEERS = ("tests", "bench", "cli", "capi")
# The bench libraries the CLI may link: what it has of bench/. The ceilings are the GPU's
# (capi/ may link them too); bench/serve/ measures stage 09's engine, for the CLI and the
# tests only.
SHARED_BENCH = "bench/ceilings/"
SHARED_BENCH_TARGETS = {"flashstep_ceilings", "flashstep::ceilings"}
SERVE_BENCH = "bench/serve/"
SERVE_BENCH_TARGETS = {"flashstep_serve_measure", "flashstep::serve_measure", "flashstep_serve_measure_gpu",
                       "flashstep::serve_measure_gpu"}


def layer(rel):
    """(kind, stage number) of a repository path: kind is reference, kernels, stage,
    registry, stages-library, ceilings, serve-measure, tests, bench, cli, capi or python;
    None outside."""
    parts = rel.split("/")
    top = parts[0]
    if top == "stages" and len(parts) > 2 and re.match(r"\d\d_", parts[1]):
        return "stage", int(parts[1][:2])
    if top == "stages":
        return ("registry" if parts[-1].startswith("registry.") and len(parts) == 2 else "stages-library"), None
    if rel.startswith(SHARED_BENCH):
        return "ceilings", None
    if rel.startswith(SERVE_BENCH):
        return "serve-measure", None
    if top in SCANNED:
        return top, None
    return None, None


def folder(kind):
    """The folder a layer's kind names, for a message."""
    return {"ceilings": SHARED_BENCH, "serve-measure": SERVE_BENCH}.get(kind, kind + "/")


def describe(rel):
    kind, number = layer(rel)
    return f"stage {number:02d}" if kind == "stage" else kind


def rule_broken(src, dst):
    """The rule an include of `dst` from `src` breaks, or None."""
    skind, snum = layer(src)
    dkind, dnum = layer(dst)
    if dkind is None or skind is None:
        return None
    if dkind == "python" and skind != "python":
        return "nothing includes python/ (the last layer)"
    if skind == "reference":
        if dkind == "reference" or dst in REFERENCE_MAY_INCLUDE:
            return None
        return "the reference is the first layer: it includes only itself (and kernels/'s philox.cuh)"
    if skind == "kernels":
        if dkind in ("reference", "kernels"):
            return None
        return "kernels/ includes only kernels/ and the reference"
    lower = ("reference", "kernels")
    library = ("stages-library", "registry")
    if skind == "stage":
        if dkind in lower or dkind in library:
            return None
        if dkind == "stage":
            if dnum <= snum:
                return None
            return (f"stage {snum:02d} includes a later stage ({dnum:02d}): sharing between stages goes forward "
                    "only (a later stage lends a kernel through the registry)")
        return ("a stage includes only kernels/, the reference, the stages library and earlier stages, "
                f"not {folder(dkind)}")
    if skind == "stages-library":
        if dkind in lower or dkind in library:
            return None
        if dkind == "stage":
            return "the stages library (stage.*, harness/, the feature folders) includes no stage; only registry.* lists them"
        return f"the stages library includes only kernels/ and the reference, not {folder(dkind)}"
    if skind == "registry":
        if dkind in lower or dkind in library or dkind == "stage":
            return None
        return f"the registry includes the stages, kernels/ and the reference, not {folder(dkind)}"
    if skind == "ceilings":
        if dkind in lower or dkind == "ceilings":
            return None
        return "bench/ceilings (flashstep::ceilings, linked by the CLI) includes only kernels/ and the reference"
    if skind == "serve-measure":
        if dkind in lower or dkind in library or dkind == "stage" or dkind == "serve-measure":
            return None
        return ("bench/serve (flashstep::serve_measure, linked by the CLI and the tests) includes only the stages, "
                f"kernels/ and the reference, not {folder(dkind)}")
    if skind in PEERS:
        if dkind in lower or dkind in library or dkind == "stage" or dkind == skind:
            return None
        if dkind == "ceilings":
            return None  # the shared library flashstep::ceilings
        if dkind == "serve-measure" and skind != "capi":
            return None  # the shared library flashstep::serve_measure
        if skind == "capi" and dkind in ("tests", "bench", "serve-measure"):
            return ("capi/ uses nothing of tests/ or bench/ (only the ceilings library, bench/ceilings/); move "
                    "what both need to the stages library or kernels/")
        if skind == "cli" and dkind in ("tests", "bench"):
            return ("cli/ uses nothing of tests/ or bench/ (only the libraries of bench/ceilings/ and bench/serve/); "
                    "move what both need to the stages library or kernels/")
        return f"tests/, bench/, cli/ and capi/ include each other's nothing; {skind}/ includes {dkind}/"
    return None  # python/ may include every layer to its left


def sources(root):
    for top in SCANNED:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build", "__pycache__")))
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    yield os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")


def resolve(root, src, name):
    """The repository path `#include name` in `src` reads, or None (another project's)."""
    here = os.path.dirname(src)
    beside = os.path.normpath(os.path.join(here, name)).replace(os.sep, "/")
    if os.path.isfile(os.path.join(root, beside)):
        return beside
    found = []
    for inc in INCLUDE_ROOTS:
        path = os.path.normpath(os.path.join(inc, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, path)) and path not in found:
            found.append(path)
    if not found:
        return None
    # a name two folders hold: the one in the file's own top-level folder
    own = [p for p in found if p.split("/")[0] == src.split("/")[0]]
    return (own or found)[0]


def include_breaches(root=SOURCE):
    """Every include that breaks a rule, as 'file:line: #include ... (what it reaches): rule'."""
    breaches = []
    for src in sources(root):
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = m.group(1) or m.group(2)
                dst = resolve(root, src, name)
                if dst is None:
                    continue
                why = rule_broken(src, dst)
                if why:
                    breaches.append(f"{src}:{n}: #include \"{name}\" ({dst}, {describe(dst)}): {why}")
    return breaches


# ---- CMake: what cli/ and capi/ link and compile -------------------------------------

COMMAND = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)", re.S)
DEFINES = ("add_library", "add_executable")
TAKES_PATHS = ("add_library", "add_executable", "target_sources", "target_include_directories",
               "include_directories", "add_subdirectory", "include")
REPO_PATH = re.compile(r"\$\{(?:PROJECT_SOURCE_DIR|CMAKE_SOURCE_DIR|flashstep_SOURCE_DIR)\}/(tests|bench)(/[^\s)\"]*)?"
                       r"|(?:\.\./)+(tests|bench)(/[^\s)\"]*)?")


def cmake_files(root, top):
    for d, dirs, names in os.walk(os.path.join(root, top)):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")))
        for name in sorted(names):
            if name == "CMakeLists.txt" or name.endswith(".cmake"):
                yield os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")


def without_comments(text):
    return "\n".join(re.sub(r"(^|\s)#.*$", r"\1", line) for line in text.split("\n"))


def commands(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        text = without_comments(f.read())
    for m in COMMAND.finditer(text):
        yield m.group(1).lower(), m.group(2), text.count("\n", 0, m.start()) + 1


def targets_of(root, top):
    """The targets (and aliases) tests/ or bench/ define, less the shared ceilings library."""
    names = set()
    for rel in cmake_files(root, top):
        for cmd, args, _ in commands(root, rel):
            if cmd in DEFINES and args.split():
                names.add(args.split()[0])
    return names - SHARED_BENCH_TARGETS


def may_link(top):
    """The targets of bench/ that cli/ or capi/ may link."""
    return SHARED_BENCH_TARGETS | (SERVE_BENCH_TARGETS if top == "cli" else set())


def cmake_breaches(root=SOURCE):
    forbidden = {name: top for top in ("tests", "bench") for name in targets_of(root, top)}
    breaches = []
    for top in ("cli", "capi"):
        for rel in cmake_files(root, top):
            for cmd, args, line in commands(root, rel):
                if cmd == "target_link_libraries":
                    for token in args.split():
                        if token in forbidden and token not in may_link(top):
                            allowed = " and ".join(sorted(t for t in may_link(top) if "::" in t))
                            breaches.append(f"{rel}:{line}: {cmd} {token}: {top}/ links no target of "
                                            f"{forbidden[token]}/ (only {allowed} of bench/)")
                if cmd in TAKES_PATHS:
                    for m in REPO_PATH.finditer(args):
                        folder, rest = m.group(1) or m.group(3), m.group(2) or m.group(4) or ""
                        breaches.append(f"{rel}:{line}: {cmd} {folder}{rest}: {top}/ takes no sources or include "
                                        f"folders from {folder}/ (link flashstep::ceilings for the ceilings)")
    return breaches


# ---- the checks -----------------------------------------------------------------------

def test_every_include_goes_forward():
    found = include_breaches(SOURCE)
    assert not found, "includes that go backwards (ARCHITECTURE.md, Which way data flows):\n" + "\n".join(found)


def test_cli_and_capi_link_nothing_of_tests_or_bench():
    found = cmake_breaches(SOURCE)
    assert not found, "cli/ or capi/ reach into tests/ or bench/:\n" + "\n".join(found)


def plant(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


TREE = {
    "reference/include/flashstep/reference/tensor.hpp": "",
    "kernels/flashstep/kernels/state.cuh": '#include "flashstep/reference/tensor.hpp"\n',
    "kernels/flashstep/kernels/philox.cuh": "",
    "stages/stage.hpp": "",
    "stages/registry.hpp": '#include "stage.hpp"\n',
    "stages/registry.cpp": '#include "05_cascade/cascade.hpp"\n#include "07_hopper/hopper.hpp"\n',
    "stages/harness/case.hpp": '#include "stage.hpp"\n',
    "stages/02_paged/decode_loop.cuh": "",
    "stages/03_split_kv/chunk_decode.cuh": '#include "02_paged/decode_loop.cuh"\n',
    "stages/05_cascade/cascade.hpp": '#include "registry.hpp"\n',
    "stages/07_hopper/hopper.hpp": '#include "stage.hpp"\n',
    "tests/stages/grid.hpp": '#include "harness/case.hpp"\n',
    "bench/ceilings/read_ceiling.hpp": "",
    "bench/stages/timing.hpp": "",
    "stages/09_engine/engine.hpp": '#include "registry.hpp"\n',
    "bench/serve/step_floor.hpp": '#include "09_engine/engine.hpp"\n',
    "bench/serve/step_floor.cpp": '#include "step_floor.hpp"\n',
    "tests/engine/test_step_floor.cpp": '#include "step_floor.hpp"\n',
    "cli/serve.cpp": '#include "read_ceiling.hpp"\n#include "step_floor.hpp"\n#include <flashstep/kernels/state.cuh>\n',
    "cli/CMakeLists.txt": ("target_link_libraries(flashstep_cli PRIVATE flashstep::stages flashstep::ceilings\n"
                           "  flashstep::serve_measure)\n"),
    "capi/CMakeLists.txt": "target_link_libraries(flashstep_capi PRIVATE flashstep::stages)\n",
    "bench/CMakeLists.txt": "add_executable(flashstep_bench main.cpp)\n",
    "bench/ceilings/CMakeLists.txt": "add_library(flashstep_ceilings STATIC read_ceiling.cu)\n",
    "bench/serve/CMakeLists.txt": ("add_library(flashstep_serve_measure STATIC step_floor.cpp)\n"
                                   "add_library(flashstep::serve_measure ALIAS flashstep_serve_measure)\n"),
    "reference/src/sampling.cpp": "#include <flashstep/kernels/philox.cuh>\n",
}


def test_a_tree_that_follows_the_rules_passes(tmp_path):
    root = plant(tmp_path, TREE)
    assert include_breaches(root) == [] and cmake_breaches(root) == []


PLANTED_INCLUDES = [  # (file, its text, words of the rule it breaks)
    ("stages/05_cascade/cascade.cu", '#include "07_hopper/hopper.hpp"\n', "later stage (07)"),
    ("stages/harness/compare.hpp", '#include "03_split_kv/chunk_decode.cuh"\n', "includes no stage"),
    ("kernels/flashstep/kernels/vec.cuh", '#include "harness/case.hpp"\n', "kernels/ includes only"),
    ("reference/src/attention.cpp", '#include "flashstep/kernels/state.cuh"\n', "first layer"),
    ("reference/src/radix.cpp", '#include "stages/grid.hpp"\n', "first layer"),
    ("cli/gpu.cpp", '#include "grid.hpp"\n', "uses nothing of tests/ or bench/"),
    ("capi/capi.cpp", '#include "timing.hpp"\n', "uses nothing of tests/ or bench/"),
    ("bench/ceilings/launch_floor.cu", '#include "timing.hpp"\n', "includes only kernels/"),
    ("capi/capi_engine.cpp", '#include "step_floor.hpp"\n', "capi/ uses nothing of tests/ or bench/"),
    ("bench/serve/serve_results.cpp", '#include "timing.hpp"\n', "bench/serve (flashstep::serve_measure"),
    ("bench/serve/serve_results.hpp", '#include "stages/grid.hpp"\n', "not tests/"),
    ("stages/09_engine/engine.cu", '#include "step_floor.hpp"\n', "not bench/serve/"),
    ("tests/stages/test_x.cpp", '#include "timing.hpp"\n', "each other's nothing"),
    ("stages/02_paged/paged.cu", '#include "../../tests/stages/grid.hpp"\n', "not tests/"),
]


def test_a_planted_backward_include_is_named(tmp_path):
    for i, (rel, text, expect) in enumerate(PLANTED_INCLUDES):
        root = plant(tmp_path / str(i), dict(TREE, **{rel: text}))
        found = include_breaches(root)
        assert len(found) == 1 and found[0].startswith(rel + ":1: ") and expect in found[0], (rel, found)


PLANTED_CMAKE = [  # (cli/CMakeLists.txt, what the breach says)
    ("target_link_libraries(flashstep_cli PRIVATE\n  flashstep_bench)\n", "cli/CMakeLists.txt:1: target_link_"),
    ("target_include_directories(flashstep_cli PRIVATE ${PROJECT_SOURCE_DIR}/tests/stages)\n", "tests/stages"),
    ("if(ON)\n  add_library(x STATIC ${PROJECT_SOURCE_DIR}/bench/ceilings/read_ceiling.cu)\nendif()\n",
     "cli/CMakeLists.txt:2: add_library bench/ceilings/read_ceiling.cu"),
]


def test_a_planted_link_into_bench_or_tests_is_named(tmp_path):
    for i, (text, expect) in enumerate(PLANTED_CMAKE):
        root = plant(tmp_path / str(i), dict(TREE, **{"cli/CMakeLists.txt": text}))
        found = cmake_breaches(root)
        assert len(found) == 1 and expect in found[0], (text, found)


def test_capi_may_not_link_what_measures_the_engine(tmp_path):
    text = "target_link_libraries(flashstep_capi PRIVATE flashstep::serve_measure)\n"
    found = cmake_breaches(plant(tmp_path, dict(TREE, **{"capi/CMakeLists.txt": text})))
    assert len(found) == 1 and "capi/ links no target of bench/ (only flashstep::ceilings" in found[0], found


if __name__ == "__main__":
    tree = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else SOURCE)
    found = include_breaches(tree) + cmake_breaches(tree)
    print("\n".join(found) if found else f"{tree}: sharing goes forward only")
    sys.exit(1 if found else 0)
