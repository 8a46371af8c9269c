"""Every repository path the project names to a reader exists in the tree.

A path in a doc, a docstring, a comment or a report template that no longer exists is a wrong
instruction. This test reads the files a reader follows: the Markdown of the repository (README,
docs/, examples/, tools/, tests/), the Python of src/, tools/ and tests/ (docstrings, comments and
strings, so the report templates of `report/sections/` too), the shell scripts of tools/ and the
YAML of the package (recipe and policy comments), and checks three kinds of name in them:

- a path token: slash-separated words that end in a file extension of `EXTENSIONS` (a file) or in
  a slash (a folder), whose first word is a top-level folder of the repository, a package folder
  under src/quantstudy or a folder under docs/ (`quant/fitting/rounding.py`, `docs/results/`,
  `sections/`). It exists when it resolves against the repository root, src/quantstudy, src/,
  or the naming file's folder or one of its parents. Tokens inside URLs, starting at `.`, `/`,
  `~` or `$`, or with a glob or placeholder (`*`, `<name>`) after their last slash are not paths
  of this tree (write a placeholder in angle brackets);
- a Markdown link target without a scheme: resolved against the Markdown file's folder, as a
  Markdown viewer resolves it;
- a dotted module name `quantstudy.a.b` whose `a` is a subpackage or module of quantstudy: each
  word a subpackage or module until a module is reached (what follows is an attribute), or a
  name its package's `__init__.py` defines. (`quantstudy.precision`, an ONNX metadata key, is
  no module name.)

Paths in records (JSON) are data about a past run, not instructions; they are not read, and
neither is `NOT_READ`.

What the tools write into folders git ignores (`studies/` of `make demo`, `zoo/`, `sweeps/`,
`.cache/`, a venv) is no part of the tree: a path counts as the repository's only if git tracks
it or it lies outside every ignored folder (`Tree`), so the README's commands pass in either
order on one checkout (`make demo` then `make test`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "quantstudy"
EXTENSIONS = ("py", "md", "yaml", "yml", "json", "jsonl", "sh", "toml", "txt", "png", "csv")

_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
_TOKEN = re.compile(r"(?<![\w./$~-])[\w.-]+(?:/[\w.-]+)*/(?:[\w.-]+)?")
_FILE = re.compile(r"\.(?:" + "|".join(EXTENSIONS) + r")$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MODULE = re.compile(r"(?<![\w./])quantstudy(?:\.\w+)+")
NOT_READ = {
    # Its table names the bulky source files it compacted into docs/results/figures/: they left
    # the tree by design (its docstring says how to restore them from git to redo a group).
    "tools/lab/results/compact.py",
    # Rendered from the records of docs/results/ (a test holds it to them): its prose comes from
    # bench/report.py, read here; the records' notes name the code of the commit they ran at.
    "docs/results/README.md",
    # Their cases name made-up paths on purpose: the missing ones this check must report, a
    # report's figure and link its self-check must skip, test files of a made-up suite, the
    # missing tests an exactness claim names that the claims check must report.
    "tests/unit/test_paths_named.py",
    "tests/unit/test_report.py",
    "tests/unit/test_gpu_suite.py",
    "tests/unit/test_claims_named.py",
}


@dataclass(frozen=True)
class Tree:
    """The repository as a reader's paths see it: `root`, less what git ignores (`ignored`,
    repository-relative paths, folders ending in `/`, as `git ls-files --others --ignored
    --directory` lists them: a folder that holds a tracked file is never listed whole)."""

    root: Path
    ignored: tuple[str, ...] = ()

    @classmethod
    def of(cls, root: Path) -> Tree:
        """`root` with git's ignored paths; none outside a git checkout (an unpacked sdist)."""
        command = ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"]
        try:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        except FileNotFoundError:  # no git installed
            return cls(root)
        return cls(root, tuple(done.stdout.splitlines()) if done.returncode == 0 else ())

    def holds(self, path: Path) -> bool:
        """Whether `path` exists and is the repository's: tracked, or outside every ignored
        folder (a tool's output there is not)."""
        if not path.exists():
            return False
        try:
            rel = path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return True  # outside the repository (`../shared`): not the tree's to judge
        rel += "/" if path.is_dir() else ""
        return not any(rel == i or (i.endswith("/") and rel.startswith(i)) for i in self.ignored)


TREE = Tree.of(REPO)


def _roots(tree: Tree) -> set[str]:
    """First words that make a token a path of this tree: top-level folders and package folders
    (an ignored folder, `studies/` say, is none)."""
    repo = tree.root
    top = {
        p.name
        for p in repo.iterdir()
        if p.is_dir() and not p.name.startswith(".") and tree.holds(p)
    }
    package = repo / "src" / "quantstudy"
    inner = {p.name for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    docs = {p.name for p in (repo / "docs").rglob("*") if p.is_dir()}
    return top | inner | docs | {"quantstudy"}


def named_files(tree: Tree) -> Iterator[Path]:
    """The files whose text names paths for a reader (`NOT_READ` and ignored files aside)."""
    for path in _candidates(tree.root):
        if str(path.relative_to(tree.root)) not in NOT_READ and tree.holds(path):
            yield path


def _candidates(repo: Path) -> Iterator[Path]:
    yield from repo.glob("*.md")
    for folder in ("docs", "examples", "tools", "tests"):
        yield from (repo / folder).rglob("*.md")
    for folder in ("src", "tools", "tests"):
        yield from (repo / folder).rglob("*.py")
    yield from (repo / "tools").rglob("*.sh")
    yield from (repo / "src").rglob("*.yaml")


def _exists(token: str, bases: list[Path], tree: Tree) -> bool:
    return any(tree.holds(base / token) for base in bases)


def _module_exists(name: str, package: Path) -> bool:
    here = package
    for word in name.split(".")[1:]:
        if (here / word).is_dir():
            here = here / word
        elif (here / f"{word}.py").is_file():
            return True  # a module: what follows is an attribute of it
        else:
            init = here / "__init__.py"
            return init.is_file() and re.search(rf"\b{word}\b", init.read_text()) is not None
    return True


def missing_paths(path: Path, tree: Tree = TREE) -> list[str]:
    """The paths named in the file `path` that do not exist in `tree` (each once, in order)."""
    return missing_in(path.read_text(encoding="utf-8"), path, tree)


def missing_in(text: str, path: Path, tree: Tree = TREE) -> list[str]:
    """The paths named in `text`, read as the text of the file `path`, missing from `tree`."""
    repo = tree.root
    roots = _roots(tree)
    bases = [repo, repo / "src" / "quantstudy", repo / "src"]
    bases += [p for p in path.parents if p.is_relative_to(repo)]
    missing: list[str] = []
    if path.suffix == ".md":
        for target in _LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:|#", target):
                continue
            if not tree.holds(path.parent / target.split("#")[0]):
                missing.append(target)
    for token in _TOKEN.findall(_URL.sub(" ", text)):
        token = token.rstrip(".")
        if token.split("/")[0] not in roots or not (token.endswith("/") or _FILE.search(token)):
            continue
        if not _exists(token, bases, tree):
            missing.append(token)
    package = repo / "src" / "quantstudy"
    for name in _MODULE.findall(text):
        first = name.split(".")[1]
        if not ((package / first).is_dir() or (package / f"{first}.py").is_file()):
            continue  # not a module name of this package (an ONNX metadata key, say)
        if not _module_exists(name, package):
            missing.append(name)
    return list(dict.fromkeys(missing))


def test_every_path_named_for_a_reader_exists():
    stale = {}
    for f in sorted(set(named_files(TREE))):
        name = str(f.relative_to(REPO))
        if missing := missing_paths(f):
            stale[name] = missing
    assert not stale, "paths named that do not exist (fix the name or the text):\n" + "\n".join(
        f"  {f}: {', '.join(m)}" for f, m in stale.items()
    )


def test_the_files_read_include_docs_sources_recipes_and_report_templates():
    files = {str(f.relative_to(REPO)) for f in named_files(TREE)}
    assert {
        "README.md",
        "docs/DESIGN.md",
        "src/quantstudy/report/sections/method.py",
        "src/quantstudy/recipe/builtin/generic_pointwise.yaml",
        "tools/gpu_suite.py",
        "tests/gpu/test_engines_gpu.py",
    } <= files


@pytest.mark.parametrize(
    ("text", "stale"),
    [
        ("See `quant/triton_fp8.py` for the kernel.", "quant/triton_fp8.py"),
        ("# the rounding (quant/rounding.py), then", "quant/rounding.py"),
        ("results go to docs/no_such_folder/.", "docs/no_such_folder/"),
        ("[the design](no_such_note.md)", "no_such_note.md"),
        ("`quantstudy.bench.limit` times it", "quantstudy.bench.limit"),
    ],
)
def test_a_fabricated_missing_path_is_caught(text, stale):
    """The check can fail: each name of a missing file, folder, link or module is reported."""
    assert missing_in(text, REPO / "docs" / "note.md") == [stale]


@pytest.mark.parametrize(
    "text",
    [
        "`quant/fitting/rounding.py` and `record/vocab.py: Accumulation`",
        "[the design](DESIGN.md#layers), `docs/results/*.json`, `studies/<model>/study.json`",
        "https://github.com/pytorch/pytorch/blob/main/quant/gone.py and ../shared/data/x.json",
        "`quantstudy.record.StudyRecord`, `quantstudy.quant.kernels.gemm.fp8_gemm_triton`",
        "`docs/results/<name>.json`, the ONNX key `quantstudy.precision`",
        "tools/device/quantstudy.sh",
    ],
)
def test_paths_that_exist_or_are_no_tree_paths_pass(text):
    assert missing_in(text, REPO / "docs" / "note.md") == []


def test_a_path_resolves_against_the_naming_files_folders():
    """In report/render.py, `sections/tables.py` is report/sections/tables.py; in a doc it is
    no file of the tree."""
    text = "tables declared in `sections/tables.py`"
    assert missing_in(text, PACKAGE / "report" / "render.py") == []
    assert missing_in(text, REPO / "docs" / "note.md") == ["sections/tables.py"]


def test_what_the_tools_write_into_ignored_folders_is_no_path_of_the_tree(tmp_path):
    """`make demo` writes `studies/` into the checkout (ignored by git): a path named there is
    no path of the tree, whether its folder exists or not, and a file a tool leaves in an
    ignored folder does not make a name true; a file git tracks there does."""
    repo = tmp_path / "repo"
    for folder in ("docs", "src/quantstudy/zoo", "studies/m", "docs/scratch"):
        (repo / folder).mkdir(parents=True)
    (repo / ".gitignore").write_text("studies/\ndocs/scratch/\n/zoo/\n")
    (repo / "docs" / "note.md").write_text("a note\n")
    (repo / "studies" / "m" / "searched.yaml").write_text("written by a run\n")
    (repo / "docs" / "scratch" / "left.md").write_text("written by a tool\n")
    (repo / "docs" / "scratch" / "kept.md").write_text("tracked\n")
    (repo / "zoo").mkdir()
    (repo / "zoo" / "board.md").write_text("written by `quantstudy zoo`\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", ".gitignore", "docs/note.md"], check=True)
    subprocess.run([*git, "add", "-f", "docs/scratch/kept.md"], check=True)
    tree = Tree.of(repo)
    note = repo / "docs" / "note.md"
    assert "studies/" in tree.ignored and "zoo/" in tree.ignored
    assert missing_in("`studies/m/searched.yaml`", note, tree) == []  # no root: not a tree path
    text = "`docs/scratch/left.md`, `docs/scratch/kept.md`, `zoo/board.md`, [l](scratch/left.md)"
    stale = ["scratch/left.md", "docs/scratch/left.md", "zoo/board.md"]
    assert missing_in(text, note, tree) == stale
    without_git = Tree(repo)  # an sdist: every file on disk is the tree's
    assert missing_in(text, note, without_git) == []
