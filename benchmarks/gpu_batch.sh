#!/usr/bin/env bash
# The GPU work of a session in a few device calls. Each phase fits one call (< 10 min) and leaves
# one tarball plus its log under $OUT (a device call returns at most 8 files).
#
#   device run, carry [".gpu"]:  source .gpu/setup.sh && bash benchmarks/gpu_batch.sh PHASE COMMIT [ARG]
#
# PHASE: tests  every @pytest.mark.gpu test (kernels against oracles, cache-loaded kernels);
#               ARG, if given, is a pytest -k selection
#        bench  `sweep --bench` of FAMILIES (comma-separated; ~1-3 min each, so 3-4 per call):
#               ours vs torch eager / torch.compile / peers, in one process per family
#        fmha   the FMHA production shapes against FlashMLA, FA4 and cuDNN in one process
set -uo pipefail
phase=${1:?usage: gpu_batch.sh tests|bench|fmha COMMIT [FAMILIES]}
export DSV4BENCH_COMMIT=${2:?give the commit the tree is at}
export PYTHONUNBUFFERED=1
out=${OUT:?run on the device (OUT unset)}
work=$(mktemp -d)
log="$out/$phase.log"

case "$phase" in
  tests)
    # tests/remote needs asyncssh and an sshd, neither of which the GPU site has; it is CPU-only
    timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/remote --tb=short -rf \
      --junitxml="$work/gpu-tests.xml" ${3:+-k "$3"} 2>&1 | tee "$log"
    status=${PIPESTATUS[0]} ;;
  bench)
    for fam in ${3//,/ }; do
      echo "=== $fam" | tee -a "$log"
      timeout 200 python3 -m dsv4bench sweep "$fam" --bench --examples 4 --timeout 120 \
        --out "$work/$fam" 2>&1 | tail -4 | tee -a "$log"
    done
    status=0 ;;
  fmha)
    timeout 540 python3 benchmarks/fmha_bench.py --out "$work/fmha-h100.json" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]} ;;
  *) echo "unknown phase '$phase' (tests|bench|fmha)" >&2; exit 2 ;;
esac
tar -C "$work" -czf "$out/$phase.tar.gz" .
echo "packed $(du -h "$out/$phase.tar.gz" | cut -f1) into $phase.tar.gz" | tee -a "$log"
exit "$status"  # the phase's own status (pytest's for tests), not the packer's
