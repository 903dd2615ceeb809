#!/usr/bin/env bash
# Issue 17 part 5: the kernel figures (4: batched vs per-sequence decode, 5: decode vs the
# memory roofline) on CUDA, plus the CUDA graph-reuse audit. Run from the repo root on the
# device machine (one H200; torch, Triton, hypothesis and numpy preinstalled under python3;
# no registry). About 3-5 minutes: inductor compiles 3 Triton graphs for the bench and ~16
# small ones for the audit. Everything it reports lands flat in $OUT (at most 8 files):
#   env.txt, bench.log, bench.json, bench.md, audit.log, audit.json, audit.md
set -u -o pipefail
OUT=${OUT:-$PWD/gpu17-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
WORK=$(mktemp -d /tmp/gpu17.XXXXXX)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
  "$PY" -c 'import hypothesis, numpy; print("hypothesis", hypothesis.__version__, "numpy", numpy.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# Install without the network: the image already has every dependency. If the editable install
# cannot build (no setuptools), run from the checkout instead; the bench needs no entry points.
if "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$OUT/env.txt" 2>&1; then
  echo "installed: $("$PY" -m pip show spyre-verify 2>/dev/null | grep -i '^version')" | tee -a "$OUT/env.txt"
else
  echo "pip install failed (see env.txt): running from the checkout via PYTHONPATH" | tee -a "$OUT/env.txt"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
SV=("$PY" -m spyre_verify)

# Figures 4 and 5 on the GPU, inductor, 7 repeats (median and min..max in the table), every
# timed region bracketed by torch.cuda.synchronize(). Figure 5 runs 8x the CPU's rows on CUDA.
rc=0
timeout 290 "${SV[@]}" bench --device cuda --backend inductor --repeats 7 --out "$WORK/bench" \
  >"$OUT/bench.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
  # Inductor's Triton path failed or overran: keep whatever it printed and measure with
  # aot_eager instead, so the CUDA column has numbers (marked "not judged" in the table).
  echo "[gpu17] inductor bench exited $rc; retrying with aot_eager" | tee -a "$OUT/bench.log"
  timeout 100 "${SV[@]}" bench --device cuda --backend aot_eager --repeats 7 --out "$WORK/bench" \
    >>"$OUT/bench.log" 2>&1 || echo "[gpu17] aot_eager bench exited $?" | tee -a "$OUT/bench.log"
fi
cat "$OUT/bench.log"
cp "$WORK/bench/bench.json" "$WORK/bench/bench.md" "$OUT/" 2>/dev/null || echo "[gpu17] no bench report"

# The on-device graph-reuse audit (default small config): cheap, and the README's CUDA
# column wants it. Its heatmaps stay behind: only the reports come back.
timeout 120 "${SV[@]}" audit --device cuda --out "$WORK/audit" >"$OUT/audit.log" 2>&1 ||
  echo "[gpu17] audit exited $?" | tee -a "$OUT/audit.log"
tail -n 25 "$OUT/audit.log"
cp "$WORK/audit/audit.json" "$WORK/audit/audit.md" "$OUT/" 2>/dev/null || echo "[gpu17] no audit report"
ls -l "$OUT"
