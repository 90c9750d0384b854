#!/usr/bin/python3
"""The Python client (client/python/tandem_client) against a real deployment: `tandem up` with
the tiny preset, started here (TANDEM_BIN names the binary). Streams carry the same tokens as
the C++ library's `tandem generate` for the same greedy request, cancel and deadlines end a
stream with its one final event, errors come back as final events or TandemError with the
library's codes, 32 generators from 32 threads each get their own tokens, and status,
tokenize and metrics_text answer. Run by run_client_test.sh in a venv (ctest python_client)."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

from tandem_client import Client, FinalEvent, TandemError, TokenEvent

TANDEM = os.environ["TANDEM_BIN"]


def prompt_of(n, salt):
    return [3 + (i * 31 + salt * 17) % 200 for i in range(n)]


def collect(stream, limit=60.0):
    """(token ids, texts, the final event); fails past `limit` seconds."""
    ids, texts, deadline = [], [], time.monotonic() + limit
    while time.monotonic() < deadline:
        ev = stream.next(timeout=0.1)
        if ev is None:
            continue
        if ev.final:
            return ids, texts, ev
        ids.append(ev.id)
        texts.append(ev.text)
    raise AssertionError(f"stream {stream.id} had no final event within {limit} s")


class Deployment:
    """`tandem up` (one worker, steps slowed to 5 ms so a stream lasts long enough to cancel)."""

    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="tandem-py-")
        self.model = os.path.join(self.dir, "tiny.gguf")
        subprocess.run([TANDEM, "make-model", "--preset", "tiny", "--out", self.model], check=True,
                       stdout=subprocess.DEVNULL)
        self.out = open(os.path.join(self.dir, "up.out"), "w+")
        self.proc = subprocess.Popen(
            [TANDEM, "up", "--model", self.model, "--runtime-dir", os.path.join(self.dir, "run"), "--workers", "1",
             "--threads", "1", "--log-level", "warn", "--test-step-delay-ms", "5", *flags],
            stdout=self.out, stderr=subprocess.STDOUT)
        self.endpoint = "ipc://" + os.path.join(self.dir, "run", "client.sock")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(self.out.name) as f:
                if "tandem: ready" in f.read():
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError("tandem up did not become ready: " + open(self.out.name).read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Deployment()
        cls.c = Client(cls.d.endpoint)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.stop()

    def test_a_stream_carries_what_tandem_generate_prints(self):
        prompt = prompt_of(12, 1)
        events = list(self.c.generate(prompt, max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2))
        self.assertEqual(len(events), 9)
        self.assertTrue(all(isinstance(e, TokenEvent) for e in events[:8]))
        fin = events[-1]
        self.assertIsInstance(fin, FinalEvent)
        self.assertEqual((fin.reason, fin.error_code), ("length", ""))
        self.assertEqual((fin.prompt_tokens, fin.completion_tokens), (12, 8))
        self.assertGreater(fin.total_ms, 0)
        self.assertTrue(all(len(e.top) == 2 and e.logprob <= 0 for e in events[:8]))
        out = subprocess.run(
            [TANDEM, "generate", "--endpoint", self.d.endpoint, "--tokens", ",".join(map(str, prompt)),
             "--max-tokens", "8", "--ignore-eos", "--json"], check=True, capture_output=True, text=True).stdout
        cpp = [e["id"] for e in map(json.loads, out.splitlines()) if e["type"] == "token"]
        self.assertEqual([e.id for e in events[:8]], cpp)
        # Not streamed: the same tokens, all with the final event.
        ids, _, fin = collect(self.c.generate(prompt, max_tokens=8, ignore_eos=True, stream=False))
        self.assertEqual(ids, cpp)

    def test_text_prompts_are_charged_what_count_tokens_says(self):
        text = "The lighthouse keeper"
        ids, texts, fin = collect(self.c.generate(text, max_tokens=4, ignore_eos=True))
        self.assertEqual(fin.prompt_tokens, self.c.count_tokens(text))
        self.assertEqual(len(self.c.tokenize(text)), fin.prompt_tokens)
        self.assertEqual(len(ids), 4)

    def test_cancel_ends_a_stream_with_one_final_event(self):
        s = self.c.generate(prompt_of(8, 2), max_tokens=400, ignore_eos=True)
        self.assertIsNotNone(s.next(timeout=30))
        s.cancel()
        ids, _, fin = collect(s)
        self.assertEqual(fin.reason, "cancelled")
        self.assertLess(len(ids), 399)
        self.assertIsNone(s.next(timeout=0.1))
        self.assertTrue(s.finished)
        # By id, through the client.
        s = self.c.generate(prompt_of(8, 3), max_tokens=400, ignore_eos=True, id="py-cancel-by-id")
        self.assertIsNotNone(s.next(timeout=30))
        self.c.cancel("py-cancel-by-id")
        self.assertEqual(collect(s)[2].reason, "cancelled")
        # A deadline: the scheduler cancels it.
        fin = collect(self.c.generate(prompt_of(8, 4), max_tokens=400, ignore_eos=True, timeout=0.2))[2]
        self.assertEqual((fin.reason, fin.error_message), ("cancelled", "deadline exceeded"))

    def test_logit_bias_and_penalties_pass_through(self):
        ids, _, fin = collect(self.c.generate(prompt_of(8, 6), max_tokens=6, ignore_eos=True, temperature=1.0,
                                              seed=3, logit_bias={"77": 100}))
        self.assertEqual(ids, [77] * 6)
        fin = collect(self.c.generate([3, 4], max_tokens=4, logit_bias={1 << 20: 5}))[2]
        self.assertEqual(fin.error_code, "INVALID_ARGUMENT")
        self.assertIn("logit_bias: token id 1048576", fin.error_message)
        fin = collect(self.c.generate([3, 4], max_tokens=4, presence_penalty=3))[2]
        self.assertEqual((fin.error_code, fin.error_message), ("INVALID_ARGUMENT", "presence_penalty 3 is outside [-2, 2]"))
        self.assertEqual(collect(self.c.generate([3, 4], max_tokens=4, ignore_eos=True, frequency_penalty=1.5))[2].reason, "length")

    def test_errors_come_back_as_final_events_or_tandem_errors(self):
        fin = collect(self.c.generate([3, 1 << 30], max_tokens=4))[2]
        self.assertEqual((fin.reason, fin.error_code), ("error", "INVALID_ARGUMENT"))
        self.assertIn("1073741824", fin.error_message)
        fin = collect(self.c.generate([3, 4], max_tokens=4, temperature=-1))[2]
        self.assertEqual(fin.error_code, "INVALID_ARGUMENT")
        fin = collect(self.c.generate([3, 4], id="x" * 300))[2]
        self.assertEqual((fin.error_code, fin.error_message), ("INVALID_ARGUMENT", "request_id: 300 bytes, at most 256"))
        fin = collect(self.c.generate("x" * ((1 << 20) + 1)))[2]
        self.assertEqual(fin.error_code, "INVALID_ARGUMENT")
        # The same id twice while the first is live.
        first = self.c.generate(prompt_of(8, 5), max_tokens=400, ignore_eos=True, id="py-dup")
        fin = collect(self.c.generate(prompt_of(8, 5), id="py-dup"))[2]
        self.assertEqual(fin.error_code, "INVALID_ARGUMENT")
        self.assertIn("already in flight", fin.error_message)
        first.cancel()
        self.assertEqual(collect(first)[2].reason, "cancelled")
        with self.assertRaises(TandemError) as e:
            self.c.tokenize(messages=[{"role": "asistant", "content": "x"}])
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(TypeError):
            self.c.generate(b"bytes are neither text nor token ids")
        with self.assertRaises(TandemError) as e:
            Client("")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")

    def test_a_principal_is_sent_and_checked(self):
        # Without client keys any client may name a principal (a label for limits and logs).
        fin = collect(self.c.generate([3, 4], max_tokens=2, principal="alice"))[2]
        self.assertEqual(fin.reason, "length")
        fin = collect(self.c.generate([3, 4], principal="p" * 129))[2]
        self.assertEqual((fin.error_code, fin.error_message), ("INVALID_ARGUMENT", "principal: 129 bytes, at most 128"))
        fin = collect(self.c.generate([3, 4], principal="tab\there"))[2]
        self.assertEqual(fin.error_code, "INVALID_ARGUMENT")
        self.assertIn("principal: byte 9 at position 3 is not printable ASCII", fin.error_message)

    def test_a_closed_client_ends_what_it_has_in_flight_and_refuses_more(self):
        c = Client(self.d.endpoint)
        s = c.generate(prompt_of(8, 6), max_tokens=400, ignore_eos=True)
        self.assertIsNotNone(s.next(timeout=30))
        c.close()
        fin = collect(s)[2]
        self.assertEqual((fin.error_code, fin.error_message), ("UNAVAILABLE", "client closed"))
        fin = collect(c.generate([3, 4]))[2]
        self.assertEqual((fin.error_code, fin.error_message), ("UNAVAILABLE", "client closed"))
        with self.assertRaises(TandemError) as e:
            c.status()
        self.assertEqual(e.exception.code, "UNAVAILABLE")
        c.close()  # idempotent

    def test_a_silent_scheduler_ends_streams_with_unavailable(self):
        nowhere = "ipc://" + os.path.join(self.d.dir, "nobody.sock")
        with Client(nowhere, liveness_timeout=0.2, request_timeout=0.3) as c:
            started = time.monotonic()
            fin = collect(c.generate([3, 4], max_tokens=4), limit=10)[2]
            self.assertEqual(fin.error_code, "UNAVAILABLE")
            self.assertIn("did not answer a probe", fin.error_message)
            self.assertLess(time.monotonic() - started, 5)
            with self.assertRaises(TandemError) as e:
                c.metrics_text()
            self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_32_generators_from_32_threads_each_get_their_own_tokens(self):
        prompts = [prompt_of(6 + i % 5, 100 + i) for i in range(32)]
        expected = [collect(self.c.generate(p, max_tokens=6, ignore_eos=True))[0] for p in prompts[:4]]
        results = [None] * 32

        def run(i):
            events = list(self.c.generate(prompts[i], max_tokens=6, ignore_eos=True))
            results[i] = events

        threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i, events in enumerate(results):
            self.assertIsNotNone(events, f"generator {i} did not end")
            self.assertEqual(sum(e.final for e in events), 1)
            self.assertEqual(events[-1].reason, "length", events[-1])
            self.assertEqual(len(events), 7)
            if i < 4:
                self.assertEqual([e.id for e in events[:-1]], expected[i])

    def test_status_and_metrics_answer(self):
        s = self.c.status()
        self.assertTrue(s["ready"])
        self.assertEqual(len(s["workers"]), 1)
        self.assertEqual(s["workers"][0]["role"], "both")
        self.assertGreater(s["workers"][0]["kv_blocks_total"], 0)
        before = s["tokens_generated"]
        collect(self.c.generate([3, 4, 5], max_tokens=3, ignore_eos=True))
        self.assertEqual(self.c.status()["tokens_generated"], before + 3)
        text = self.c.metrics_text()
        self.assertIn("# TYPE tandem:time_to_first_token_seconds histogram\n", text)
        line = next(l for l in text.splitlines() if l.startswith("tandem:generation_tokens_total"))
        self.assertEqual(line, f'tandem:generation_tokens_total{{model_name="tandem-tiny"}} {before + 3}')
        cpp = subprocess.run([TANDEM, "status", "--endpoint", self.d.endpoint, "--prometheus"], check=True,
                             capture_output=True, text=True).stdout
        self.assertEqual([l for l in cpp.splitlines() if "generation_tokens_total" in l],
                         [l for l in text.splitlines() if "generation_tokens_total" in l])


class CurveTest(unittest.TestCase):
    def test_only_a_client_with_the_server_key_is_served(self):
        keys = tempfile.mkdtemp(prefix="tandem-py-keys-")
        try:
            subprocess.run([TANDEM, "keys", "--out", keys], check=True, capture_output=True)
            d = Deployment("--curve-keys", keys)
            try:
                with open(os.path.join(keys, "server.pub")) as f:
                    pub = f.read().strip()
                with Client(d.endpoint, curve_server_key=pub) as c:
                    ids, _, fin = collect(c.generate([5, 6, 7], max_tokens=4))
                    self.assertEqual((fin.reason, len(ids)), ("length", 4), fin)
                with Client(d.endpoint) as c, self.assertRaises(TandemError) as e:
                    c.status(timeout=1)
                self.assertEqual(e.exception.code, "UNAVAILABLE")
            finally:
                d.stop()
        finally:
            shutil.rmtree(keys, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
