//! How a step's work is split over the ranks of a data-parallel run: each
//! rank generates and runs the samples of a contiguous share of the step's
//! tasks (whole GRPO groups, so no advantage needs another rank), then the
//! samples are gathered so that every rank scores the whole batch alike;
//! each rank back-propagates its share against the whole batch's
//! normalisers, and the summed gradients are the one-process gradient.
//! With one process every function here is the identity.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Recipe, TrainError};
use crate::config::{MetaAlgorithm, RunConfig, StrategyKind};
use crate::dist::Group;

/// What a data-parallel run cannot do yet, refused before it starts.
pub(super) fn check(cfg: &RunConfig, recipe: Recipe, world: usize) -> Result<(), TrainError> {
    let t = &cfg.train;
    let refuse = |why: String| Err(TrainError::Invalid(format!("{why} (world size {world})")));
    if t.strategy != StrategyKind::ZeroShot {
        return refuse(format!(
            "[train] strategy = \"{}\" learns from the samples in order on one process; \
             data-parallel runs train with the zero-shot strategy only",
            t.strategy.name()
        ));
    }
    if t.tasks_per_step < world {
        return refuse(format!(
            "[train] tasks_per_step = {} leaves a rank without a task: give each rank at least \
             one (whole GRPO groups are split over the ranks)",
            t.tasks_per_step
        ));
    }
    match recipe {
        Recipe::Rl => {}
        Recipe::Meta(MetaAlgorithm::Fomaml) | Recipe::Meta(MetaAlgorithm::Maml) => {}
        Recipe::Meta(a) => {
            return refuse(format!(
                "[meta] algorithm = \"{}\" is not data-parallel yet (maml and fomaml are)",
                a.name()
            ))
        }
        Recipe::Sft => return refuse("`falcon sft` runs on one process".into()),
    }
    Ok(())
}

/// Rank `rank`'s share of `n` items: contiguous, sizes differing by at
/// most one, in rank order.
pub(super) fn range(n: usize, rank: usize, world: usize) -> Range<usize> {
    (n * rank / world)..(n * (rank + 1) / world)
}

/// This rank's share of `n` tasks.
pub(super) fn local(dist: &Group, n: usize) -> Range<usize> {
    range(n, dist.rank(), dist.world())
}

/// This rank's sequences of a batch of `n` in groups of `g`: the whole
/// groups of its [`local`] tasks (all `n` on one process).
pub(super) fn local_seqs(dist: &Group, n: usize, g: usize) -> Range<usize> {
    if dist.world() == 1 {
        return 0..n;
    }
    let tasks = local(dist, n / g.max(1));
    tasks.start * g..tasks.end * g
}

/// Sum the gradients of `params` over the ranks (buckets of
/// `bucket_bytes`): each rank's loss is already normalised by the whole
/// batch, so the sum is the one-process gradient.
pub(super) fn sum_grads(
    dist: &Group,
    params: &[(String, tch::Tensor)],
    bucket_bytes: usize,
) -> Result<(), TrainError> {
    if dist.world() == 1 {
        return Ok(());
    }
    let ps: Vec<tch::Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    Ok(dist.all_reduce_grads(&ps, bucket_bytes, false)?)
}

/// Every rank's `mine`, concatenated in rank order (the whole batch when
/// each holds its [`local`] share).
pub(super) fn gather<T: Serialize + DeserializeOwned>(
    dist: &Group,
    mine: Vec<T>,
) -> Result<Vec<T>, TrainError> {
    if dist.world() == 1 {
        return Ok(mine);
    }
    let bytes = serde_json::to_vec(&mine).map_err(|source| TrainError::Gather {
        rank: dist.rank(),
        source,
    })?;
    let mut all = Vec::new();
    for (r, part) in dist.all_gather_bytes(&bytes)?.into_iter().enumerate() {
        let items: Vec<T> = serde_json::from_slice(&part)
            .map_err(|source| TrainError::Gather { rank: r, source })?;
        all.extend(items);
    }
    Ok(all)
}

/// The term-by-term sum of every rank's loss terms.
pub(super) fn sum_terms(
    dist: &Group,
    mine: BTreeMap<String, f64>,
) -> Result<BTreeMap<String, f64>, TrainError> {
    if dist.world() == 1 {
        return Ok(mine);
    }
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    for (k, v) in gather(dist, vec![mine])?.into_iter().flatten() {
        *sum.entry(k).or_insert(0.0) += v;
    }
    Ok(sum)
}

/// Go on only if every rank's `result` is Ok: a rank that failed returns
/// its own error, the others one naming it (so no rank waits for a
/// collective that a failed rank will never join).
pub(super) fn agree(
    dist: &Group,
    result: Result<(), TrainError>,
    what: &str,
) -> Result<(), TrainError> {
    let ok = [result.is_ok() as u8];
    let all = dist.all_gather_bytes(&ok)?;
    result?;
    if let Some(r) = all.iter().position(|v| v.first() != Some(&1)) {
        return Err(TrainError::Invalid(format!(
            "rank {r} failed {what}; its output says why"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_contiguous_balanced_and_cover_everything() {
        for n in 1..12 {
            for world in 1..=n {
                let parts: Vec<Range<usize>> = (0..world).map(|r| range(n, r, world)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[world - 1].end, n);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1 && *lo >= 1, "{n} over {world}: {sizes:?}");
            }
        }
    }
}
