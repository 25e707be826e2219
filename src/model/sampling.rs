//! Next-token selection on the device: greedy, or temperature sampling with
//! optional top-k and top-p (nucleus) filtering, drawn by inverse CDF at one
//! uniform per row: from a per-row seeded stream ([`row_uniform`]), so a
//! row's tokens are the same whatever batch (or data-parallel rank) it is
//! generated in, or from libtorch's generator. Per token the host sends one
//! number per row and receives the chosen ids.
//!
//! The log-probability returned for each chosen token is under the
//! temperature-scaled, *unfiltered* distribution `log_softmax(logits / T)`
//! (raw logits when greedy): the distribution the policy-gradient loss
//! recomputes, so importance ratios start at exactly 1.

use tch::{Kind, Tensor};

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// 0 means greedy.
    pub temperature: f64,
    /// 0 means off.
    pub top_k: i64,
    /// 1.0 means off.
    pub top_p: f64,
}

impl Sampler {
    pub fn greedy() -> Self {
        Sampler {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Pick one token per row of `logits` `[B, V]` with uniforms from
    /// libtorch's generator; see [`Sampler::sample_with`].
    pub fn sample(&self, logits: &Tensor) -> (Tensor, Tensor) {
        let b = logits.size()[0];
        let u = Tensor::rand([b], (Kind::Double, logits.device()));
        self.sample_with(logits, &u)
    }

    /// Pick one token per row of `logits` `[B, V]`, row i by inverse CDF at
    /// the uniform `u[i]` in [0, 1) (ignored when greedy); returns `(ids
    /// [B] i64, logprobs [B] f32)`, both on the logits' device. One uniform
    /// per row is what lets each row draw from its own seeded stream
    /// ([`row_uniform`]), so a row's tokens do not depend on which other
    /// rows share its batch.
    pub fn sample_with(&self, logits: &Tensor, u: &Tensor) -> (Tensor, Tensor) {
        let logits = logits.to_kind(Kind::Float);
        if self.is_greedy() {
            let ids = logits.argmax(-1, false);
            let lp = logits
                .log_softmax(-1, Kind::Float)
                .gather(-1, &ids.unsqueeze(-1), false)
                .squeeze_dim(-1);
            return (ids, lp);
        }
        // Dividing by 1 is exact: skip the pass over `[B, V]`.
        let scaled = if self.temperature == 1.0 {
            logits
        } else {
            logits / self.temperature
        };
        let logp = scaled.log_softmax(-1, Kind::Float);
        let mut filtered = logp.shallow_clone();
        let vocab = *logp.size().last().unwrap_or(&1);
        if self.top_k > 0 && self.top_k < vocab {
            let (vals, _) = filtered.topk(self.top_k, -1, true, true);
            let kth = vals.narrow(-1, self.top_k - 1, 1);
            filtered = filtered.masked_fill(&filtered.lt_tensor(&kth), f64::NEG_INFINITY);
        }
        if self.top_p < 1.0 {
            filtered = nucleus(&filtered, self.top_p);
        }
        // Inverse CDF over the kept tokens: the first token whose cumulative
        // mass reaches u × (kept mass). A dropped token adds no mass, so it
        // is never the first to reach a positive target.
        let probs = filtered.exp();
        let ids = inverse_cdf_cpu(&probs, u).unwrap_or_else(|| inverse_cdf(&probs, u));
        let lp = logp.gather(-1, &ids.unsqueeze(-1), false).squeeze_dim(-1);
        (ids, lp)
    }
}

/// Row i's first token whose cumulative mass (fp64) reaches `u[i]` × the
/// row's total mass, on any device.
fn inverse_cdf(probs: &Tensor, u: &Tensor) -> Tensor {
    let vocab = *probs.size().last().unwrap_or(&1);
    let cdf = probs.cumsum(-1, Kind::Double);
    let total = cdf.narrow(-1, vocab - 1, 1);
    let target = u
        .to_device(cdf.device())
        .to_kind(Kind::Double)
        .clamp(1e-12, 1.0 - 1e-12)
        .unsqueeze(-1)
        * &total;
    // ATen's `self` is the values searched for.
    target
        .searchsorted(&cdf, false, false, "left", None::<Tensor>)
        .squeeze_dim(-1)
        .clamp_max(vocab - 1)
}

/// [`inverse_cdf`] for fp32 probabilities `[B, V]`
/// on the CPU: the same fp64 running sum, element by element in order, as
/// libtorch's `cumsum(Double)` + `searchsorted`, so the same token, without
/// materialising the fp64 `[B, V]` prefix sums (libtorch's double cumsum
/// was 7 of the 7.5 ms a batch-32 sampling step took, 2 threads). `None`
/// off the CPU or for other dtypes: the caller takes the libtorch path.
fn inverse_cdf_cpu(probs: &Tensor, u: &Tensor) -> Option<Tensor> {
    if probs.device() != tch::Device::Cpu || probs.kind() != Kind::Float || probs.dim() != 2 {
        return None;
    }
    let (b, v) = (probs.size()[0] as usize, probs.size()[1] as usize);
    if v == 0 {
        return None;
    }
    let probs = probs.contiguous();
    let u = Vec::<f64>::try_from(&u.to_device(tch::Device::Cpu).to_kind(Kind::Double)).ok()?;
    if u.len() != b {
        return None;
    }
    // SAFETY: `probs` is a contiguous fp32 CPU tensor of b · v elements,
    // alive for this borrow.
    let p = unsafe { std::slice::from_raw_parts(probs.data_ptr() as *const f32, b * v) };
    let pick = |row: &[f32], u: f64| {
        let total = row.iter().fold(0f64, |acc, &x| acc + x as f64);
        let target = u.clamp(1e-12, 1.0 - 1e-12) * total;
        let mut acc = 0f64;
        row.iter()
            .position(|&x| {
                acc += x as f64;
                acc >= target
            })
            .unwrap_or(v - 1) as i64
    };
    let mut ids = vec![0i64; b];
    // Each row is one long chain of dependent additions: two threads take
    // half the rows each once a batch is worth a thread's start.
    let half = if b * v >= 1 << 20 { b / 2 } else { 0 };
    let (first, second) = ids.split_at_mut(half);
    std::thread::scope(|sc| {
        if half > 0 {
            sc.spawn(|| {
                for (i, id) in first.iter_mut().enumerate() {
                    *id = pick(&p[i * v..(i + 1) * v], u[i]);
                }
            });
        }
        for (j, id) in second.iter_mut().enumerate() {
            let i = half + j;
            *id = pick(&p[i * v..(i + 1) * v], u[i]);
        }
    });
    Some(Tensor::from_slice(&ids))
}

/// The uniform in [0, 1) that row `row` of the call seeded `seed` draws at
/// decode position `pos`: a hash of the three, so the stream is a row's own.
pub fn row_uniform(seed: u64, row: u64, pos: u64) -> f64 {
    let h = splitmix(splitmix(seed ^ 0x005e_ed0f_a11c_0de5) ^ row);
    let h = splitmix(h ^ pos.wrapping_mul(0x2545_f491_4f6c_dd1d));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Candidates a nucleus is first looked for among: a sort of the whole
/// vocabulary per decode step cost more than the rest of sampling together
/// (~60 ms per step for 24 rows of a 49k vocabulary on 2 cores).
const NUCLEUS_PREFILTER: i64 = 1024;

/// Top-p filtering of log-probabilities `[B, V]`: a token is dropped when
/// the mass of the tokens ranked before it already reaches `top_p` (the most
/// likely token always stays). The nucleus is looked for among the
/// `NUCLEUS_PREFILTER` most likely tokens; when their mass reaches `top_p`
/// in every row, every token outside them is dropped anyway, so the result
/// is the full sort's (up to rounding of the boundary token's preceding
/// mass, summed in another order).
/// Otherwise the whole vocabulary is sorted.
fn nucleus(logp: &Tensor, top_p: f64) -> Tensor {
    let vocab = *logp.size().last().unwrap_or(&1);
    if vocab > NUCLEUS_PREFILTER {
        let (vals, idx) = logp.topk(NUCLEUS_PREFILTER, -1, true, true);
        // Probabilities under the full (renormalised) distribution.
        let lse = logp.logsumexp([-1].as_slice(), true);
        let probs = (&vals - &lse).exp();
        let cum = probs.cumsum(-1, Kind::Float);
        let covered = cum
            .narrow(-1, NUCLEUS_PREFILTER - 1, 1)
            .ge(top_p)
            .all()
            .int64_value(&[])
            != 0;
        if covered {
            let drop_sorted = (cum - &probs).ge(top_p);
            let kept = vals.masked_fill(&drop_sorted, f64::NEG_INFINITY);
            return logp.full_like(f64::NEG_INFINITY).scatter(-1, &idx, &kept);
        }
    }
    nucleus_full_sort(logp, top_p)
}

fn nucleus_full_sort(logp: &Tensor, top_p: f64) -> Tensor {
    let (sorted, idx) = logp.sort(-1, true);
    let probs = sorted.softmax(-1, Kind::Float);
    let cum = probs.cumsum(-1, Kind::Float);
    let drop_sorted = (cum - &probs).ge(top_p);
    let drop = drop_sorted.scatter(-1, &idx, &drop_sorted);
    logp.masked_fill(&drop, f64::NEG_INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_with_its_logprob() {
        let logits = Tensor::from_slice(&[0.0f32, 2.0, 1.0, 3.0, 0.0, -1.0]).view([2, 3]);
        let (ids, lp) = Sampler::greedy().sample(&logits);
        assert_eq!(Vec::<i64>::try_from(&ids).unwrap(), vec![1, 0]);
        let lp = Vec::<f32>::try_from(&lp).unwrap();
        let want0 = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((lp[0] - want0).abs() < 1e-5);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_nucleus() {
        tch::manual_seed(7);
        let logits = Tensor::from_slice(&[0.0f32, 5.0, 4.9, -3.0]).view([1, 4]);
        let s = Sampler {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
        };
        for _ in 0..20 {
            assert_eq!(s.sample(&logits).0.int64_value(&[0]), 1);
        }
        // Two tokens hold ~0.99 of the mass: top_p = 0.9 only ever yields those two.
        let s = Sampler {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
        };
        let mut seen = [0usize; 4];
        for _ in 0..200 {
            seen[s.sample(&logits).0.int64_value(&[0]) as usize] += 1;
        }
        assert_eq!(seen[0] + seen[3], 0, "{seen:?}");
        assert!(seen[1] > 0 && seen[2] > 0, "{seen:?}");
    }

    #[test]
    fn prefiltered_nucleus_equals_the_full_sort() {
        tch::manual_seed(3);
        // Peaked rows (nucleus inside the prefilter) and a flat one (not).
        let peaked = Tensor::randn([6, 5000], (Kind::Float, tch::Device::Cpu)) * 4.0;
        let flat = Tensor::randn([1, 5000], (Kind::Float, tch::Device::Cpu)) * 0.01;
        for logits in [peaked.shallow_clone(), Tensor::cat(&[peaked, flat], 0)] {
            let logp = logits.log_softmax(-1, Kind::Float);
            for p in [0.5, 0.9, 0.99] {
                let fast = nucleus(&logp, p).isfinite();
                let full = nucleus_full_sort(&logp, p).isfinite();
                // The two sum probabilities in different orders, so a token
                // whose preceding mass is within rounding of top_p may fall
                // on either side: at most one token per row.
                let per_row = fast
                    .logical_xor(&full)
                    .sum_dim_intlist(-1, false, Kind::Int64);
                assert!(
                    per_row.max().int64_value(&[]) <= 1,
                    "top_p {p}: kept sets differ by more than the boundary token"
                );
                let kept = fast.sum(Kind::Int64).int64_value(&[]);
                assert!(kept >= logp.size()[0], "every row keeps a token");
            }
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_is_seeded() {
        let logits = Tensor::from_slice(&[0.0f32, (3.0f32).ln()]).view([1, 2]);
        let s = Sampler {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        };
        let big = logits.expand([4000, 2], false).contiguous();
        tch::manual_seed(1);
        let a = s.sample(&big).0;
        tch::manual_seed(1);
        let b = s.sample(&big).0;
        assert!(a.equal(&b), "same seed, same draws");
        let frac = a.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        assert!((frac - 0.75).abs() < 0.03, "P(token 1) = 0.75, got {frac}");
    }

    /// The CPU scan picks exactly the token libtorch's fp64 cumsum and
    /// searchsorted pick, including uniforms at and next to a boundary.
    #[test]
    fn the_cpu_inverse_cdf_equals_libtorchs() {
        tch::manual_seed(5);
        for (b, v) in [(3, 7), (32, 49152), (5, 1)] {
            let logp = (Tensor::randn([b, v], (Kind::Float, tch::Device::Cpu)) * 3.0)
                .log_softmax(-1, Kind::Float);
            let probs = logp.exp();
            let mut us: Vec<Vec<f64>> = (0..20)
                .map(|k| (0..b).map(|r| row_uniform(k, r as u64, 0)).collect())
                .collect();
            us.push(vec![0.0; b as usize]);
            us.push(vec![1.0; b as usize]);
            // Uniforms that land exactly on a prefix sum of row 0.
            let cdf0 = probs.get(0).cumsum(-1, Kind::Double);
            let total = cdf0.double_value(&[v - 1]);
            for j in [0, v / 2, v - 1] {
                us.push(vec![cdf0.double_value(&[j]) / total; b as usize]);
            }
            for u in us {
                let u = Tensor::from_slice(&u);
                let fast = inverse_cdf_cpu(&probs, &u).expect("fp32 CPU probabilities");
                assert!(fast.equal(&inverse_cdf(&probs, &u)), "b {b}, v {v}: {u:?}");
            }
        }
        let bf = Tensor::ones([2, 4], (Kind::BFloat16, tch::Device::Cpu));
        assert!(inverse_cdf_cpu(&bf, &Tensor::from_slice(&[0.5, 0.5])).is_none());
    }

    #[test]
    fn a_rows_draw_depends_on_its_own_uniform_only() {
        let logits = Tensor::randn([3, 50], (Kind::Float, tch::Device::Cpu));
        let s = Sampler {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.95,
        };
        let u: Vec<f64> = (0..3).map(|r| row_uniform(9, r, 4)).collect();
        let all = s.sample_with(&logits, &Tensor::from_slice(&u)).0;
        // Row 2 alone, as another rank's batch would hold it.
        let alone = s
            .sample_with(&logits.narrow(0, 2, 1), &Tensor::from_slice(&u[2..]))
            .0;
        assert_eq!(all.int64_value(&[2]), alone.int64_value(&[0]));
        // The streams differ by row and position, and stay in [0, 1).
        let draws: Vec<f64> = (0..1000).map(|p| row_uniform(1, p % 7, p)).collect();
        assert!(draws.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(row_uniform(1, 0, 0), row_uniform(1, 1, 0));
        assert_ne!(row_uniform(1, 0, 0), row_uniform(1, 0, 1));
    }
}
