#!/usr/bin/env bash
# The GPU checks of issue 28 in one run, on a machine with one CUDA GPU:
#
#   bash bench/gpu_check.sh OUT [PARTS...]
#
# PARTS (default: all, in this order): env, cuda_tests, gpu_bench, align_bench, tiny_gpu.
#   env          nvidia-smi, torch/CUDA/cuDNN versions
#   cuda_tests   ASRTRAIN_TEST_DEVICE=cuda pytest -m cuda (the files that hold such tests)
#   tiny_gpu     the tiny recipe from its align stage on, GMM passes on the GPU
#                (align.passes.*.device=cuda, ivector.device=cuda) and the hybrid trained on
#                the GPU;
#                needs exp/tiny built by `make smoke` (the audio-derived stages need sox):
#                TINY_EXP (default exp/tiny), TINY_TAR (an archive of it to unpack at /).
#                TINY_FROM=train_hybrid: the hybrid alone (carry the exp dir through ivectors).
#                On one H100 (e5fa46a) the GMM passes took 317 s on the GPU against 115 s on
#                2 CPU cores, train_hybrid 21 s against 206 s: the first is the long part.
#   gpu_bench    bench/gpu.py: IBM model, 260 inputs, 32k outputs; 128, 512, 1,536 and 2,048
#                chunks; fp32 and bf16; resident and stream loaders; one 260-dim ark and the
#                recipe's fbank | fMLLR | i-vector tables (128 and 2,048 chunks) -> OUT/gpu.json,
#                OUT/gpu.png, OUT/ibm260/gpu.json
#   align_bench  one GMM alignment iteration and one accumulation at Switchboard size
#                (11.5k pdfs, 200k Gaussians) on the GPU -> OUT/align_bench.jsonl
#
# Every part's output goes to OUT/gpu_check.log (and the console); a part that fails or runs
# past its time limit is reported and the next one runs. Limits: CUDA_TESTS_LIMIT, BENCH_LIMIT,
# IBM260_LIMIT, ALIGN_LIMIT, TINY_LIMIT (seconds); DEADLINE_S: the whole run's seconds, no part
# runs past them (for a lease of device time). PYTHON (default python3) is the
# interpreter: one with torch built for CUDA and this project's other dependencies importable.
set -u
OUT=${1:?usage: bash bench/gpu_check.sh OUT [PARTS...]}
shift
PARTS=${*:-env cuda_tests gpu_bench align_bench tiny_gpu}
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
export PYTHONUNBUFFERED=1
END=$(( $(date +%s) + ${DEADLINE_S:-0} ))
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

part() {  # part NAME SECONDS COMMAND...: run with a time limit, log it, report its status
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    if [ -n "${DEADLINE_S:-}" ]; then  # no part runs past the whole run's deadline
        local left=$(( END - start - 10 ))
        if [ "$left" -lt 5 ]; then
            echo "=== $name: skipped: the run's deadline (DEADLINE_S=$DEADLINE_S) is reached" | tee -a "$LOG"
            return
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "=== $name: $* (limit ${limit}s, $(date -u +%T))" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$LOG"
}

for p in $PARTS; do
    case $p in
    env)
        part env 60 bash -c "nvidia-smi; $PY -c 'import torch; print(\"torch\", torch.__version__,
\"cuda\", torch.version.cuda, \"cudnn\", torch.backends.cudnn.version(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\")'; nproc" ;;
    cuda_tests)
        part cuda_tests "${CUDA_TESTS_LIMIT:-240}" env ASRTRAIN_TEST_DEVICE=cuda "$PY" -m pytest -m cuda -p no:cacheprovider \
            -q -rs tests/test_precision.py tests/test_store.py tests/test_models.py tests/test_adapt.py \
            tests/test_gossip_stream.py ;;
    tiny_gpu)
        # TINY_TAR: exp/tiny's upstream stages as `make smoke` wrote them here, archived from /
        # (the scp files hold absolute paths: they are unpacked where they were written)
        if [ -n "${TINY_TAR:-}" ]; then tar -xf "$TINY_TAR" -C /; fi
        TINY_EXP=${TINY_EXP:-$REPO/exp/tiny}
        if [ ! -f "$TINY_EXP/data/train_nodup/feats.scp" ]; then
            echo "=== tiny_gpu: skipped: $TINY_EXP has no features (run make smoke first)" | tee -a "$LOG"
            continue
        fi
        if [ "${TINY_FROM:-align}" = align ]; then
            part tiny_gpu "${TINY_LIMIT:-300}" "$PY" -m asrtrain.cli run recipes/tiny \
                exp_dir="$TINY_EXP" --stage align --force align,ivectors ivector.device=cuda \
                +align.passes.{mono,tri1,tri2,tri3,tri4}.device=cuda
        else  # the GMM passes and i-vectors as carried: the hybrid alone on the GPU
            part tiny_gpu "${TINY_LIMIT:-300}" "$PY" -m asrtrain.cli run recipes/tiny \
                exp_dir="$TINY_EXP" --stage train_hybrid --force train_hybrid
        fi
        cp "$TINY_EXP/RESULTS.md" "$OUT/tiny_RESULTS.md" 2>/dev/null
        tail -n 40 "$TINY_EXP/log/train_hybrid.log" > "$OUT/tiny_train_hybrid.log" 2>/dev/null ;;
    gpu_bench)
        part gpu_bench "${BENCH_LIMIT:-300}" "$PY" bench/gpu.py --out "$OUT" \
            --chunks 128 512 1536 2048 --chunk-data resident stream --end-to-end-steps 8
        part gpu_bench_ibm260 "${IBM260_LIMIT:-200}" "$PY" bench/gpu.py --out "$OUT/ibm260" \
            --chunks 128 2048 --chunk-data resident stream --inputs ibm260 --end-to-end-steps 8 ;;
    align_bench)
        part align_bench "${ALIGN_LIMIT:-120}" bash -c "$PY -m asrtrain.align.bench --device cuda \
            --pdfs 11500 --gaussians 200000 --frames 20000 --distinct-pdfs 150 \
            | tee $OUT/align_bench.jsonl" ;;
    *)
        echo "unknown part $p" >&2; exit 2 ;;
    esac
done
