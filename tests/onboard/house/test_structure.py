"""Package structure, checked statically: no import cycles, titan_core never imports onboard (nor do
its tests), titan_core's text speaks of what its code does for any caller, not of the onboarding
ladder or the onboard commands, and no module name means one thing in titan_core and another in onboard."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("titan_core", "onboard")
LADDER_WORDS = re.compile(r"(?<![\w.])(rungs?|ladders?|gates?|workspaces?)(?![\w.])", re.IGNORECASE)
# from Python 3.12 an f-string is tokenized in pieces: its literal text is FSTRING_MIDDLE
TEXT_TOKENS = {tokenize.COMMENT, tokenize.STRING} | {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _modules(packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` (a package is its __init__)."""
    out = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules `name` imports anywhere in its file (function-level imports included).

    `from pkg import x` imports `pkg.x` when that is a module, else `pkg`."""
    base_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    found.add(full)
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)

    def edges(comp):
        return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp)

    assert not found, "import cycles (function-level imports counted):\n" + "\n".join(
        f"  {' <-> '.join(c)}  ({edges(c)})" for c in found
    )


def test_titan_core_never_imports_onboard():
    mods = _modules()
    known = set(mods)
    bad = {
        name: sorted(m for m in _imports(name, path, known) if m.split(".")[0] == "onboard")
        for name, path in mods.items()
        if name.split(".")[0] == "titan_core"
    }
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"titan_core modules importing onboard: {bad}"
    for name, path in mods.items():  # also a plain `import onboard...` of an unlisted module
        if name.startswith("titan_core"):
            assert not re.search(r"^\s*(from|import)\s+onboard\b", path.read_text(), re.MULTILINE), name


def _text_hits(pattern: re.Pattern, packages=("titan_core",)) -> list[str]:
    """`file:line: match` for every match of `pattern` in the comments, docstrings and strings of `packages`."""
    hits = []
    for name, path in _modules(packages).items():
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        for tok in tokens:
            if tok.type not in TEXT_TOKENS:
                continue
            for m in pattern.finditer(tok.string):
                line = tok.start[0] + tok.string.count("\n", 0, m.start())
                hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    return hits


def test_titan_core_text_does_not_speak_of_the_ladder():
    """Comments, docstrings and strings under titan_core/ say what the code does for any caller."""
    hits = _text_hits(LADDER_WORDS)
    assert not hits, "titan_core text naming rungs / ladders / gates / workspaces:\n" + "\n".join(hits)


def onboard_commands() -> set[str]:
    """The onboard CLI's command names, read from its sources: `@app.command("x")` and sub-apps."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "onboard" / "cli").glob("*.py")))
    commands = set(re.findall(r'\.command\(\s*"([\w-]+)"', text))
    return commands | set(re.findall(r'add_typer\([^)]*name="([\w-]+)"', text))


def command_words(commands: set[str]) -> re.Pattern:
    """`onboard <command>` for any command, and a hyphenated command name (new-model) on its own:
    a plain word such as `plan` or `train` is ordinary prose, `onboard plan` is the command."""
    alternatives = "|".join(sorted(map(re.escape, commands), key=len, reverse=True))
    hyphenated = "|".join(sorted(re.escape(c) for c in commands if "-" in c))
    return re.compile(rf"(?<![\w.-])onboard\s+({alternatives})(?![\w-])|(?<![\w-])({hyphenated})(?![\w-])")


def test_the_command_checker_finds_commands_and_nothing_else():
    commands = onboard_commands()
    assert {"new-model", "next-step", "plan", "train", "status", "skill"} <= commands, commands
    pattern = command_words(commands)
    named = [
        "run `onboard next-step x`",
        "see onboard plan",
        "next-step refuses it",
        "a new-model twin",
        "onboard train --nproc 2",
    ]
    prose = ["pip install 'titan-onboard[hf]'", "plan the batch", "the next step", "a new model", "onboard.train"]
    assert [bool(pattern.search(t)) for t in named + prose] == [True] * len(named) + [False] * len(prose)


def test_titan_core_text_does_not_name_onboard_commands():
    """titan_core's messages are read by callers other than onboard: a fix names what to change, not a command."""
    hits = _text_hits(command_words(onboard_commands()))
    assert not hits, "titan_core text naming onboard commands:\n" + "\n".join(hits)


def test_core_tests_never_import_onboard():
    """tests/core tests titan_core alone. tests/core/conftest.py refuses the import at run time; this
    also covers a function-level import once onboard is loaded, and the workers run as subprocesses."""
    bad = []
    for path in sorted((ROOT / "tests" / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "onboard"]
    assert not bad, "tests/core importing onboard:\n" + "\n".join(bad)


# the files every model family under titan_core/models/<family>/ has by design (one of each per family)
PER_FAMILY_FILES = {"model", "flavors", "state_dict_adapter"}


def module_names(package: str) -> dict[str, list[str]]:
    """Module stem or package folder name -> its paths, under `package` (entry points and the
    per-family files of titan_core's models left out)."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / package).rglob("*")):
        rel = path.relative_to(ROOT)
        if "__pycache__" in rel.parts or not (path.is_dir() or path.suffix == ".py"):
            continue
        name = path.name if path.is_dir() else path.stem
        per_family = rel.parts[:2] == ("titan_core", "models") and len(rel.parts) == 4 and name in PER_FAMILY_FILES
        if name in ("__init__", "__main__") or per_family:
            continue
        out.setdefault(name, []).append(str(rel))
    return out


def test_no_module_name_in_both_packages():
    core, onboard = module_names("titan_core"), module_names("onboard")
    assert "llama3" in core and "model" not in core and "rungs" in onboard  # the walk sees what it should
    clashes = {name: core[name] + onboard[name] for name in set(core) & set(onboard)}
    assert not clashes, f"module names in both titan_core and onboard (rename one): {clashes}"


# ---- a model's kind is asked, never sniffed ----------------------------------------------------
# spelled in pieces, so this file is no hit of its own scan (nor of `git grep` for the same words)
KIND_SNIFFS = re.compile("|".join(("flux" + "_of", "DIFFUSION" + "_", re.escape('"noise"' + " in"))))
"""What told a FLUX model from a causal LM before the args said what they build (titan_core's
ModelArgs: `kind`, `sample_spec()`, `initial_loss()`, `own_samples()`): a helper of flux's
config, a set of diffusion families, a batch probed for a flow input."""
KIND_SNIFF_ALLOWED = ("titan_core/models/flux/", "onboard/parity/diffusion.py", "onboard/sizing/twin/flux_twin.py")
"""The family's own folder and onboard's diffusers-specific modules (parity against diffusers' class, the
twin of a diffusers config): they may name FLUX's own things; nothing else needs to."""
SCANNED = ("titan_core", "onboard", "tests", "docs", "skills", "templates", "bench", "README.md")


def test_no_code_sniffs_which_kind_of_model_it_has():
    hits = []
    for top in SCANNED:
        base = ROOT / top
        for path in sorted([base] if base.is_file() else base.rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if not path.is_file() or "__pycache__" in rel or rel.startswith(KIND_SNIFF_ALLOWED):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            lines = enumerate(text.splitlines(), 1)
            hits += [f"{rel}:{n}: {line.strip()}" for n, line in lines if KIND_SNIFFS.search(line)]
    assert not hits, "ask the model's args what it is (args.kind, sample_spec(), ...) instead:\n" + "\n".join(hits)


def test_only_the_diffusers_modules_import_the_flux_family():
    """The trainer and its data draw a flux model's samples through `args.own_samples`, and onboard asks the
    args or the family (ModelFamily.kind) what a model is: neither imports the flux family for it."""
    graph = import_graph()
    bad = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if target.startswith("titan_core.models.flux")
        and not name.startswith("titan_core.models")
        and not any(str(_modules()[name].relative_to(ROOT)).startswith(a) for a in KIND_SNIFF_ALLOWED)
    )
    assert not bad, "imports of the flux family outside its diffusers modules:\n" + "\n".join(bad)
