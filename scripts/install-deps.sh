#!/usr/bin/env bash
# Installs tandem's build and test dependencies from Debian's packages (Debian 12).
# Idempotent: only missing packages are installed; a second run does nothing. Then builds
# tandem's libzmq (scripts/build-libzmq.sh) if this machine does not have it yet.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  cppzmq-dev libsodium-dev             # transport between actors: cppzmq headers; libzmq itself is
                                       # built by scripts/build-libzmq.sh (Debian's source + a patch)
  dpkg-dev patch                       # build-libzmq.sh: unpacking and patching the source package
  libprotobuf-dev protobuf-compiler    # the wire format (proto/)
  libboost-dev                         # Asio event loops; Beast (the HTTP gateway)
  nlohmann-json3-dev libssl-dev        # the HTTP gateway: JSON request bodies, TLS
  openssl curl                         # gateway tests: a self-signed certificate, curl -N
  libopenblas-dev                      # BLAS (sgemm rate reference, optional GEMM backend)
  libspdlog-dev                        # logging
  libtomlplusplus-dev                  # the flag table (cli/flags.toml) and tandem up --config
  libxxhash-dev                        # prefix cache block keys (XXH3, header-only use)
  libicu-dev                           # tokenizers: Unicode regex splitting (\p{L}, \p{N}, lookaheads), model/ only
  libgtest-dev libgmock-dev            # unit and end-to-end tests
  libbenchmark-dev                     # engine micro-benchmarks
  gnuplot-nox                          # tandem bench --plot (PNG charts of a run)
  clang libclang-rt-14-dev             # libFuzzer targets (fuzz/), run by scripts/test.sh
  clang-format-14 clang-tidy-14        # scripts/lint.sh: formatting and function length, in CI
  python3-numpy                        # float64 references of the engine and the quantizers (tests/*.py)
  python3-jinja2                       # the reference renderer of chat templates (tests/chat_template_reference.py)
  wamerican                            # the word list trained_model_test checks generated English against
  stress-ng                            # CPU load beside the no-false-fence test (stuck_plan_test) and scripts/stress-tests.sh
  prometheus                           # promtool check metrics on tandem status --prometheus (metrics_test)
  python3-zmq python3-protobuf         # the Python client (client/python), over Debian's pyzmq and protobuf
  python3-venv python3-pip             # its install test: a venv with --system-site-packages, pip --no-build-isolation
  python3-setuptools python3-wheel     # what that pip builds it with, offline
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done"
fi
# libzmq with tandem's patch, built once per machine (nothing to do when it is there).
bash "$(dirname "$0")/build-libzmq.sh"
