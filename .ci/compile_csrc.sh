#!/usr/bin/env bash
# Compile every csrc/**/*.cu for the H100 (sm_90a) with nvcc alone (the .cu files include no torch
# header, DESIGN §2), fail on any compile error, and fail when a kernel spills registers to local
# memory (ptxas -v "bytes spill stores/loads" non-zero): a spill in a memory-bound kernel is extra
# DRAM/L1 traffic in the hot loop. Prints one line per kernel template: instantiations, registers,
# static shared memory, spills (and every spilling instantiation in full).
#
#   .ci/compile_csrc.sh                 # all of csrc/
#   .ci/compile_csrc.sh csrc/softmax    # one directory
# Env: NVCC (default nvcc), JOBS (default: nproc), ALLOW_SPILLS (a regex of demangled kernel names
# whose spills only warn; empty by default), KEEP_LOGS=1 (keep the ptxas logs, path printed).
#
# The flags match the extension build (tiled_attn/cuda/_build.py) plus what torch's cpp_extension
# adds to every .cu (the __CUDA_NO_HALF* defines, --expt-relaxed-constexpr), so code that builds here
# builds there.
set -euo pipefail
cd "$(dirname "$0")/.."

NVCC=${NVCC:-nvcc}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
ROOTS=("${@:-csrc}")
FLAGS=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Xptxas -v -Icsrc
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
       -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr)

mapfile -t SOURCES < <(find "${ROOTS[@]}" -name '*.cu' | sort)
if [ "${#SOURCES[@]}" -eq 0 ]; then
  echo "compile_csrc: no .cu files under ${ROOTS[*]}" >&2
  exit 1
fi

LOGS=$(mktemp -d)
if [ "${KEEP_LOGS:-0}" != 1 ]; then trap 'rm -rf "$LOGS"' EXIT; fi

compile_one() {  # $1: source; writes $LOGS/<name>.log and .rc
  local src=$1 tag
  tag=$(echo "$src" | tr '/' '_')
  local start=$SECONDS
  if "$NVCC" "${FLAGS[@]}" -c "$src" -o "$LOGS/$tag.o" >"$LOGS/$tag.log" 2>&1; then
    echo 0 >"$LOGS/$tag.rc"
  else
    echo 1 >"$LOGS/$tag.rc"
  fi
  echo "$src" >"$LOGS/$tag.src"
  echo $((SECONDS - start)) >"$LOGS/$tag.secs"
}
export -f compile_one
export NVCC LOGS
export FLAGS_STR="${FLAGS[*]}"
# Arrays do not cross into xargs' shells: rebuild FLAGS there from the string.
printf '%s\n' "${SOURCES[@]}" |
  xargs -P "$JOBS" -I{} bash -c 'read -r -a FLAGS <<<"$FLAGS_STR"; compile_one "$1"' _ {}

status=0
python3 - "$LOGS" "${ALLOW_SPILLS:-}" <<'PY' || status=$?
import collections, glob, os, re, shutil, subprocess, sys

logs, allow = sys.argv[1], sys.argv[2]
allow_re = re.compile(allow) if allow else None

def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))

def template_of(name):
    """'void ns::(anonymous namespace)::kernel<float, 4>(Args)' -> 'kernel'"""
    name = re.sub(r"^void ", "", name.replace("(anonymous namespace)", "anon"))
    return re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1]

failed_compile, kernels = [], []   # kernels: (source, mangled, regs, smem, spill_st, spill_ld, stack)
for rc_path in sorted(glob.glob(os.path.join(logs, "*.rc"))):
    base = rc_path[:-3]
    src = open(base + ".src").read().strip()
    log = open(base + ".log").read()
    secs = open(base + ".secs").read().strip()
    if open(rc_path).read().strip() != "0":
        failed_compile.append((src, log))
        continue
    print(f"compiled {src} ({secs} s)")
    current, props = None, {}
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1)
            props[current] = {"stack": 0, "st": 0, "ld": 0, "regs": None, "smem": 0}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            props[current].update(stack=int(m.group(1)), st=int(m.group(2)), ld=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            props[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            props[current]["smem"] = int(s.group(1)) if s else 0
            current = None
    for name, p in props.items():
        if p["regs"] is not None:  # entry functions (device functions report no register line)
            kernels.append((src, name, p["regs"], p["smem"], p["st"], p["ld"], p["stack"]))

for src, log in failed_compile:
    print(f"\nFAILED to compile {src}:\n{log}", file=sys.stderr)

names = demangle([k[1] for k in kernels])
groups = collections.OrderedDict()
spilling, allowed = [], []
for src, mangled, regs, smem, st, ld, stack in kernels:
    full = names.get(mangled, mangled)
    key = (os.path.basename(src), template_of(full))
    g = groups.setdefault(key, {"n": 0, "regs": 0, "smem": 0, "spill": 0})
    g["n"] += 1
    g["regs"] = max(g["regs"], regs)
    g["smem"] = max(g["smem"], smem)
    g["spill"] += st + ld
    if st or ld:
        (allowed if allow_re and allow_re.search(full) else spilling).append((src, full, regs, st, ld))

print(f"\n{'file':<28} {'kernel':<34} {'inst':>4} {'max regs':>8} {'max smem':>9} {'spill B':>8}")
for (src, kernel), g in groups.items():
    print(f"{src:<28} {kernel:<34} {g['n']:>4} {g['regs']:>8} {g['smem']:>9} {g['spill']:>8}")
print(f"{len(kernels)} kernels in {len(groups)} templates")

for src, full, regs, st, ld in allowed:
    print(f"warning: {full} ({src}): {regs} registers, {st} B spill stores, {ld} B spill loads (ALLOW_SPILLS)")
for src, full, regs, st, ld in spilling:
    print(f"SPILL: {full} ({src}): {regs} registers, {st} B spill stores, {ld} B spill loads", file=sys.stderr)

if failed_compile or spilling or not kernels:
    print(f"compile_csrc: {len(failed_compile)} file(s) failed, {len(spilling)} kernel(s) spill"
          + ("" if kernels else ", no kernels found"), file=sys.stderr)
    sys.exit(1)
print("compile_csrc: OK")
PY
if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "ptxas logs in $LOGS"; fi
exit $status
