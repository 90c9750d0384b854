#!/usr/bin/env bash
# The Python client's test (ctest python_client): installs client/python as a user would, into a
# venv of Debian's /usr/bin/python3 that sees Debian's python3-zmq and python3-protobuf
# (--system-site-packages), offline (--no-build-isolation --no-index: Debian's setuptools and
# protoc build it), then runs client_test.py against a real `tandem up` it starts, and
# prometheus_scrape_test.py (a real Prometheus server scraping the metrics).
# Usage: run_client_test.sh WORK_DIR TANDEM_BIN
set -euo pipefail
work=$(realpath -m "$1") tandem=$(realpath "$2")
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work/src/client"
# A copy of the package and the protos it is generated from: pip builds in the tree it is given,
# and the source tree stays clean.
cp -r "$src/client/python" "$work/src/client/python"
cp -r "$src/proto" "$work/src/proto"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-build-isolation --no-index "$work/src/client/python"
cd "$work"  # not the source tree: the installed package is what is imported
export TANDEM_BIN=$tandem
status=0
"$work/venv/bin/python" "$src/tests/python/client_test.py" -v || status=1
"$work/venv/bin/python" "$src/tests/python/prometheus_scrape_test.py" -v || status=1
exit $status
