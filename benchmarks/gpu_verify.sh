#!/usr/bin/env bash
# The GPU verification in one call (a CUDA machine; benchmarks/results/*-gpu-check.md hold its runs):
#
#     OUT=/some/folder bash benchmarks/gpu_verify.sh [quick]
#
# It builds the native part for the machine's torch, prints what ProcessGroupNCCL's completion hook reports
# (gpu_workinfo_probe.py), runs the GPU tests (tests/test_gpu.py and the NVML one), then what a collective
# costs instrumented (gpu_collective_cost.py; not with "quick"). Everything it prints and the JSON reports
# go to $OUT (default: a new folder under /tmp). Wheels in .whl/ (the OpenTelemetry SDK and exporters, for a
# machine that cannot reach PyPI) are installed into $OUT's site folder first.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d /tmp/gpu-verify.XXXXXX)}"
mkdir -p "$OUT"
log="$OUT/gpu-verify.txt"
say() { echo "== $*" | tee -a "$log"; }

if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$OUT/site" .whl/*.whl >> "$log" 2>&1
    export PYTHONPATH="$OUT/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
say "machine"
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"; } 2>&1 | tee -a "$log"
say "build-native"
python3 -c "import otel_torchdist.cli as c; c.main(['build-native'])" 2>&1 | tail -3 | tee -a "$log"
say "gpu_workinfo_probe.py"
timeout 60 python3 benchmarks/gpu_workinfo_probe.py --out "$OUT/workinfo.json" 2>&1 | grep -v "OnCompletion hook will be deprecated" | tee -a "$log"
say "tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_gpu.py \
    tests/test_system.py::test_nvml_readings_agree_with_nvidia_smi > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt" | tee -a "$log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | tee -a "$log"
if [ "${1:-}" != "quick" ]; then
    say "gpu_collective_cost.py"
    timeout 200 python3 benchmarks/gpu_collective_cost.py --calls 10000 --rounds 2 --out "$OUT/collective-cost.json" 2>&1 \
        | grep -v "OnCompletion hook will be deprecated" | tail -12 | tee -a "$log"
fi
say "done: $OUT"
