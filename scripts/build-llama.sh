#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-server, llama-quantize) and its shared libraries once, from the llama.cpp source
# that the pinned llama-cpp-python sdist vendors, into a cache outside the clone. A re-run with the cache in place does
# nothing. Prints the install prefix (bin/, lib/) as its last line.
#   usage: scripts/build-llama.sh [python]   (python: the interpreter whose pip fetches the sdist)
# With FACTORY_LLAMA_CUDA_ARCHS (CMake's CUDA architectures, "90" or "80;86"; scripts/install.sh sets it on a node
# with NVIDIA GPUs and the CUDA toolkit) ggml's CUDA backend is built for those GPUs with the toolkit's nvcc
# (CUDACXX, else on PATH, else in CUDA_HOME, /usr/local/cuda), into a prefix of its own named by the toolkit's CUDA version and the
# architectures (<version>-cuda13.0-sm90): a CPU build and GPU builds live side by side, and a new toolkit or GPU
# builds anew.
set -euo pipefail
cd "$(dirname "$0")/.."

PIP_PYTHON=${1:-python3}
CACHE=${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}/llama.cpp
version=$(grep -iE '^llama[-_]cpp[-_]python==' requirements/constraints.txt | cut -d= -f3)
prefix="$CACHE/$version"

# -march=native (llama.cpp's default) compiles for this CPU: a build is reused only on a CPU with the same
# instruction sets and with the same options, so a cache carried to another machine is rebuilt, not run into SIGILL.
# AMX stays off: on virtual machines that advertise it (amx_tile in /proc/cpuinfo) ggml's AMX kernels died with
# SIGILL at their first tile instruction, though the kernel granted the tile state.
# No network at build time: no curl, no prebuilt web UI download, no UI build (the platform has its own GUI).
# $ORIGIN/../lib lets the binaries find the shared libraries wherever the prefix is copied.
cmake_options=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib'
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF ${FACTORY_LLAMA_CMAKE_ARGS:-})
cuda_archs=${FACTORY_LLAMA_CUDA_ARCHS:-}
if [ -n "$cuda_archs" ]; then
  nvcc=${CUDACXX:-$(command -v nvcc || true)}
  [ -n "$nvcc" ] || [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
  [ -n "$nvcc" ] || { echo "error: a CUDA build of llama.cpp needs the CUDA toolkit's nvcc (set CUDACXX)" >&2; exit 1; }
  cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -n 1)
  [ -n "$cuda_version" ] || { echo "error: $nvcc --version names no CUDA release" >&2; exit 1; }
  cmake_options+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda_archs" "-DCMAKE_CUDA_COMPILER=$nvcc")
  prefix="$CACHE/$version-cuda$cuda_version-sm${cuda_archs//;/-}"
fi
signature=$( { printf '%s\n' "${cmake_options[@]}"; grep -m1 '^flags' /proc/cpuinfo || uname -m; } | sha256sum | cut -c1-16)

if [ -x "$prefix/bin/llama-server" ] && [ -x "$prefix/bin/llama-quantize" ] \
    && [ "$(cat "$prefix/.complete" 2>/dev/null)" = "$signature" ]; then
  echo "$prefix"
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "error: building llama.cpp needs $tool (Debian: cmake, g++)" >&2; exit 1; }
done

sdist_dir="$CACHE/sdist"
sdist="$sdist_dir/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$sdist_dir"
  "$PIP_PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$sdist_dir" >&2
fi

work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "==> Building llama-server and llama-quantize from llama.cpp (llama-cpp-python $version's source) once;" \
     "about 6 minutes on 2 cores${cuda_archs:+ (with CUDA $cuda_version for sm_$cuda_archs: about 5 minutes on 16)};" \
     "cached in $prefix" >&2
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" "${cmake_options[@]}" >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --parallel "$(nproc)" --target llama-server llama-quantize >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }

# Keep only what was built: the two tools and every shared library they (and llama-cpp-python) load.
mkdir -p "$work/install/bin" "$work/install/lib"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$work/install/bin/"
find "$work/build" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "$work/install/lib/" \;
echo "$signature" > "$work/install/.complete"
rm -rf "$prefix"
mkdir -p "$CACHE"
mv "$work/install" "$prefix"
echo "$prefix"
