"""Every command answers --help, and every bad command line gets a clear message on
stderr naming what is wrong, and exit code 2 (never a crash, never exit 0)."""
import pytest

COMMANDS = ["tour", "explain", "validate", "bench", "serve", "exercise"]


def test_top_level_help_lists_every_command(flashstep):
    r = flashstep("--help")
    assert r.rc == 0, r
    assert "Usage: flashstep" in r.out, r
    for cmd in COMMANDS:
        assert f"\n  {cmd} " in r.out, (cmd, r)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(flashstep, cmd):
    r = flashstep(cmd, "--help")
    assert r.rc == 0, r
    assert f"Usage: flashstep {cmd}" in r.out, r
    assert "--help" in r.out, r


@pytest.mark.parametrize("cmd,options", [("tour", ["--seed"]), ("explain", ["--page-size", "--br", "--seed"]),
                                         ("validate", ["--seed"])])
def test_help_shows_integer_options_as_int(flashstep, cmd, options):
    r = flashstep(cmd, "--help")
    assert r.rc == 0, r
    for option in options:
        line = next(l for l in r.out.splitlines() if l.strip().startswith(option))
        assert f"{option} INT" in line, line


def test_version(flashstep):
    r = flashstep("--version")
    assert r.rc == 0, r
    assert r.out.startswith("flashstep "), r


# (command line, a word the error message must contain)
BAD = [
    ([], "subcommand is required"),
    (["frobnicate"], "frobnicate"),
    (["tour", "--section", "nope"], "--section"),
    (["tour", "--seed", "minus-one"], "--seed"),
    (["tour", "--unknown-flag"], "--unknown-flag"),
    (["explain"], "--prompt is required"),
    (["explain", "--prompt"], "--prompt"),
    (["explain", "--prompt", "a b", "--page-size", "0"], "--page-size"),
    (["explain", "--prompt", "a b", "--page-size", "x"], "--page-size"),
    (["explain", "--prompt", "a b", "--br", "0"], "--br"),
    (["explain", "--prompt", "a b", "--br", "-3"], "--br"),
    (["explain", "--prompt", "a b", "--section", "attention"], "--section"),
    (["explain", "--prompt", "a", "b"], "b"),
    (["explain", "--prompt", "   "], "--prompt #1 is empty"),
    (["explain", "--prompt", "ok", "--prompt", ""], "--prompt #2 is empty"),
    (["explain"] + sum([["--prompt", f"p{i}"] for i in range(27)], []), "at most 26"),
    (["explain", "--prompt", " ".join(["w"] * 200)], "<= 96"),
    (["validate", "--quick", "extra"], "extra"),
    (["bench", "--out"], "--out"),
    (["bench", "--shapes", "bench/no_such_shapes.csv"], "--shapes: no shapes file"),
    # Seeds: an integer in [0, 2**64 - 1], as the Python module's `seed`.
    (["tour", "--seed", "-1"], "--seed must be an integer in [0, 18446744073709551615]"),
    (["tour", "--seed=-1"], "--seed must be an integer in [0, 18446744073709551615]"),
    (["tour", "--seed", "18446744073709551616"], "--seed must be an integer"),
    (["tour", "--seed", "99999999999999999999999"], "--seed must be an integer"),
    (["explain", "--prompt", "a", "--seed", "1.5"], "--seed must be an integer"),
    (["validate", "--seed", " 7"], "--seed must be an integer"),
    (["validate", "--stage", "nonesuch"], 'no stage named "nonesuch"'),
    # Sizes: the same words as the seeds' and the Python module's integer arguments.
    (["explain", "--prompt", "a", "--page-size", "0"], "--page-size must be an integer in [1, 4096]"),
    (["explain", "--prompt", "a", "--page-size", "4097"], "--page-size must be an integer in [1, 4096]"),
    (["explain", "--prompt", "a", "--page-size", "99999999999999999999999"], "--page-size must be an integer"),
    (["explain", "--prompt", "a", "--br", "-3"], "--br must be an integer in [1, 4096]"),
    # serve: sizes checked before anything runs; the sampling mode and dtype by name
    (["serve", "--page-size", "0"], "--page-size must be an integer in [1, 64]"),
    (["serve", "--max-running", "-1"], "--max-running must be an integer in [1, 4096]"),
    (["serve", "--requests", "0"], "--requests must be an integer in [1, 100000]"),
    (["serve", "--sampling", "beam"], 'sampling mode must be "greedy" or "sample", got "beam"'),
    (["serve", "--dtype", "f8"], "dtype"),
    (["serve", "--min-new", "0"], "--min-new must be an integer in [1, 65536]"),
    (["serve", "--max-prompt", "x"], "--max-prompt must be an integer in [1, 65536]"),
    (["serve", "--shared-prefixes", "0"], "--shared-prefixes must be an integer in [1, 64]"),
    (["serve", "--num-pages", "-1"], "--num-pages must be an integer in [0, 100000000]"),
    (["serve", "--prefix-study"], "--prefix-study measures, so it needs --json FILE"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a)[:40] or "(none)" for a, _ in BAD])
def test_bad_arguments_exit_2_with_a_clear_message(flashstep, args, needle):
    r = flashstep(*args)
    if args[:2] == ["validate", "--stage"] and "this build has no CUDA stages" in r.out:
        pytest.skip("a build without CUDA stages has no registry to look the name up in")
    if args[:1] == ["serve"] and "this build has no CUDA engine" in r.out and not needle.startswith("--"):
        pytest.skip("a build without the CUDA engine does not parse the engine's names")
    assert r.rc == 2, r
    assert needle in r.err, r
    assert r.out == "" or "Usage" not in r.out, r


@pytest.mark.parametrize("args", [["explain", "--prompt", "   "], ["validate", "--stage", "nonesuch"],
                                  ["tour", "--seed", "-1"]])
def test_errors_name_the_flag_not_a_function(flashstep, args):
    """One "flashstep: error: " prefix, then what the user wrote wrong; no internal
    function name ("find_stage: ") and no second "flashstep: "."""
    r = flashstep(*args)
    if args[0] == "validate" and "this build has no CUDA stages" in r.out:
        pytest.skip("a build without CUDA stages has no registry to look the name up in")
    assert r.rc == 2, r
    line = r.err.strip().splitlines()[0]
    assert line.startswith("flashstep: error: "), r
    rest = line[len("flashstep: error: "):]
    assert not rest.startswith("flashstep"), r
    assert not any(rest.startswith(f"{name}: ") for name in ("find_stage", "make_scenario")), r
    assert rest.startswith("--"), r


@pytest.mark.parametrize("seed", ["0", "18446744073709551615"])
def test_seed_bounds_are_accepted_and_printed_as_given(flashstep, seed):
    r = flashstep("tour", "--no-gpu", "--section", "tokens", "--seed", seed)
    assert r.rc == 0, r


@pytest.mark.parametrize("args", [["tour", "--frob"], [], ["explain", "--prompt", "a", "--page-size", "x"]])
def test_every_error_has_one_prefix(flashstep, args):
    r = flashstep(*args)
    assert r.rc == 2, r
    assert r.err.startswith("flashstep: error: "), r
    assert r.err.count("flashstep: error: ") == 1, r
