//! Advantages from per-sample scalar rewards, with a baseline taken over the
//! G samples drawn for the same prompt.
//!
//! FALCON's losses (Eqs. 2 and 8) weight log-probabilities by the raw reward
//! (`AdvantageKind::None`, REINFORCE without a baseline). Subtracting a
//! baseline keeps the policy-gradient estimate unbiased and lowers its
//! variance: the group mean (GRPO, optionally divided by the group's standard
//! deviation) or the leave-one-out mean of the other G−1 samples (RLOO).
//!
//! A sample with no signal (reward `None`: the sandbox broke) gets advantage 0
//! and is left out of its group's statistics, so it neither moves the policy
//! nor shifts its siblings' baseline (verl#4074, STYLE.md §6).

use std::collections::BTreeMap;

/// Added to the group's standard deviation before dividing by it, so a group
/// whose rewards are all equal gets advantage 0 rather than NaN.
pub const STD_EPS: f64 = 1e-4;

pub use crate::config::AdvantageKind;

/// Rewards and group ids that do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdvantageError {
    /// `rewards` and `group` have different lengths.
    #[error("{rewards} rewards but {groups} group ids; give one group id per sample")]
    LengthMismatch {
        /// Number of rewards.
        rewards: usize,
        /// Number of group ids.
        groups: usize,
    },
    /// A reward is NaN or infinite.
    #[error(
        "reward of sample {index} is {value}; rewards must be finite (use None for no signal)"
    )]
    NonFinite {
        /// Sample index.
        index: usize,
        /// The reward.
        value: f64,
    },
    /// Samples cannot be cut into groups of the given size.
    #[error("{n} samples do not split into groups of {size}")]
    BadGroupSize {
        /// Number of samples.
        n: usize,
        /// Requested group size.
        size: usize,
    },
}

/// Group ids for `n` samples laid out as consecutive groups of `size`
/// (samples `0..size` are group 0, and so on).
pub fn equal_groups(n: usize, size: usize) -> Result<Vec<usize>, AdvantageError> {
    if size == 0 || !n.is_multiple_of(size) {
        return Err(AdvantageError::BadGroupSize { n, size });
    }
    Ok((0..n).map(|i| i / size).collect())
}

/// Per-sample advantages. `group[i]` is the prompt (group) id of sample `i`;
/// ids need not be contiguous or sorted. Samples whose reward is `None` get 0
/// and are excluded from their group's mean, std and size.
/// `normalize_std` applies to [`AdvantageKind::GroupMean`] only.
pub fn advantages(
    kind: AdvantageKind,
    rewards: &[Option<f64>],
    group: &[usize],
    normalize_std: bool,
) -> Result<Vec<f64>, AdvantageError> {
    if rewards.len() != group.len() {
        return Err(AdvantageError::LengthMismatch {
            rewards: rewards.len(),
            groups: group.len(),
        });
    }
    if let Some((index, value)) = rewards
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.filter(|v| !v.is_finite()).map(|v| (i, v)))
    {
        return Err(AdvantageError::NonFinite { index, value });
    }

    let stats = group_stats(rewards, group);
    let out = rewards
        .iter()
        .zip(group)
        .map(|(r, g)| {
            let Some(r) = *r else { return 0.0 };
            let s = &stats[g];
            match kind {
                AdvantageKind::None => r,
                AdvantageKind::GroupMean => {
                    let a = r - s.mean();
                    if normalize_std {
                        a / (s.std() + STD_EPS)
                    } else {
                        a
                    }
                }
                AdvantageKind::Rloo if s.n < 2 => 0.0,
                // mean of the other n−1 = (Σ − r)/(n−1); r − that = n/(n−1)·(r − mean).
                AdvantageKind::Rloo => r - (s.sum - r) / (s.n - 1) as f64,
            }
        })
        .collect();
    Ok(out)
}

/// Sums over the samples of one group that carry a reward.
#[derive(Default)]
struct GroupStats {
    n: usize,
    sum: f64,
    sum_sq: f64,
}

impl GroupStats {
    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }

    /// Sample standard deviation (Bessel's n−1, as `torch.std` and TRL's GRPO
    /// use, so numbers compare with theirs); 0 for fewer than two samples.
    fn std(&self) -> f64 {
        if self.n < 2 {
            return 0.0;
        }
        let mean = self.mean();
        let var = (self.sum_sq - self.n as f64 * mean * mean) / (self.n - 1) as f64;
        // Cancellation can leave a tiny negative variance for equal rewards.
        var.max(0.0).sqrt()
    }
}

fn group_stats(rewards: &[Option<f64>], group: &[usize]) -> BTreeMap<usize, GroupStats> {
    let mut stats: BTreeMap<usize, GroupStats> = BTreeMap::new();
    for (r, g) in rewards.iter().zip(group) {
        let s = stats.entry(*g).or_default();
        if let Some(r) = r {
            s.n += 1;
            s.sum += r;
            s.sum_sq += r * r;
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn none_is_the_reward_and_zero_without_signal() {
        let r = [Some(1.0), None, Some(-0.3)];
        let a = advantages(AdvantageKind::None, &r, &[0, 0, 1], true).unwrap();
        assert!(close(&a, &[1.0, 0.0, -0.3]));
    }

    #[test]
    fn group_mean_subtracts_each_groups_mean() {
        // group 0: 1, 0, −1 → mean 0; group 1: 2, 4 → mean 3
        let r = [Some(1.0), Some(0.0), Some(-1.0), Some(2.0), Some(4.0)];
        let g = [0, 0, 0, 1, 1];
        let a = advantages(AdvantageKind::GroupMean, &r, &g, false).unwrap();
        assert!(close(&a, &[1.0, 0.0, -1.0, -1.0, 1.0]));
    }

    #[test]
    fn group_mean_normalized_by_sample_std() {
        // group 0: 1, 0, −1 → std = sqrt(2/2) = 1; group 1: 2, 4 → std = sqrt(2) ≈ 1.41421
        let r = [Some(1.0), Some(0.0), Some(-1.0), Some(2.0), Some(4.0)];
        let g = [0, 0, 0, 1, 1];
        let a = advantages(AdvantageKind::GroupMean, &r, &g, true).unwrap();
        let s2 = 2f64.sqrt() + STD_EPS;
        let want = [
            1.0 / (1.0 + STD_EPS),
            0.0,
            -1.0 / (1.0 + STD_EPS),
            -1.0 / s2,
            1.0 / s2,
        ];
        assert!(close(&a, &want), "{a:?}");
    }

    #[test]
    fn equal_rewards_give_zero_not_nan() {
        let r = [Some(0.5); 4];
        let a = advantages(AdvantageKind::GroupMean, &r, &[7; 4], true).unwrap();
        assert!(close(&a, &[0.0; 4]), "{a:?}");
    }

    #[test]
    fn rloo_subtracts_mean_of_the_others() {
        // 1 − (2+6)/2 = −3; 2 − (1+6)/2 = −1.5; 6 − (1+2)/2 = 4.5; group of one → 0
        let r = [Some(1.0), Some(2.0), Some(6.0), Some(5.0)];
        let g = [3, 3, 3, 9];
        let a = advantages(AdvantageKind::Rloo, &r, &g, false).unwrap();
        assert!(close(&a, &[-3.0, -1.5, 4.5, 0.0]), "{a:?}");
    }

    #[test]
    fn samples_without_signal_are_left_out_of_group_statistics() {
        // group 0 has rewards 1, 3 (and one None): mean 2; RLOO: 1−3, 3−1
        let r = [Some(1.0), None, Some(3.0)];
        let g = [0, 0, 0];
        let gm = advantages(AdvantageKind::GroupMean, &r, &g, false).unwrap();
        assert!(close(&gm, &[-1.0, 0.0, 1.0]), "{gm:?}");
        let rloo = advantages(AdvantageKind::Rloo, &r, &g, false).unwrap();
        assert!(close(&rloo, &[-2.0, 0.0, 2.0]), "{rloo:?}");
        // A group whose only scored sample is alone: RLOO 0, group mean 0.
        let r = [None, Some(4.0)];
        let rloo = advantages(AdvantageKind::Rloo, &r, &[1, 1], false).unwrap();
        assert!(close(&rloo, &[0.0, 0.0]), "{rloo:?}");
        let gm = advantages(AdvantageKind::GroupMean, &r, &[1, 1], true).unwrap();
        assert!(close(&gm, &[0.0, 0.0]), "{gm:?}");
    }

    #[test]
    fn equal_groups_lays_out_consecutive_ids() {
        assert_eq!(equal_groups(6, 3).unwrap(), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(
            equal_groups(5, 2),
            Err(AdvantageError::BadGroupSize { n: 5, size: 2 })
        );
        assert!(equal_groups(4, 0).is_err());
    }

    #[test]
    fn rejects_mismatched_lengths_and_non_finite_rewards() {
        let e = advantages(AdvantageKind::None, &[Some(1.0)], &[0, 0], false);
        assert_eq!(
            e,
            Err(AdvantageError::LengthMismatch {
                rewards: 1,
                groups: 2
            })
        );
        let e = advantages(AdvantageKind::Rloo, &[Some(f64::NAN)], &[0], false);
        assert!(matches!(e, Err(AdvantageError::NonFinite { index: 0, .. })));
    }

    #[test]
    fn kind_serializes_in_snake_case() {
        for (k, s) in [
            (AdvantageKind::None, "\"none\""),
            (AdvantageKind::GroupMean, "\"group_mean\""),
            (AdvantageKind::Rloo, "\"rloo\""),
        ] {
            assert_eq!(serde_json::to_string(&k).unwrap(), s);
            assert_eq!(serde_json::from_str::<AdvantageKind>(s).unwrap(), k);
        }
    }
}
