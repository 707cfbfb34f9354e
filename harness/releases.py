"""Earlier releases, built from their commits, for the tests that run them beside the current code
(the rolling upgrade, the schema rule).

``ops/releases.toml`` lists every release and the commit it was built from. :func:`release` makes a
source tree of that commit (``git archive``: the repository's own history, no network) and a
virtualenv of its own with the release's pinned dependencies, once, in
``.cache/releases/<version>-<commit>/`` (as the Kafka jars and Jaeger are cached), and says how to
run it: its ``faust``, its Python, its source folder. A fresh clone builds it once (a minute or
two: the packages come from the pip cache or PyPI).

    previous = previous_release()
    previous.faust            # .cache/releases/1.0.0-03930b5cf054/venv/bin/faust
    previous.src              # its source tree: run it with cwd=previous.src
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ROOT / "ops" / "releases.toml"
CACHE = ROOT / ".cache" / "releases"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    home: Path

    @property
    def src(self) -> Path:
        return self.home / "src"

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def faust(self) -> Path:
        return self.venv / "bin" / "faust"

    @property
    def built(self) -> bool:
        return (self.home / ".complete").is_file()

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment that runs this release's code (its source first on the path), never ours."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = str(self.src)
        env.pop("VIRTUAL_ENV", None)
        return env

    def migrate(self, url: str, revision: str = "head") -> None:
        """Migrate the database at ``url`` with this release's own migrations, by its own alembic run
        from its source tree, as its operators did: a database that is where this release left it."""
        done = subprocess.run([str(self.python), "-m", "alembic", "-x", f"url={url}", "upgrade", revision],
                              cwd=self.src, env=self.env(), capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"release {self.version}'s migrations failed ({done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")


def releases() -> list[tuple[str, str]]:
    """(version, commit) of every release, oldest first."""
    listed = tomllib.loads(RELEASES.read_text())["release"]
    return [(entry["version"], entry["commit"]) for entry in listed]


def current_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("version") or _version_attr()


def _version_attr() -> str:
    # pyproject.toml may read the version from app/version.py (dynamic): read it without importing app.
    text = (ROOT / "app" / "version.py").read_text()
    for line in text.splitlines():
        if line.startswith("VERSION"):
            return line.split("=", 1)[1].strip().strip('"\'')
    raise LookupError("no VERSION in app/version.py")


def _key(version: str) -> Version:
    return Version(version)


def previous_release() -> Release:
    """The newest release older than the current code's version, built."""
    now = _key(current_version())
    older = [(v, c) for v, c in releases() if _key(v) < now]
    if not older:
        raise LookupError(f"ops/releases.toml lists no release older than {current_version()}")
    version, commit = max(older, key=lambda vc: _key(vc[0]))
    return release(version, commit)


def release(version: str, commit: str) -> Release:
    """The release ``version`` built from ``commit`` (once; later calls find it in the cache)."""
    made = Release(version, commit, CACHE / f"{version}-{commit[:12]}")
    if made.built:
        return made
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # two test processes building it at once: one builds
        if not made.built:
            _build(made)
    return made


def _build(made: Release) -> None:
    if made.home.exists():
        shutil.rmtree(made.home)
    made.src.mkdir(parents=True)
    archive = made.home / "src.tar"
    try:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), made.commit],
                       check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"release {made.version}: commit {made.commit} is not in this clone's history "
                           f"({exc.stderr.strip()}); fetch it (git fetch --unshallow) or the tag v{made.version}") from None
    with tarfile.open(archive) as tar:
        tar.extractall(made.src, filter="data")
    archive.unlink()
    log = made.home / "build.log"
    with open(log, "w") as out:
        steps = [[sys.executable, "-m", "venv", str(made.venv)],
                 [str(made.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade", "pip"],
                 [str(made.python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  "-e", f"{made.src}[test]"]]
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, cwd=made.src).returncode:
                raise RuntimeError(f"release {made.version} could not be built: {' '.join(step)} failed; read {log}")
    (made.home / ".complete").write_text(f"{made.version} {made.commit}\n")


if __name__ == "__main__":      # python -m harness.releases: build the previous release now (make test-tools)
    built = previous_release()
    print(f"release {built.version} ({built.commit[:12]}) in {built.home}")
