"""Generates data/numba_cuda_tasks.jsonl and data/numba_cuda_tasks.mutants.jsonl (falcon-rl)."""
import json, re, sys, textwrap

HEADER = "import math\nimport numpy as np\nfrom numba import cuda\n"
TEST_SETUP = "import numpy as np\nfrom numba import cuda\n"
REQ = ("Requirements: do the computation in at least one CUDA kernel written with\n"
       "numba.cuda (@cuda.jit) and launched from this function. The code must also run\n"
       "in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1). Arguments are host numpy\n"
       "arrays; return host (numpy) results and do not modify the arguments unless\n"
       "stated.")

TASKS = []


def task(name, params, doc, kernels, body, tests, mutants, tags):
    entry = name
    doc = textwrap.dedent(doc).strip("\n") + "\n\n" + REQ
    sig = f"def {entry}({params}):\n" + textwrap.indent('"""' + doc + '\n"""', "    ") + "\n"
    kernels = textwrap.dedent(kernels).strip("\n") + "\n"
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    prompt = HEADER + "\n\n" + sig
    canonical = HEADER + "\n\n" + kernels + "\n\n" + sig + body
    tests = [textwrap.dedent(t).strip("\n") for t in tests]
    muts = []
    for what, repls in mutants:
        # mutate only the code (kernels + host body), never the docstring
        code = kernels + "\x00" + body
        for old, new in repls:
            c = code.count(old)
            assert c == 1, (name, what, old, c)
            code = code.replace(old, new)
        mk, mb = code.split("\x00")
        wrong = HEADER + "\n\n" + mk + "\n\n" + sig + mb
        assert wrong != canonical
        muts.append({"what_is_wrong": what, "wrong_solution": wrong})
    TASKS.append(dict(id=f"numba_cuda/{name}", prompt=prompt, entry_point=entry, tests=tests,
                      kind="numba_cuda", canonical_solution=canonical, test_setup=TEST_SETUP,
                      tags=["numba_cuda", "falcon-bundled"] + tags, _mutants=muts))

# ---------------------------------------------------------------- vector ops
task("vector_add", "a, b",
     """
     Element-wise sum of two 1-D float64 arrays of equal length n (n may be 0).
     Returns a new float64 array c with c[i] = a[i] + b[i].
     """,
     """
     TPB = 64

     @cuda.jit
     def _add_kernel(a, b, out):
         i = cuda.grid(1)
         if i < out.size:
             out[i] = a[i] + b[i]
     """,
     """
     n = a.shape[0]
     out = np.zeros(n, dtype=np.float64)
     if n == 0:
         return out
     _add_kernel[(n + TPB - 1) // TPB, TPB](a, b, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(1)
      a = rng.standard_normal(300)
      b = rng.standard_normal(300)
      r = vector_add(a, b)
      assert r.shape == (300,) and np.allclose(r, a + b)
      """,
      """
      a = np.array([2.5]); b = np.array([-4.0])
      assert np.allclose(vector_add(a, b), [-1.5])
      """,
      """
      r = vector_add(np.zeros(0), np.zeros(0))
      assert r.shape == (0,)
      """,
      """
      a = np.arange(64, dtype=np.float64); b = np.full(64, 0.5)
      assert np.allclose(vector_add(a, b), a + 0.5)
      """,
      """
      rng = np.random.default_rng(2)
      a = rng.standard_normal(129); b = rng.standard_normal(129)
      a0, b0 = a.copy(), b.copy()
      r = vector_add(a, b)
      assert np.allclose(r, a0 + b0) and np.array_equal(a, a0) and np.array_equal(b, b0)
      """],
     [("bound check drops the last element (i < n - 1)", [("if i < out.size:", "if i < out.size - 1:")]),
      ("launches a fixed grid of one block, ignoring n", [("_add_kernel[(n + TPB - 1) // TPB, TPB]", "_add_kernel[1, TPB]")])],
     ["vector"])

task("saxpy", "alpha, x, y",
     """
     Returns a new float64 array alpha * x + y for a float scalar alpha and 1-D
     float64 arrays x, y of equal length n >= 1.
     """,
     """
     TPB = 64

     @cuda.jit
     def _saxpy_kernel(alpha, x, y, out):
         i = cuda.grid(1)
         if i < out.size:
             out[i] = alpha * x[i] + y[i]
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _saxpy_kernel[(n + TPB - 1) // TPB, TPB](float(alpha), x, y, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(3)
      x = rng.standard_normal(200); y = rng.standard_normal(200)
      assert np.allclose(saxpy(2.5, x, y), 2.5 * x + y)
      """,
      """
      rng = np.random.default_rng(4)
      x = rng.standard_normal(65); y = rng.standard_normal(65)
      assert np.allclose(saxpy(0.0, x, y), y)
      """,
      """
      assert np.allclose(saxpy(-1.0, np.array([3.0]), np.array([1.0])), [-2.0])
      """,
      """
      x = np.linspace(-1, 1, 131); y = np.ones(131)
      assert np.allclose(saxpy(3.0, x, y), 3.0 * x + 1.0)
      """],
     [("scales the sum instead of x: alpha * (x + y)", [("alpha * x[i] + y[i]", "alpha * (x[i] + y[i])")])],
     ["vector"])

task("scale_inplace", "x, factor",
     """
     Multiplies the 1-D float64 array x by the scalar factor IN PLACE (the caller's
     array changes) and returns None. n >= 1.
     """,
     """
     TPB = 64

     @cuda.jit
     def _scale_kernel(x, factor):
         i = cuda.grid(1)
         if i < x.size:
             x[i] = x[i] * factor
     """,
     """
     n = x.shape[0]
     d = cuda.to_device(x)
     _scale_kernel[(n + TPB - 1) // TPB, TPB](d, float(factor))
     d.copy_to_host(x)
     return None
     """,
     ["""
      rng = np.random.default_rng(5)
      x = rng.standard_normal(150); ref = x * 3.0
      scale_inplace(x, 3.0)
      assert np.allclose(x, ref)
      """,
      """
      x = np.array([4.0])
      assert scale_inplace(x, -0.5) is None and np.allclose(x, [-2.0])
      """,
      """
      x = np.arange(70, dtype=np.float64)
      scale_inplace(x, 0.0)
      assert np.all(x == 0.0)
      """,
      """
      x = np.linspace(0, 1, 129); ref = x * 2.0
      scale_inplace(x, 2.0)
      assert np.allclose(x, ref)
      """],
     [("never copies the device result back into x", [("d.copy_to_host(x)", "d.copy_to_host()")]),
      ("bound check skips element 0 (0 < i < n)", [("if i < x.size:", "if 0 < i < x.size:")])],
     ["vector", "in-place"])

task("clamp", "x, lo, hi",
     """
     Returns a new float64 array with every element of the 1-D float64 array x
     limited to the closed range [lo, hi] (lo <= hi), like np.clip(x, lo, hi).
     n >= 1.
     """,
     """
     TPB = 64

     @cuda.jit
     def _clamp_kernel(x, lo, hi, out):
         i = cuda.grid(1)
         if i < x.size:
             v = x[i]
             if v < lo:
                 v = lo
             elif v > hi:
                 v = hi
             out[i] = v
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _clamp_kernel[(n + TPB - 1) // TPB, TPB](x, float(lo), float(hi), out)
     return out
     """,
     ["""
      rng = np.random.default_rng(6)
      x = rng.standard_normal(257) * 3
      assert np.allclose(clamp(x, -1.0, 2.0), np.clip(x, -1.0, 2.0))
      """,
      """
      x = np.array([-5.0, 0.0, 5.0])
      assert np.allclose(clamp(x, 1.0, 1.0), [1.0, 1.0, 1.0])
      """,
      """
      x = np.array([7.5])
      assert np.allclose(clamp(x, -2.0, 3.0), [3.0])
      """,
      """
      x = np.linspace(-10, 10, 100)
      assert np.allclose(clamp(x, -20.0, 20.0), x)
      """],
     [("passes lo and hi to the kernel in the wrong order", [("(x, float(lo), float(hi), out)", "(x, float(hi), float(lo), out)")]),
      ("only the lower bound is applied", [("        elif v > hi:\n            v = hi\n", "")])],
     ["vector", "elementwise"])

task("sigmoid", "x",
     """
     Returns a new float64 array with the logistic function 1 / (1 + exp(-x))
     applied to each element of the 1-D float64 array x (n >= 1). Must not
     overflow for large |x| (e.g. x = -800 gives 0.0, x = 800 gives 1.0).
     """,
     """
     TPB = 64

     @cuda.jit
     def _sigmoid_kernel(x, out):
         i = cuda.grid(1)
         if i < x.size:
             v = x[i]
             if v >= 0:
                 out[i] = 1.0 / (1.0 + math.exp(-v))
             else:
                 e = math.exp(v)
                 out[i] = e / (1.0 + e)
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _sigmoid_kernel[(n + TPB - 1) // TPB, TPB](x, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(7)
      x = rng.standard_normal(200) * 4
      assert np.allclose(sigmoid(x), 1.0 / (1.0 + np.exp(-x)))
      """,
      """
      assert np.allclose(sigmoid(np.array([0.0])), [0.5])
      """,
      """
      x = np.array([-800.0, -30.0, 30.0, 800.0])
      with np.errstate(over='ignore'):
          ref = 1.0 / (1.0 + np.exp(-x))
      r = sigmoid(x)
      assert np.all(np.isfinite(r)) and np.allclose(r, ref)
      """,
      """
      x = np.linspace(-6, 6, 97)
      assert np.allclose(sigmoid(x) + sigmoid(-x), 1.0) and np.allclose(sigmoid(x), 1.0 / (1.0 + np.exp(-x)))
      """],
     [("sign error in the exponent for x >= 0", [("1.0 / (1.0 + math.exp(-v))", "1.0 / (1.0 + math.exp(v))")])],
     ["elementwise", "math"])

task("poly_eval", "coeffs, x",
     """
     Evaluates the polynomial with float64 coefficients `coeffs` (highest degree
     first, the np.polyval convention; len(coeffs) >= 1) at every element of the
     1-D float64 array x (n >= 1). Returns a new float64 array equal to
     np.polyval(coeffs, x). Use Horner's rule inside the kernel.
     """,
     """
     TPB = 64

     @cuda.jit
     def _horner_kernel(c, x, out):
         i = cuda.grid(1)
         if i < x.size:
             v = x[i]
             acc = 0.0
             for k in range(c.size):
                 acc = acc * v + c[k]
             out[i] = acc
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _horner_kernel[(n + TPB - 1) // TPB, TPB](coeffs, x, out)
     return out
     """,
     ["""
      c = np.array([2.0, -3.0, 0.5, 1.0])
      x = np.linspace(-2, 2, 150)
      assert np.allclose(poly_eval(c, x), np.polyval(c, x))
      """,
      """
      c = np.array([4.25])
      x = np.array([-1.0, 0.0, 3.0])
      assert np.allclose(poly_eval(c, x), [4.25, 4.25, 4.25])
      """,
      """
      c = np.array([1.0, 0.0, -1.0])
      assert np.allclose(poly_eval(c, np.array([3.0])), [8.0])
      """,
      """
      rng = np.random.default_rng(8)
      c = rng.standard_normal(6); x = rng.uniform(-1.5, 1.5, 77)
      assert np.allclose(poly_eval(c, x), np.polyval(c, x))
      """],
     [("Horner loop skips the leading coefficient", [("for k in range(c.size):", "for k in range(1, c.size):")]),
      ("coefficients read in reverse order (lowest degree first)", [("acc = acc * v + c[k]", "acc = acc * v + c[c.size - 1 - k]")])],
     ["elementwise", "math"])

task("cube_grid_stride", "x",
     """
     Returns a new float64 array with x[i] ** 3 for the 1-D float64 array x
     (n >= 1, n may be much larger than the number of threads). Launch the
     kernel with a FIXED grid of 2 blocks of 64 threads whatever n is, and cover
     all elements with a grid-stride loop.
     """,
     """
     @cuda.jit
     def _cube_kernel(x, out):
         start = cuda.grid(1)
         stride = cuda.gridsize(1)
         for i in range(start, x.size, stride):
             v = x[i]
             out[i] = v * v * v
     """,
     """
     out = np.zeros(x.shape[0], dtype=np.float64)
     _cube_kernel[2, 64](x, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(9)
      x = rng.standard_normal(1000)
      assert np.allclose(cube_grid_stride(x), x ** 3)
      """,
      """
      x = np.array([1.0, -2.0, 3.0, 0.5, -0.5])
      assert np.allclose(cube_grid_stride(x), x ** 3)
      """,
      """
      x = np.arange(129, dtype=np.float64) / 10
      assert np.allclose(cube_grid_stride(x), x ** 3)
      """,
      """
      x = np.linspace(-3, 3, 517)
      assert np.allclose(cube_grid_stride(x), x ** 3)
      """],
     [("no grid-stride loop: only the first 128 elements are computed",
       [("for i in range(start, x.size, stride):\n        v = x[i]\n        out[i] = v * v * v",
         "if start < x.size:\n        v = x[start]\n        out[start] = v * v * v")]),
      ("loop starts at the thread index within the block, not the global index", [("start = cuda.grid(1)", "start = cuda.threadIdx.x")])],
     ["elementwise", "grid-stride"])

# ---------------------------------------------------------------- reductions
task("array_sum", "x",
     """
     Returns the sum of the 1-D float64 array x as a Python float (0.0 for an
     empty array). Use a shared-memory tree reduction per block and combine the
     block results with an atomic add.
     """,
     """
     TPB = 64

     @cuda.jit
     def _sum_kernel(x, out):
         sh = cuda.shared.array(TPB, dtype=np.float64)
         t = cuda.threadIdx.x
         i = cuda.grid(1)
         sh[t] = x[i] if i < x.size else 0.0
         cuda.syncthreads()
         s = TPB // 2
         while s > 0:
             if t < s:
                 sh[t] += sh[t + s]
             cuda.syncthreads()
             s //= 2
         if t == 0:
             cuda.atomic.add(out, 0, sh[0])
     """,
     """
     n = x.shape[0]
     out = np.zeros(1, dtype=np.float64)
     if n == 0:
         return 0.0
     _sum_kernel[(n + TPB - 1) // TPB, TPB](x, out)
     return float(out[0])
     """,
     ["""
      rng = np.random.default_rng(10)
      x = rng.standard_normal(300)
      assert np.isclose(array_sum(x), x.sum())
      """,
      """
      assert np.isclose(array_sum(np.array([-7.25])), -7.25)
      """,
      """
      assert array_sum(np.zeros(0)) == 0.0
      """,
      """
      x = np.arange(1, 201, dtype=np.float64)
      assert np.isclose(array_sum(x), 20100.0)
      """,
      """
      assert np.isclose(array_sum(np.ones(64)), 64.0)
      """],
     [("tree loop stops one step early (while s > 1)", [("while s > 0:", "while s > 1:")]),
      ("block result stored instead of atomically added", [("cuda.atomic.add(out, 0, sh[0])", "out[0] = sh[0]")])],
     ["reduction", "shared-memory", "atomics"])

task("array_max", "x",
     """
     Returns the maximum of the non-empty 1-D float64 array x as a Python float.
     Reduce in shared memory per block and combine blocks with an atomic max.
     The values may all be negative.
     """,
     """
     TPB = 64

     @cuda.jit
     def _max_kernel(x, out):
         sh = cuda.shared.array(TPB, dtype=np.float64)
         t = cuda.threadIdx.x
         i = cuda.grid(1)
         sh[t] = x[i] if i < x.size else -math.inf
         cuda.syncthreads()
         s = TPB // 2
         while s > 0:
             if t < s:
                 sh[t] = max(sh[t], sh[t + s])
             cuda.syncthreads()
             s //= 2
         if t == 0:
             cuda.atomic.max(out, 0, sh[0])
     """,
     """
     n = x.shape[0]
     out = np.full(1, -np.inf, dtype=np.float64)
     _max_kernel[(n + TPB - 1) // TPB, TPB](x, out)
     return float(out[0])
     """,
     ["""
      rng = np.random.default_rng(11)
      x = rng.standard_normal(250)
      assert array_max(x) == x.max()
      """,
      """
      rng = np.random.default_rng(12)
      x = -1.0 - rng.random(70)
      assert array_max(x) == x.max()
      """,
      """
      assert array_max(np.array([-3.5])) == -3.5
      """,
      """
      x = np.zeros(129); x[128] = 9.0
      assert array_max(x) == 9.0
      """],
     [("out-of-range threads pad with 0.0 instead of -inf", [("x[i] if i < x.size else -math.inf", "x[i] if i < x.size else 0.0")]),
      ("bound check misses the last element", [("x[i] if i < x.size else -math.inf", "x[i] if i < x.size - 1 else -math.inf")])],
     ["reduction", "shared-memory", "atomics"])

task("dot", "x, y",
     """
     Returns the dot product of two 1-D float64 arrays of equal length n >= 1
     as a Python float. Multiply element-wise, reduce per block in shared
     memory and combine the block partial sums with an atomic add.
     """,
     """
     TPB = 64

     @cuda.jit
     def _dot_kernel(x, y, out):
         sh = cuda.shared.array(TPB, dtype=np.float64)
         t = cuda.threadIdx.x
         i = cuda.grid(1)
         sh[t] = x[i] * y[i] if i < x.size else 0.0
         cuda.syncthreads()
         s = TPB // 2
         while s > 0:
             if t < s:
                 sh[t] += sh[t + s]
             cuda.syncthreads()
             s //= 2
         if t == 0:
             cuda.atomic.add(out, 0, sh[0])
     """,
     """
     n = x.shape[0]
     out = np.zeros(1, dtype=np.float64)
     _dot_kernel[(n + TPB - 1) // TPB, TPB](x, y, out)
     return float(out[0])
     """,
     ["""
      rng = np.random.default_rng(13)
      x = rng.standard_normal(300); y = rng.standard_normal(300)
      assert np.isclose(dot(x, y), float(x @ y))
      """,
      """
      assert np.isclose(dot(np.array([3.0]), np.array([-2.0])), -6.0)
      """,
      """
      x = np.tile([1.0, 0.0], 50); y = np.tile([0.0, 1.0], 50)
      assert dot(x, y) == 0.0
      """,
      """
      x = np.arange(129, dtype=np.float64); y = np.ones(129)
      assert np.isclose(dot(x, y), 128 * 129 / 2)
      """],
     [("block partial sums are stored, not atomically added", [("cuda.atomic.add(out, 0, sh[0])", "out[0] = sh[0]")]),
      ("reduction starts at a quarter of the block", [("s = TPB // 2", "s = TPB // 4")])],
     ["reduction", "shared-memory", "atomics"])

task("count_greater", "x, threshold",
     """
     Returns, as a Python int, how many elements of the 1-D array x are strictly
     greater than threshold. Count with atomic additions on a device counter.
     x may be empty (result 0).
     """,
     """
     TPB = 64

     @cuda.jit
     def _count_kernel(x, threshold, counter):
         i = cuda.grid(1)
         if i < x.size and x[i] > threshold:
             cuda.atomic.add(counter, 0, 1)
     """,
     """
     n = x.shape[0]
     counter = np.zeros(1, dtype=np.int64)
     if n == 0:
         return 0
     _count_kernel[(n + TPB - 1) // TPB, TPB](x, threshold, counter)
     return int(counter[0])
     """,
     ["""
      rng = np.random.default_rng(14)
      x = rng.integers(0, 10, 300).astype(np.float64)
      assert count_greater(x, 4.0) == int((x > 4.0).sum())
      """,
      """
      x = np.array([5.0, 5.0, 5.0])
      assert count_greater(x, 5.0) == 0
      """,
      """
      assert count_greater(np.zeros(0), 1.0) == 0
      """,
      """
      x = np.arange(130, dtype=np.float64)
      assert count_greater(x, -1.0) == 130
      """,
      """
      rng = np.random.default_rng(15)
      x = rng.standard_normal(77)
      assert count_greater(x, 0.25) == int((x > 0.25).sum())
      """],
     [("uses >= instead of >", [("x[i] > threshold", "x[i] >= threshold")]),
      ("counter increment is a plain store", [("cuda.atomic.add(counter, 0, 1)", "counter[0] = 1")])],
     ["reduction", "atomics"])

task("histogram", "values, nbins",
     """
     values is a 1-D int64 array whose elements lie in [0, nbins), 1 <= nbins
     <= 256; values may be empty. Returns an int64 array of length nbins with
     the number of occurrences of each value (like np.bincount(values,
     minlength=nbins)). Build a per-block histogram in shared memory with atomic
     adds, then merge every bin of it into the global result with atomic adds.
     """,
     """
     TPB = 64
     MAXBINS = 256

     @cuda.jit
     def _hist_kernel(values, nbins, out):
         local = cuda.shared.array(MAXBINS, dtype=np.int64)
         t = cuda.threadIdx.x
         for b in range(t, nbins, cuda.blockDim.x):
             local[b] = 0
         cuda.syncthreads()
         i = cuda.grid(1)
         if i < values.size:
             cuda.atomic.add(local, values[i], 1)
         cuda.syncthreads()
         for b in range(t, nbins, cuda.blockDim.x):
             if local[b] != 0:
                 cuda.atomic.add(out, b, local[b])
     """,
     """
     n = values.shape[0]
     out = np.zeros(nbins, dtype=np.int64)
     if n == 0:
         return out
     _hist_kernel[(n + TPB - 1) // TPB, TPB](values, nbins, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(16)
      v = rng.integers(0, 10, 300)
      assert np.array_equal(histogram(v, 10), np.bincount(v, minlength=10))
      """,
      """
      rng = np.random.default_rng(17)
      v = rng.integers(0, 100, 400)
      assert np.array_equal(histogram(v, 100), np.bincount(v, minlength=100))
      """,
      """
      v = np.zeros(90, dtype=np.int64)
      assert np.array_equal(histogram(v, 1), [90])
      """,
      """
      r = histogram(np.zeros(0, dtype=np.int64), 5)
      assert np.array_equal(r, np.zeros(5, dtype=np.int64))
      """,
      """
      v = np.array([3, 3, 3, 0], dtype=np.int64)
      assert np.array_equal(histogram(v, 6), [1, 0, 0, 3, 0, 0])
      """],
     [("merge step only covers the first blockDim bins",
       [("    for b in range(t, nbins, cuda.blockDim.x):\n        if local[b] != 0:",
         "    if t < nbins:\n        b = t\n        if local[b] != 0:")]),
      ("shared-memory update is a plain store, not an atomic add", [("cuda.atomic.add(local, values[i], 1)", "local[values[i]] = 1")])],
     ["histogram", "shared-memory", "atomics"])

task("histogram_range", "x, lo, hi, nbins",
     """
     Histogram of the 1-D float64 array x over [lo, hi] (lo < hi) with nbins
     equal-width bins. An element v with lo <= v <= hi goes to bin
     floor((v - lo) / (hi - lo) * nbins), except that v == hi goes to the last
     bin; elements outside [lo, hi] are ignored. Returns an int64 array of length
     nbins. Use atomic adds.
     """,
     """
     TPB = 64

     @cuda.jit
     def _hist_range_kernel(x, lo, hi, nbins, out):
         i = cuda.grid(1)
         if i < x.size:
             v = x[i]
             if v >= lo and v <= hi:
                 b = int(math.floor((v - lo) / (hi - lo) * nbins))
                 if b >= nbins:
                     b = nbins - 1
                 cuda.atomic.add(out, b, 1)
     """,
     """
     n = x.shape[0]
     out = np.zeros(nbins, dtype=np.int64)
     if n == 0:
         return out
     _hist_range_kernel[(n + TPB - 1) // TPB, TPB](x, float(lo), float(hi), nbins, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(18)
      x = rng.integers(-20, 120, 300) / 4.0
      lo, hi, nbins = 0.0, 25.0, 10
      m = (x >= lo) & (x <= hi)
      idx = np.minimum(np.floor((x[m] - lo) / (hi - lo) * nbins).astype(np.int64), nbins - 1)
      assert np.array_equal(histogram_range(x, lo, hi, nbins), np.bincount(idx, minlength=nbins))
      """,
      """
      x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
      assert np.array_equal(histogram_range(x, 0.0, 4.0, 4), [1, 1, 1, 2])
      """,
      """
      x = np.array([-1.0, 5.0, 10.5])
      assert np.array_equal(histogram_range(x, 0.0, 10.0, 3), [0, 1, 0])
      """,
      """
      x = np.full(80, 2.0)
      assert np.array_equal(histogram_range(x, 2.0, 3.0, 1), [80])
      """,
      """
      rng = np.random.default_rng(19)
      x = rng.integers(0, 64, 150) / 8.0
      lo, hi, nbins = 1.0, 7.0, 12
      m = (x >= lo) & (x <= hi)
      idx = np.minimum(np.floor((x[m] - lo) / (hi - lo) * nbins).astype(np.int64), nbins - 1)
      assert np.array_equal(histogram_range(x, lo, hi, nbins), np.bincount(idx, minlength=nbins))
      """],
     [("values equal to hi are dropped (v < hi)", [("if v >= lo and v <= hi:", "if v >= lo and v < hi:")]),
      ("bin index computed with the bin count off by one", [("(v - lo) / (hi - lo) * nbins))", "(v - lo) / (hi - lo) * (nbins - 1)))")])],
     ["histogram", "atomics"])

# ---------------------------------------------------------------- scans
task("inclusive_scan", "x",
     """
     Inclusive prefix sum of the 1-D int64 array x (any length, possibly 0):
     returns an int64 array y with y[i] = x[0] + ... + x[i] (like np.cumsum).
     Scan each block in shared memory, scan the per-block totals, then add each
     block's offset.
     """,
     """
     TPB = 64

     @cuda.jit
     def _block_scan(x, out, sums):
         sh = cuda.shared.array(TPB, dtype=np.int64)
         t = cuda.threadIdx.x
         i = cuda.grid(1)
         sh[t] = x[i] if i < x.size else 0
         cuda.syncthreads()
         off = 1
         while off < TPB:
             v = sh[t - off] if t >= off else 0
             cuda.syncthreads()
             sh[t] += v
             cuda.syncthreads()
             off *= 2
         if i < x.size:
             out[i] = sh[t]
         if t == TPB - 1:
             sums[cuda.blockIdx.x] = sh[t]

     @cuda.jit
     def _add_offsets(out, scanned_sums):
         i = cuda.grid(1)
         b = cuda.blockIdx.x
         if i < out.size and b > 0:
             out[i] += scanned_sums[b - 1]

     def _scan_device(d_x, n):
         nblocks = (n + TPB - 1) // TPB
         d_out = cuda.device_array(n, dtype=np.int64)
         d_sums = cuda.device_array(nblocks, dtype=np.int64)
         _block_scan[nblocks, TPB](d_x, d_out, d_sums)
         if nblocks > 1:
             d_scanned = _scan_device(d_sums, nblocks)
             _add_offsets[nblocks, TPB](d_out, d_scanned)
         return d_out
     """,
     """
     n = x.shape[0]
     if n == 0:
         return np.zeros(0, dtype=np.int64)
     d_x = cuda.to_device(np.ascontiguousarray(x, dtype=np.int64))
     return _scan_device(d_x, n).copy_to_host()
     """,
     ["""
      rng = np.random.default_rng(20)
      x = rng.integers(-50, 50, 300)
      assert np.array_equal(inclusive_scan(x), np.cumsum(x))
      """,
      """
      assert np.array_equal(inclusive_scan(np.array([42], dtype=np.int64)), [42])
      """,
      """
      assert inclusive_scan(np.zeros(0, dtype=np.int64)).shape == (0,)
      """,
      """
      x = np.ones(64, dtype=np.int64)
      assert np.array_equal(inclusive_scan(x), np.arange(1, 65))
      """,
      """
      x = np.arange(130, dtype=np.int64)
      assert np.array_equal(inclusive_scan(x), np.cumsum(x))
      """],
     [("adds the block's own total instead of the previous blocks' total", [("out[i] += scanned_sums[b - 1]", "out[i] += scanned_sums[b]")]),
      ("Hillis-Steele loop stops one doubling early", [("while off < TPB:", "while off < TPB // 2:")])],
     ["scan", "shared-memory"])

task("exclusive_scan", "x",
     """
     Exclusive prefix sum of the 1-D int64 array x with 0 <= n <= 256: returns
     an int64 array y with y[0] = 0 and y[i] = x[0] + ... + x[i-1]. Use a single
     block and a work-efficient (Blelloch up-sweep / down-sweep) scan in shared
     memory.
     """,
     """
     SCAN_N = 256

     @cuda.jit
     def _blelloch_kernel(x, out, n):
         sh = cuda.shared.array(SCAN_N, dtype=np.int64)
         t = cuda.threadIdx.x
         for k in range(t, SCAN_N, cuda.blockDim.x):
             sh[k] = x[k] if k < n else 0
         cuda.syncthreads()
         off = 1
         d = SCAN_N // 2
         while d > 0:
             if t < d:
                 ai = off * (2 * t + 1) - 1
                 bi = off * (2 * t + 2) - 1
                 sh[bi] += sh[ai]
             off *= 2
             d //= 2
             cuda.syncthreads()
         if t == 0:
             sh[SCAN_N - 1] = 0
         cuda.syncthreads()
         d = 1
         while d < SCAN_N:
             off //= 2
             if t < d:
                 ai = off * (2 * t + 1) - 1
                 bi = off * (2 * t + 2) - 1
                 tmp = sh[ai]
                 sh[ai] = sh[bi]
                 sh[bi] += tmp
             d *= 2
             cuda.syncthreads()
         for k in range(t, n, cuda.blockDim.x):
             out[k] = sh[k]
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.int64)
     if n == 0:
         return out
     _blelloch_kernel[1, SCAN_N // 2](np.ascontiguousarray(x, dtype=np.int64), out, n)
     return out
     """,
     ["""
      rng = np.random.default_rng(21)
      x = rng.integers(0, 100, 256)
      ref = np.concatenate(([0], np.cumsum(x)[:-1]))
      assert np.array_equal(exclusive_scan(x), ref)
      """,
      """
      assert np.array_equal(exclusive_scan(np.array([9], dtype=np.int64)), [0])
      """,
      """
      rng = np.random.default_rng(22)
      x = rng.integers(-20, 20, 100)
      ref = np.concatenate(([0], np.cumsum(x)[:-1]))
      assert np.array_equal(exclusive_scan(x), ref)
      """,
      """
      assert exclusive_scan(np.zeros(0, dtype=np.int64)).shape == (0,)
      """,
      """
      x = np.full(37, 2, dtype=np.int64)
      assert np.array_equal(exclusive_scan(x), 2 * np.arange(37))
      """],
     [("root is not cleared before the down-sweep (result is shifted by the total)",
       [("    if t == 0:\n        sh[SCAN_N - 1] = 0\n", "")]),
      ("down-sweep swap lost: the left child keeps its own value",
       [("            sh[ai] = sh[bi]\n", "")])],
     ["scan", "shared-memory"])

# ---------------------------------------------------------------- stencils
task("box_blur_1d", "x, radius",
     """
     1-D box blur: y[i] = mean of x[j] for j in [i - radius, i + radius], where
     indices outside [0, n-1] are clamped to the nearest edge (edge replication),
     so every window has 2*radius + 1 terms. x is 1-D float64 with n >= 1;
     radius >= 0 is an int. Returns a new float64 array of length n.
     """,
     """
     TPB = 64

     @cuda.jit
     def _blur1d_kernel(x, radius, out):
         i = cuda.grid(1)
         n = x.size
         if i < n:
             acc = 0.0
             for k in range(-radius, radius + 1):
                 j = min(max(i + k, 0), n - 1)
                 acc += x[j]
             out[i] = acc / (2 * radius + 1)
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _blur1d_kernel[(n + TPB - 1) // TPB, TPB](x, int(radius), out)
     return out
     """,
     ["""
      rng = np.random.default_rng(23)
      x = rng.standard_normal(100); r = 2
      ref = np.convolve(np.pad(x, r, mode='edge'), np.ones(2 * r + 1) / (2 * r + 1), mode='valid')
      assert np.allclose(box_blur_1d(x, r), ref)
      """,
      """
      rng = np.random.default_rng(24)
      x = rng.standard_normal(70)
      assert np.allclose(box_blur_1d(x, 0), x)
      """,
      """
      x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]); r = 5
      ref = np.convolve(np.pad(x, r, mode='edge'), np.ones(2 * r + 1) / (2 * r + 1), mode='valid')
      assert np.allclose(box_blur_1d(x, r), ref)
      """,
      """
      assert np.allclose(box_blur_1d(np.array([3.0]), 3), [3.0])
      """,
      """
      x = np.linspace(0, 1, 130); r = 1
      ref = np.convolve(np.pad(x, r, mode='edge'), np.ones(3) / 3, mode='valid')
      assert np.allclose(box_blur_1d(x, r), ref)
      """],
     [("zero padding instead of edge replication",
       [("j = min(max(i + k, 0), n - 1)\n            acc += x[j]", "j = i + k\n            if j >= 0 and j < n:\n                acc += x[j]")]),
      ("window misses its last element", [("for k in range(-radius, radius + 1):", "for k in range(-radius, radius):")])],
     ["stencil", "1d"])

task("box_blur_2d", "img",
     """
     3x3 box blur of the 2-D float64 array img (shape (H, W), H, W >= 1): each
     output pixel is the mean of the 3x3 neighbourhood, with coordinates outside
     the image clamped to the nearest edge pixel. Returns a new (H, W) float64
     array. Use a 2-D grid of 2-D blocks.
     """,
     """
     BS = 8

     @cuda.jit
     def _blur2d_kernel(img, out):
         r, c = cuda.grid(2)
         H = img.shape[0]
         W = img.shape[1]
         if r < H and c < W:
             acc = 0.0
             for dr in range(-1, 2):
                 for dc in range(-1, 2):
                     rr = min(max(r + dr, 0), H - 1)
                     cc = min(max(c + dc, 0), W - 1)
                     acc += img[rr, cc]
             out[r, c] = acc / 9.0
     """,
     """
     H, W = img.shape
     out = np.zeros((H, W), dtype=np.float64)
     grid = ((H + BS - 1) // BS, (W + BS - 1) // BS)
     _blur2d_kernel[grid, (BS, BS)](img, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(25)
      img = rng.random((20, 13))
      p = np.pad(img, 1, mode='edge')
      ref = sum(p[dr:dr + 20, dc:dc + 13] for dr in range(3) for dc in range(3)) / 9.0
      assert np.allclose(box_blur_2d(img), ref)
      """,
      """
      rng = np.random.default_rng(26)
      img = rng.random((13, 20))
      p = np.pad(img, 1, mode='edge')
      ref = sum(p[dr:dr + 13, dc:dc + 20] for dr in range(3) for dc in range(3)) / 9.0
      assert np.allclose(box_blur_2d(img), ref)
      """,
      """
      assert np.allclose(box_blur_2d(np.array([[4.0]])), [[4.0]])
      """,
      """
      img = np.full((5, 5), 2.5)
      assert np.allclose(box_blur_2d(img), img)
      """,
      """
      img = np.arange(9, dtype=np.float64).reshape(1, 9)
      p = np.pad(img, 1, mode='edge')
      ref = sum(p[dr:dr + 1, dc:dc + 9] for dr in range(3) for dc in range(3)) / 9.0
      assert np.allclose(box_blur_2d(img), ref)
      """],
     [("column index clamped with the row count (H) instead of W", [("cc = min(max(c + dc, 0), W - 1)", "cc = min(max(c + dc, 0), H - 1)")]),
      ("grid sized from H in both dimensions", [("grid = ((H + BS - 1) // BS, (W + BS - 1) // BS)", "grid = ((H + BS - 1) // BS, (H + BS - 1) // BS)")])],
     ["stencil", "2d-grid"])

task("laplacian_2d", "u",
     """
     Discrete 5-point Laplacian of the 2-D float64 array u (shape (H, W)):
     out[i, j] = u[i-1, j] + u[i+1, j] + u[i, j-1] + u[i, j+1] - 4 * u[i, j]
     for interior points (1 <= i <= H-2 and 1 <= j <= W-2) and 0.0 on the
     border. Returns a new (H, W) float64 array. Use a 2-D grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _lap_kernel(u, out):
         i, j = cuda.grid(2)
         H = u.shape[0]
         W = u.shape[1]
         if i < H and j < W:
             if 1 <= i and i < H - 1 and 1 <= j and j < W - 1:
                 out[i, j] = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
             else:
                 out[i, j] = 0.0
     """,
     """
     H, W = u.shape
     out = np.zeros((H, W), dtype=np.float64)
     _lap_kernel[((H + BS - 1) // BS, (W + BS - 1) // BS), (BS, BS)](u, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(27)
      u = rng.standard_normal((15, 11))
      ref = np.zeros_like(u)
      ref[1:-1, 1:-1] = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
      assert np.allclose(laplacian_2d(u), ref)
      """,
      """
      y, x = np.mgrid[0:9, 0:12].astype(np.float64)
      r = laplacian_2d(x ** 2 + y ** 2)
      assert np.allclose(r[1:-1, 1:-1], 4.0) and np.all(r[0] == 0) and np.all(r[-1] == 0) and np.all(r[:, 0] == 0) and np.all(r[:, -1] == 0)
      """,
      """
      u = np.arange(10, dtype=np.float64).reshape(2, 5)
      assert np.array_equal(laplacian_2d(u), np.zeros((2, 5)))
      """,
      """
      u = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
      assert np.allclose(laplacian_2d(u), [[0, 0, 0], [0, -4, 0], [0, 0, 0]])
      """,
      """
      rng = np.random.default_rng(28)
      u = rng.standard_normal((10, 17))
      ref = np.zeros_like(u)
      ref[1:-1, 1:-1] = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
      assert np.allclose(laplacian_2d(u), ref)
      """],
     [("interior test lets the first row and column through (negative indices wrap)",
       [("if 1 <= i and i < H - 1 and 1 <= j and j < W - 1:", "if i < H - 1 and j < W - 1:")]),
      ("vertical neighbour taken from the wrong axis", [("u[i + 1, j] + u[i, j - 1]", "u[i, j + 1] + u[i, j - 1]")])],
     ["stencil", "2d-grid"])

task("conv1d_same", "x, w",
     """
     1-D correlation with zero padding and 'same' output length: with r =
     (len(w) - 1) // 2, y[i] = sum_k w[k] * x[i + k - r] over k = 0..len(w)-1,
     where x outside [0, n-1] counts as 0. x is 1-D float64 (n >= 1), w is 1-D
     float64 of odd length between 1 and 15. Returns a float64 array of length n.
     Stage each block's input tile plus a halo of r elements on each side in
     shared memory.
     """,
     """
     TPB = 64
     MAXR = 7
     SH_LEN = TPB + 2 * MAXR

     @cuda.jit
     def _conv_kernel(x, w, out):
         sh = cuda.shared.array(SH_LEN, dtype=np.float64)
         t = cuda.threadIdx.x
         i = cuda.grid(1)
         n = x.size
         r = (w.size - 1) // 2
         g = cuda.blockIdx.x * TPB
         sh[t + r] = x[i] if i < n else 0.0
         if t < r:
             j = g - r + t
             sh[t] = x[j] if j >= 0 else 0.0
             j = g + TPB + t
             sh[TPB + r + t] = x[j] if j < n else 0.0
         cuda.syncthreads()
         if i < n:
             acc = 0.0
             for k in range(w.size):
                 acc += w[k] * sh[t + k]
             out[i] = acc
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _conv_kernel[(n + TPB - 1) // TPB, TPB](x, w, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(29)
      x = rng.standard_normal(200); w = rng.standard_normal(5); r = 2
      p = np.pad(x, r)
      ref = np.array([np.dot(w, p[i:i + 2 * r + 1]) for i in range(200)])
      assert np.allclose(conv1d_same(x, w), ref)
      """,
      """
      rng = np.random.default_rng(30)
      x = rng.standard_normal(130); w = np.array([1.0, 2.0, 3.0]); r = 1
      p = np.pad(x, r)
      ref = np.array([np.dot(w, p[i:i + 3]) for i in range(130)])
      assert np.allclose(conv1d_same(x, w), ref)
      """,
      """
      rng = np.random.default_rng(31)
      x = rng.standard_normal(90)
      assert np.allclose(conv1d_same(x, np.array([2.0])), 2.0 * x)
      """,
      """
      assert np.allclose(conv1d_same(np.array([5.0]), np.array([1.0, 10.0, 100.0])), [50.0])
      """,
      """
      rng = np.random.default_rng(32)
      x = rng.standard_normal(70); w = rng.standard_normal(15); r = 7
      p = np.pad(x, r)
      ref = np.array([np.dot(w, p[i:i + 15]) for i in range(70)])
      assert np.allclose(conv1d_same(x, w), ref)
      """],
     [("right halo is zero-filled instead of loaded", [("sh[TPB + r + t] = x[j] if j < n else 0.0", "sh[TPB + r + t] = 0.0")]),
      ("left halo is zero-filled instead of loaded", [("sh[t] = x[j] if j >= 0 else 0.0", "sh[t] = 0.0")])],
     ["stencil", "shared-memory", "halo"])

# ---------------------------------------------------------------- transposes / matrices
task("transpose", "a",
     """
     Returns the transpose of the 2-D float64 array a (shape (H, W), H, W >= 1)
     as a new C-contiguous (W, H) float64 array. One thread per element on a 2-D
     grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _transpose_kernel(a, out):
         r, c = cuda.grid(2)
         if r < a.shape[0] and c < a.shape[1]:
             out[c, r] = a[r, c]
     """,
     """
     H, W = a.shape
     out = np.zeros((W, H), dtype=np.float64)
     _transpose_kernel[((H + BS - 1) // BS, (W + BS - 1) // BS), (BS, BS)](a, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(33)
      a = rng.standard_normal((7, 19))
      r = transpose(a)
      assert r.shape == (19, 7) and np.array_equal(r, a.T)
      """,
      """
      rng = np.random.default_rng(34)
      a = rng.standard_normal((19, 7))
      assert np.array_equal(transpose(a), a.T)
      """,
      """
      assert np.array_equal(transpose(np.array([[1.5]])), [[1.5]])
      """,
      """
      a = np.arange(50, dtype=np.float64).reshape(1, 50)
      assert np.array_equal(transpose(a), a.T)
      """,
      """
      a = np.arange(256, dtype=np.float64).reshape(16, 16)
      assert np.array_equal(transpose(a), a.T)
      """],
     [("column bound checked against the row count", [("if r < a.shape[0] and c < a.shape[1]:", "if r < a.shape[0] and c < a.shape[0]:")]),
      ("grid dimensions swapped", [("((H + BS - 1) // BS, (W + BS - 1) // BS)", "((W + BS - 1) // BS, (H + BS - 1) // BS)")])],
     ["transpose", "2d-grid"])

task("transpose_tiled", "a",
     """
     Returns the transpose of the 2-D float64 array a (shape (H, W), H, W >= 1)
     as a new (W, H) float64 array, using shared-memory tiles (e.g. 8x8 with one
     column of padding) so that both the reads of a and the writes of the result
     are row-wise; synchronise the block between loading and storing a tile.
     """,
     """
     TILE = 8
     TILE_PAD = TILE + 1

     @cuda.jit
     def _tiled_transpose_kernel(a, out):
         tile = cuda.shared.array((TILE, TILE_PAD), dtype=np.float64)
         tx = cuda.threadIdx.x
         ty = cuda.threadIdx.y
         bx = cuda.blockIdx.x
         by = cuda.blockIdx.y
         col = bx * TILE + tx
         row = by * TILE + ty
         if row < a.shape[0] and col < a.shape[1]:
             tile[ty, tx] = a[row, col]
         cuda.syncthreads()
         ocol = by * TILE + tx
         orow = bx * TILE + ty
         if orow < out.shape[0] and ocol < out.shape[1]:
             out[orow, ocol] = tile[tx, ty]
     """,
     """
     H, W = a.shape
     out = np.zeros((W, H), dtype=np.float64)
     grid = ((W + TILE - 1) // TILE, (H + TILE - 1) // TILE)
     _tiled_transpose_kernel[grid, (TILE, TILE)](a, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(35)
      a = rng.standard_normal((19, 27))
      r = transpose_tiled(a)
      assert r.shape == (27, 19) and np.array_equal(r, a.T)
      """,
      """
      rng = np.random.default_rng(36)
      a = rng.standard_normal((27, 19))
      assert np.array_equal(transpose_tiled(a), a.T)
      """,
      """
      a = np.arange(64, dtype=np.float64).reshape(8, 8)
      assert np.array_equal(transpose_tiled(a), a.T)
      """,
      """
      assert np.array_equal(transpose_tiled(np.array([[2.0]])), [[2.0]])
      """,
      """
      a = np.arange(51, dtype=np.float64).reshape(3, 17)
      assert np.array_equal(transpose_tiled(a), a.T)
      """],
     [("reads the tile without swapping the thread indices", [("out[orow, ocol] = tile[tx, ty]", "out[orow, ocol] = tile[ty, tx]")]),
      ("output tile placed at the input tile's coordinates",
       [("ocol = by * TILE + tx\n    orow = bx * TILE + ty", "ocol = bx * TILE + tx\n    orow = by * TILE + ty")])],
     ["transpose", "shared-memory", "2d-grid"])

task("matmul", "A, B",
     """
     Matrix product of float64 matrices A (m, k) and B (k, p), all dimensions
     >= 1. Returns a new (m, p) float64 array equal to A @ B. One thread per
     output element on a 2-D grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _matmul_kernel(A, B, C):
         i, j = cuda.grid(2)
         if i < C.shape[0] and j < C.shape[1]:
             acc = 0.0
             for k in range(A.shape[1]):
                 acc += A[i, k] * B[k, j]
             C[i, j] = acc
     """,
     """
     m, p = A.shape[0], B.shape[1]
     C = np.zeros((m, p), dtype=np.float64)
     _matmul_kernel[((m + BS - 1) // BS, (p + BS - 1) // BS), (BS, BS)](A, B, C)
     return C
     """,
     ["""
      rng = np.random.default_rng(37)
      A = rng.standard_normal((5, 7)); B = rng.standard_normal((7, 3))
      assert np.allclose(matmul(A, B), A @ B)
      """,
      """
      assert np.allclose(matmul(np.array([[3.0]]), np.array([[-2.0]])), [[-6.0]])
      """,
      """
      rng = np.random.default_rng(38)
      A = rng.standard_normal((16, 9)); B = rng.standard_normal((9, 12))
      assert np.allclose(matmul(A, B), A @ B)
      """,
      """
      rng = np.random.default_rng(39)
      A = rng.standard_normal((6, 6))
      assert np.allclose(matmul(A, np.eye(6)), A)
      """,
      """
      rng = np.random.default_rng(40)
      A = rng.standard_normal((1, 20)); B = rng.standard_normal((20, 1))
      assert np.allclose(matmul(A, B), A @ B)
      """],
     [("inner loop drops the last k", [("for k in range(A.shape[1]):", "for k in range(A.shape[1] - 1):")]),
      ("B indexed transposed", [("acc += A[i, k] * B[k, j]", "acc += A[i, k] * B[j, k]")])],
     ["matmul", "2d-grid"])

task("matmul_tiled", "A, B",
     """
     Matrix product of float64 matrices A (m, k) and B (k, p), all dimensions
     >= 1 and not necessarily multiples of the tile size. Returns a new (m, p)
     float64 array equal to A @ B. Use square shared-memory tiles (e.g. 8x8):
     each block loads a tile of A and a tile of B per step (zero-padding outside
     the matrices), synchronises, accumulates, and synchronises again.
     """,
     """
     TILE = 8

     @cuda.jit
     def _mm_tiled_kernel(A, B, C):
         sA = cuda.shared.array((TILE, TILE), dtype=np.float64)
         sB = cuda.shared.array((TILE, TILE), dtype=np.float64)
         tx = cuda.threadIdx.x
         ty = cuda.threadIdx.y
         row = cuda.blockIdx.y * TILE + ty
         col = cuda.blockIdx.x * TILE + tx
         K = A.shape[1]
         acc = 0.0
         ntiles = (K + TILE - 1) // TILE
         for t in range(ntiles):
             k = t * TILE + tx
             sA[ty, tx] = A[row, k] if row < A.shape[0] and k < K else 0.0
             k = t * TILE + ty
             sB[ty, tx] = B[k, col] if k < K and col < B.shape[1] else 0.0
             cuda.syncthreads()
             for q in range(TILE):
                 acc += sA[ty, q] * sB[q, tx]
             cuda.syncthreads()
         if row < C.shape[0] and col < C.shape[1]:
             C[row, col] = acc
     """,
     """
     m, p = A.shape[0], B.shape[1]
     C = np.zeros((m, p), dtype=np.float64)
     grid = ((p + TILE - 1) // TILE, (m + TILE - 1) // TILE)
     _mm_tiled_kernel[grid, (TILE, TILE)](A, B, C)
     return C
     """,
     ["""
      rng = np.random.default_rng(41)
      A = rng.standard_normal((13, 17)); B = rng.standard_normal((17, 11))
      assert np.allclose(matmul_tiled(A, B), A @ B)
      """,
      """
      rng = np.random.default_rng(42)
      A = rng.standard_normal((8, 8)); B = rng.standard_normal((8, 8))
      assert np.allclose(matmul_tiled(A, B), A @ B)
      """,
      """
      rng = np.random.default_rng(43)
      A = rng.standard_normal((3, 5)); B = rng.standard_normal((5, 2))
      assert np.allclose(matmul_tiled(A, B), A @ B)
      """,
      """
      rng = np.random.default_rng(44)
      A = rng.standard_normal((1, 20)); B = rng.standard_normal((20, 1))
      assert np.allclose(matmul_tiled(A, B), A @ B)
      """,
      """
      rng = np.random.default_rng(45)
      A = rng.standard_normal((9, 4)); B = rng.standard_normal((4, 10))
      assert np.allclose(matmul_tiled(A, B), A @ B)
      """],
     [("number of k-tiles rounded down (remainder of k ignored)", [("ntiles = (K + TILE - 1) // TILE", "ntiles = K // TILE")]),
      ("B tile stored transposed in shared memory", [("sB[ty, tx] = B[k, col]", "sB[tx, ty] = B[k, col]")])],
     ["matmul", "shared-memory", "2d-grid"])

task("matvec", "A, x",
     """
     Matrix-vector product: A is a float64 (m, k) matrix and x a float64 vector
     of length k (m, k >= 1). Returns a new float64 vector of length m equal to
     A @ x. One thread per row.
     """,
     """
     TPB = 64

     @cuda.jit
     def _matvec_kernel(A, x, y):
         i = cuda.grid(1)
         if i < A.shape[0]:
             acc = 0.0
             for j in range(A.shape[1]):
                 acc += A[i, j] * x[j]
             y[i] = acc
     """,
     """
     m = A.shape[0]
     y = np.zeros(m, dtype=np.float64)
     _matvec_kernel[(m + TPB - 1) // TPB, TPB](A, x, y)
     return y
     """,
     ["""
      rng = np.random.default_rng(46)
      A = rng.standard_normal((70, 9)); x = rng.standard_normal(9)
      assert np.allclose(matvec(A, x), A @ x)
      """,
      """
      rng = np.random.default_rng(47)
      A = rng.standard_normal((3, 40)); x = rng.standard_normal(40)
      assert np.allclose(matvec(A, x), A @ x)
      """,
      """
      assert np.allclose(matvec(np.array([[2.0]]), np.array([4.0])), [8.0])
      """,
      """
      rng = np.random.default_rng(48)
      A = rng.standard_normal((5, 5))
      assert np.allclose(matvec(A, np.ones(5)), A.sum(axis=1))
      """],
     [("row loop starts at column 1", [("for j in range(A.shape[1]):", "for j in range(1, A.shape[1]):")]),
      ("thread per row bound checked against the column count", [("if i < A.shape[0]:", "if i < A.shape[1]:")])],
     ["matmul"])

task("outer", "a, b",
     """
     Outer product of float64 vectors a (length m) and b (length p), m, p >= 1.
     Returns a new (m, p) float64 array with out[i, j] = a[i] * b[j]. Use a 2-D
     grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _outer_kernel(a, b, out):
         i, j = cuda.grid(2)
         if i < a.size and j < b.size:
             out[i, j] = a[i] * b[j]
     """,
     """
     m, p = a.shape[0], b.shape[0]
     out = np.zeros((m, p), dtype=np.float64)
     _outer_kernel[((m + BS - 1) // BS, (p + BS - 1) // BS), (BS, BS)](a, b, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(49)
      a = rng.standard_normal(13); b = rng.standard_normal(21)
      assert np.allclose(outer(a, b), np.outer(a, b))
      """,
      """
      rng = np.random.default_rng(50)
      a = rng.standard_normal(21); b = rng.standard_normal(5)
      assert np.allclose(outer(a, b), np.outer(a, b))
      """,
      """
      assert np.allclose(outer(np.array([3.0]), np.array([-1.0, 2.0])), [[-3.0, 6.0]])
      """,
      """
      a = np.arange(8, dtype=np.float64)
      assert np.allclose(outer(a, a), np.outer(a, a))
      """],
     [("grid sized from m in both dimensions", [("((m + BS - 1) // BS, (p + BS - 1) // BS)", "((m + BS - 1) // BS, (m + BS - 1) // BS)")])],
     ["2d-grid", "vector"])

task("row_sums", "M",
     """
     Returns a float64 vector with the sum of each row of the 2-D float64 array
     M (shape (m, k), m, k >= 1), like M.sum(axis=1). One thread per row.
     """,
     """
     TPB = 64

     @cuda.jit
     def _row_sum_kernel(M, out):
         i = cuda.grid(1)
         if i < M.shape[0]:
             acc = 0.0
             for j in range(M.shape[1]):
                 acc += M[i, j]
             out[i] = acc
     """,
     """
     m = M.shape[0]
     out = np.zeros(m, dtype=np.float64)
     _row_sum_kernel[(m + TPB - 1) // TPB, TPB](M, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(51)
      M = rng.standard_normal((100, 7))
      assert np.allclose(row_sums(M), M.sum(axis=1))
      """,
      """
      M = np.arange(30, dtype=np.float64).reshape(3, 10)
      assert np.allclose(row_sums(M), M.sum(axis=1))
      """,
      """
      assert np.allclose(row_sums(np.array([[5.0]])), [5.0])
      """,
      """
      rng = np.random.default_rng(52)
      M = rng.standard_normal((65, 1))
      assert np.allclose(row_sums(M), M[:, 0])
      """],
     [("inner loop skips the first column", [("for j in range(M.shape[1]):", "for j in range(1, M.shape[1]):")])],
     ["reduction", "2d"])

task("col_means", "M",
     """
     Returns a float64 vector with the mean of each column of the 2-D float64
     array M (shape (m, k), m, k >= 1), like M.mean(axis=0). One thread per
     column.
     """,
     """
     TPB = 64

     @cuda.jit
     def _col_mean_kernel(M, out):
         j = cuda.grid(1)
         if j < M.shape[1]:
             acc = 0.0
             for i in range(M.shape[0]):
                 acc += M[i, j]
             out[j] = acc / M.shape[0]
     """,
     """
     k = M.shape[1]
     out = np.zeros(k, dtype=np.float64)
     _col_mean_kernel[(k + TPB - 1) // TPB, TPB](M, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(53)
      M = rng.standard_normal((9, 70))
      assert np.allclose(col_means(M), M.mean(axis=0))
      """,
      """
      M = np.arange(12, dtype=np.float64).reshape(4, 3)
      assert np.allclose(col_means(M), [4.5, 5.5, 6.5])
      """,
      """
      assert np.allclose(col_means(np.array([[2.0, -4.0]])), [2.0, -4.0])
      """,
      """
      rng = np.random.default_rng(54)
      M = rng.standard_normal((31, 1))
      assert np.allclose(col_means(M), M.mean(axis=0))
      """],
     [("divides by the number of columns instead of rows", [("out[j] = acc / M.shape[0]", "out[j] = acc / M.shape[1]")])],
     ["reduction", "2d"])

task("pairwise_distances", "X, Y",
     """
     Euclidean distance matrix: X is float64 (m, d), Y is float64 (p, d), with
     m, p, d >= 1. Returns a new (m, p) float64 array with
     D[i, j] = sqrt(sum_k (X[i, k] - Y[j, k]) ** 2). Use a 2-D grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _dist_kernel(X, Y, D):
         i, j = cuda.grid(2)
         if i < X.shape[0] and j < Y.shape[0]:
             acc = 0.0
             for k in range(X.shape[1]):
                 diff = X[i, k] - Y[j, k]
                 acc += diff * diff
             D[i, j] = math.sqrt(acc)
     """,
     """
     m, p = X.shape[0], Y.shape[0]
     D = np.zeros((m, p), dtype=np.float64)
     _dist_kernel[((m + BS - 1) // BS, (p + BS - 1) // BS), (BS, BS)](X, Y, D)
     return D
     """,
     ["""
      rng = np.random.default_rng(55)
      X = rng.standard_normal((11, 3)); Y = rng.standard_normal((17, 3))
      ref = np.sqrt(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1))
      assert np.allclose(pairwise_distances(X, Y), ref)
      """,
      """
      X = np.array([[0.0, 0.0]]); Y = np.array([[3.0, 4.0], [0.0, 0.0]])
      assert np.allclose(pairwise_distances(X, Y), [[5.0, 0.0]])
      """,
      """
      rng = np.random.default_rng(56)
      X = rng.standard_normal((9, 5))
      D = pairwise_distances(X, X)
      assert np.allclose(np.diag(D), 0.0) and np.allclose(D, D.T) and np.allclose(D, np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1)))
      """,
      """
      X = np.array([[1.0], [4.0], [-2.0]]); Y = np.array([[0.0]])
      assert np.allclose(pairwise_distances(X, Y), [[1.0], [4.0], [2.0]])
      """],
     [("returns squared distances (missing sqrt)", [("D[i, j] = math.sqrt(acc)", "D[i, j] = acc")]),
      ("bound on j uses the feature dimension", [("if i < X.shape[0] and j < Y.shape[0]:", "if i < X.shape[0] and j < Y.shape[1]:")])],
     ["2d-grid", "distance"])

# ---------------------------------------------------------------- softmax / argmax
task("softmax_rows", "X",
     """
     Row-wise softmax of the 2-D float64 array X (shape (m, k), m, k >= 1):
     out[i, j] = exp(X[i, j] - max_j X[i, :]) / sum_j exp(X[i, j] - max_j X[i, :]).
     Must be numerically stable (entries may be as large as 1000). Use one block
     per row: its threads reduce the row maximum and the row sum in shared
     memory.
     """,
     """
     SM_TPB = 32

     @cuda.jit
     def _softmax_kernel(X, out):
         sh = cuda.shared.array(SM_TPB, dtype=np.float64)
         row = cuda.blockIdx.x
         t = cuda.threadIdx.x
         ncol = X.shape[1]
         m = -math.inf
         for j in range(t, ncol, SM_TPB):
             m = max(m, X[row, j])
         sh[t] = m
         cuda.syncthreads()
         s = SM_TPB // 2
         while s > 0:
             if t < s:
                 sh[t] = max(sh[t], sh[t + s])
             cuda.syncthreads()
             s //= 2
         m = sh[0]
         cuda.syncthreads()
         acc = 0.0
         for j in range(t, ncol, SM_TPB):
             e = math.exp(X[row, j] - m)
             out[row, j] = e
             acc += e
         sh[t] = acc
         cuda.syncthreads()
         s = SM_TPB // 2
         while s > 0:
             if t < s:
                 sh[t] += sh[t + s]
             cuda.syncthreads()
             s //= 2
         total = sh[0]
         for j in range(t, ncol, SM_TPB):
             out[row, j] = out[row, j] / total
     """,
     """
     m = X.shape[0]
     out = np.zeros(X.shape, dtype=np.float64)
     _softmax_kernel[m, SM_TPB](X, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(57)
      X = rng.standard_normal((5, 40))
      e = np.exp(X - X.max(axis=1, keepdims=True))
      assert np.allclose(softmax_rows(X), e / e.sum(axis=1, keepdims=True))
      """,
      """
      X = np.array([[3.0], [-1.0], [0.0]])
      assert np.allclose(softmax_rows(X), np.ones((3, 1)))
      """,
      """
      X = np.array([[1000.0, 999.0, 998.0], [-1000.0, 0.0, 1000.0]])
      e = np.exp(X - X.max(axis=1, keepdims=True))
      r = softmax_rows(X)
      assert np.all(np.isfinite(r)) and np.allclose(r, e / e.sum(axis=1, keepdims=True))
      """,
      """
      rng = np.random.default_rng(58)
      X = rng.standard_normal((2, 100)) * 5
      e = np.exp(X - X.max(axis=1, keepdims=True))
      assert np.allclose(softmax_rows(X), e / e.sum(axis=1, keepdims=True))
      """,
      """
      X = np.zeros((4, 33))
      assert np.allclose(softmax_rows(X), np.full((4, 33), 1 / 33))
      """],
     [("no max subtraction (overflows for large entries)", [("e = math.exp(X[row, j] - m)", "e = math.exp(X[row, j])")]),
      ("threads cover only the first SM_TPB columns of a row",
       [("    for j in range(t, ncol, SM_TPB):\n        e = math.exp(X[row, j] - m)\n        out[row, j] = e\n        acc += e",
         "    if t < ncol:\n        e = math.exp(X[row, t] - m)\n        out[row, t] = e\n        acc += e")])],
     ["softmax", "reduction", "shared-memory"])

task("argmax", "x",
     """
     Returns, as a Python int, the index of the largest element of the
     non-empty 1-D float64 array x; on ties the smallest such index (like
     np.argmax). Use a single block: each thread scans a strided part of x, then
     the (value, index) pairs are reduced in shared memory.
     """,
     """
     AM_TPB = 64

     @cuda.jit
     def _argmax_kernel(x, out):
         sv = cuda.shared.array(AM_TPB, dtype=np.float64)
         si = cuda.shared.array(AM_TPB, dtype=np.int64)
         t = cuda.threadIdx.x
         bv = -math.inf
         bi = x.size
         for j in range(t, x.size, AM_TPB):
             v = x[j]
             if v > bv or bi == x.size:
                 bv = v
                 bi = j
         sv[t] = bv
         si[t] = bi
         cuda.syncthreads()
         s = AM_TPB // 2
         while s > 0:
             if t < s:
                 ov = sv[t + s]
                 oi = si[t + s]
                 if ov > sv[t] or (ov == sv[t] and oi < si[t]):
                     sv[t] = ov
                     si[t] = oi
             cuda.syncthreads()
             s //= 2
         if t == 0:
             out[0] = si[0]
     """,
     """
     out = np.zeros(1, dtype=np.int64)
     _argmax_kernel[1, AM_TPB](x, out)
     return int(out[0])
     """,
     ["""
      rng = np.random.default_rng(59)
      x = rng.standard_normal(300)
      assert argmax(x) == int(np.argmax(x))
      """,
      """
      x = np.array([1.0, 5.0, 5.0, 2.0, 5.0])
      assert argmax(x) == 1
      """,
      """
      assert argmax(np.full(100, -2.0)) == 0
      """,
      """
      assert argmax(np.array([-7.0])) == 0
      """,
      """
      x = np.zeros(129); x[128] = 1.0
      assert argmax(x) == 128
      """,
      """
      x = np.tile([0.0, 3.0, 1.0], 40)
      assert argmax(x) == 1
      """],
     [("ties resolved towards the larger index", [("(ov == sv[t] and oi < si[t])", "(ov == sv[t] and oi > si[t])")]),
      ("strided scan skips the first element of each thread's slice", [("for j in range(t, x.size, AM_TPB):", "for j in range(t + AM_TPB, x.size, AM_TPB):")])],
     ["argmax", "reduction", "shared-memory"])

# ---------------------------------------------------------------- compaction / gather / scatter / sort
task("filter_positive", "x",
     """
     Stream compaction: returns a new float64 array with the elements of the
     1-D float64 array x (n >= 0) that are strictly greater than 0, in their
     original order (like x[x > 0]). Compute the output positions with a
     prefix sum of the keep-flags in shared memory.
     """,
     """
     CT = 64

     @cuda.jit
     def _compact_kernel(x, out, count):
         flags = cuda.shared.array(CT, dtype=np.int64)
         t = cuda.threadIdx.x
         n = x.size
         base = 0
         start = 0
         while start < n:
             i = start + t
             f = 0
             if i < n and x[i] > 0:
                 f = 1
             flags[t] = f
             cuda.syncthreads()
             off = 1
             while off < CT:
                 v = flags[t - off] if t >= off else 0
                 cuda.syncthreads()
                 flags[t] += v
                 cuda.syncthreads()
                 off *= 2
             if f == 1:
                 out[base + flags[t] - 1] = x[i]
             total = flags[CT - 1]
             cuda.syncthreads()
             base += total
             start += CT
         if t == 0:
             count[0] = base
     """,
     """
     n = x.shape[0]
     if n == 0:
         return np.zeros(0, dtype=np.float64)
     out = np.zeros(n, dtype=np.float64)
     count = np.zeros(1, dtype=np.int64)
     _compact_kernel[1, CT](x, out, count)
     return out[:int(count[0])].copy()
     """,
     ["""
      rng = np.random.default_rng(60)
      x = rng.standard_normal(300)
      assert np.array_equal(filter_positive(x), x[x > 0])
      """,
      """
      x = -np.arange(1, 71, dtype=np.float64)
      assert filter_positive(x).shape == (0,)
      """,
      """
      x = np.arange(1, 71, dtype=np.float64)
      assert np.array_equal(filter_positive(x), x)
      """,
      """
      x = np.array([0.0, 1.0, 0.0, -1.0, 2.0])
      assert np.array_equal(filter_positive(x), [1.0, 2.0])
      """,
      """
      assert np.array_equal(filter_positive(np.array([0.5])), [0.5])
      """,
      """
      assert filter_positive(np.zeros(0)).shape == (0,)
      """],
     [("output position off by one (inclusive scan used as exclusive)", [("out[base + flags[t] - 1] = x[i]", "out[base + flags[t]] = x[i]")]),
      ("running offset not carried across chunks", [("        base += total\n", "")])],
     ["compaction", "scan", "shared-memory"])

task("gather", "src, idx",
     """
     Gather: src is a 1-D float64 array and idx a 1-D int64 array of valid
     indices into src (len(idx) >= 1, may be longer or shorter than src, with
     repeats). Returns a new float64 array out with out[i] = src[idx[i]].
     """,
     """
     TPB = 64

     @cuda.jit
     def _gather_kernel(src, idx, out):
         i = cuda.grid(1)
         if i < idx.size:
             out[i] = src[idx[i]]
     """,
     """
     n = idx.shape[0]
     out = np.zeros(n, dtype=np.float64)
     _gather_kernel[(n + TPB - 1) // TPB, TPB](src, idx, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(61)
      src = rng.standard_normal(50); idx = rng.integers(0, 50, 200)
      assert np.array_equal(gather(src, idx), src[idx])
      """,
      """
      rng = np.random.default_rng(62)
      src = rng.standard_normal(300); idx = rng.integers(0, 300, 20)
      assert np.array_equal(gather(src, idx), src[idx])
      """,
      """
      src = np.array([1.0, 2.0, 3.0]); idx = np.array([2, 2, 0, 1], dtype=np.int64)
      assert np.array_equal(gather(src, idx), [3.0, 3.0, 1.0, 2.0])
      """,
      """
      assert np.array_equal(gather(np.array([9.5]), np.array([0], dtype=np.int64)), [9.5])
      """],
     [("bound check uses len(src) instead of len(idx)", [("if i < idx.size:", "if i < src.size:")]),
      ("writes to the gathered position instead of position i", [("out[i] = src[idx[i]]", "out[idx[i]] = src[idx[i]]")])],
     ["gather"])

task("scatter_add", "values, idx, n",
     """
     Scatter-add: values is a 1-D float64 array, idx a 1-D int64 array of the
     same length (possibly 0) with entries in [0, n), n >= 1. Returns a float64
     array out of length n, zero-initialised, after out[idx[i]] += values[i] for
     every i (like np.add.at). Indices repeat, so use atomic adds.
     """,
     """
     TPB = 64

     @cuda.jit
     def _scatter_add_kernel(values, idx, out):
         i = cuda.grid(1)
         if i < values.size:
             cuda.atomic.add(out, idx[i], values[i])
     """,
     """
     m = values.shape[0]
     out = np.zeros(n, dtype=np.float64)
     if m == 0:
         return out
     _scatter_add_kernel[(m + TPB - 1) // TPB, TPB](values, idx, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(63)
      v = rng.standard_normal(300); idx = rng.integers(0, 20, 300)
      ref = np.zeros(20); np.add.at(ref, idx, v)
      assert np.allclose(scatter_add(v, idx, 20), ref)
      """,
      """
      v = np.ones(100); idx = np.zeros(100, dtype=np.int64)
      assert np.allclose(scatter_add(v, idx, 3), [100.0, 0.0, 0.0])
      """,
      """
      assert np.array_equal(scatter_add(np.zeros(0), np.zeros(0, dtype=np.int64), 4), np.zeros(4))
      """,
      """
      v = np.array([1.0, 2.0, 3.0]); idx = np.array([4, 0, 4], dtype=np.int64)
      assert np.allclose(scatter_add(v, idx, 6), [2.0, 0, 0, 0, 4.0, 0])
      """],
     [("plain store instead of atomic accumulation", [("cuda.atomic.add(out, idx[i], values[i])", "out[idx[i]] = values[i]")])],
     ["scatter", "atomics"])

task("bitonic_sort", "x",
     """
     Returns a new float64 array with the elements of the 1-D float64 array x
     (1 <= n <= 256) sorted ascending. Use a bitonic sorting network inside a
     single block: load into shared memory padded with +inf up to a power of
     two, run the compare-exchange stages with a barrier after each, write back.
     """,
     """
     MAXN = 256

     @cuda.jit
     def _bitonic_kernel(x, out, npad):
         sh = cuda.shared.array(MAXN, dtype=np.float64)
         i = cuda.threadIdx.x
         sh[i] = x[i] if i < x.size else math.inf
         cuda.syncthreads()
         k = 2
         while k <= npad:
             j = k // 2
             while j > 0:
                 ixj = i ^ j
                 if ixj > i:
                     a = sh[i]
                     b = sh[ixj]
                     if (i & k) == 0:
                         if a > b:
                             sh[i] = b
                             sh[ixj] = a
                     else:
                         if a < b:
                             sh[i] = b
                             sh[ixj] = a
                 cuda.syncthreads()
                 j //= 2
             k *= 2
         if i < x.size:
             out[i] = sh[i]
     """,
     """
     n = x.shape[0]
     npad = 1
     while npad < n:
         npad *= 2
     out = np.zeros(n, dtype=np.float64)
     _bitonic_kernel[1, npad](x, out, npad)
     return out
     """,
     ["""
      rng = np.random.default_rng(64)
      x = rng.standard_normal(100)
      assert np.array_equal(bitonic_sort(x), np.sort(x))
      """,
      """
      assert np.array_equal(bitonic_sort(np.array([3.0])), [3.0])
      """,
      """
      rng = np.random.default_rng(65)
      x = rng.standard_normal(256)
      assert np.array_equal(bitonic_sort(x), np.sort(x))
      """,
      """
      rng = np.random.default_rng(66)
      x = rng.integers(0, 5, 37).astype(np.float64)
      assert np.array_equal(bitonic_sort(x), np.sort(x))
      """,
      """
      x = np.arange(64, 0, -1, dtype=np.float64)
      assert np.array_equal(bitonic_sort(x), np.sort(x))
      """,
      """
      x = np.array([2.0, -1.0])
      assert np.array_equal(bitonic_sort(x), [-1.0, 2.0])
      """],
     [("sort direction chosen from the wrong bit (i & j instead of i & k)", [("if (i & k) == 0:", "if (i & j) == 0:")]),
      ("merge stages stop before distance 1 (while j > 1)", [("while j > 0:", "while j > 1:")])],
     ["sort", "shared-memory"])

task("rgb_to_gray", "img",
     """
     Converts an RGB image, a float64 array of shape (H, W, 3) with H, W >= 1,
     to grey: returns a new (H, W) float64 array with
     0.299 * R + 0.587 * G + 0.114 * B per pixel. Use a 2-D grid.
     """,
     """
     BS = 8

     @cuda.jit
     def _gray_kernel(img, out):
         r, c = cuda.grid(2)
         if r < img.shape[0] and c < img.shape[1]:
             out[r, c] = 0.299 * img[r, c, 0] + 0.587 * img[r, c, 1] + 0.114 * img[r, c, 2]
     """,
     """
     H, W = img.shape[0], img.shape[1]
     out = np.zeros((H, W), dtype=np.float64)
     _gray_kernel[((H + BS - 1) // BS, (W + BS - 1) // BS), (BS, BS)](img, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(67)
      img = rng.random((9, 14, 3))
      assert np.allclose(rgb_to_gray(img), img @ np.array([0.299, 0.587, 0.114]))
      """,
      """
      img = np.zeros((2, 3, 3)); img[..., 0] = 1.0
      assert np.allclose(rgb_to_gray(img), np.full((2, 3), 0.299))
      """,
      """
      assert np.allclose(rgb_to_gray(np.array([[[0.0, 0.0, 1.0]]])), [[0.114]])
      """,
      """
      rng = np.random.default_rng(68)
      img = rng.random((17, 5, 3))
      assert np.allclose(rgb_to_gray(img), img @ np.array([0.299, 0.587, 0.114]))
      """],
     [("red and blue weights swapped", [("0.299 * img[r, c, 0] + 0.587 * img[r, c, 1] + 0.114 * img[r, c, 2]",
                                         "0.299 * img[r, c, 2] + 0.587 * img[r, c, 1] + 0.114 * img[r, c, 0]")])],
     ["elementwise", "2d-grid", "image"])

task("reverse", "x",
     """
     Returns a new float64 array with the elements of the 1-D float64 array x in
     reverse order (like x[::-1]); n >= 0.
     """,
     """
     TPB = 64

     @cuda.jit
     def _reverse_kernel(x, out):
         i = cuda.grid(1)
         n = x.size
         if i < n:
             out[i] = x[n - 1 - i]
     """,
     """
     n = x.shape[0]
     out = np.zeros(n, dtype=np.float64)
     if n == 0:
         return out
     _reverse_kernel[(n + TPB - 1) // TPB, TPB](x, out)
     return out
     """,
     ["""
      rng = np.random.default_rng(69)
      x = rng.standard_normal(150)
      assert np.array_equal(reverse(x), x[::-1])
      """,
      """
      assert np.array_equal(reverse(np.array([4.0])), [4.0])
      """,
      """
      assert reverse(np.zeros(0)).shape == (0,)
      """,
      """
      x = np.arange(64, dtype=np.float64)
      assert np.array_equal(reverse(x), x[::-1])
      """],
     [("off-by-one source index (n - i)", [("out[i] = x[n - 1 - i]", "out[i] = x[(n - i) % n]")])],
     ["vector", "gather"])


def main(outdir):
    ids = set()
    with open(f"{outdir}/numba_cuda_tasks.jsonl", "w") as f, open(f"{outdir}/numba_cuda_tasks.mutants.jsonl", "w") as g:
        for t in TASKS:
            assert t["id"] not in ids
            ids.add(t["id"])
            muts = t.pop("_mutants")
            f.write(json.dumps(t) + "\n")
            for k, m in enumerate(muts):
                g.write(json.dumps({"id": t["id"], "wrong_solution": m["wrong_solution"],
                                    "what_is_wrong": m["what_is_wrong"]}) + "\n")
    print(len(TASKS), "tasks")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
