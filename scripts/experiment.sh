#!/usr/bin/env bash
# One command per benchmark / experiment, from a clean checkout: set-up
# (scripts/setup.sh, plus torchao for the MX reference peer and iperf3 when
# root), then run. Each writes its study folder experiments/results/<study>/ (README.md with the
# command, machine, date and commit, raw JSON, plot; experiments/RESULTS.md indexes them):
#   bash scripts/experiment.sh kernels    # C++ kernel throughput vs memcpy (~3 min)           -> results/kernels/
#   bash scripts/experiment.sh allreduce  # loopback all-reduce, 2 and 4 ranks (~8 min)        -> results/allreduce_loopback/
#   bash scripts/experiment.sh netbed     # emulated cluster, 1 and 10 Gbit/s (root, ~10 min)  -> results/allreduce_netbed/
#   bash scripts/experiment.sh vnmse      # the paper's error tables on real gradients (~10 min) -> results/vnmse/,
#                                         #   and lossless per tensor                           -> results/lossless_tensors/
#   bash scripts/experiment.sh equal_bits # vNMSE at equal wire bits, TinyGPT and a 21M Llama (~100 min on
#                                         #   2 loaded cores, ~20 with experiments/out/llm_grads/*.pt) -> results/vnmse_equal_bits/
#   bash scripts/experiment.sh topology   # vNMSE against world size 2..64 (~10 min)           -> results/topology/
#   bash scripts/experiment.sh train      # time to accuracy, 4 ranks at 1 Gbit/s (root, 25-45 min) -> results/train/
#   bash scripts/experiment.sh tta        # time to accuracy, a 2.9M Llama, 8 methods, 4 ranks at 1 Gbit/s
#                                         #   (root, ~30-40 min on 2 loaded cores)           -> results/time_to_accuracy/
#   bash scripts/experiment.sh memory     # host memory per rank of DDP with each hook (~2 min; --pool-table: ~7)
#                                         #   -> results/memory/ (--pool-only: results/memory_pool/)
# Extra arguments go to the experiment's script (`--out experiments/out/<name>` for a scratch run
# that leaves results/ alone; not for kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
export PATH="$PWD/.venv/bin:$PATH"
what=${1:?usage: scripts/experiment.sh kernels|allreduce|netbed|vnmse|equal_bits|topology|train|tta|memory [args]}
shift
export DYNAMIQ_EXPERIMENT="bash scripts/experiment.sh $what${*:+ $*}"  # the header line of the results README
case "$what" in
  kernels)
    cmake -S . -B build/bench -G Ninja -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_BENCHMARKS=ON -DDYNAMIQ_CUDA=OFF >/dev/null
    ninja -C build/bench -j2 bench_kernels bench_lossless bench_bitsplit >/dev/null
    mkdir -p experiments/out
    # each under the load recorder: its "# load" lines end the text, FILE.load.json goes with the part
    L() { local out=$1; shift; $PY python/dynamiq/_load.py --json "$out.load.json" -- "$@" | tee "$out"; }
    L experiments/out/kernels.txt build/bench/bench_kernels "$@"
    DYNAMIQ_CPU_THREADS=2 L experiments/out/kernels_2threads.txt build/bench/bench_kernels 16777216 0.4 float32/mix5/
    L experiments/out/lossless_kernels.txt build/bench/bench_lossless
    L experiments/out/bitsplit_kernels.txt build/bench/bench_bitsplit
    $PY experiments/results_io.py kernels "CPU kernels against memcpy" --command "$DYNAMIQ_EXPERIMENT" \
      --part bench_kernels experiments/out/kernels.txt "build/bench/bench_kernels${*:+ $*}" \
      --part bench_kernels_2threads experiments/out/kernels_2threads.txt \
        "DYNAMIQ_CPU_THREADS=2 build/bench/bench_kernels 16777216 0.4 float32/mix5/" \
      --part bench_lossless experiments/out/lossless_kernels.txt build/bench/bench_lossless \
      --part bench_bitsplit experiments/out/bitsplit_kernels.txt build/bench/bench_bitsplit ;;
  allreduce)
    $PY experiments/bench/bench_allreduce.py --worlds 2 4 --sizes-mb 1 16 64 256 --repeats 5 \
      --methods gloo fp16 none:ring none:butterfly dynamiq:ring:3 dynamiq:ring:4 dynamiq:ring:5 dynamiq:ring:6 \
        dynamiq:butterfly:3 dynamiq:butterfly:4 dynamiq:butterfly:5 dynamiq:butterfly:6 lossless:ring bitsplit:twostep:4 \
      "$@" ;;
  netbed)
    [ "$(id -u)" -eq 0 ] || { echo "netbed needs root (network namespaces); try 'allreduce' for loopback"; exit 2; }
    command -v iperf3 >/dev/null || apt-get install -y --no-install-recommends iperf3 >/dev/null 2>&1 || true
    B="$PY experiments/bench/bench_allreduce.py --netbed"
    $B 1gbit --worlds 2 4 --sizes-mb 4 64 --repeats 5 \
      --methods gloo fp16 ddp:allreduce ddp:fp16 ddp:powersgd1 ddp:powersgd4 ddp:dynamiq5 none:ring \
        dynamiq:ring:3 dynamiq:ring:4 dynamiq:ring:5 dynamiq:ring:6 dynamiq:butterfly:3 dynamiq:butterfly:4 \
        dynamiq:butterfly:5 dynamiq:butterfly:6 lossless:ring bitsplit:twostep:8 bitsplit:twostep:4 bitsplit:twostep:2 \
      --part 1gbit "$@"
    $B 1gbit --worlds 4 --sizes-mb 16 256 --repeats 3 \
      --methods gloo fp16 dynamiq:ring:5@256k dynamiq:ring:5 dynamiq:ring:5@4m dynamiq:butterfly:5 lossless:ring bitsplit:twostep:4 \
      --part 1gbit_sizes "$@"
    $B 1gbit --dtype bfloat16 --worlds 2 4 --sizes-mb 64 --repeats 5 \
      --methods gloo fp16 none:ring dynamiq:ring:5 dynamiq:butterfly:5 lossless:ring bitsplit:twostep:4 \
      --part 1gbit_bf16 "$@"
    $B 1gbit --worlds 8 --sizes-mb 64 --repeats 3 \
      --methods gloo fp16 dynamiq:ring:5 dynamiq:butterfly:5 bitsplit:twostep:4 lossless:ring \
      --part 1gbit_w8 "$@"
    $B 10gbit --worlds 2 4 --sizes-mb 64 --repeats 5 \
      --methods gloo fp16 ddp:powersgd4 ddp:dynamiq5 none:ring dynamiq:ring:3 dynamiq:ring:5 dynamiq:butterfly:5 \
        lossless:ring bitsplit:twostep:8 bitsplit:twostep:4 \
      --part 10gbit "$@" ;;
  vnmse)
    $PY -c "import torchao" 2>/dev/null || $PY -m pip install -q --no-deps torchao
    $PY experiments/studies/vnmse.py "$@"
    $PY experiments/studies/lossless_tensors.py ;;
  equal_bits)
    $PY -c "import torchao" 2>/dev/null || $PY -m pip install -q --no-deps torchao
    $PY -c "import transformers, tokenizers" 2>/dev/null || \
      $PY -m pip install -q "transformers==5.23.0" "tokenizers==0.23.3"
    # gradient caches (experiments/out/llm_grads/, seed 0): made once, reused by later runs
    [ -f experiments/out/llm_grads/tinygpt.pt ] || $PY experiments/studies/llm_grads.py --model tinygpt --threads 1
    [ -f experiments/out/llm_grads/llama.pt ] || $PY experiments/studies/llm_grads.py --model llama
    $PY experiments/studies/vnmse_equal_bits.py "$@" ;;
  topology)
    $PY experiments/studies/topology.py "$@"
    $PY experiments/studies/topology.py --data identical \
      --rows dynamiq:5:correlated dynamiq:5:independent bitsplit:4 bitsplit:8 \
      "$@"
    $PY experiments/studies/topology.py --data heavy \
      --rows dynamiq:5:correlated dynamiq:5:independent dynamiq:3:correlated bitsplit:4 bitsplit:8 \
      "$@" ;;
  train)
    [ "$(id -u)" -eq 0 ] || { echo "train runs in the netbed and needs root; add --loopback to run unshaped"; }
    $PY experiments/studies/train.py "$@" ;;
  tta)
    [ "$(id -u)" -eq 0 ] || { echo "tta runs in the netbed and needs root; add --loopback to run unshaped"; }
    $PY -c "import transformers, tokenizers" 2>/dev/null || \
      $PY -m pip install -q "transformers==5.23.0" "tokenizers==0.23.3"
    $PY experiments/studies/time_to_accuracy.py "$@" ;;
  memory)
    $PY experiments/bench/bench_memory.py "$@" ;;
  *) echo "unknown experiment: $what"; exit 2 ;;
esac
