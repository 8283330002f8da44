# Source from the project root on a CPU machine: an environment that compiles the kernels with
# the CuTe DSL build the GPU runs (the device bundle .devcache/cutedsl, nvidia-cutlass-dsl
# 4.8.1 with its CUDA 13 libraries for CPython 3.12, whose embedded ptxas is CUDA 13.4), so
# that the SASS read on CPU is the device's. Sets PY13 (its python), CUDA_HOME (nvdisasm and
# cuobjdump) and PYTHONPATH. Needs python3.12 (pyenv or PATH) and a package index for jax,
# numpy, chex, flatbuffers, cuda-bindings and the two NVIDIA tool wheels; everything goes to
# $SASS_ENV_DIR (default /tmp/sass_env).
_root="$PWD"
_dir="${SASS_ENV_DIR:-/tmp/sass_env}"
_py312=""
for _c in python3.12 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python 2>/dev/null); do
  if "$_c" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
    _py312="$_c"; break
  fi
done
if [ -z "$_py312" ]; then
  echo "sass_env.sh: no python3.12 found" >&2
  return 2 2>/dev/null || exit 2
fi
mkdir -p "$_dir"
if [ ! -f "$_dir/venv/.ready" ]; then
  rm -rf "$_dir/venv"
  "$_py312" -m venv "$_dir/venv" &&
    "$_dir/venv/bin/pip" install -q "jax==0.10.2" "jaxlib==0.10.2" numpy chex flatbuffers \
      "cuda-bindings>=13" cuda-pathfinder && touch "$_dir/venv/.ready" ||
    { echo "sass_env.sh: the venv's packages did not install" >&2; return 3 2>/dev/null || exit 3; }
fi
if [ ! -f "$_dir/dsl/.ready" ]; then
  rm -rf "$_dir/dsl" && mkdir -p "$_dir/dsl" &&
    (set -o pipefail; cat "$_root"/.devcache/cutedsl/a/*.part-* "$_root"/.devcache/cutedsl/b/*.part-* |
     xz -d -T0 | tar xf - -C "$_dir/dsl") && touch "$_dir/dsl/.ready" ||
    { echo "sass_env.sh: no device bundle under .devcache/cutedsl (scripts: ../shared/device/stage.sh)" >&2;
      return 4 2>/dev/null || exit 4; }
fi
# nvdisasm must be at least as new as the ptxas that built the cubin (13.4): CUDA 13.4 or later
if [ ! -x "$_dir/cuda/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$_dir/cuda/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$_dir/whl" "$_dir/cuda" &&
    "$_dir/venv/bin/pip" download -q --no-deps "nvidia-cuda-nvdisasm>=13.4" \
      "nvidia-cuda-cuobjdump>=13.4" -d "$_dir/whl" &&
    for w in "$_dir"/whl/*.whl; do "$_dir/venv/bin/python" -m zipfile -e "$w" "$_dir/cuda" || break; done &&
    chmod +x "$_dir"/cuda/nvidia/cu13/bin/* &&
    [ -x "$_dir/cuda/nvidia/cu13/bin/nvdisasm" ] && [ -x "$_dir/cuda/nvidia/cu13/bin/cuobjdump" ] ||
    { echo "sass_env.sh: nvdisasm / cuobjdump (CUDA 13.4 or later) not installed under $_dir/cuda" >&2;
      return 5 2>/dev/null || exit 5; }
fi
export CUDA_HOME="$_dir/cuda/nvidia/cu13"
export PYTHONPATH="$_root:$_dir/dsl:$_dir/dsl/nvidia_cutlass_dsl/dsl_packages"
PY13="$_dir/venv/bin/python"
unset _root _dir _py312 _c w
