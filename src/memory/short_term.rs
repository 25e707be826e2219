//! FALCON's short-term memory: a fixed-capacity ring buffer of the most
//! recent samples as device tensors (token ids, attention mask, per-token
//! rewards, log-probs and advantages), on the GPU when training runs there,
//! with seeded mini-batch sampling and a checkpoint round trip.
//!
//! Every sample is stored padded (or cut) to `max_len` tokens; the mask marks
//! the real ones and `scored` the completion's (the tokens a loss trains),
//! and each row records whether the sample passed (FALCON's `L_sl`). The sampler's RNG is ours (SplitMix64) so its state is one
//! integer that goes into the checkpoint: a resumed run samples exactly what
//! an uninterrupted one would have.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::MemoryError;
use crate::model::weights;

/// One sample as the trainer produced it (CPU vectors of equal length).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub token_ids: &'a [i64],
    pub rewards: &'a [f32],
    pub logprobs: &'a [f32],
    pub advantages: &'a [f32],
    /// Tokens before this index are the prompt.
    pub prompt_len: usize,
    pub passed: bool,
}

/// A mini-batch drawn from the buffer: `[b, max_len]` tensors on its device.
#[derive(Debug)]
pub struct Batch {
    /// Ring slots the rows came from.
    pub slots: Vec<i64>,
    pub token_ids: Tensor,
    pub mask: Tensor,
    pub rewards: Tensor,
    pub logprobs: Tensor,
    pub advantages: Tensor,
    /// `[b, max_len]` bool: completion tokens.
    pub scored: Tensor,
    /// `[b]` bool.
    pub passed: Tensor,
}

pub struct ShortTerm {
    capacity: i64,
    max_len: i64,
    device: Device,
    token_ids: Tensor,
    mask: Tensor,
    rewards: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    scored: Tensor,
    passed: Tensor,
    /// Next slot to write.
    head: i64,
    /// Slots filled (≤ capacity).
    count: i64,
    /// Samples pushed over the buffer's life.
    pushed: u64,
    rng: u64,
}

const FIELDS: [&str; 6] = [
    "token_ids",
    "mask",
    "rewards",
    "logprobs",
    "advantages",
    "scored",
];

impl ShortTerm {
    pub fn new(
        capacity: usize,
        max_len: usize,
        device: Device,
        seed: u64,
    ) -> Result<Self, MemoryError> {
        if capacity == 0 || max_len == 0 {
            return Err(MemoryError::Invalid(
                "short-term memory: capacity and max_len must be > 0".into(),
            ));
        }
        let (c, l) = (capacity as i64, max_len as i64);
        Ok(ShortTerm {
            capacity: c,
            max_len: l,
            device,
            token_ids: Tensor::zeros([c, l], (Kind::Int64, device)),
            mask: Tensor::zeros([c, l], (Kind::Bool, device)),
            rewards: Tensor::zeros([c, l], (Kind::Float, device)),
            logprobs: Tensor::zeros([c, l], (Kind::Float, device)),
            advantages: Tensor::zeros([c, l], (Kind::Float, device)),
            scored: Tensor::zeros([c, l], (Kind::Bool, device)),
            passed: Tensor::zeros([c], (Kind::Bool, device)),
            head: 0,
            count: 0,
            pushed: 0,
            rng: seed,
        })
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Samples pushed since the buffer was created (evicted ones included).
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Append samples, overwriting the oldest when full. The rows are built
    /// on the host and copied to the device in one transfer per field.
    pub fn push(&mut self, samples: &[Sample<'_>]) -> Result<(), MemoryError> {
        if samples.is_empty() {
            return Ok(());
        }
        // Only the newest `capacity` of a large push survive anyway.
        let skip = samples.len().saturating_sub(self.capacity as usize);
        let samples = &samples[skip..];
        let l = self.max_len as usize;
        let n = samples.len();
        let mut ids = vec![0i64; n * l];
        let mut mask = vec![0u8; n * l];
        let mut rew = vec![0f32; n * l];
        let mut lp = vec![0f32; n * l];
        let mut adv = vec![0f32; n * l];
        let mut scored = vec![0u8; n * l];
        let passed: Vec<u8> = samples.iter().map(|s| s.passed as u8).collect();
        for (r, s) in samples.iter().enumerate() {
            let len = s.token_ids.len();
            if s.rewards.len() != len || s.logprobs.len() != len || s.advantages.len() != len {
                return Err(MemoryError::Invalid(format!(
                    "short-term memory: sample {} has {len} tokens but {} rewards, {} logprobs, {} advantages",
                    skip + r,
                    s.rewards.len(),
                    s.logprobs.len(),
                    s.advantages.len()
                )));
            }
            let m = len.min(l);
            let o = r * l;
            ids[o..o + m].copy_from_slice(&s.token_ids[..m]);
            mask[o..o + m].fill(1);
            rew[o..o + m].copy_from_slice(&s.rewards[..m]);
            lp[o..o + m].copy_from_slice(&s.logprobs[..m]);
            adv[o..o + m].copy_from_slice(&s.advantages[..m]);
            scored[o + s.prompt_len.min(m)..o + m].fill(1);
        }
        let shape = [n as i64, self.max_len];
        let dev = self.device;
        let rows = [
            Tensor::from_slice(&ids).view(shape).to_device(dev),
            Tensor::from_slice(&mask)
                .view(shape)
                .to_kind(Kind::Bool)
                .to_device(dev),
            Tensor::from_slice(&rew).view(shape).to_device(dev),
            Tensor::from_slice(&lp).view(shape).to_device(dev),
            Tensor::from_slice(&adv).view(shape).to_device(dev),
            Tensor::from_slice(&scored)
                .view(shape)
                .to_kind(Kind::Bool)
                .to_device(dev),
        ];
        let slots: Vec<i64> = (0..n as i64)
            .map(|i| (self.head + i) % self.capacity)
            .collect();
        let slots_t = Tensor::from_slice(&slots).to_device(dev);
        tch::no_grad(|| {
            for (dst, src) in [
                &mut self.token_ids,
                &mut self.mask,
                &mut self.rewards,
                &mut self.logprobs,
                &mut self.advantages,
                &mut self.scored,
            ]
            .into_iter()
            .zip(rows.iter())
            {
                let _ = dst.index_copy_(0, &slots_t, src);
            }
            let passed = Tensor::from_slice(&passed)
                .to_kind(Kind::Bool)
                .to_device(dev);
            let _ = self.passed.index_copy_(0, &slots_t, &passed);
        });
        self.head = (self.head + n as i64) % self.capacity;
        self.count = (self.count + n as i64).min(self.capacity);
        self.pushed += (skip + n) as u64;
        Ok(())
    }

    fn next_u64(&mut self) -> u64 {
        // SplitMix64: tiny state, good enough for choosing rows.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `b` distinct samples drawn uniformly (fewer if the buffer holds fewer).
    pub fn sample(&mut self, b: usize) -> Batch {
        let n = self.count as usize;
        let b = b.min(n);
        // Partial Fisher-Yates over the filled slots.
        let mut pool: Vec<i64> = (0..n as i64).collect();
        for i in 0..b {
            let j = i + (self.next_u64() % (n - i) as u64) as usize;
            pool.swap(i, j);
        }
        pool.truncate(b);
        self.gather(pool)
    }

    /// The `n` most recently pushed samples, newest first.
    pub fn recent(&self, n: usize) -> Batch {
        let n = (n as i64).min(self.count);
        let slots = (1..=n)
            .map(|i| (self.head - i).rem_euclid(self.capacity))
            .collect();
        self.gather(slots)
    }

    fn gather(&self, slots: Vec<i64>) -> Batch {
        let idx = Tensor::from_slice(&slots).to_device(self.device);
        Batch {
            token_ids: self.token_ids.index_select(0, &idx),
            mask: self.mask.index_select(0, &idx),
            rewards: self.rewards.index_select(0, &idx),
            logprobs: self.logprobs.index_select(0, &idx),
            advantages: self.advantages.index_select(0, &idx),
            scored: self.scored.index_select(0, &idx),
            passed: self.passed.index_select(0, &idx),
            slots,
        }
    }

    /// Write the whole buffer (tensors, ring position, RNG state) atomically.
    pub fn save(&self, path: &Path) -> Result<(), MemoryError> {
        let state = Tensor::from_slice(&[
            self.capacity,
            self.max_len,
            self.head,
            self.count,
            self.pushed as i64,
            self.rng as i64,
        ]);
        let mut tensors: Vec<(String, Tensor)> = vec![("state".into(), state)];
        for (name, t) in FIELDS.iter().zip(self.fields()) {
            let t = if t.kind() == Kind::Bool {
                t.to_kind(Kind::Uint8)
            } else {
                t.shallow_clone()
            };
            tensors.push(((*name).into(), t));
        }
        tensors.push(("passed".into(), self.passed.to_kind(Kind::Uint8)));
        let meta = HashMap::from([(
            "format".to_owned(),
            "falcon-rl short-term memory v2".to_owned(),
        )]);
        weights::save_safetensors(path, &tensors, Some(meta)).map_err(MemoryError::Model)
    }

    fn fields(&self) -> [&Tensor; 6] {
        [
            &self.token_ids,
            &self.mask,
            &self.rewards,
            &self.logprobs,
            &self.advantages,
            &self.scored,
        ]
    }

    /// Read a buffer written by [`ShortTerm::save`] onto `device`.
    pub fn load(path: &Path, device: Device) -> Result<Self, MemoryError> {
        let bad = |r: String| MemoryError::BadFile {
            path: path.to_path_buf(),
            reason: r,
        };
        let mut t = weights::read_all(path).map_err(MemoryError::Model)?;
        let state: Vec<i64> = t
            .remove("state")
            .and_then(|s| Vec::try_from(s.to_kind(Kind::Int64)).ok())
            .ok_or_else(|| bad("missing `state`".into()))?;
        let [capacity, max_len, head, count, pushed, rng] = state[..] else {
            return Err(bad(format!(
                "`state` has {} values, expected 6",
                state.len()
            )));
        };
        if capacity <= 0
            || max_len <= 0
            || !(0..capacity).contains(&head)
            || !(0..=capacity).contains(&count)
        {
            return Err(bad(format!(
                "inconsistent state: capacity {capacity}, max_len {max_len}, head {head}, count {count}"
            )));
        }
        let passed = t.remove("passed").ok_or_else(|| {
            bad("missing `passed` (a v1 file, from before rows recorded it)".into())
        })?;
        if passed.size() != [capacity] {
            return Err(bad(format!(
                "`passed` has shape {:?}, expected [{capacity}]",
                passed.size()
            )));
        }
        let passed = passed.to_kind(Kind::Bool).to_device(device);
        let mut take = |name: &str, kind: Kind| -> Result<Tensor, MemoryError> {
            let x = t
                .remove(name)
                .ok_or_else(|| bad(format!("missing `{name}`")))?;
            if x.size() != [capacity, max_len] {
                return Err(bad(format!(
                    "`{name}` has shape {:?}, expected [{capacity}, {max_len}]",
                    x.size()
                )));
            }
            Ok(x.to_kind(kind).to_device(device))
        };
        Ok(ShortTerm {
            token_ids: take("token_ids", Kind::Int64)?,
            mask: take("mask", Kind::Bool)?,
            rewards: take("rewards", Kind::Float)?,
            logprobs: take("logprobs", Kind::Float)?,
            advantages: take("advantages", Kind::Float)?,
            scored: take("scored", Kind::Bool)?,
            passed,
            capacity,
            max_len,
            device,
            head,
            count,
            pushed: pushed as u64,
            rng: rng as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push_n(st: &mut ShortTerm, from: i64, n: i64) {
        let data: Vec<(Vec<i64>, Vec<f32>)> = (from..from + n)
            .map(|i| {
                let len = (i % 3 + 1) as usize;
                (vec![i; len], vec![i as f32; len])
            })
            .collect();
        let samples: Vec<Sample> = data
            .iter()
            .map(|(ids, f)| Sample {
                token_ids: ids,
                rewards: f,
                logprobs: f,
                advantages: f,
                prompt_len: 1,
                passed: f[0] > 1.0,
            })
            .collect();
        st.push(&samples).unwrap();
    }

    fn first_tokens(b: &Batch) -> Vec<i64> {
        Vec::try_from(b.token_ids.select(1, 0)).unwrap()
    }

    #[test]
    fn ring_keeps_the_newest_and_masks_padding() {
        let mut st = ShortTerm::new(4, 2, Device::Cpu, 7).unwrap();
        push_n(&mut st, 1, 3);
        assert_eq!(st.len(), 3);
        push_n(&mut st, 4, 3); // 6 pushed into 4 slots: 1 and 2 evicted
        assert_eq!((st.len(), st.pushed()), (4, 6));
        let r = st.recent(10);
        assert_eq!(first_tokens(&r), [6, 5, 4, 3]);
        // Sample i has i % 3 + 1 tokens: 6 and 3 have one, 4 has two, and
        // 5 has three, cut to max_len 2.
        let mask: Vec<i64> = Vec::try_from(r.mask.to_kind(Kind::Int64).reshape([-1])).unwrap();
        assert_eq!(mask, [1, 0, 1, 1, 1, 1, 1, 0]);
        let rew: Vec<f32> = Vec::try_from(r.rewards.reshape([-1])).unwrap();
        assert_eq!(rew, [6.0, 0.0, 5.0, 5.0, 4.0, 4.0, 3.0, 0.0]);
        // The first token of each is the prompt; samples above 1 passed.
        let scored: Vec<i64> = Vec::try_from(r.scored.to_kind(Kind::Int64).reshape([-1])).unwrap();
        assert_eq!(scored, [0, 0, 0, 1, 0, 1, 0, 0]);
        let passed: Vec<i64> = Vec::try_from(r.passed.to_kind(Kind::Int64)).unwrap();
        assert_eq!(passed, [1, 1, 1, 1]);
        // A push larger than the buffer keeps its last `capacity` samples.
        push_n(&mut st, 10, 9);
        assert_eq!(first_tokens(&st.recent(4)), [18, 17, 16, 15]);
    }

    #[test]
    fn sampling_is_seeded_distinct_and_survives_a_checkpoint() {
        let mut a = ShortTerm::new(16, 3, Device::Cpu, 42).unwrap();
        push_n(&mut a, 0, 12);
        let first = first_tokens(&a.sample(5));
        let mut sorted = first.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 5, "distinct rows: {first:?}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short_term.safetensors");
        a.save(&path).unwrap();
        let mut b = ShortTerm::load(&path, Device::Cpu).unwrap();
        assert_eq!((b.len(), b.pushed()), (a.len(), a.pushed()));
        for _ in 0..3 {
            let (x, y) = (a.sample(4), b.sample(4));
            assert_eq!(x.slots, y.slots, "same RNG state after the round trip");
            assert!(x.rewards.equal(&y.rewards) && x.mask.equal(&y.mask));
            assert!(x.scored.equal(&y.scored) && x.passed.equal(&y.passed));
        }
        push_n(&mut a, 100, 2);
        push_n(&mut b, 100, 2);
        assert_eq!(first_tokens(&a.recent(3)), first_tokens(&b.recent(3)));
        let mut c = ShortTerm::new(16, 3, Device::Cpu, 43).unwrap();
        push_n(&mut c, 0, 12);
        assert_ne!(
            first_tokens(&c.sample(5)),
            first,
            "another seed, another draw"
        );
    }

    #[test]
    fn bad_input_is_rejected() {
        assert!(ShortTerm::new(0, 4, Device::Cpu, 0).is_err());
        let mut st = ShortTerm::new(2, 4, Device::Cpu, 0).unwrap();
        let e = st
            .push(&[Sample {
                token_ids: &[1, 2],
                rewards: &[0.0],
                logprobs: &[0.0, 0.0],
                advantages: &[0.0, 0.0],
                prompt_len: 1,
                passed: false,
            }])
            .unwrap_err();
        assert!(e.to_string().contains("2 tokens but 1 rewards"), "{e}");
        assert!(st.is_empty(), "nothing written");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.safetensors");
        std::fs::write(&p, b"not safetensors").unwrap();
        assert!(ShortTerm::load(&p, Device::Cpu).is_err());
    }
}
