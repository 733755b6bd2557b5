#!/usr/bin/env bash
# make bundle: one archive that installs AI Factory with no network on a machine like this one (same OS release, CPU
# architecture and Python): dist/ai-factory-<version>-<arch>.tar.gz (gzip: every
# Debian install can unpack it). README "Appliance".
#   release.tar        this checkout's files (tracked and new, not ignored), translations compiled, the vendored
#                      browser libraries (static/vendor/, scripts/vendor-js.sh)
#   requirements.txt   the pinned set, resolved for Debian's Python
#   wheels/            a wheel for each of them (the preset models are PyPI packages too), llama-cpp-python's included
#   llama/             the llama.cpp tools and shared libraries built for this CPU (scripts/build-llama.sh)
#   debs/              the Debian packages the platform installs and what they need beyond a base Debian install
#   install.sh         the offline installer (appliance/install.sh), and bundle.py, its check of this manifest
#   manifest.json      the version, what it was built for and every file's sha256 (appliance/bundle.py)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install.sh
scripts/system-deps.sh gettext
scripts/compile-messages.sh
CACHE=${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}
out=${FACTORY_BUNDLE_DIR:-$PWD/dist}
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit-modified"
version="$(grep -m1 '^version' pyproject.toml | cut -d'"' -f2)+$commit"
name="ai-factory-$version-$(uname -m)"
mkdir -p "$out"
stage=$(mktemp -d "$out/.staging.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
mkdir -p "$root/wheels" "$root/debs" "$root/llama"

echo "==> release files"
{ git ls-files -co --exclude-standard; find locale -name '*.mo'; find static/vendor -type f; } | sort -u \
  | while read -r path; do
  [ -f "$path" ] && printf '%s\0' "$path"
done | tar --null -T - -cf "$root/release.tar"

echo "==> wheels of the pinned set, for Debian's Python"
# Resolved for the interpreter the appliance runs, Debian's: its patch release can differ from this venv's, and so
# can the environment markers of the pinned set (redis needs async-timeout below Python 3.11.3).
python_version=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
target_python=/usr/bin/python$python_version
[ -x "$target_python" ] || { echo "error: the bundle is built for Debian's $target_python, which is missing" >&2; exit 1; }
"$target_python" -m venv "$stage/venv"
llama_version=$(grep -iE '^llama[-_]cpp[-_]python==' requirements/constraints.txt | cut -d= -f3)
llama="$CACHE/llama.cpp/$llama_version"
# pip wheel takes a published wheel as it is and builds one from a package published as source only; the
# llama-cpp-python wheel comes from the llama.cpp build (scripts/install.sh).
# Built from a copy of the release, so that nothing is written into this checkout.
mkdir "$stage/src" && tar -xf "$root/release.tar" -C "$stage/src"
"$stage/venv/bin/pip" wheel --disable-pip-version-check -c requirements/constraints.txt --find-links "$llama/wheel" \
  -w "$root/wheels" "$stage/src[ray]" >"$stage/pip.log" 2>&1 || {
  echo "error: the pinned set does not resolve for $target_python ($("$target_python" -V)):" >&2
  grep -v "is ignored: it is neither" "$stage/pip.log" | tail -12 >&2
  exit 1
}
rm -f "$root"/wheels/ai_factory-*.whl
for wheel in "$root"/wheels/*.whl; do
  basename "$wheel" | awk -F- '{print $1 "==" $2}'
done >"$root/requirements.txt"

echo "==> llama.cpp tools and libraries"
cp -a "$llama/bin" "$llama/lib" "$root/llama/"

echo "==> Debian packages"
# What the platform installs (scripts/system-deps.sh, less the test browser), Python's venv module (a package of
# its own on Debian) and their dependencies, less the packages every Debian install has (priority required or
# important).
wanted=(redis-server bubblewrap libgl1 libglib2.0-0 "python$python_version-venv")
mapfile -t packages < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${wanted[@]}" | grep -E '^[a-z0-9]' | sort -u)
# Of alternatives (libsystemd0 or libelogind0), the one this machine chose: only packages installed here are kept.
mapfile -t keep < <(apt-cache show --no-all-versions "${packages[@]}" 2>/dev/null \
  | awk '/^Package: /{name=$2} /^Priority: /{if ($2 != "required" && $2 != "important") print name}' | sort -u \
  | while read -r package; do
      [ "$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null)" = "install ok installed" ] && echo "$package"
    done)
(cd "$root/debs" && apt-get download "${keep[@]}" >/dev/null)

cp appliance/install.sh appliance/bundle.py "$root/"
python3 appliance/bundle.py manifest "$root" --version "$version" --commit "$commit"
bundle="$out/$name.tar.gz"
tar -C "$stage" -czf "$bundle.partial" "$name"
mv "$bundle.partial" "$bundle"
echo "==> $bundle: $(du -h "$bundle" | cut -f1) (unpacked: $(du -sh "$root" | cut -f1))"
echo "    what takes the space (unpacked):"
du -sh "$root"/* | sort -rh | sed 's/^/      /'
echo "    the largest wheels:"
# awk reads to the end: a reader that stops early (head) kills the writer with SIGPIPE, and pipefail makes that
# this script's status (141) after the archive is complete.
du -h "$root"/wheels/*.whl | sort -rh | awk -F'\t' 'NR <= 5 {sub(".*/", "", $2); print "      " $1 " " $2}'
