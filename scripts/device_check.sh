#!/usr/bin/env bash
# The CUDA and NCCL paths and their benchmarks, in one short run on a machine with one NVIDIA GPU.
#
# 1. the router at the full shape (256 experts, 64x5 and 128x3) on the GPU: eager, compiled, and the compiled
#    router replayed from a CUDA graph (scripts/bench_router.py --device cuda);
# 2. the live demo on a 1-process NCCL group in every routing mode: output against the dense layer, tokens lost;
# 3. the layer's per-step cost on that group, dynamic routing + recorder against static routing without it, at the
#    demo's shape and at 256 experts top-8 (scripts/bench_live.py --device cuda);
# 4. rebalancing while decoding on that group (scripts/bench_live.py --section rebalance --device cuda): step time
#    with a background cpsat solve, staging and switch against none.
# Python packages the GPU image lacks travel as wheels in an ignored .whl/, which this script installs: download them
# first, at the versions `pip list` shows in .venv (`pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux_2_28_x86_64 -d .whl ortools==9.15.6755 pydantic pydantic_core annotated-types
# typing-inspection immutabledict protobuf typing_extensions`). Each part has its own time limit, so a slow one leaves
# the others' figures. Output: stdout, and one file per part under $OUT when that is set.
#
# Usage: bash scripts/device_check.sh [router] [demo] [layer] [rebalance]   (default: all four)
set -u
parts="${*:-router demo layer rebalance}"
want() { [[ " $parts " == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/device_check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"

want router && timeout 210 python3 scripts/bench_router.py --device cuda --steps 20 --repeats 3 --calls 200 2>&1 \
    | grep -v Warning | tee "$out/bench_router_cuda.txt"
want demo && for routing in static dynamic oblivious; do
    timeout 60 python3 scripts/live_demo.py --device cuda --world-size 1 --steps 20 --routing "$routing" --json 2>&1 \
        | tail -1 | tee -a "$out/live_demo_cuda.txt"
done
want demo && timeout 60 python3 scripts/live_demo.py --device cuda --world-size 1 --steps 10 --experts 256 --top-k 8 \
    --slots-per-gpu 256 --hidden-size 256 --tokens-per-step 4096 --json 2>&1 | tail -1 | tee -a "$out/live_demo_cuda.txt"
want layer && timeout 100 python3 scripts/bench_live.py --section overhead --device cuda --world-size 1 --steps 20 \
    --repeats 3 2>&1 \
    | grep -v -i warn | tee "$out/bench_live_cuda.txt"
want layer && timeout 150 python3 scripts/bench_live.py --section overhead --device cuda --world-size 1 --steps 10 \
    --repeats 3 --experts 256 \
    --top-k 8 --slots-per-gpu 256 --hidden-size 256 --tokens-per-step 4096 2>&1 | grep -v -i warn | tee -a "$out/bench_live_cuda.txt"
want rebalance && timeout 200 python3 scripts/bench_live.py --section rebalance --device cuda --world-size 1 \
    --experts 64 --top-k 8 --hidden-size 512 --tokens-per-step 4096 --rebalance-steps 200 --rebalance-every 40 2>&1 \
    | grep -v -i warn | tee "$out/bench_rebalance_cuda.txt"
