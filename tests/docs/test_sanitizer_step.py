"""scripts/gpu-run.sh's sanitizer step, read on any machine: racecheck leaves library
kernels out by name, and no kernel flashstep compiles matches one of those names; both
tools run the stages' sanitizer subsets, memcheck the engine's short run and racecheck
the engine's POD attention, each in a process of its own with its own limit; a failed
tool fails the step and the script."""
import os
import re

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "scripts", "gpu-run.sh")


def script():
    with open(SCRIPT) as f:
        return f.read()


def racecheck_skips():
    m = re.search(r"^RACECHECK_SKIPS=\(([^)]*)\)", script(), re.M)
    assert m, "gpu-run.sh has no RACECHECK_SKIPS=(...) list"
    return m.group(1).split()


def flashstep_kernels():
    """Every __global__ function's name in the folders whose code runs on the GPU."""
    names = set()
    pattern = re.compile(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s*)?(?:static\s+)?void\s+"
                         r"(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")
    for top in ("stages", "kernels", "capi", "tests", "bench"):
        for root, _, files in os.walk(os.path.join(SOURCE, top)):
            for name in files:
                if name.endswith((".cu", ".cuh", ".hpp", ".h")):
                    with open(os.path.join(root, name), errors="replace") as f:
                        names.update(pattern.findall(f.read()))
    return names


def test_racecheck_skips_no_flashstep_kernel():
    skips = racecheck_skips()
    assert skips and "nvjet" in skips  # the cuBLAS kernels racecheck reported on an H200
    kernels = flashstep_kernels()
    assert {"paged_decode_kernel", "chunk_decode_kernel", "pod_attention_kernel",
            "hopper_attention_kernel"} <= kernels, sorted(kernels)
    hit = sorted(k for k in kernels if any(s.lower() in k.lower() for s in skips))
    assert not hit, f"racecheck would skip flashstep kernels {hit}: rename them or narrow RACECHECK_SKIPS"


def test_both_tools_run_both_parts_with_their_own_limits():
    body = script()
    step = body[body.index("step_sanitizer() {"):]
    step = step[:step.index("\n}\n")]
    assert "for tool in memcheck racecheck" in step
    assert "for part in subsets engine" in step
    assert "-tc='*sanitizer*,kernels:*' -tce='09_engine*'" in step
    assert "engine=(-tc='09_engine: a short run*')" in step
    assert "pod=(-tc='09_engine mixed step: two calls*,09_engine POD grid*')" in step
    assert re.search(r"timeout \d+ compute-sanitizer", step)
    assert "--kernel-name-exclude" in step and '[ "$tool" = racecheck ] && args+=' in step
    assert "return $failed" in step
    assert 'status=1' in body and 'exit $status' in body


def test_the_engine_case_exists():
    with open(os.path.join(SOURCE, "tests", "stages", "test_engine_gpu.cpp")) as f:
        assert 'TEST_CASE("09_engine: a short run (for compute-sanitizer)")' in f.read()
    with open(os.path.join(SOURCE, "tests", "stages", "test_mixed_step.cpp")) as f:
        text = f.read()
    assert 'TEST_CASE("09_engine mixed step: two calls, one call and POD attention' in text
    assert 'TEST_CASE("09_engine POD grid:' in text
