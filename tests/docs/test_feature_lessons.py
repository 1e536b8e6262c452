"""The lessons of the features that cross stages (stages/fp8/, stages/rope/, stages/sinks/,
stages/soft_cap/: a folder with a chapter but no stage number) are part of the course:
each chapter has a page label the course index links, is an input of the docs build, and
ends with an exercise a learner can check; and no lesson kernel carries a feature's code by
name (the features reach the kernels through kernels/flashstep/kernels/attention_policy.cuh)."""
import os
import re

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
STAGES = os.path.join(SOURCE, "stages")
FEATURES = sorted(d for d in os.listdir(STAGES)
                  if re.match(r"[a-z]", d) and os.path.isfile(os.path.join(STAGES, d, "README.md")))


def read(*parts):
    with open(os.path.join(SOURCE, *parts), encoding="utf-8") as f:
        return f.read()


def test_there_are_feature_lessons():
    assert {"fp8", "rope", "sinks", "soft_cap"} <= set(FEATURES), FEATURES


def test_each_lesson_is_a_page_of_the_course_with_an_exercise():
    index, docs_cmake = read("docs", "index.md"), read("docs", "CMakeLists.txt")
    for name in FEATURES:
        text = read("stages", name, "README.md")
        first = text.splitlines()[0]
        assert first.startswith("# ") and first.endswith("{#lesson_%s}" % name), (name, first)
        assert "\\subpage lesson_%s" % name in index, f"docs/index.md does not link lesson_{name}"
        assert "stages/%s/README.md" % name in docs_cmake, f"docs/CMakeLists.txt does not build stages/{name}"
        exercise = re.search(r"^## Exercise\n(.*?)(^## |\Z)", text, re.S | re.M)
        assert exercise and re.search(r"flashstep exercise check \d+", exercise.group(1)), \
            f"stages/{name}/README.md has no exercise section naming `flashstep exercise check N`"


def test_the_lesson_kernels_carry_no_rope_code():
    """RoPE reaches stages 02-04 through the policy: their kernels name no rotation."""
    kernels = ["02_paged/decode_loop.cuh", "02_paged/paged_decode.cuh", "03_split_kv/chunk_decode.cuh",
               "04_tensor_core/prefill_attention.cuh"]
    for path in kernels:
        text = read("stages", path)
        for word in ("rope_cos_sin", "rope_rotate", "rotate_tile", "rotate_half", "rope_turns", "ROPE"):
            assert word not in text, f"stages/{path} names {word}: RoPE belongs to stages/rope/'s policy"


if __name__ == "__main__":
    test_there_are_feature_lessons()
    test_each_lesson_is_a_page_of_the_course_with_an_exercise()
    test_the_lesson_kernels_carry_no_rope_code()
    print("feature lessons: ok")
