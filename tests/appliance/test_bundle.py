"""The offline bundle's installer refuses, before it touches anything, a bundle built for another machine or one
whose files do not match their checksums; and `make bundle` (slow: it gathers every wheel of the pinned set) makes
a bundle that this machine's installer accepts."""

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from appliance import bundle
from tests.conftest import ROOT


@pytest.fixture
def small_bundle(tmp_path) -> Path:
    """A bundle of the real layout with a few files, its manifest written by appliance/bundle.py."""
    root = tmp_path / "ai-factory-0.1.0-test"
    (root / "wheels").mkdir(parents=True)
    (root / "wheels" / "example-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 a wheel's bytes")
    (root / "requirements.txt").write_text("example==1.0\n")
    with tarfile.open(root / "release.tar", "w") as release:
        release.add(ROOT / "manage.py", arcname="manage.py")
    shutil.copy(ROOT / "appliance" / "install.sh", root / "install.sh")
    shutil.copy(ROOT / "appliance" / "bundle.py", root / "bundle.py")
    bundle.write_manifest(root, "0.1.0+test", "test")
    return root


def _install(root: Path, prefix: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "install.sh"), "--prefix", str(prefix), "--user", "aif-bundle-test",
                           "--no-start"], capture_output=True, text=True, timeout=120)


def _nothing_installed(prefix: Path) -> bool:
    known_user = subprocess.run(["id", "-u", "aif-bundle-test"], capture_output=True).returncode == 0
    return not prefix.exists() and not known_user


def test_a_bundle_for_another_architecture_is_refused_naming_what_it_was_built_for(small_bundle, tmp_path):
    manifest = json.loads((small_bundle / "manifest.json").read_text())
    manifest["built_for"]["arch"] = "riscv64"
    (small_bundle / "manifest.json").write_text(json.dumps(manifest))
    here = bundle.this_machine()

    refused = _install(small_bundle, tmp_path / "prefix")

    assert refused.returncode == 2
    assert f"this bundle was built for {here['os']} {here['os_version']} on riscv64" in refused.stderr
    assert f"this machine is {here['os']} {here['os_version']} on {here['arch']}" in refused.stderr
    assert _nothing_installed(tmp_path / "prefix")


def test_a_damaged_bundle_is_refused_before_anything_is_touched(small_bundle, tmp_path):
    wheel = small_bundle / "wheels" / "example-1.0-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0x01
    wheel.write_bytes(bytes(data))

    refused = _install(small_bundle, tmp_path / "prefix")

    assert refused.returncode == 2
    assert "wheels/example-1.0-py3-none-any.whl does not match its checksum in the manifest (damaged)" in \
        refused.stderr
    assert "Nothing was installed or changed" in refused.stderr
    assert _nothing_installed(tmp_path / "prefix")


def test_a_file_slipped_into_the_bundle_or_one_missing_is_refused(small_bundle):
    (small_bundle / "wheels" / "extra-2.0-py3-none-any.whl").write_bytes(b"PK")
    with pytest.raises(bundle.BundleRefused, match="extra-2.0-py3-none-any.whl is not listed"):
        bundle.verify(small_bundle)
    (small_bundle / "wheels" / "extra-2.0-py3-none-any.whl").unlink()
    (small_bundle / "requirements.txt").unlink()
    with pytest.raises(bundle.BundleRefused, match="requirements.txt is missing from the bundle"):
        bundle.verify(small_bundle)


@pytest.fixture(scope="module")
def built_bundle(tmp_path_factory) -> dict:
    """`make bundle`, unpacked."""
    out = tmp_path_factory.mktemp("bundle")
    built = subprocess.run(["scripts/bundle.sh"], cwd=ROOT, env={**os.environ, "FACTORY_BUNDLE_DIR": str(out)},
                           capture_output=True, text=True, timeout=3500)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    print(built.stdout)
    archive, = out.glob("ai-factory-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(out / "unpacked", filter="data")
    root, = (out / "unpacked").iterdir()
    return {"archive": archive, "root": root}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_make_bundle_builds_an_archive_this_machine_accepts(built_bundle):
    root = built_bundle["root"]
    manifest = bundle.verify(root)
    names = set(manifest["files"])
    assert {"install.sh", "bundle.py", "release.tar", "requirements.txt"} <= names
    assert any(name.startswith("wheels/llama_cpp_python-") for name in names)
    assert any(name.startswith("wheels/torch-") for name in names)
    assert {"llama/bin/llama-server", "llama/bin/llama-quantize"} <= names
    assert any(name.startswith("debs/redis-server_") for name in names)
    with tarfile.open(root / "release.tar") as release:  # the vendored browser libraries: the appliance has no npm
        assert "static/vendor/drawflow/drawflow.min.js" in release.getnames()
    pinned = (root / "requirements.txt").read_text().splitlines()
    wheels = [name.split("/")[1].split("-")[0].lower().replace("_", "-") for name in names
              if name.startswith("wheels/")]
    assert all(line.split("==")[0].lower().replace("_", "-") in wheels for line in pinned if "==" in line)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.geteuid() != 0, reason="the installer creates a system user and installs Debian packages")
def test_the_bundle_installs_with_no_network_and_ingests_and_chats(built_bundle, tmp_path):
    """install.sh in a network namespace with loopback only: the services start under the supervisor (systemd is
    not PID 1 here), then appliance/smoke.py ingests a document and has a chat answered, in that namespace."""
    prefix, user = tmp_path / "prefix", "aif-offline-test"
    installed = subprocess.run(
        ["unshare", "-n", "bash", "-c", f"ip link set lo up && bash {built_bundle['root']}/install.sh --prefix "
         f"{prefix} --user {user} --units-dir {prefix}/units"], capture_output=True, text=True, timeout=3000)
    try:
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        print(installed.stdout)
        assert "login:    admin / " in installed.stdout
        assert "FACTORY_ADMIN_PASSWORD" not in (prefix / "env").read_text()
        supervisor = (prefix / "supervise.pid").read_text().strip()
        in_namespace = ["nsenter", "-t", supervisor, "-n"]
        reachable = subprocess.run([*in_namespace, "curl", "-sS", "-m", "5", "https://pypi.org"], capture_output=True)
        assert reachable.returncode != 0  # no network in there
        smoke = subprocess.run([*in_namespace, str(prefix / "current" / ".venv" / "bin" / "python"),
                                str(prefix / "current" / "appliance" / "smoke.py"), "--prefix", str(prefix)],
                               capture_output=True, text=True, timeout=1800)
        print(smoke.stdout)
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
        assert "chat answered" in smoke.stdout
    finally:
        subprocess.run([str(prefix / "current" / "appliance" / "supervise.sh"), "stop"],
                       env={**os.environ, "FACTORY_PREFIX": str(prefix)}, capture_output=True, timeout=300)
        subprocess.run(["userdel", user], capture_output=True)
