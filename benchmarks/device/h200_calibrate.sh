#!/usr/bin/env bash
# One prepared run on a lent NVIDIA H200 (the device tool; see docs/calibration.md, "GPU: one NVIDIA H200"):
# calibrate Qwen3-8B and Llama-3.1-8B shapes (random BF16 weights), eager and with CUDA graphs, on the
# quick CUDA grid; calibrate Qwen3-8B eager with `--attention no-cudnn` and replay a short trace at two
# loads against it (`capsim validate`); run the GPU-marked tests; the standard grid with what is left.
# (The first run, on 2026-12-04, validated against the torch-attention eager profile instead, which
# showed the first-shape cost that MODE=diagnose then measured: docs/validation.md, "H200".)
#
# The device image has torch (CUDA), numpy, pandas, scipy, pyyaml, matplotlib but no simpy or
# pydantic: they travel as wheels in .whl/, git-excluded (`echo /.whl/ >> .git/info/exclude`), fetched with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl simpy==4.1.2 pydantic==2.14.4 \
#     pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 typing_extensions==4.16.0
# Every stage has its own time limit under one deadline, so that what finished comes back even when
# a later stage does not; after each stage the work folder is packed again into $OUT/results.tar.gz.
#
#   DEADLINE_S   seconds from the start after which no stage starts (default 430)
#   MODE=recheck    the third run: first_shapes.py, an eager profile and the two loads again
#   MODE=diagnose   the second run instead: first_shapes.py and one load replayed twice
#   SMOKE=1      a CPU rehearsal of the same steps (tiny grid, one layer, no graphs, a CPU scenario)
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-430}
OUT=${OUT:?OUT must name the folder the results go to}
W=${WORK:-/tmp/capsim-h200}
mkdir -p "$W/profiles" "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import simpy, pydantic' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
CAPSIM="python3 -m capsim.cli"

pack() {
  tar -czf "$OUT/results.tar.gz.tmp" -C "$W" . && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
}

# stage NAME MIN_SECONDS CMD...: run CMD with what is left before the deadline, if at least MIN_SECONDS
stage() {
  local name=$1 need=$2; shift 2
  local now left rc
  now=$(date +%s); left=$((T0 + DEADLINE_S - now))
  if [ "$left" -lt "$need" ]; then
    echo "=== $name: SKIPPED, $left s left before the deadline, needs about $need s" | tee -a "$W/stages.txt"
    return 0
  fi
  echo "=== $name: start at +$((now - T0)) s, limit $left s: $*"
  timeout --signal=INT --kill-after=10 "$left" "$@"
  rc=$?
  echo "=== $name: rc $rc after $(( $(date +%s) - now )) s" | tee -a "$W/stages.txt"
  pack
  return 0
}

if [ "${SMOKE:-0}" = 1 ]; then
  NOCUDNN=""
  DEV=cpu; GRID=tiny; HW=cpu-epyc-2c; EXTRA="--layers 1"; GRAPHS=""
  MODELS="qwen2.5-0.5b"; SCEN=scenarios/validation/cpu-qwen0.5b-continuous.yaml; RATES=0.5
  VAL_EXTRA="--set workload.num_requests=4 --set step_time.allow_extrapolation=true --seeds 2 --model-draws 2"
else
  NOCUDNN="--attention no-cudnn"
  DEV=cuda; GRID=quick; HW=h200-sxm; EXTRA=""; GRAPHS="--cuda-graphs"
  MODELS="qwen3-8b llama-3.1-8b"; SCEN=scenarios/validation/h200-qwen3-8b-chunked.yaml; RATES=1,4
  VAL_EXTRA=""
fi

{
  date -u; uname -a; git rev-parse HEAD 2>/dev/null || true
  nvidia-smi 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())'
} > "$W/environment.txt" 2>&1
cat "$W/environment.txt"
pack

if [ "${MODE:-calibrate}" = recheck ]; then
  # the third run, after the reference model stopped using cuDNN's attention on CUDA: the first-shape
  # costs again, an eager profile measured that way, and the two loads replayed against it
  stage "first shapes" 20 python3 benchmarks/device/first_shapes.py --model "${MODELS%% *}" --device $DEV \
    ${NOCUDNN} --out "$W/first_shapes.csv"
  stage "calibrate ${MODELS%% *} eager" 30 $CAPSIM calibrate --model "${MODELS%% *}" --device $DEV --dtype bf16 \
    --grid $GRID --hardware $HW $EXTRA $NOCUDNN --out "$W/profiles/"
  prof=$(ls "$W"/profiles/*__"${MODELS%% *}"__bf16${NOCUDNN:+__no-cudnn}.yaml 2>/dev/null | head -1)
  [ -n "$prof" ] && stage "validate" 60 $CAPSIM validate "$SCEN" --profile "$prof" --device $DEV --rates $RATES \
    --no-plots $VAL_EXTRA --out "$W/validation"
  echo "=== done at +$(( $(date +%s) - T0 )) s"
  pack
  exit 0
fi

if [ "${MODE:-calibrate}" = diagnose ]; then
  # the second run: why the first replay was slower than the second (benchmarks/device/first_shapes.py),
  # and the same load replayed twice in one process
  prof=profiles/fitted/h200-sxm__qwen3-8b__bf16.yaml
  [ "$DEV" = cpu ] && prof=profiles/fitted/cpu__qwen2.5-0.5b__bf16.yaml
  stage "first shapes" 20 python3 benchmarks/device/first_shapes.py --model "${MODELS%% *}" --device $DEV \
    --out "$W/first_shapes.csv"
  stage "validate twice" 60 $CAPSIM validate "$SCEN" --profile "$prof" --device $DEV --rates "${RATES##*,}" \
    --replays 2 --no-plots $VAL_EXTRA --out "$W/validation-replays2"
  echo "=== done at +$(( $(date +%s) - T0 )) s"
  pack
  exit 0
fi

for m in $MODELS; do
  stage "calibrate $m eager" 40 $CAPSIM calibrate --model "$m" --device $DEV --dtype bf16 --grid $GRID \
    --hardware $HW $EXTRA --out "$W/profiles/"
  if [ -n "$GRAPHS" ]; then
    stage "calibrate $m graphs" 40 $CAPSIM calibrate --model "$m" --device $DEV --dtype bf16 --grid $GRID \
      --hardware $HW $GRAPHS $EXTRA --out "$W/profiles/"
  fi
done

# the replay is eager and meets new attention shapes at every step: validate against an eager profile
# measured with the same kernels (--attention no-cudnn on CUDA; docs/validation.md, "H200")
m=${MODELS%% *}
if [ -n "$NOCUDNN" ]; then
  stage "calibrate $m eager $NOCUDNN" 30 $CAPSIM calibrate --model "$m" --device $DEV --dtype bf16 --grid $GRID \
    --hardware $HW $EXTRA $NOCUDNN --out "$W/profiles/"
  prof=$(ls "$W"/profiles/*__"$m"__bf16__no-cudnn.yaml 2>/dev/null | head -1)
else
  prof=$(ls "$W"/profiles/*__"$m"__bf16.yaml 2>/dev/null | head -1)
fi
if [ -n "$prof" ]; then
  stage "validate $m" 120 $CAPSIM validate "$SCEN" --profile "$prof" --device $DEV --rates $RATES \
    --no-plots $VAL_EXTRA --out "$W/validation"
else
  echo "=== validate $m: SKIPPED, no eager profile was written" | tee -a "$W/stages.txt"
fi

if [ "$DEV" = cuda ]; then
  stage "gpu tests" 30 python3 -m pytest -q -m gpu -p no:cacheprovider tests/calibration/test_harness.py \
    tests/calibration/test_replay.py
  # what is left: the standard grid for Qwen3-8B with graphs, resumable points (a fresh folder)
  stage "calibrate qwen3-8b graphs standard" 90 $CAPSIM calibrate --model qwen3-8b --device cuda --dtype bf16 \
    --grid standard --hardware h200-sxm --cuda-graphs --out "$W/standard/"
fi
echo "=== done at +$(( $(date +%s) - T0 )) s"
pack
