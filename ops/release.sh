#!/usr/bin/env bash
# Release the order-event processor: `make release VERSION=1.1.0` (or ops/release.sh 1.1.0).
#
# On a clean checkout of main whose app/version.py, the Helm chart's Chart.yaml (version and
# appVersion) and docs/openapi.yaml say VERSION and whose CHANGELOG.md has a section for it
# (`## [VERSION] - YYYY-MM-DD`), this:
#   1. builds the sdist and the wheel into dist/ (python -m build: isolated, from pyproject.toml);
#   2. checks the wheel holds what a worker needs and nothing else (ops/check_wheel.py);
#   3. tags the commit vVERSION;
#   4. records VERSION and the commit in ops/releases.toml, in a commit of its own (a tag does not
#      travel with every clone; the rolling-upgrade and schema-rule tests build earlier releases from
#      the commits listed there).
# Then: push main and the tag, publish dist/*, and set app/version.py to the next development version
# (`X.Y.Z.dev0`) with an empty `## [Unreleased]` section in the changelog.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"

version="${1:-}"
[ -n "$version" ] || { echo "usage: make release VERSION=X.Y.Z" >&2; exit 2; }
die() { echo "release $version: $*" >&2; exit 1; }

[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "a release's version is X.Y.Z (semantic versioning)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || die "the checkout has uncommitted changes"
coded=$("$PY" -c 'from app.version import VERSION; print(VERSION)')
[ "$coded" = "$version" ] || die "app/version.py says $coded: set it to $version in the release's commit"
grep -Eq "^## \[$version\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$" CHANGELOG.md \
  || die "CHANGELOG.md has no section '## [$version] - YYYY-MM-DD'"
chart=deploy/helm/order-event-processor/Chart.yaml
grep -q "^version: $version$" "$chart" && grep -q "^appVersion: \"$version\"$" "$chart" \
  || die "$chart must say version: $version and appVersion: \"$version\" (the chart is released with the worker)"
grep -q "^  version: $version$" docs/openapi.yaml || die "docs/openapi.yaml's info.version must be $version"
! git rev-parse -q --verify "refs/tags/v$version" >/dev/null || die "the tag v$version exists already"
grep -q "^version = \"$version\"$" ops/releases.toml && die "ops/releases.toml lists $version already"

rm -rf dist
"$PY" -m build --outdir dist . >/dev/null
"$PY" ops/check_wheel.py dist/*.whl
commit=$(git rev-parse HEAD)
git tag -a "v$version" -m "order-event-processor $version"
printf '\n[[release]]\nversion = "%s"\ncommit = "%s"\ndate = "%s"\n' "$version" "$commit" "$(date -u +%F)" \
  >> ops/releases.toml
git add ops/releases.toml
git commit -q -m "Release $version recorded: commit ${commit:0:12}, tag v$version"
echo "released $version (${commit:0:12}):"
ls -1 dist/
