"""Every file the documentation names is in the repository: a reader who follows a path (a module, a
test, a benchmark's result) finds it in a clone, not only on the machine the docs were written on.
The documentation is README.md, the site's pages (docs/) and the benchmarks' history (bench/results/).

The repository is what ``git ls-files`` lists, so a file that exists here but is ignored (a benchmark's
result left uncommitted) counts as missing, as it is in a fresh clone.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
RESULTS = "bench/results"
# A benchmark result cited by its name alone, after the first one with its folder: `20261202T220421Z.json`.
RESULT_NAME = re.compile(r"(?:[a-z]+-)?\d{8}T\d{6}Z\.json")
PLACEHOLDER = re.compile(r"[<>*{}$]")


def documents() -> list[Path]:
    """README.md, every page of docs/ and the Markdown files of bench/results/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / RESULTS).glob("*.md"))]


def tracked_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return set(listed.stdout.decode().split("\0")) - {""}


def named_paths(text: str, top_folders: set[str]) -> list[str]:
    """The repository paths ``text`` names in backticks: a token under one of ``top_folders``
    (``app/adapters/kafka/batches.py``, ``tests/unit/``, ``app/x.py:function``) or a result's bare name."""
    paths = []
    for token in re.findall(r"`([^`\s]+)`", text):
        if PLACEHOLDER.search(token):
            continue
        path = token.split(":", 1)[0].removeprefix("./")
        if RESULT_NAME.fullmatch(path):
            paths.append(f"{RESULTS}/{path}")
        elif "/" in path and path.split("/", 1)[0] in top_folders:
            paths.append(path.rstrip("/"))
    return paths


def test_the_documentation_names_only_files_the_repository_has():
    files = tracked_files()
    folders = {name.rsplit("/", 1)[0] for name in files if "/" in name}
    folders |= {parent for folder in folders for parent in _parents(folder)}
    tops = {name.split("/", 1)[0] for name in folders}
    for document in documents():
        named = named_paths(document.read_text(), tops)
        missing = sorted({path for path in named if path not in files and path not in folders})
        assert missing == [], (f"{document.relative_to(ROOT)} names {len(missing)} path(s) a clone does not have "
                               f"(an ignored file is committed with `git add -f`): {missing}")
    everything = "\n".join(document.read_text() for document in documents())
    assert named_paths(everything, tops), "no repository path found in the docs: the test would pass on anything"


def _parents(folder: str) -> list[str]:
    parts = folder.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def test_a_bare_result_name_is_read_as_a_file_of_the_results_folder():
    text = "runs `bench/results/20261202T215659Z.json`, `20261202T220421Z.json`, `bulk-20261201T205239Z.json`"
    assert named_paths(text, {"bench"}) == [f"{RESULTS}/20261202T215659Z.json", f"{RESULTS}/20261202T220421Z.json",
                                            f"{RESULTS}/bulk-20261201T205239Z.json"]


def test_commands_placeholders_and_outside_folders_are_not_paths():
    text = ("`make bench`, `bench/results/<UTC timestamp>.json`, `.cache/bench/`, `python -m bench.run`, "
            "`app/pipeline/plan.py:plan_batch`, `tests/unit/`, `/usr/sbin/mariadbd`")
    assert named_paths(text, {"app", "tests", "bench"}) == ["app/pipeline/plan.py", "tests/unit"]


def architecture(text: str) -> str:
    """The module map: the Architecture page up to its section on running two workers."""
    return text[:text.index("## Running two workers")]


def modules_not_in(section: str, modules: list[Path]) -> list[str]:
    """The modules of ``modules`` whose file name the section never says (``__init__.py`` aside)."""
    return sorted(str(path.relative_to(ROOT)) for path in modules
                  if path.name != "__init__.py" and not re.search(rf"\b{re.escape(path.name)}\b", section))


def test_the_architecture_page_names_every_module_of_app():
    missing = modules_not_in(architecture(ARCHITECTURE.read_text()), sorted((ROOT / "app").rglob("*.py")))
    assert not missing, f"docs/architecture.md should say what these are: {missing}"


def test_the_readme_fits_on_a_screen_and_a_half():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/ (at most 250)"


def test_the_site_has_a_page_for_every_file_of_docs():
    """Every page of docs/ is in mkdocs.yml's nav, and every page of the nav exists."""
    import yaml

    def pages(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [page for item in entry for page in pages(item)]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in pages(value)]
        return []

    nav = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = sorted(str(page.relative_to(ROOT / "docs")) for page in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == on_disk


def test_a_module_the_architecture_does_not_name_is_found():
    assert modules_not_in("pipeline/ plan.py batch.py", [ROOT / "app/pipeline/plan.py", ROOT / "app/pipeline/x.py",
                                                       ROOT / "app/pipeline/__init__.py"]) == ["app/pipeline/x.py"]
