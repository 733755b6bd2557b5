#!/usr/bin/env bash
# make stop: stops exactly the processes make run started, by their recorded PIDs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/procs.lib.sh
for name in web beat worker redis; do
  stop_proc "$name"
done
