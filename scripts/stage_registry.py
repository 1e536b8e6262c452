#!/usr/bin/env python3
"""The attention stages' registry as data, for the docs: each entry's name, summary and
capabilities, the same line `flashstep validate --list` prints (StageInfo::capabilities).

    stage_registry.py SOURCE_DIR [--cli FLASHSTEP]     prints one entry per line

Two ways to read it, the first that works:
  - from the registry itself: `flashstep validate --list`, where the command was built with
    the CUDA stages (it lists them without a GPU);
  - from the sources, on any machine: stages/registry.cpp's list of `ns::function()` calls,
    each function's `StageInfo` statements in its stage folder (helpers such as stage 04's
    common_info() and stage 07's common_info(name) followed, constants such as
    tensor_core::kMaxPageSize read from the stage headers), with StageInfo's defaults from
    stages/stage.hpp. A statement this reader does not understand is an error that names
    it, never a guess: the docs then fail to build rather than say something false.

tests/docs/test_stage_registry.py checks the two against each other where the command has
the stages, and the stage pages against the registry everywhere.
"""
import argparse
import os
import re
import subprocess
import sys


class RegistryError(Exception):
    """The registry could not be read; the message says where and why."""


# ---- the StageInfo fields the capabilities line shows, with stage.hpp's defaults ------------

DEFAULTS = {"name": "", "summary": "", "modes": [], "storage": "paged", "dtypes": [], "kv_dtypes": [],
            "head_dims": [], "head_dim_pairs": [], "kv_layouts": [], "max_page_size": 0, "max_group_size": 0, "causal": False,
            "window_left": False, "logits_soft_cap": False, "sinks": False, "needs_host_page_table": False,
            "pos_encodings": ["none"], "rope_rounds_to_dtype": False, "cuda_graph": False, "rules": False}
# Fields that take a runner or a function: their value is code, not data (rules: whether set).
CODE_FIELDS = {"make_runner", "rules"}


def capabilities(e):
    """StageInfo::capabilities() of entry `e` (stages/stage.cpp), word for word."""
    s = e["storage"] + "".join(" " + m for m in e["modes"])
    s += "; dtypes" + "".join(" " + d for d in e["dtypes"])
    if e["kv_dtypes"]:
        s += "; FP8 K/V" + "".join(" " + d for d in e["kv_dtypes"]) + " (k_scale, v_scale)"
    s += "; head_dim" + "".join(f" {d}" for d in e["head_dims"])
    s += "".join(f" {qk}/{vo}" for qk, vo in e["head_dim_pairs"])
    s += "; layouts" + "".join(" " + l for l in e["kv_layouts"])
    s += f"; GQA groups 1..{e['max_group_size']}"
    if e["storage"] == "paged":
        s += f"; page_size 1..{e['max_page_size']}"
    for flag in ("causal", "window_left", "logits_soft_cap", "sinks"):
        if e[flag]:
            s += "; " + flag
    if e["needs_host_page_table"]:
        s += "; plans from the host page table"
    for p in e["pos_encodings"]:
        if p != "none":
            s += f"; pos_encoding {p}" + (" (rotated q, k rounded to the dtype)" if e["rope_rounds_to_dtype"] else "")
    if e["cuda_graph"]:
        s += "; cuda_graph (the launch depends on batch_size and nnz_qo only)"
    return s


# ---- C++ text helpers -------------------------------------------------------------------------

def _strip_comments(text):
    """C++ without // and /* */ comments (string literals kept whole)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _matching(text, start, open_ch="{", close_ch="}"):
    """Index just past the bracket that closes the one at `start` (strings skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise RegistryError(f"unbalanced {open_ch}{close_ch} in C++ source")


def _statements(body):
    """Top-level statements of a function body (brace- and string-aware)."""
    out, start, i, depth = [], 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == '"':
            i = _matching_quote(body, i)
            continue
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c == ";" and depth == 0:
            out.append(" ".join(body[start:i].split()))
            start = i + 1
        i += 1
    return [s for s in out if s]


def _matching_quote(text, i):
    j = i + 1
    while text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _string_value(expr):
    """Adjacent string literals, concatenated; None if `expr` is not only literals."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', expr)
    if not parts or re.sub(r'"((?:[^"\\]|\\.)*)"', "", expr).strip():
        return None
    return "".join(re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), p) for p in parts)


class _Sources:
    """The stage folders' C++ sources, by namespace."""

    def __init__(self, source_dir):
        self.stages = os.path.join(source_dir, "stages")
        self.registry_cpp = os.path.join(self.stages, "registry.cpp")
        if not os.path.isfile(self.registry_cpp):
            raise RegistryError(f"{self.registry_cpp} does not exist")
        self.text = _strip_comments(open(self.registry_cpp, encoding="utf-8").read())
        self.folder_of = {}  # namespace -> stage folder
        for inc in re.findall(r'#include\s+"((\d\d_\w+)/[\w.]+)"', self.text):
            path = os.path.join(self.stages, inc[0])
            for ns in re.findall(r"namespace\s+flashstep::stages::(\w+)\s*\{", open(path, encoding="utf-8").read()):
                self.folder_of.setdefault(ns, inc[1])
        self._files = {}

    def files(self, folder, exts):
        key = (folder, exts)
        if key not in self._files:
            d = os.path.join(self.stages, folder)
            self._files[key] = [(f, _strip_comments(open(os.path.join(d, f), encoding="utf-8").read()))
                                for f in sorted(os.listdir(d)) if f.endswith(exts) and not f.startswith("exercise")]
        return self._files[key]

    def calls(self):
        """The registry's entries in order: (namespace, function) of each `ns::fn()` in
        registry()'s table."""
        m = re.search(r"std::vector<StageInfo>\s*&?\s*registry\s*\(\s*\)\s*\{", self.text)
        if not m:
            raise RegistryError(f"{self.registry_cpp}: no registry() function")
        body = self.text[m.end() - 1:_matching(self.text, m.end() - 1)]
        table = re.search(r"std::vector<StageInfo>\s+\w+\s*=\s*\{", body)
        if not table:
            raise RegistryError(f"{self.registry_cpp}: registry() has no `std::vector<StageInfo> ... = {{...}}` table")
        items = body[table.end() - 1:_matching(body, table.end() - 1)][1:-1]
        calls = [(ns, fn) for ns, fn in re.findall(r"(\w+)::(\w+)\s*\(\s*\)", items)]
        rest = re.sub(r"(\w+)::(\w+)\s*\(\s*\)", "", items).replace(",", "").strip()
        if rest:
            raise RegistryError(f"{self.registry_cpp}: registry()'s table holds something other than "
                                f"`namespace::function()` calls: {rest[:60]!r}")
        return calls

    def function(self, ns, name):
        """(folder, parameter names, body) of `StageInfo name(...)` in namespace ns's folder."""
        folder = self.folder_of.get(ns)
        if folder is None:
            raise RegistryError(f"registry.cpp calls {ns}::{name}(), but no header it includes opens namespace "
                                f"flashstep::stages::{ns}")
        pattern = re.compile(r"\bStageInfo\s+" + re.escape(name) + r"\s*\(([^)]*)\)\s*\{")
        for fname, text in self.files(folder, (".cu", ".cpp")):
            m = pattern.search(text)
            if m:
                params = [p.split()[-1].lstrip("&*") for p in m.group(1).split(",") if p.strip()]
                body = text[m.end() - 1:_matching(text, m.end() - 1)][1:-1]
                return folder, params, body, f"stages/{folder}/{fname}"
        raise RegistryError(f"no definition of StageInfo {name}() in stages/{folder}/")

    def constant(self, folder, qualified):
        """The value of an integer constant such as kMaxPageSize or tensor_core::kMaxPageSize."""
        ns, _, name = qualified.rpartition("::")
        if ns:
            folder = self.folder_of.get(ns)
            if folder is None:
                raise RegistryError(f"constant {qualified}: no stage folder declares namespace {ns}")
        for _, text in self.files(folder, (".hpp", ".cuh", ".cu", ".cpp")):
            m = re.search(r"constexpr\s+(?:int|int32_t|int64_t|size_t)\s+" + re.escape(name) + r"\s*=\s*(\d+)\s*;", text)
            if m:
                return int(m.group(1))
        raise RegistryError(f"constant {qualified} not found in stages/{folder}/")


_ENUMS = {"Mode": "modes", "DType": "dtypes", "KVLayout": "kv_layouts", "PosEncoding": "pos_encodings"}


def _value(expr, field, bindings, folder, src, where):
    """The value of the right-hand side of `s.field = expr`."""
    if field in CODE_FIELDS:
        return True
    text = _string_value(expr)
    if text is not None:
        return text
    if expr in bindings:
        return bindings[expr]
    if expr in ("true", "false"):
        return expr == "true"
    if re.fullmatch(r"-?\d+", expr):
        return int(expr)
    m = re.fullmatch(r"(?:\w+::)?KVStorage::(\w+)", expr)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\{((?:\{\d+, \d+\}(?:, )?)*)\}", expr)
    if m and field == "head_dim_pairs":  # {{192, 128}, ...}: (head_dim, head_dim_vo) pairs
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+), (\d+)\}", m.group(1))]
    if expr.startswith("{") and expr.endswith("}"):
        items = [x.strip() for x in expr[1:-1].split(",") if x.strip()]
        values = []
        for x in items:
            m = re.fullmatch(r"(?:\w+::)?(Mode|DType|KVLayout|PosEncoding)::(\w+)", x)
            if m:
                values.append(m.group(2))
            elif re.fullmatch(r"\d+", x):
                values.append(int(x))
            else:
                raise RegistryError(f"{where}: cannot read {x!r} in `s.{field} = {expr}`")
        return values
    if re.fullmatch(r"(\w+::)?k\w+", expr):
        return src.constant(folder, expr)
    raise RegistryError(f"{where}: cannot read `s.{field} = {expr}`")


def _evaluate(src, ns, name, args=(), depth=0):
    """The StageInfo that function ns::name(args) returns, as a dict."""
    if depth > 4:
        raise RegistryError(f"{ns}::{name}: helpers nested too deep")
    folder, params, body, where = src.function(ns, name)
    if len(params) != len(args):
        raise RegistryError(f"{where}: {name}() takes {len(params)} argument(s), called with {len(args)}")
    bindings = dict(zip(params, args))
    info, var = None, None
    for st in _statements(body):
        m = re.fullmatch(r"StageInfo (\w+)", st)
        if m:
            info, var = dict(DEFAULTS), m.group(1)
            continue
        m = re.fullmatch(r"StageInfo (\w+) = (\w+)\((.*)\)", st)
        if m:
            call_args = [a.strip() for a in m.group(3).split(",") if a.strip()]
            values = []
            for a in call_args:
                v = _string_value(a)
                if v is None and a not in bindings:
                    raise RegistryError(f"{where}: cannot read the argument {a!r} of {m.group(2)}()")
                values.append(v if v is not None else bindings[a])
            info, var = _evaluate(src, ns, m.group(2), values, depth + 1), m.group(1)
            continue
        if var is not None:
            m = re.fullmatch(re.escape(var) + r"\.(\w+) = (.*)", st, re.S)
            if m:
                field, expr = m.group(1), m.group(2)
                if field not in DEFAULTS and field not in CODE_FIELDS:
                    raise RegistryError(f"{where}: StageInfo has no field {field} this reader knows; teach "
                                        "scripts/stage_registry.py (DEFAULTS and capabilities())")
                info[field] = _value(expr, field, bindings, folder, src, where)
                continue
            if st == f"return {var}":
                info["folder"] = folder
                return info
        raise RegistryError(f"{where}: cannot read the statement `{st[:80]}` in {name}()")
    raise RegistryError(f"{where}: {name}() does not end with `return <StageInfo>;`")


def from_sources(source_dir):
    """The registry's entries read from the sources, in registry order: dicts with name,
    summary, folder, capabilities and the fields they come from."""
    src = _Sources(source_dir)
    entries = []
    for ns, fn in src.calls():
        e = _evaluate(src, ns, fn)
        if not e["name"]:
            raise RegistryError(f"{ns}::{fn}(): the entry has no name")
        e["capabilities"] = capabilities(e)
        entries.append(e)
    return entries


def from_cli(cli):
    """The registry's entries as `flashstep validate --list` prints them (name, summary,
    capabilities), or None where the command has no CUDA stages or cannot run."""
    try:
        run = subprocess.run([cli, "validate", "--list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if run.returncode != 0 or not run.stdout.startswith("Attention stages"):
        return None
    part = run.stdout.split("\nValidated elsewhere:")[0]
    entries = []
    for block in re.split(r"\n(?=  \S)", part)[1:]:
        lines = block.strip("\n").splitlines()
        name = lines[0].strip()
        text = " ".join(l.strip() for l in lines[1:])
        summary, _, caps = text.partition("supports: ")
        entries.append({"name": name, "summary": summary.strip(), "capabilities": " ".join(caps.split())})
    return entries or None


def entries(source_dir, cli=None):
    """(entries, where they were read): the command's list where it has the stages, else the
    sources'."""
    listed = from_cli(cli) if cli else None
    if listed is not None:
        return listed, "flashstep validate --list"
    return from_sources(source_dir), "the sources (stages/registry.cpp and each entry's stage_info)"


def for_folder(all_entries, folder):
    """The entries of stage folder `folder` ("07_hopper"): those named after its number."""
    number = os.path.basename(folder)[:3]  # "07_"
    return [e for e in all_entries if e["name"].startswith(number)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source_dir")
    p.add_argument("--cli", help="the flashstep command, asked first")
    a = p.parse_args()
    try:
        found, where = entries(a.source_dir, a.cli)
    except RegistryError as e:
        print(f"stage_registry.py: {e}", file=sys.stderr)
        return 1
    print(f"# read from {where}")
    for e in found:
        print(f"{e['name']}: {e['capabilities']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
