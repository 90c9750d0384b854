#!/usr/bin/python3
"""A real Prometheus server (Debian's prometheus, on loopback, a config written here) scrapes the
HTTP gateway's GET /metrics (`tandem up --http`) while `tandem bench --openai-url` drives the
gateway, and PromQL over the TTFT histogram returns values; `promtool check metrics` accepts
the text the gateway serves. Run by run_client_test.sh (ctest python_client)."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from client_test import TANDEM, Deployment

REQUESTS, OUTPUT_LEN = 12, 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    """(status, content type, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()
    except OSError:
        return 0, None, ""


class PrometheusScrapeTest(unittest.TestCase):
    def test_prometheus_scrapes_the_gateway_during_a_bench_and_promql_reads_the_ttft_histogram(self):
        self.assertIsNotNone(shutil.which("prometheus"), "Debian's prometheus package (scripts/install-deps.sh)")
        gateway = f"127.0.0.1:{free_port()}"
        d = Deployment("--http", gateway, "--model-name", "tiny")
        work = tempfile.mkdtemp(prefix="tandem-prom-")
        prom = None
        err = open(os.path.join(work, "prometheus.err"), "w+")
        try:
            deadline = time.monotonic() + 30
            while get(f"http://{gateway}/ready")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(get(f"http://{gateway}/ready")[0], 200, "the gateway did not become ready")
            config = os.path.join(work, "prometheus.yml")
            with open(config, "w") as f:
                f.write("global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
                        f"scrape_configs:\n  - job_name: tandem\n    static_configs:\n      - targets: ['{gateway}']\n")
            web = f"127.0.0.1:{free_port()}"
            prom = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                 f"--web.listen-address={web}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=err)

            def query(q):
                status, _, body = get(f"http://{web}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
                result = json.loads(body)["data"]["result"] if status == 200 else []
                return float(result[0]["value"][1]) if result else None

            # Prometheus has scraped the gateway before the bench begins (so the run is seen).
            deadline = time.monotonic() + 60
            while query('up{job="tandem"}') != 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            err.seek(0)
            self.assertEqual(query('up{job="tandem"}'), 1, err.read())
            out = os.path.join(work, "bench.json")
            bench = subprocess.run(
                [TANDEM, "bench", "--openai-url", f"http://{gateway}", "--model", "tiny", "--token-prompts",
                 "--concurrency", "2", "--num-requests", str(REQUESTS), "--input-len", "10", "--output-len",
                 str(OUTPUT_LEN), "--ignore-eos", "--out", out],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(bench.returncode, 0, bench.stdout + bench.stderr)

            count, deadline = None, time.monotonic() + 60
            while count != REQUESTS and time.monotonic() < deadline:
                time.sleep(0.2)
                count = query('tandem:time_to_first_token_seconds_count{job="tandem"}')
            err.seek(0)
            self.assertEqual(count, REQUESTS, err.read() + bench.stdout)
            p50 = query("histogram_quantile(0.5, sum by (le) (tandem:time_to_first_token_seconds_bucket))")
            self.assertIsNotNone(p50)
            self.assertGreater(p50, 0)
            self.assertLess(p50, 10)
            self.assertEqual(query('tandem:generation_tokens_total{model_name="tandem-tiny"}'), REQUESTS * OUTPUT_LEN)
            self.assertEqual(query('count(tandem:kv_cache_usage_perc{worker!=""})'), 1)
            # The gateway's own series: the bench's completions among its 200s.
            self.assertGreaterEqual(query('tandem:gateway_http_requests_total{code="200"}'), REQUESTS)

            status, content_type, text = get(f"http://{gateway}/metrics")
            self.assertEqual(status, 200)
            self.assertEqual(content_type, "text/plain; version=0.0.4; charset=utf-8")
            self.check_promtool(text, work)
        finally:
            if prom is not None:
                prom.terminate()
                try:
                    prom.wait(10)
                except subprocess.TimeoutExpired:
                    prom.kill()
                    prom.wait()
            d.stop()
            err.close()
            shutil.rmtree(work, ignore_errors=True)

    def check_promtool(self, text, work):
        """`promtool check metrics` parses the text; its one lint (exit 3) is the colon of vLLM's
        "tandem:" namespacing, which it keeps for recording rules; nothing else."""
        path = os.path.join(work, "metrics.txt")
        with open(path, "w") as f:
            f.write(text)
        with open(path) as f:
            r = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True, text=True)
        self.assertIn(r.returncode, (0, 3), r.stdout + r.stderr)
        lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
        self.assertTrue(lines, "the colon lint names every family")
        for line in lines:
            self.assertIn("metric names should not contain ':'", line)
        self.assertTrue(any("tandem:gateway_http_requests_total" in line for line in lines), lines)


if __name__ == "__main__":
    unittest.main()
