#!/usr/bin/env bash
# Installs the Debian packages a command needs, only when missing: redis-server, chromium, bubblewrap (the python
# tools' sandbox), gettext (msgfmt, which compiles the GUI's translations), npm (vendors the GUI's
# browser libraries once, scripts/vendor-js.sh), the libraries OpenCV's cv2 loads (RapidOCR's, for OCR: libGL and
# GLib), and a Chinese font (the OCR tests and bench.ocr render Chinese pages with it).
set -euo pipefail
missing=()
for want in "$@"; do
  case "$want" in
    redis) command -v redis-server >/dev/null || missing+=(redis-server) ;;
    chromium) [ -x /usr/bin/chromium ] || missing+=(chromium) ;;
    bwrap) command -v bwrap >/dev/null || missing+=(bubblewrap) ;;
    gettext) command -v msgfmt >/dev/null || missing+=(gettext) ;;
    npm) command -v npm >/dev/null || missing+=(npm) ;;
    opencv)
      for package in libgl1 libglib2.0-0; do
        [[ "$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null)" == *"ok installed" ]] || missing+=("$package")
      done ;;
    cjk-font) [ -f /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc ] || missing+=(fonts-wqy-zenhei) ;;
    *) echo "unknown system dependency: $want" >&2; exit 2 ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "==> Installing Debian packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
