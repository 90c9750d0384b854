#!/usr/bin/python3
"""A real Prometheus server (Debian's prometheus, on loopback, a config written here) scrapes
tandem's metrics during a run of requests, and PromQL over the TTFT histogram returns values.

Until the HTTP gateway serves GET /metrics, the endpoint scraped is the smallest one there can
be: Python's http.server answering each scrape with Client.metrics_text() (the text the gateway
will serve is the same call's). Run by run_client_test.sh in the client's venv."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from client_test import Deployment, collect, prompt_of
from tandem_client import Client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_server(client: Client) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = client.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class PrometheusScrapeTest(unittest.TestCase):
    def test_prometheus_scrapes_tandem_and_promql_reads_the_ttft_histogram(self):
        self.assertIsNotNone(shutil.which("prometheus"), "Debian's prometheus package (scripts/install-deps.sh)")
        d = Deployment()
        work = tempfile.mkdtemp(prefix="tandem-prom-")
        prom, server = None, None
        err = open(os.path.join(work, "prometheus.err"), "w+")
        try:
            with Client(d.endpoint) as c:
                server = metrics_server(c)
                target = f"127.0.0.1:{server.server_address[1]}"
                config = os.path.join(work, "prometheus.yml")
                with open(config, "w") as f:
                    f.write("global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
                            f"scrape_configs:\n  - job_name: tandem\n    static_configs:\n      - targets: ['{target}']\n")
                web = f"127.0.0.1:{free_port()}"
                prom = subprocess.Popen(
                    ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                     f"--web.listen-address={web}", "--log.level=warn"],
                    stdout=subprocess.DEVNULL, stderr=err)
                for i in range(6):
                    self.assertEqual(collect(c.generate(prompt_of(10, i), max_tokens=5, ignore_eos=True))[2].reason,
                                     "length")

                def query(q):
                    url = f"http://{web}/api/v1/query?" + urllib.parse.urlencode({"query": q})
                    try:
                        with urllib.request.urlopen(url, timeout=2) as r:
                            result = json.load(r)["data"]["result"]
                    except OSError:
                        return None
                    return float(result[0]["value"][1]) if result else None

                count, deadline = None, time.monotonic() + 60
                while count != 6 and time.monotonic() < deadline:
                    time.sleep(0.2)
                    count = query('tandem:time_to_first_token_seconds_count{job="tandem"}')
                err.seek(0)
                self.assertEqual(count, 6, err.read())
                p50 = query("histogram_quantile(0.5, sum by (le) (tandem:time_to_first_token_seconds_bucket))")
                self.assertIsNotNone(p50)
                self.assertGreater(p50, 0)
                self.assertLess(p50, 10)
                self.assertEqual(query('tandem:generation_tokens_total{model_name="tandem-tiny"}'), 30)
                self.assertEqual(query('count(tandem:kv_cache_usage_perc{worker!=""})'), 1)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
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


if __name__ == "__main__":
    unittest.main()
