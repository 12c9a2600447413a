#!/usr/bin/env bash
# The GPU work of a session in a few device calls. Each phase fits one call (< 10 min) and leaves
# under $OUT its log (to read) and one tarball (to commit) holding its runs in the dataset layout
# of benchmarks/results (INDEX.md): results/<family>/<date>-<device>-<commit7>[-<tag>]/ with
# results.jsonl.gz, README.md (command, commit, device, date) and, for sweeps, a compact run.json.
#
#   device run, carry [".gpu"]:  source .gpu/setup.sh && bash benchmarks/gpu_batch.sh PHASE COMMIT [ARG]
#   back here:                   tar -xzf PHASE.tar.gz -C benchmarks      # -> benchmarks/results/<family>/<run>/
#                                git add benchmarks/results/<family>/<run> # + a line in benchmarks/results/INDEX.md
#
# Runs are saved with --drop-samples (the tree's budget); `dsv4bench report <run>` re-renders a sweep's HTML and CSV.
#
# PHASE: tests  every @pytest.mark.gpu test (kernels against oracles, cache-loaded kernels);
#               ARG, if given, is a pytest -k selection; one <family>/<date>-<device>-<commit>-gpu-tests
#               run per tests/<family>/ (a row per test: outcome, seconds, message)
#        conformance  the generic GPU conformance cases (tests/conformance), ARG as for tests; one
#               <family>/<date>-<device>-<commit>-conformance run per family the case ids name
#        bench  `sweep --bench` of FAMILIES (comma-separated; ~1-3 min each, so 3-4 per call):
#               ours vs torch eager / torch.compile / peers, in one process per family; one run each
#        fmha   the FMHA production shapes against FlashMLA, FA4 and cuDNN in one process (fmha_bench)
# DSV4BENCH_DEVICE names the device in the run directories (default h100).
set -uo pipefail
phase=${1:?usage: gpu_batch.sh tests|conformance|bench|fmha COMMIT [ARG]}
export DSV4BENCH_COMMIT=${2:?give the commit the tree is at}
export PYTHONUNBUFFERED=1
device=${DSV4BENCH_DEVICE:-h100}
out=${OUT:?run on the device (OUT unset)}
work=$(mktemp -d)
log="$out/$phase.log"
# the tarball is rewritten after every saved run, so an outer timeout keeps the runs finished before it
pack() { mkdir -p "$work/results" && tar -C "$work" -czf "$out/$phase.tar.gz.part" results && mv "$out/$phase.tar.gz.part" "$out/$phase.tar.gz"; }
save() { python3 benchmarks/save_run.py "$@" --commit "$DSV4BENCH_COMMIT" --device "$device" --root "$work/results" --drop-samples 2>&1 | tee -a "$log"; pack; }

# pytest-xdist, where importable (the GPU site has none: carry its two wheels unpacked on PYTHONPATH), runs
# the GPU tests in DSV4BENCH_WORKERS processes sharing the GPU: the CPU-bound compiles then overlap
par=""
python3 -c "import xdist" 2>/dev/null && par="-n ${DSV4BENCH_WORKERS:-8}"
run_tests() {  # $1: test path, $2: optional -k selection
  cmd="python3 -m pytest -q $par -m gpu $1 --ignore=tests/remote${2:+ -k \"$2\"}"
  # SIGINT at the limit: pytest stops like a Ctrl-C and still writes the junit of what ran
  timeout --signal=INT --kill-after=30 540 python3 -m pytest -q -p no:cacheprovider $par -m gpu "$1" --ignore=tests/remote \
    --tb=short -rf --junitxml="$work/gpu-tests.xml" ${2:+-k "$2"} 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  [ -s "$work/gpu-tests.xml" ] && save "$work/gpu-tests.xml" --junit --command "$cmd"
}

case "$phase" in
  # tests/remote needs asyncssh and an sshd, neither of which the GPU site has; it is CPU-only
  tests) run_tests tests "${3:-}" ;;
  conformance) run_tests tests/conformance "${3:-}" ;;
  bench)
    for fam in ${3//,/ }; do
      echo "=== $fam" | tee -a "$log"
      timeout 200 python3 -m dsv4bench sweep "$fam" --bench --examples 4 --timeout 120 \
        --out "$work/runs/$fam" 2>&1 | tail -4 | tee -a "$log"
      save "$work/runs/$fam" --family "$fam"
    done
    status=0 ;;
  fmha)
    cmd="python3 benchmarks/fmha_bench.py --out fmha-h100.json"
    timeout 540 python3 benchmarks/fmha_bench.py --out "$work/fmha-h100.json" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    [ -s "$work/fmha-h100.json" ] && save "$work/fmha-h100.json" --json --family fmha --command "$cmd" ;;
  *) echo "unknown phase '$phase' (tests|conformance|bench|fmha)" >&2; exit 2 ;;
esac
pack
echo "packed $(du -h "$out/$phase.tar.gz" | cut -f1) into $phase.tar.gz: $(cd "$work" && find results -mindepth 2 -maxdepth 2 -type d | tr '\n' ' ')" | tee -a "$log"
exit "$status"  # the phase's own status (pytest's for tests), not the packer's
