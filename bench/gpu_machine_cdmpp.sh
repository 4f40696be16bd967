#!/usr/bin/env bash
# CDMPP device domains of a GPU machine that has no TVM: its GPU and its many-core CPU.
#
# The lent GPU machine (../.library/device) has CUDA, PyTorch, pyarrow and pandas but no TVM and
# no network, so TVM 0.27 travels with the working tree. A call carries 64 MiB in all, of which
# the tracked tree takes ~40 MB, so TVM goes in pieces of < 24 MB, one per call:
#   calls 1..N-1: carry .tvmpack/pK (K = 0, 1, ...) -> `$0 stash` (keeps the piece in /tmp/pk)
#   call N:       carry the last .tvmpack/pK -> `$0 install` (TVM under /tmp/site)
# then `$0 gpu MINUTES`, `$0 cpu MINUTES`, `$0 features [N]`, `$0 scaling [N]`, `$0 out` in the same or later calls while the machine
# stays warm (stores live in /tmp and are resumable).  Build the pieces here with `$0 pack`;
# the programs to time go in the last piece (PROGRAMS=.tvmpack/pK/FILE.parquet), e.g. from
#   tensorplan predictor dataset sample --target nvidia/nvidia-h100 -o FILE    (new programs), or
#   data/cdmpp-h100/programs.parquet                                 (re-time the H100's programs on another GPU),
#   data/cdmpp-h100/untimed_programs.parquet                         (more programs per task: the 4,644 draws of
#     `dataset sample --target nvidia/nvidia-h100 --programs-per-task 12 --skip-timed data/cdmpp-h100`; it travels
#     with the tree, so PROGRAMS may name it directly).
# Results come back as $OUT/*.sqlite.xz; merge them with
#   tensorplan predictor dataset export --store gpu.sqlite --out data/cdmpp-h100         (a new GPU dataset)
#   tensorplan predictor dataset export --store gpu.sqlite --out data/cdmpp-h100b        (new programs of the same tasks; load
#     both as --data data/cdmpp-h100,data/cdmpp-h100b; bench/cdmpp_programs_per_task.py scores what they add)
#   tensorplan predictor dataset merge-gpu --name h200 --store gpu.sqlite --data data/cdmpp-h100  (same programs, new GPU)
#   tensorplan predictor dataset merge-device --prefix gpuhost --store cpu.sqlite
set -uo pipefail
step=${1:?step: pack|stash|install|gpu|cpu|features|scaling|out}
site=/tmp/site
env_setup() {
  export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1
  export LD_LIBRARY_PATH=$(find / -name 'libcudart.so.13' -printf '%h\n' 2>/dev/null | head -1):${LD_LIBRARY_PATH:-}
  export PATH=$PATH:/usr/local/cuda/bin
}
case $step in
pack)   # here: split TVM into pieces of < 24 MB (.tvmpack/p0, p1, ...)
  v=.venv/lib/python3.11/site-packages
  rm -rf .tvmpack/p* /tmp/tvmstage && mkdir -p /tmp/tvmstage
  [ -f /tmp/ltc.so.xz ] || xz -9e -T2 -c $v/tvm/lib/libtvm_compiler.so > /tmp/ltc.so.xz
  rm -f /tmp/ltc.xz.* && split -b 23000000 -d /tmp/ltc.so.xz /tmp/ltc.xz.
  for f in /tmp/ltc.xz.*; do k=$((10#${f##*.})); mkdir -p .tvmpack/p$k && mv $f .tvmpack/p$k/; done
  cp -r $v/tvm $v/apache_tvm-*.dist-info /tmp/tvmstage/
  rm -rf /tmp/tvmstage/tvm/3rdparty/cutlass /tmp/tvmstage/tvm/lib/libtvm_compiler.so
  find /tmp/tvmstage -name __pycache__ -prune -exec rm -rf {} +
  last=$(ls -d .tvmpack/p* | sort -V | tail -1)
  tar -C /tmp/tvmstage -cf - . | xz -9 -T2 > $last/tvm_rest.tar.xz
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d $last apache-tvm-ffi==0.1.14.post1
  du -sb .tvmpack/p* ;;
stash)  # device, calls 1..N-1
  mkdir -p /tmp/pk && cp .tvmpack/p*/* /tmp/pk/ && ls -la /tmp/pk
  nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\)|Socket|L3"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -V; command -v nvcc gcc g++; python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion())" ;;
install)  # device, call N
  mkdir -p /tmp/pk && cp .tvmpack/p*/* /tmp/pk/
  cat $(ls /tmp/pk/ltc.xz.* | sort) | xz -d -T0 > /tmp/ltc.so || exit 1
  mkdir -p $site && tar -C $site -xJf /tmp/pk/tvm_rest.tar.xz && mv /tmp/ltc.so $site/tvm/lib/libtvm_compiler.so
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site /tmp/pk/apache_tvm_ffi-*.whl
  [ -f /tmp/pk/cpu.sqlite.xz ] && [ ! -f /tmp/cpu.sqlite ] && xz -dc /tmp/pk/cpu.sqlite.xz > /tmp/cpu.sqlite  # resume
  env_setup
  python3 -c "import tvm; print('tvm', tvm.__version__, tvm.support.libinfo().get('USE_CUDA'))" ;;
gpu)    # device: time the sampled CUDA programs for MINUTES (resumable)
  env_setup
  python3 -m tensorplan predictor dataset measure-gpu --programs "${PROGRAMS:-$(ls .tvmpack/p*/*.parquet /tmp/pk/*.parquet 2>/dev/null | head -1)}" --name "${GPU_NAME:-h100}" \
    --store /tmp/gpu.sqlite --budget-minutes "${2:-5}" --no-progress --json ;;
cpu)    # device: re-time the dataset's CPU programs on this machine's CPU, 1 and all threads
  env_setup
  n=$(nproc)
  python3 -m tensorplan predictor dataset measure-device --prefix "${CPU_NAME:-gpuhost}" --threads 1,$n --workers $n \
    --store /tmp/cpu.sqlite --budget-minutes "${2:-3}" --no-merge --no-progress --json ;;
features)  # device: featurisation throughput on this machine's cores (the 1,000 programs/s;
           # the 2-core VM reaches 579/s with 2 workers, research/notes/cdmpp.md)
  env_setup
  python3 bench/features_speed.py --n "${2:-800}" --no-passes --out $OUT/features_speed_gpuhost.json ;;
scaling)   # device: featurisation throughput per worker count (1 .. all cores) on N programs
  env_setup
  python3 bench/features_speed.py --n "${2:-2400}" --scaling "1,4,8,$(nproc)" --out $OUT/features_scaling_gpuhost.json ;;
out)
  for f in /tmp/gpu.sqlite /tmp/cpu.sqlite; do [ -f $f ] && xz -T0 -6 -c $f > $OUT/$(basename $f).xz; done
  ls -la $OUT ;;
esac
