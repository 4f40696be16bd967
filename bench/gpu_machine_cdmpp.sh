#!/usr/bin/env bash
# CDMPP device domains of a GPU machine that has no TVM: the H100 GPU and its many-core CPU.
#
# The lent GPU machine (../.library/device) has CUDA, PyTorch, pyarrow and pandas but no TVM and
# no network, so TVM 0.27 travels with the working tree (64 MiB a call) in two calls:
#   call 1: carry .tvmpack/a (first half of libtvm_compiler.so (xz), the rest of TVM, tvm-ffi) -> `$0 stash`
#   call 2: carry .tvmpack/b (second half of libtvm_compiler.so, the sampled programs) -> `$0 install`
# then `$0 gpu MINUTES`, `$0 cpu MINUTES`, `$0 features [N]`, `$0 out` in the same or later calls while the machine
# stays warm (stores live in /tmp and are resumable).  Build the packs here with `$0 pack`.
# Results come back as $OUT/*.sqlite.xz; merge them with
#   tensorplan dataset export --store gpu.sqlite --out data/cdmpp-h100
#   tensorplan dataset merge-device --prefix gpuhost --store cpu.sqlite
set -uo pipefail
step=${1:?step: pack|stash|install|gpu|cpu|features|out}
site=/tmp/site
env_setup() {
  export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1
  export LD_LIBRARY_PATH=$(find / -name 'libcudart.so.13' -printf '%h\n' 2>/dev/null | head -1):${LD_LIBRARY_PATH:-}
  export PATH=$PATH:/usr/local/cuda/bin
}
case $step in
pack)   # here: split TVM into two carries of < 40 MB each (then: tensorplan dataset sample -o .tvmpack/b/gpu_programs_h100.parquet)
  v=.venv/lib/python3.11/site-packages
  rm -rf .tvmpack/a .tvmpack/b /tmp/tvmstage && mkdir -p .tvmpack/a .tvmpack/b /tmp/tvmstage
  xz -9e -T1 -c $v/tvm/lib/libtvm_compiler.so > /tmp/ltc.so.xz
  split -b 32000000 -d /tmp/ltc.so.xz /tmp/ltc.xz.
  mv /tmp/ltc.xz.00 .tvmpack/a/ && mv /tmp/ltc.xz.01 .tvmpack/b/
  cp -r $v/tvm $v/apache_tvm-*.dist-info /tmp/tvmstage/
  rm -rf /tmp/tvmstage/tvm/3rdparty/cutlass /tmp/tvmstage/tvm/lib/libtvm_compiler.so
  find /tmp/tvmstage -name __pycache__ -prune -exec rm -rf {} +
  tar -C /tmp/tvmstage -cf - . | xz -9 -T2 > .tvmpack/a/tvm_rest.tar.xz
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .tvmpack/a apache-tvm-ffi==0.1.14.post1
  ls -la .tvmpack/a .tvmpack/b ;;
stash)  # device, call 1
  mkdir -p /tmp/pk && cp .tvmpack/a/* /tmp/pk/ && ls -la /tmp/pk
  nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\)|Socket|L3"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -V; command -v nvcc gcc g++; python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion())" ;;
install)  # device, call 2
  cat /tmp/pk/ltc.xz.00 .tvmpack/b/ltc.xz.01 | xz -d -T0 > /tmp/ltc.so || exit 1
  mkdir -p $site && tar -C $site -xJf /tmp/pk/tvm_rest.tar.xz && mv /tmp/ltc.so $site/tvm/lib/libtvm_compiler.so
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site /tmp/pk/apache_tvm_ffi-*.whl
  [ -f .tvmpack/b/cpu.sqlite.xz ] && [ ! -f /tmp/cpu.sqlite ] && xz -dc .tvmpack/b/cpu.sqlite.xz > /tmp/cpu.sqlite  # resume
  env_setup
  python3 -c "import tvm; print('tvm', tvm.__version__, tvm.support.libinfo().get('USE_CUDA'))" ;;
gpu)    # device: time the sampled CUDA programs for MINUTES (resumable)
  env_setup
  python3 -m tensorplan dataset measure-gpu --programs .tvmpack/b/gpu_programs_h100.parquet --name "${GPU_NAME:-h100}" \
    --store /tmp/gpu.sqlite --budget-minutes "${2:-5}" --no-progress --json ;;
cpu)    # device: re-time the dataset's CPU programs on this machine's CPU, 1 and all threads
  env_setup
  n=$(nproc)
  python3 -m tensorplan dataset measure-device --prefix "${CPU_NAME:-gpuhost}" --threads 1,$n --workers $n \
    --store /tmp/cpu.sqlite --budget-minutes "${2:-3}" --no-merge --no-progress --json ;;
features)  # device: featurisation throughput on this machine's cores (the 1,000 programs/s;
           # the 2-core VM reaches 579/s with 2 workers, docs/cdmpp.md)
  env_setup
  python3 bench/features_speed.py --n "${2:-400}" --out $OUT/features_speed_gpuhost.json ;;
out)
  for f in /tmp/gpu.sqlite /tmp/cpu.sqlite; do [ -f $f ] && xz -T0 -6 -c $f > $OUT/$(basename $f).xz; done
  ls -la $OUT ;;
esac
