"""Every command answers --help, and every bad command line gets a clear message on
stderr naming what is wrong, and exit code 2 (never a crash, never exit 0)."""
import pytest

COMMANDS = ["tour", "explain", "validate", "bench"]


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
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a)[:40] or "(none)" for a, _ in BAD])
def test_bad_arguments_exit_2_with_a_clear_message(flashstep, args, needle):
    r = flashstep(*args)
    assert r.rc == 2, r
    assert needle in r.err, r
    assert r.out == "" or "Usage" not in r.out, r
