# Sourced by scripts/install.sh: what this machine's install is, from its NVIDIA GPUs (cluster/gpus.py reads
# nvidia-smi). On a machine without them (no nvidia-smi, none listed, or FACTORY_GPU=off) nothing here changes the
# install: gpu_count=0, and install.sh runs its CPU path as before.
#
# gpu_detect sets:
#   gpu_count, gpu_names, gpu_driver_cuda (the CUDA version the driver runs), gpu_archs (CMAKE_CUDA_ARCHITECTURES),
#   gpu_problem (why a machine with GPUs installs for its CPUs), torch_cuda (cu130, ...; empty: the CPU torch),
#   torch_index (its wheel index; FACTORY_TORCH_INDEX_URL replaces it, for a mirror), llama_cuda_archs (set when
#   llama.cpp is to be built for the GPUs: nvcc is there), nvcc.

# The CUDA toolkit's compiler: CUDACXX, else nvcc on PATH, else in CUDA_HOME (/usr/local/cuda, where NVIDIA's
# packages put it without touching PATH).
find_nvcc() {
  local home=${CUDA_HOME:-/usr/local/cuda}
  if [ -n "${CUDACXX:-}" ]; then echo "$CUDACXX"
  elif command -v nvcc >/dev/null; then command -v nvcc
  elif [ -x "$home/bin/nvcc" ]; then echo "$home/bin/nvcc"
  fi
}

gpu_detect() {
  gpu_count=0 gpu_names="" gpu_driver_cuda="" gpu_archs="" gpu_problem="" torch_cuda="" torch_index=""
  llama_cuda_archs="" nvcc=""
  if command -v "$PYTHON" >/dev/null; then
    eval "$("$PYTHON" -m cluster.gpus shell)"
  fi
  if [ -n "$gpu_problem" ]; then
    echo "warning: NVIDIA GPUs found ($gpu_names) but this install is for the CPU: $gpu_problem" >&2
    torch_cuda="" torch_index=""
    return 0
  fi
  [ "$gpu_count" -gt 0 ] || return 0
  torch_index=${FACTORY_TORCH_INDEX_URL:-$torch_index}
  nvcc=$(find_nvcc)
  if [ -n "$nvcc" ] && [ -n "$gpu_archs" ]; then
    llama_cuda_archs=$gpu_archs
  else
    echo "warning: no CUDA toolkit (nvcc) on this GPU node: llama.cpp is built for the CPU, and its deployments" \
         "run there. Install the CUDA toolkit (NVIDIA's cuda-toolkit, or Debian's nvidia-cuda-toolkit) and run" \
         "make install again." >&2
  fi
}

# What the install's stamp adds for this machine: nothing on the CPU path, so its stamp is the one it always was.
gpu_install_key() {
  [ "$gpu_count" -gt 0 ] || return 0
  printf 'gpu %s %s %s %s\n' "$torch_cuda" "$torch_index" "$llama_cuda_archs" "$nvcc"
}

# The pinned set for this machine: the constraints file itself on the CPU path; on a GPU node a copy at $2 with
# torch's CPU build (+cpu) swapped for the CUDA one (+cu130, ...). Prints the file to install with.
gpu_constraints() {
  if [ -z "$torch_cuda" ]; then
    echo "$1"
    return 0
  fi
  sed -E "s/^(torch==[^+[:space:]]+)\+cpu[[:space:]]*\$/\1+$torch_cuda/" "$1" >"$2"
  echo "$2"
}
