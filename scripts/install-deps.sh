#!/usr/bin/env bash
# Installs tandem's build and test dependencies from Debian's packages (Debian 12).
# Idempotent: only missing packages are installed; a second run does nothing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libzmq3-dev cppzmq-dev               # transport between actors
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
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all ${#packages[@]} packages present"; exit 0; }

echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
