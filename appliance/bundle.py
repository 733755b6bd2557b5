"""The offline bundle's manifest: what it was built for and each file's sha256 (`make bundle` writes it, install.sh
checks it before it touches anything). Standard library only: it runs on a machine that has nothing else yet.

    python3 appliance/bundle.py manifest DIR --version V    write DIR/manifest.json for the files under DIR
    python3 appliance/bundle.py verify DIR                  refuse a bundle for another machine, or a damaged one
"""

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

FORMAT = "ai-factory-bundle"
MANIFEST = "manifest.json"


class BundleRefused(Exception):
    """The bundle cannot be installed here; the message says why. Nothing was changed."""


def this_machine() -> dict:
    release = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        key, _, value = line.partition("=")
        release[key] = value.strip('"')
    return {"arch": platform.machine(), "os": release.get("ID", "unknown"),
            "os_version": release.get("VERSION_ID", "unknown"),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file() and path.name != MANIFEST)


def write_manifest(root: Path, version: str, commit: str) -> dict:
    files = {path.relative_to(root).as_posix(): {"sha256": _sha256(path), "size": path.stat().st_size}
             for path in _files(root)}
    manifest = {"format": FORMAT, "version": version, "commit": commit, "built_for": this_machine(), "files": files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def verify(root: Path, machine: dict | None = None) -> dict:
    """The bundle's manifest, once it is known to be for this machine and every file matches it."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BundleRefused(f"{root} has no readable {MANIFEST} ({exc}); it is not an AI Factory bundle")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleRefused(f"{root}/{MANIFEST} is not an AI Factory bundle's manifest")
    built_for, here = manifest["built_for"], machine or this_machine()
    if {key: built_for.get(key) for key in here} != here:
        raise BundleRefused(
            f"this bundle was built for {built_for['os']} {built_for['os_version']} on {built_for['arch']} with "
            f"Python {built_for['python']}; this machine is {here['os']} {here['os_version']} on {here['arch']} "
            f"with Python {here['python']}. Build one here with `make bundle`")
    listed = manifest["files"]
    present = {path.relative_to(root).as_posix() for path in _files(root)}
    for name in sorted(set(listed) - present):
        raise BundleRefused(f"{name} is missing from the bundle (damaged)")
    for name in sorted(present - set(listed)):
        raise BundleRefused(f"{name} is not listed in the bundle's manifest")
    for name, expected in sorted(listed.items()):
        if _sha256(root / name) != expected["sha256"]:
            raise BundleRefused(f"{name} does not match its checksum in the manifest (damaged)")
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("manifest")
    made.add_argument("root", type=Path)
    made.add_argument("--version", required=True)
    made.add_argument("--commit", default="")
    checked = commands.add_parser("verify")
    checked.add_argument("root", type=Path)
    args = parser.parse_args()
    if args.command == "manifest":
        manifest = write_manifest(args.root, args.version, args.commit)
        print(f"==> manifest: {len(manifest['files'])} files, built for {manifest['built_for']}")
        return 0
    try:
        manifest = verify(args.root)
    except BundleRefused as exc:
        print(f"error: the bundle was refused: {exc}. Nothing was installed or changed.", file=sys.stderr)
        return 2
    print(f"==> bundle {manifest['version']}: {len(manifest['files'])} files checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
