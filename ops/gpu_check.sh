#!/usr/bin/env bash
# Check the cuda target on a fresh GPU host that has no network.
#
#   On a connected machine, in the repository:   ops/gpu_check.sh fill [WHEELHOUSE]
#   Copy the repository (with WHEELHOUSE inside it) to the GPU host, then there:
#                                                 ops/gpu_check.sh run [WHEELHOUSE] [OUT]
#
# `fill` downloads every wheel the project needs for the GPU host's Python (PYTHON_VERSION,
# default 3.12; x86_64 manylinux), and pycuda's source with what building it (and this
# project) needs. `run` makes a virtual environment that also sees the host's own
# packages (torch and cupy, the baselines), installs the project with its `cuda` extra
# from the folder alone (building pycuda against the host's CUDA), then runs
# `kfactory gpu-check`: a table on stdout, JSON and the events in OUT (default gpu-check/).
set -euo pipefail

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

here="$(cd "$(dirname "$0")/.." && pwd)"
command="${1:-}"
wheelhouse="${2:-$here/wheelhouse}"

fill() {
    local python_version="${PYTHON_VERSION:-3.12}"
    mkdir -p "$wheelhouse"
    local platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform linux_x86_64)
    local binary=(--only-binary=:all: --python-version "$python_version" --implementation cp
        "${platforms[@]}" --dest "$wheelhouse")
    echo "dependencies for CPython $python_version (binary wheels)"
    local requirements
    requirements="$(python3 - "$here/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = project["dependencies"] + [d for d in project["optional-dependencies"]["cuda"] if not d.startswith("pycuda")]
print("\n".join(deps))
PY
)"
    # shellcheck disable=SC2086
    python3 -m pip download --quiet "${binary[@]}" $(echo "$requirements" | tr '\n' ' ')
    echo "pycuda source and what building it needs"
    local pycuda
    pycuda="$(grep -o '"pycuda[^"]*"' "$here/pyproject.toml" | tr -d '"')"
    python3 -m pip download --quiet --no-binary=pycuda --no-deps --dest "$wheelhouse" "$pycuda"
    python3 -m pip download --quiet "${binary[@]}" pytools platformdirs mako markupsafe \
        typing_extensions siphash24 "setuptools>=69" wheel "numpy>=1.26"
    du -sh "$wheelhouse"
    echo "now copy the repository, $wheelhouse included, to the GPU host and run: ops/gpu_check.sh run"
}

run() {
    local out="${3:-gpu-check}"
    [[ -d "$wheelhouse" ]] || { echo "no wheelhouse at $wheelhouse: run 'ops/gpu_check.sh fill' on a connected machine first" >&2; exit 2; }
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    local venv="${KF_GPU_VENV:-$here/.venv-gpu}"
    local started=$SECONDS
    if [[ ! -x "$venv/bin/kfactory" ]]; then
        python3 -m venv --system-site-packages "$venv"
        # pycuda builds against this CUDA (its nvcc first on PATH tells it where), linking
        # the driver API through the toolkit's stub library.
        if [[ -z "${CUDA_ROOT:-}" ]]; then
            if [[ -d /usr/local/cuda/include ]]; then CUDA_ROOT=/usr/local/cuda
            else CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; fi
        fi
        export CUDA_ROOT PATH="$CUDA_ROOT/bin:$PATH"
        # pycuda reads its build settings from ~/.aksetup-defaults.py: give it one of its own.
        local build_home curand=True
        build_home="$(mktemp -d)"
        [[ -f "$CUDA_ROOT/include/curand.h" ]] || curand=False
        # It links -lcuda: a driver often ships only libcuda.so.1, so point a libcuda.so at it.
        local driver
        driver="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')"
        for candidate in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1; do
            [[ -n "$driver" ]] || { [[ -e "$candidate" ]] && driver="$candidate"; }
        done
        mkdir -p "$build_home/lib"
        [[ -n "$driver" ]] && ln -s "$driver" "$build_home/lib/libcuda.so"
        printf 'CUDA_ROOT = "%s"\nCUDA_ENABLE_CURAND = %s\nCUDADRV_LIB_DIR = ["%s", "%s/lib64", "%s/lib64/stubs"]\n' \
            "$CUDA_ROOT" "$curand" "$build_home/lib" "$CUDA_ROOT" "$CUDA_ROOT" >"$build_home/.aksetup-defaults.py"
        HOME="$build_home" "$venv/bin/pip" install --quiet --no-index --find-links "$wheelhouse" \
            "$here[cuda]"
        rm -rf "$build_home"
        echo "installed in $((SECONDS - started)) s"
    fi
    "$venv/bin/kfactory" gpu-check --out "$out"
    echo "gpu check finished in $((SECONDS - started)) s"
}

case "$command" in
    fill) fill ;;
    run) run "$@" ;;
    *) usage ;;
esac
