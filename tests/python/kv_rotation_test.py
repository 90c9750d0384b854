#!/usr/bin/python3
"""The rotated KV scheme's fixed parts in scripts/kv-quant-sim.py (issue #23): the Lloyd-Max
levels satisfy both optimality conditions, match N(0, 1)'s tabulated levels where the
coordinate distribution becomes Gaussian, and the randomized Hadamard rotation is orthonormal,
deterministic for a seed and different across seeds, layers and K/V. numpy only.
  /usr/bin/python3 tests/python/kv_rotation_test.py -v   (ctest -R kv_rotation)
"""
import importlib.util
import math
import os
import unittest

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
spec = importlib.util.spec_from_file_location("kv_quant_sim", os.path.join(ROOT, "scripts", "kv-quant-sim.py"))
sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)

# Max (1960), Table I: Lloyd-Max levels for N(0, 1), positive half, and the MSE per coordinate.
GAUSS = {
    1: ([0.7980], 0.3634),
    2: ([0.4528, 1.5104], 0.1175),
    3: ([0.2451, 0.7560, 1.3440, 2.1520], 0.03454),
    4: ([0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326], 0.009497),
}


def simpson_moments(lo, hi, d, n=20000):
    """Integrals of f and x f over [lo, hi] by composite Simpson (independent of the
    Gauss-Legendre quadrature lloyd_max uses), f = (1 - x^2)^((d-3)/2) normalized."""
    x = np.linspace(lo, hi, 2 * n + 1)
    w = np.ones_like(x)
    w[1:-1:2], w[2:-1:2] = 4, 2
    w *= (hi - lo) / (6 * n)
    f = sim.coordinate_density(x, d)
    return (w * f).sum(), (w * x * f).sum()


class LloydMaxLevels(unittest.TestCase):
    def test_density_integrates_to_one_with_variance_one_over_d(self):
        for d in (16, 64, 128):
            m0, _ = simpson_moments(-1.0, 1.0, d)
            x = np.linspace(-1, 1, 400001)
            var = np.trapz(x * x * sim.coordinate_density(x, d), x)
            self.assertAlmostEqual(m0, 1.0, places=9, msg=f"d={d}")
            self.assertAlmostEqual(var * d, 1.0, places=6, msg=f"d={d}")

    def test_levels_are_the_centroids_of_their_cells_and_boundaries_the_midpoints(self):
        for d in (16, 64, 128):
            for bits in (2, 3, 4):
                levels, bounds, mse, _ = sim.lloyd_max(d, bits)
                self.assertEqual(len(levels), 1 << bits)
                self.assertTrue(np.all(np.diff(levels) > 0), f"d={d} bits={bits}: not ascending")
                np.testing.assert_array_equal(bounds, (levels[1:] + levels[:-1]) / 2)
                np.testing.assert_allclose(levels, -levels[::-1], atol=1e-15)
                edges = np.concatenate(([-1.0], bounds, [1.0]))
                for i, c in enumerate(levels):
                    m0, m1 = simpson_moments(edges[i], edges[i + 1], d)
                    self.assertAlmostEqual(m1 / m0, c, delta=1e-10, msg=f"d={d} bits={bits} level {i}")
                # The MSE is the variance left: E[x^2] - sum of level^2 * cell mass (centroids).
                masses = [simpson_moments(edges[i], edges[i + 1], d)[0] for i in range(len(levels))]
                self.assertAlmostEqual(mse, 1 / d - float(np.dot(levels**2, masses)), delta=1e-10)

    def test_a_perturbed_table_fails_the_centroid_condition(self):
        # A perturbed table is not a fixed point: the conditions above can fail.
        levels, bounds, _, _ = sim.lloyd_max(16, 3)
        edges = np.concatenate(([-1.0], bounds * 1.01, [1.0]))
        m0, m1 = simpson_moments(edges[4], edges[5], 16)
        self.assertGreater(abs(m1 / m0 - levels[4]), 1e-4)

    def test_large_d_gives_the_gaussian_levels_times_one_over_sqrt_d(self):
        d = 4096
        for bits, (half, mse) in GAUSS.items():
            levels, _, got_mse, _ = sim.lloyd_max(d, bits)
            np.testing.assert_allclose(levels[1 << (bits - 1):] * math.sqrt(d), half, atol=2e-3,
                                       err_msg=f"bits={bits}")
            self.assertAlmostEqual(got_mse * d, mse, delta=2e-3 * mse + 1e-4, msg=f"bits={bits}")

    def test_the_tiny_models_levels_are_what_the_design_note_prints(self):
        # docs/KV_ROTATED.md lists these for head_dim 16; a change must update the note.
        levels, _, mse, _ = sim.lloyd_max(16, 2)
        np.testing.assert_allclose(levels[2:], [0.112489, 0.367207], atol=5e-7)
        self.assertAlmostEqual(mse * 16, 0.10585, delta=1e-5)
        levels, _, _, _ = sim.lloyd_max(16, 4)
        self.assertAlmostEqual(levels[-1], 0.603895, delta=5e-7)


class RandomizedHadamard(unittest.TestCase):
    def test_orthonormal_for_every_power_of_two(self):
        for d in (4, 8, 16, 64, 128, 256):
            R = sim.rotation_matrix(7, 3, 0, d)
            np.testing.assert_allclose(R @ R.T, np.eye(d), rtol=0, atol=1e-12, err_msg=f"d={d}")
            np.testing.assert_allclose(np.abs(R), np.full((d, d), 1 / math.sqrt(d)), rtol=0, atol=1e-15)

    def test_matrix_is_the_fast_transform_of_the_sign_flipped_vector(self):
        rng = np.random.default_rng(5)
        for d in (16, 128):
            x = rng.standard_normal((10, d))
            want = sim.fwht(x * sim.rotation_signs(11, 1, 1, d))  # what a kernel computes: D then H
            np.testing.assert_allclose(x @ sim.rotation_matrix(11, 1, 1, d).T, want, rtol=0, atol=1e-12)
            np.testing.assert_allclose(want @ sim.rotation_matrix(11, 1, 1, d), x, rtol=0, atol=1e-12)  # back

    def test_walsh_hadamard_is_sylvester_ordered(self):
        d = 8
        H = sim.fwht(np.eye(d))
        want = np.array([[(-1) ** bin(i & j).count("1") for j in range(d)] for i in range(d)]) / math.sqrt(d)
        np.testing.assert_array_equal(H, want)

    def test_deterministic_for_a_seed_and_different_otherwise(self):
        a = sim.rotation_matrix(42, 0, 0, 16)
        np.testing.assert_array_equal(a, sim.rotation_matrix(42, 0, 0, 16))
        for other in ((43, 0, 0), (42, 1, 0), (42, 0, 1)):
            self.assertFalse(np.array_equal(a, sim.rotation_matrix(*other, 16)), other)
        # The signs are a fixed function of (seed, layer, kv): pinned, as every worker must agree.
        s = sim.rotation_signs(1, 0, 0, 16)
        self.assertEqual("".join("-" if v < 0 else "+" for v in s), PINNED_SIGNS)
        self.assertEqual(sim.splitmix64(0)[1], 0xE220A8397B1DCDAF)  # SplitMix64's reference output

    def test_rejects_a_head_dim_that_is_not_a_power_of_two(self):
        for d in (12, 48, 96, 2):
            with self.assertRaisesRegex(ValueError, f"power of two >= 4, got {d}"):
                sim.rotation_matrix(1, 0, 0, d)

    def test_rotated_coordinates_follow_the_modelled_distribution(self):
        # A fixed vector (not random) rotated by many seeds: its coordinates' variance is 1/d,
        # the assumption the levels rest on. A spike (one-hot) is the worst case for quantizers
        # without rotation; after it every coordinate is +-1/sqrt(d).
        d = 16
        x = np.zeros(d)
        x[3] = 1.0
        y = np.stack([x @ sim.rotation_matrix(s, 0, 0, d).T for s in range(200)])
        np.testing.assert_allclose(np.abs(y), 1 / math.sqrt(d), atol=1e-15)
        x = np.linspace(-1, 2, d) ** 3
        x /= np.linalg.norm(x)
        y = np.stack([x @ sim.rotation_matrix(s, 0, 0, d).T for s in range(2000)])
        self.assertAlmostEqual(float(y.var()) * d, 1.0, delta=0.05)


# D of (seed 1, layer 0, K) for head_dim 16: docs/KV_ROTATED.md prints it for kernel tests.
PINNED_SIGNS = "-+++++--++---+-+"


class EngineTables(unittest.TestCase):
    def test_the_engines_checked_in_tables_are_the_scripts(self):
        """workers/engine/kv_rotation_levels.inc is `kv-quant-sim.py --cxx-levels`: regenerate it
        when the levels change (tests/engine/kv_rotation_test.cpp checks the engine reads it)."""
        with open(os.path.join(ROOT, "workers", "engine", "kv_rotation_levels.inc")) as f:
            self.assertEqual(f.read(), sim.cxx_levels(),
                             "stale: /usr/bin/python3 scripts/kv-quant-sim.py --cxx-levels > workers/engine/kv_rotation_levels.inc")


if __name__ == "__main__":
    unittest.main()
