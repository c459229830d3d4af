#!/usr/bin/env bash
# Check every engine configuration specsim emits with the engines' own argument code:
# tests/test_engine_parsers.py in a virtual environment that holds vLLM 0.33.0 and SGLang 0.5.23
# (the wheels with --no-deps, on the CPU build of torch) and only the modules their argument
# code imports. The project's own environment does not hold the engines, so there the test
# module skips its vLLM and SGLang parts; this script runs them all.
#   bash benchmarks/engine_parsers.sh [VENV]   # default VENV: /tmp/specsim-engines (reused)
# Run from anywhere; it runs in the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-/tmp/specsim-engines}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
start=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/pip" install -q)
"${pip[@]}" torch==2.13.0 # the project's torch: CPU build where the machine provides it
# The engines without their CUDA dependencies, then what their argument code imports. The
# versions are the ones this check was last run with (specsim's own runtime dependencies last:
# the adaptive-steps test imports its simulator); the engines' own pins ask for other
# torch builds, so pip's resolver warnings about them are expected.
"${pip[@]}" --no-deps vllm==0.33.0 sglang==0.5.23
"${pip[@]}" --no-deps \
  transformers==5.20.2 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0 \
  hf-xet==1.8.0 fsspec==2026.9.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 \
  sniffio==1.3.1 idna==3.20 certifi==2026.10.19.post1 truststore==0.10.5 typer==0.29.2 \
  click==8.5.1 shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 \
  Pygments==2.21.0 annotated-doc==0.0.7 requests==2.34.2 urllib3==2.8.0 \
  charset-normalizer==3.5.3 numpy==2.4.6 pydantic==2.14.4 pydantic_core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 PyYAML==6.0.4 \
  msgspec==0.23.0 regex==2026.11.19 cachetools==8.0.2 psutil==7.2.2 cloudpickle==3.1.3 \
  tqdm==4.70.1 filelock==4.3.1 pybase64==1.5.1 blake3==1.0.11 py-cpuinfo==9.0.0 packaging==26.4 \
  cbor2==6.3.0 pyzmq==27.3.0 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 \
  propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 \
  openai-harmony==0.0.8 openai==3.57.0 pillow==13.0.0 uvloop==0.23.0 prometheus_client==0.26.0 \
  apache-tvm-ffi==0.1.11 xgrammar==0.2.9 fastapi==0.136.3 starlette==1.10.0 \
  partial-json-parser==0.2.1.1.post7 llguidance==1.9.1 einops==0.8.2 orjson==3.13.0 \
  triton==3.9.0 ipython==9.18.1 traitlets==5.16.1 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  pytest==9.2.0 iniconfig==2.3.1 pluggy==1.7.0 \
  scipy==1.17.1 simpy==4.1.2 pandas==3.1.1 python-dateutil==4.0.0 six==1.17.0 tzdata==2026.6 \
  numba==0.68.1 llvmlite==0.50.0
echo "== environment ready after $(($(date +%s) - start)) s"

# vLLM reads its platform from VLLM_TARGET_DEVICE without CUDA; nothing is downloaded.
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_engine_parsers.py
echo "== done after $(($(date +%s) - start)) s"
