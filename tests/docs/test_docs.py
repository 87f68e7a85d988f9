"""docs/: the site builds strictly, deploys as documented, and its code samples run.

Code samples follow one convention, checked here so the documentation cannot rot:

- every fenced block names its language;
- a ``python`` block runs as a script (``python -W error``, from a scratch directory)
  unless the line before it is ``<!-- not-runnable: REASON -->``;
- a ``bash`` block is a command line: the line before it is ``<!-- runnable -->`` (it
  runs under ``bash -euo pipefail`` from the repository root, with ``.venv/bin`` first on
  PATH) or ``<!-- not-runnable: REASON -->``;
- a ``text`` block preceded by ``<!-- output -->`` is what the runnable block before it
  prints, exactly: the messages the troubleshooting page quotes are the ones tfcoord
  prints today.

mkdocs runs as a subprocess: its plugins import with DeprecationWarnings that
``filterwarnings = error`` would turn into failures of this test process.

The strict build, ``make deploy`` end to end and the samples take about twenty seconds
together, so they are marked slow: ``make test-quick`` skips them, ``make test`` and CI
run them. The marker checks and the deploy script's tests (a local bare remote) stay quick.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = DOCS / "src"
BIN = Path(sys.executable).parent
MKDOCS = (sys.executable, "-m", "mkdocs")
#: MkDocs with its clock moved to another day (there is no faketime here).
OTHER_DAY = Path(__file__).resolve().parent / "otherday.py"

#: A sample that needs longer than this is a benchmark or a cluster, not a sample.
SAMPLE_TIMEOUT_S = 60
#: Languages that are code to run; anything else (text, ini, json) is shown, not run.
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>runnable|not-runnable|output)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: str  # "runnable", "not-runnable", "output" or ""
    reason: str
    #: The ``<!-- output -->`` block that follows this one, if any.
    output: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse(path: Path) -> list[Block]:
    """Every fenced block of one page, with the marker on the line before it."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(PAGES))
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        found = _FENCE.match(lines[i])
        if not found:
            i += 1
            continue
        indent, fence, lang = found["indent"], found["fence"], found["lang"]
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        mark = _MARK.match(prev)
        blocks.append(
            Block(
                page,
                start + 1,
                lang,
                "\n".join(body) + "\n",
                mark["kind"] if mark else "",
                (mark["reason"] or "") if mark else "",
            )
        )
    # Attach each output block to the block it follows.
    out: list[Block] = []
    for b in blocks:
        if b.mark == "output" and out:
            prev = out[-1]
            out[-1] = Block(prev.page, prev.line, prev.lang, prev.code, prev.mark, prev.reason, b.code)
        out.append(b)
    return out


ALL = [b for page in sorted(PAGES.rglob("*.md")) for b in parse(page)]
PYTHON_SAMPLES = [b for b in ALL if b.lang in PYTHON and b.mark != "not-runnable"]
SHELL_SAMPLES = [b for b in ALL if b.lang in SHELL and b.mark == "runnable"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Samples talk to coordinators they start themselves, never to one configured here.
    for name in (
        "TFCOORD_ADDRESS",
        "TFCOORD_SECRET_FILE",
        "TFCOORD_TLS_CA",
        "TFCOORD_TLS_CERT",
        "TFCOORD_TLS_KEY",
    ):
        env.pop(name, None)
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


def _check_output(block: Block, proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    if block.output is not None:
        got = [ln.rstrip() for ln in proc.stdout.rstrip("\n").splitlines()]
        want = [ln.rstrip() for ln in block.output.rstrip("\n").splitlines()]
        assert got == want, f"{block.id}: the page shows output that the sample no longer prints"


# -- the marker convention -------------------------------------------------------------


def test_pages_have_samples() -> None:
    assert len(PYTHON_SAMPLES) >= 5 and SHELL_SAMPLES, "the sample parser found nothing to run"


def test_every_fence_names_its_language() -> None:
    bare = [b.id for b in ALL if not b.lang]
    assert not bare, f"fenced blocks without a language (say text for prose output): {bare}"


def test_not_runnable_samples_say_why() -> None:
    silent = [b.id for b in ALL if b.mark == "not-runnable" and len(b.reason.strip()) < 10]
    assert not silent, f"<!-- not-runnable: REASON --> needs a reason: {silent}"


def test_every_shell_sample_is_marked() -> None:
    unmarked = [b.id for b in ALL if b.lang in SHELL and b.mark not in ("runnable", "not-runnable")]
    assert not unmarked, f"bash blocks need <!-- runnable --> or <!-- not-runnable: REASON -->: {unmarked}"


def test_output_blocks_follow_a_runnable_sample() -> None:
    # An output block is checked only against the sample right before it on its page.
    for prev, b in zip([None, *ALL], ALL, strict=False):
        if b.mark == "output":
            runs = prev is not None and prev.page == b.page and prev.lang in PYTHON + SHELL
            runs = runs and prev.mark != "not-runnable"
            assert runs, f"{b.id}: <!-- output --> must follow a runnable sample"


#: The routing cues of the two systems tfcoord replaces (TensorFlowOnSpark's cluster
#: life-cycle guide, tfmesos2's troubleshooting): each is a heading of its own.
SYMPTOMS = (
    "The cluster hangs waiting for reservations",
    "Duplicate executor id",
    "TensorBoard URL missing",
    "TF_CONFIG not set",
    "GPU allocation failed",
    "Background mode on Windows",
    "`spark.python.worker.reuse`",
    "Running several independent TensorFlow jobs on Spark executors",
    "Readiness timeout",
    "No matching offers",
    "TLS or authentication errors",
    "TensorFlow does not start",
)


def test_troubleshooting_has_every_symptom() -> None:
    headings = {
        ln.lstrip("#").strip()
        for ln in (PAGES / "troubleshooting.md").read_text().splitlines()
        if ln.startswith("#")
    }
    missing = [s for s in SYMPTOMS if not any(h.startswith(s) for h in headings)]
    assert not missing, f"troubleshooting.md lost its section on: {missing}"


# -- the samples ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_SAMPLES, ids=lambda b: b.id)
def test_python_sample_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "sample.py"
    script.write_text(block.code)
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=SAMPLE_TIMEOUT_S,
        check=False,
    )
    _check_output(block, proc)


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL_SAMPLES, ids=lambda b: b.id)
def test_shell_sample_runs(block: Block) -> None:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=SAMPLE_TIMEOUT_S,
        check=False,
    )
    _check_output(block, proc)


def test_cli_reference_names_every_flag() -> None:
    from tfcoord.cli import build_parser

    page = (PAGES / "reference" / "cli.md").read_text()
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, sub in [("", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and f"`{flag}" not in page:
                    missing.append(f"tfcoord {name} {flag}".replace("  ", " "))
    assert not missing, f"docs/src/reference/cli.md does not describe: {missing}"


# -- the build --------------------------------------------------------------------------


@pytest.mark.slow
def test_strict_build(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [*MKDOCS, "build", "--strict", "--site-dir", str(site)],
        cwd=DOCS,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    # The API reference was rendered from the docstrings, not left as ::: directives.
    client = (site / "reference" / "client" / "index.html").read_text()
    assert "tfcoord.client.client.DriverClient" in client and "await_job" in client
    assert ":::" not in client
    assert (site / "troubleshooting" / "index.html").is_file()


def test_makefile_builds_before_deploying() -> None:
    proc = subprocess.run(
        ["make", "-n", "-C", str(DOCS), "deploy", "DEPLOY_REMOTE=r", "DEPLOY_BRANCH=b"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("make")]
    assert "build --strict" in lines[0], lines
    assert lines[-1].strip() == './deploy.sh "site" "r" "b"', lines


# -- deploy -----------------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _git_bytes(*args: str, cwd: Path) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True).stdout


@pytest.fixture
def project(tmp_path: Path) -> dict[str, Path]:
    """A repository with docs/deploy.sh and a 'built' site, and a bare remote (origin)."""
    repo, remote, site = tmp_path / "repo", tmp_path / "remote.git", tmp_path / "site"
    subprocess.run(["git", "init", "--quiet", "--bare", str(remote)], check=True)
    (repo / "docs").mkdir(parents=True)
    shutil.copy(DOCS / "deploy.sh", repo / "docs" / "deploy.sh")
    (repo / "README.md").write_text("code, not site\n")
    _git("init", "--quiet", "-b", "main", cwd=repo)
    _git("config", "user.email", "dev@example.invalid", cwd=repo)
    _git("config", "user.name", "dev", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "--quiet", "-m", "code", cwd=repo)
    _git("remote", "add", "origin", str(remote), cwd=repo)
    site.mkdir()
    (site / "index.html").write_text("<h1>tfcoord</h1>\n")
    (site / "_assets").mkdir()
    (site / "_assets" / "style.css").write_text("h1 {}\n")
    return {"repo": repo, "remote": remote, "site": site, "worktree": tmp_path / "worktree"}


def _deploy(
    p: dict[str, Path], remote: str = "origin", cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "WORKTREE": str(p["worktree"])}
    script = p["repo"] / "docs" / "deploy.sh"
    return subprocess.run(
        ["bash", str(script), str(p["site"]), remote, "gh-pages"],
        cwd=cwd or p["repo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _remote_head(p: dict[str, Path]) -> str:
    return _git("rev-parse", "--verify", "--quiet", "refs/heads/gh-pages", cwd=p["remote"])


def _left_clean(p: dict[str, Path]) -> None:
    assert not p["worktree"].exists(), "the deploy worktree was left behind"
    assert _git("worktree", "list", "--porcelain", cwd=p["repo"]).count("worktree ") == 1
    assert _git("branch", "--list", cwd=p["repo"]).split() == ["*", "main"], "a temporary branch was left"


def test_deploy_pushes_only_changes(project: dict[str, Path]) -> None:
    first = _deploy(project)
    assert first.returncode == 0, first.stderr
    assert "orphan" in first.stdout
    head = _remote_head(project)
    files = _git("ls-tree", "-r", "--name-only", head, cwd=project["remote"]).split()
    assert sorted(files) == [".nojekyll", "_assets/style.css", "index.html"]  # the site alone, no code
    _left_clean(project)

    again = _deploy(project)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout
    assert _remote_head(project) == head
    _left_clean(project)

    (project["site"] / "index.html").write_text("<h1>tfcoord, revised</h1>\n")
    changed = _deploy(project)
    assert changed.returncode == 0, changed.stderr
    new = _remote_head(project)
    assert new != head
    assert _git("rev-parse", f"{new}^", cwd=project["remote"]) == head  # history grows, nothing forced
    assert "revised" in _git("show", f"{new}:index.html", cwd=project["remote"])
    _left_clean(project)


def test_deploy_to_a_relative_remote_path(project: dict[str, Path]) -> None:
    """A relative path is taken from where deploy.sh runs (docs/ under make -C docs), once:
    not from the repository for ls-remote and fetch and from the worktree for push."""
    docs = project["repo"] / "docs"
    first = _deploy(project, remote="../../remote.git", cwd=docs)
    assert first.returncode == 0, first.stderr
    head = _remote_head(project)
    assert "index.html" in _git("ls-tree", "--name-only", head, cwd=project["remote"]).split()
    again = _deploy(project, remote="../../remote.git", cwd=docs)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout and _remote_head(project) == head
    _left_clean(project)


def test_deploy_publishes_site_files_that_git_excludes_would_hide(
    project: dict[str, Path], tmp_path: Path
) -> None:
    """The worktree shares the repository's .git/info/exclude, and the user's global excludes
    apply in it too: neither may drop a file of the site."""
    site = project["site"]
    (site / "sitemap.xml.gz").write_bytes(gzip.compress(b"<urlset/>\n", mtime=0))
    (site / "_assets" / "app.min.js").write_text("let x;\n")
    (project["repo"] / ".git" / "info" / "exclude").write_text("*.gz\n")
    excludes, config = tmp_path / "global-excludes", tmp_path / "global-gitconfig"
    excludes.write_text("*.js\n")
    config.write_text(f"[core]\n\texcludesFile = {excludes}\n")
    proc = _deploy(project, env={"GIT_CONFIG_GLOBAL": str(config)})
    assert proc.returncode == 0, proc.stderr
    files = _git("ls-tree", "-r", "--name-only", _remote_head(project), cwd=project["remote"]).split()
    assert sorted(files) == [
        ".nojekyll",
        "_assets/app.min.js",
        "_assets/style.css",
        "index.html",
        "sitemap.xml.gz",
    ]
    _left_clean(project)


def test_deploy_refuses_an_existing_worktree_path(project: dict[str, Path]) -> None:
    project["worktree"].mkdir()
    (project["worktree"] / "someone-elses").write_text("keep me\n")
    proc = _deploy(project)
    assert proc.returncode != 0
    assert "already exists" in proc.stderr
    assert (project["worktree"] / "someone-elses").read_text() == "keep me\n"  # not ours to delete
    assert not _git("ls-remote", "--heads", str(project["remote"]), cwd=project["repo"])


def test_deploy_cleans_up_when_the_push_fails(project: dict[str, Path]) -> None:
    hook = project["remote"] / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'remote says no' >&2\nexit 1\n")
    hook.chmod(0o755)
    proc = _deploy(project)
    assert proc.returncode != 0
    assert "remote says no" in proc.stderr
    _left_clean(project)


def test_deploy_refuses_an_unbuilt_site(project: dict[str, Path]) -> None:
    (project["site"] / "index.html").unlink()
    proc = _deploy(project)
    assert proc.returncode != 0 and "build the site first" in proc.stderr
    assert not project["worktree"].exists()


@pytest.mark.slow
def test_make_deploy_publishes_the_real_site_once(tmp_path: Path) -> None:
    """`make -C docs deploy` end to end: a real strict build, pushed once, then unchanged,
    although the second build runs "on another day" (MkDocs' clock moved by otherday.py)."""
    clone, remote = tmp_path / "clone", tmp_path / "site.git"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    # The pages as they are now, committed or not (the code is the clone's, from HEAD).
    shutil.copytree(DOCS, clone / "docs", dirs_exist_ok=True, ignore=shutil.ignore_patterns("site"))
    subprocess.run(["git", "init", "--quiet", "--bare", str(remote)], check=True)

    def make(day: str) -> list[str]:
        return [
            "make",
            "-C",
            str(clone / "docs"),
            "deploy",
            f"DEPLOY_REMOTE={remote}",
            "DEPLOY_BRANCH=gh-pages",
            f"MKDOCS={sys.executable} {OTHER_DAY} {day}",
        ]

    env = {**_env(), "WORKTREE": str(tmp_path / "worktree")}
    env.pop("SOURCE_DATE_EPOCH", None)  # the Makefile's own, from the pages' last commit

    first = subprocess.run(
        make("2031-03-01"), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert first.returncode == 0, first.stdout + first.stderr
    head = _git("rev-parse", "refs/heads/gh-pages", cwd=remote)
    files = _git("ls-tree", "-r", "--name-only", head, cwd=remote).split()
    assert {
        "index.html",
        "reference/client/index.html",
        "troubleshooting/index.html",
        ".nojekyll",
        "sitemap.xml.gz",
    } <= set(files)
    # The sitemap's gzip header carries the day (MkDocs keeps midnight UTC) of the pages' last
    # commit, not the clock's.
    stamped = int.from_bytes(_git_bytes("show", f"{head}:sitemap.xml.gz", cwd=remote)[4:8], "little")
    epoch = int(_git("log", "-1", "--format=%ct", "--", "src", "mkdocs.yml", cwd=clone / "docs"))
    assert stamped == epoch - epoch % 86400

    # The same pages built on another day render the same bytes, so nothing is pushed.
    again = subprocess.run(
        make("2031-03-02"), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "unchanged" in again.stdout
    assert _git("rev-parse", "refs/heads/gh-pages", cwd=remote) == head
    assert not (tmp_path / "worktree").exists()
