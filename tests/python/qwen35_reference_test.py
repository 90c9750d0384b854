#!/usr/bin/python3
"""scripts/qwen35-reference.py (the float64 qwen35 reference, docs/HYBRID.md) on a freshly made
random tiny file: the recurrent and chunked forms agree, a chunked form that forgets the carried
state is caught, the file has llama.cpp's qwen35 layout, and the reference reproduces llama.cpp's
recorded continuations of the same file (tests/data/qwen35/).

  /usr/bin/python3 tests/python/qwen35_reference_test.py -v
"""
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "qwen35-reference.py")
DATA = os.path.join(ROOT, "tests", "data", "qwen35")

spec = importlib.util.spec_from_file_location("qwen35_reference", SCRIPT)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)

# llama.cpp's qwen35 tensors (src/models/qwen35.cpp, load_arch_tensors) for the tiny preset, as
# ggml dims (innermost first): dim 64, FFN 192; delta net 2 QK heads / 4 V heads of 16 (conv
# channels 2*32 + 64 = 128); attention 4 heads, 2 KV heads, head_dim 32.
COMMON = {"attn_norm.weight": [64], "post_attention_norm.weight": [64], "ffn_gate.weight": [64, 192],
          "ffn_up.weight": [64, 192], "ffn_down.weight": [192, 64]}
LINEAR = {"attn_qkv.weight": [64, 128], "attn_gate.weight": [64, 64], "ssm_conv1d.weight": [4, 128],
          "ssm_dt.bias": [4], "ssm_a": [4], "ssm_beta.weight": [64, 4], "ssm_alpha.weight": [64, 4],
          "ssm_norm.weight": [16], "ssm_out.weight": [64, 64]}
FULL = {"attn_q.weight": [64, 256], "attn_k.weight": [64, 64], "attn_v.weight": [64, 64],
        "attn_output.weight": [128, 64], "attn_q_norm.weight": [32], "attn_k_norm.weight": [32]}


def ggml_dims(array):
    return list(reversed(array.shape))


class Qwen35ReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.dir.name, "tiny.gguf")
        subprocess.run([sys.executable, SCRIPT, "--make-random", cls.path, "--preset", "tiny", "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        cls.model = ref.Model(ref.Gguf(cls.path))

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_recurrent_and_chunked_forms_agree(self):
        run = subprocess.run([sys.executable, SCRIPT, self.path, "--self-check", "--n-tokens", "150"],
                             capture_output=True, text=True)
        print(run.stdout, end="")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertEqual(run.stdout.count(" ok"), 4)

    def test_a_chunked_form_that_drops_the_carried_state_is_caught(self):
        real = ref.delta_chunk

        def forgetful(q, k, v, g, beta, S):
            S[...] = 0.0  # each grid chunk starts from zero: wrong from position 64 on
            return real(q, k, v, g, beta, S)

        ref.delta_chunk = forgetful
        try:
            with redirect_stdout(io.StringIO()) as out:
                ok = ref.self_check(self.model, 150, 1)
        finally:
            ref.delta_chunk = real
        self.assertFalse(ok, out.getvalue())
        self.assertIn("FAIL", out.getvalue())

    def test_the_file_has_llama_cpps_qwen35_layout(self):
        g = ref.Gguf(self.path)
        kv = g.kv
        self.assertEqual(kv["general.architecture"], "qwen35")
        for key, value in {"block_count": 4, "embedding_length": 64, "feed_forward_length": 192,
                           "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 32,
                           "attention.value_length": 32, "rope.dimension_count": 8,
                           "rope.dimension_sections": [2, 1, 1, 0], "ssm.conv_kernel": 4, "ssm.state_size": 16,
                           "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 64,
                           "full_attention_interval": 4}.items():
            self.assertEqual(kv["qwen35." + key], value, key)
        self.assertEqual(self.model.c.recurrent, [True, True, True, False])
        expected = {"token_embd.weight": [64, 512], "output_norm.weight": [64], "output.weight": [64, 512]}
        for i, recurrent in enumerate(self.model.c.recurrent):
            for name, dims in {**COMMON, **(LINEAR if recurrent else FULL)}.items():
                expected[f"blk.{i}.{name}"] = dims
        self.assertEqual({name: ggml_dims(a) for name, a in g.tensors.items()}, expected)
        for i in range(3):
            self.assertTrue((g.tensors[f"blk.{i}.ssm_a"] < 0).all(), "ssm_a holds -exp(A_log)")

    def test_an_explicit_layer_pattern_is_written_and_read(self):
        path = os.path.join(self.dir.name, "pattern.gguf")
        subprocess.run([sys.executable, SCRIPT, "--make-random", path, "--layers", "FLLFL", "--seed", "2"],
                       check=True, stdout=subprocess.DEVNULL)
        g = ref.Gguf(path)
        self.assertEqual(g.kv["qwen35.attention.recurrent_layers"], [False, True, True, False, True])
        model = ref.Model(g)
        self.assertEqual(model.c.recurrent, [False, True, True, False, True])
        self.assertIn("blk.0.attn_q.weight", g.tensors)
        self.assertIn("blk.4.ssm_a", g.tensors)
        with redirect_stdout(io.StringIO()) as out:
            self.assertTrue(ref.self_check(model, 100, 2), out.getvalue())

    def test_reproduces_llama_cpps_continuations_of_the_same_file(self):
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with open(os.path.join(DATA, "tiny-seed1.gguf.sha256")) as f:
            recorded = f.read().split()[0]
        if digest != recorded:
            self.skipTest(f"this numpy draws a different file ({digest}) than the recorded one ({recorded})")
        with redirect_stdout(io.StringIO()) as out:
            agree, total, worst = ref.compare_llama(self.model, os.path.join(DATA, "tiny-seed1-llamacpp.jsonl"),
                                                    os.path.join(DATA, "prompts.txt"))
        print(out.getvalue(), end="")
        self.assertEqual(agree, total)
        self.assertLess(worst, 1e-4)


if __name__ == "__main__":
    unittest.main()
