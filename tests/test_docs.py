"""The docs: a short README, and the docs site builds strictly (a broken link, anchor or a page left out of the nav fails)."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import REPO

MKDOCS = REPO / ".venv-docs" / "bin" / "mkdocs"


def build(project, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(project / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_the_docs_site_builds_strictly_and_fails_on_a_broken_link(tmp_path):
    assert MKDOCS.exists(), "make test installs .venv-docs (requirements-docs.lock)"
    project = tmp_path / "project"
    shutil.copytree(REPO / "docs", project / "docs")
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    done = build(project, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "params" / "index.html").is_file()
    with open(project / "docs" / "params.md", "a") as page:
        page.write("\nSee [the flow](no-such-page.md).\n")
    broken = build(project, tmp_path)
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr
