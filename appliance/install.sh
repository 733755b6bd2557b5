#!/usr/bin/env bash
# The offline installer, at the top of an unpacked bundle (`make bundle`; README "Appliance"). Needs no network:
#   sudo ./install.sh [--prefix /opt/ai-factory] [--user ai-factory] [--host 0.0.0.0] [--port 8000]
#                     [--units-dir /etc/systemd/system] [--python /usr/bin/python3.11] [--no-start]
# 1. checks the bundle (built for this OS, CPU and Python; every file matches its checksum) before touching anything;
# 2. installs the Debian packages that are missing, from debs/;
# 3. creates the system user, <prefix>/releases/<version> with its own venv (wheels/ only) and llama.cpp (llama/),
#    the data dir <prefix>/data, <prefix>/env and the `ai-factory` command;
# 4. on a prefix that already runs a release, upgrades it (`ai-factory upgrade`: backup, migrate, health check,
#    rollback on failure) instead;
# 5. writes the systemd units (appliance/units.py) and starts ai-factory.target, or, where systemd is not PID 1,
#    runs the same units under appliance/supervise.py; then prints the URL and the first admin's password.
set -euo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/ai-factory user=ai-factory host=0.0.0.0 port=8000 units_dir=/etc/systemd/system start=1 python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --user) user=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --units-dir) units_dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --no-start) start=0; shift ;;
    *) echo "usage: $0 [--prefix DIR] [--user NAME] [--host ADDR] [--port N] [--units-dir DIR] [--python PATH]" \
         "[--no-start]" >&2
       exit 2 ;;
  esac
done
started=$(date +%s)

# 1. The bundle, before anything is touched.
python3 "$bundle/bundle.py" verify "$bundle"
version=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$bundle/manifest.json")
# Debian's interpreter unless --python names another (one the services' user can run).
[ -n "$python" ] || python=/usr/bin/python$(python3 -c \
  'import json, sys; print(json.load(open(sys.argv[1]))["built_for"]["python"])' "$bundle/manifest.json")
[ "$(id -u)" -eq 0 ] || { echo "error: run the installer as root (sudo $0)" >&2; exit 1; }

# 2. Debian packages, from the bundle only.
missing=()
for deb in "$bundle"/debs/*.deb; do
  [ -e "$deb" ] || continue
  package=$(dpkg-deb -f "$deb" Package)
  # Compared whole, not piped into `grep -q`: under pipefail a reader that stops early can fail the pipe.
  [ "$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null)" = "install ok installed" ] || missing+=("$deb")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${#missing[@]} Debian packages from the bundle"
  DEBIAN_FRONTEND=noninteractive dpkg -i "${missing[@]}" >/dev/null
fi

# 3. The user, the release and the data dir.
# Its home holds what libraries cache (~/.cache); the releases stay root's and read-only to it.
id -u "$user" >/dev/null 2>&1 || useradd --system --home-dir "$prefix/home" --no-create-home \
  --shell /usr/sbin/nologin "$user"
release="$prefix/releases/$version"
mkdir -p "$prefix/releases" "$prefix/bin" "$prefix/data/redis" "$prefix/backups" "$prefix/logs" "$prefix/home"
if [ ! -f "$release/.complete" ]; then
  echo "==> release $version into $release"
  rm -rf "$release" && mkdir -p "$release"
  tar -xf "$bundle/release.tar" -C "$release"
  "$python" -m venv "$release/.venv"
  # The bundle's wheels only: no index, and no find-links of this machine's pip configuration.
  PIP_CONFIG_FILE=/dev/null "$release/.venv/bin/pip" install --quiet --disable-pip-version-check --no-index \
    --find-links "$bundle/wheels" -r "$bundle/requirements.txt"
  # The tools find their libraries at $ORIGIN/../lib: they stay beside them, linked from the venv's bin (where
  # serving looks for them), as scripts/install.sh links them from the build cache.
  cp -a "$bundle/llama" "$release/llama"
  ln -sf "$release/llama/bin/llama-server" "$release/llama/bin/llama-quantize" "$release/.venv/bin/"
  package_lib=$("$release/.venv/bin/python" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')
  mkdir -p "$package_lib"
  cp -P "$bundle"/llama/lib/*.so* "$package_lib/"
  touch "$release/.complete"
fi
if [ ! -f "$prefix/env" ]; then
  cat >"$prefix/env" <<ENV
FACTORY_DATA_DIR=$prefix/data
REDIS_URL=redis://127.0.0.1:6379/0
FACTORY_HOST=$host
FACTORY_PORT=$port
FACTORY_URL=http://127.0.0.1:$port
FACTORY_NODE_NAME=$(hostname | cut -d. -f1 | tr '[:upper:]' '[:lower:]')
FACTORY_UNITS_DIR=$units_dir
ENV
fi
# ai-factory runs the upgrader of the release that began an upgrade still in its journal, else the running one's.
cat >"$prefix/bin/ai-factory" <<WRAPPER
#!/bin/sh
upgrader=\$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["upgrader"])' "$prefix/upgrade.json" 2>/dev/null) \\
  || upgrader="$prefix/current/appliance/ai_factory.py"
release=\$(dirname "\$(dirname "\$upgrader")")
exec "\$release/.venv/bin/python" "\$upgrader" --prefix "$prefix" "\$@"
WRAPPER
chmod 755 "$prefix/bin/ai-factory"
chown -R "$user:$user" "$prefix/data" "$prefix/backups" "$prefix/logs" "$prefix/home"
chmod 640 "$prefix/env" && chown "root:$user" "$prefix/env"

# 4. A first install points current at the release and sets up the instance; a later one upgrades.
password=""
if [ -L "$prefix/current" ]; then
  if [ "$(readlink -f "$prefix/current")" != "$(readlink -f "$release")" ]; then
    services=systemd
    [ -d /run/systemd/system ] || services="$release/appliance/supervise.sh"
    "$release/.venv/bin/python" "$release/appliance/ai_factory.py" --prefix "$prefix" --services "$services" \
      upgrade "$release"
  fi
else
  ln -sfn "$release" "$prefix/current"
  # The setup unit's bootstrap makes the first admin with this password; the line goes once the platform is up.
  password=$("$release/.venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(12))')
  echo "FACTORY_ADMIN_PASSWORD=$password" >>"$prefix/env"
fi

# 5. The services.
"$release/.venv/bin/python" "$release/appliance/units.py" --prefix "$prefix" --user "$user" --output "$units_dir" \
  >/dev/null
if [ "$start" -eq 1 ]; then
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now ai-factory.target
  else
    FACTORY_UNITS_DIR=$units_dir "$release/appliance/supervise.sh" start
  fi
  for _ in $(seq 300); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { echo "error: the web server did not come up" >&2; exit 1; }
  sed -i '/^FACTORY_ADMIN_PASSWORD=/d' "$prefix/env"
fi
echo
echo "AI Factory $version is installed in $prefix ($(($(date +%s) - started)) s)"
address=$(hostname -I 2>/dev/null | cut -d' ' -f1) || true
echo "  URL:      http://${address:-127.0.0.1}:$port"
[ -n "$password" ] && echo "  login:    admin / $password   (shown once; change it after signing in)"
echo "  services: $([ -d /run/systemd/system ] && echo 'systemctl status ai-factory.target' || echo "$release/appliance/supervise.sh status")"
echo "  upgrade:  $prefix/bin/ai-factory upgrade RELEASE (or ./install.sh of a newer bundle)"
