//! The LM judge in training: a cache by code hash, so code judged once is
//! never judged again, and a budget of answers per training step, so a
//! judge model cannot take over the step's time. The cache travels with
//! checkpoints ([`Judge::state`]), so which code the budget leaves without
//! a score is the same in a resumed run as in an uninterrupted one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{Aspect, Judge, JudgeStats, RewardError};

/// A judge with a cache and a per-step budget of fresh answers.
pub struct Budgeted<'j> {
    inner: Box<dyn Judge + 'j>,
    /// Fresh answers allowed per step (0 = no limit).
    per_step: usize,
    used: AtomicUsize,
    /// `aspect:hash` → the score the judge gave (None: no unambiguous one).
    cache: Mutex<BTreeMap<String, Option<f64>>>,
    hits: AtomicUsize,
    over_budget: AtomicUsize,
    warned: std::sync::Once,
}

impl<'j> Budgeted<'j> {
    /// `inner` behind a cache, asked for at most `per_step` fresh answers
    /// per step (0 = no limit).
    pub fn new(inner: Box<dyn Judge + 'j>, per_step: usize) -> Self {
        Budgeted {
            inner,
            per_step,
            used: AtomicUsize::new(0),
            cache: Mutex::new(BTreeMap::new()),
            hits: AtomicUsize::new(0),
            over_budget: AtomicUsize::new(0),
            warned: std::sync::Once::new(),
        }
    }

    /// Scores answered from the cache so far.
    pub fn cache_hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }
}

/// FNV-1a of the code, the cache's key beside the aspect.
fn key(aspect: Aspect, code: &str) -> String {
    let h = crate::text::fnv1a(&[code.as_bytes()]);
    let a = match aspect {
        Aspect::Style => "style",
        Aspect::Complexity => "complexity",
    };
    format!("{a}:{h:016x}:{}", code.len())
}

impl Judge for Budgeted<'_> {
    fn score(&self, aspect: Aspect, codes: &[&str]) -> Result<Vec<Option<f64>>, RewardError> {
        let keys: Vec<String> = codes.iter().map(|c| key(aspect, c)).collect();
        let mut out: Vec<Option<Option<f64>>> = vec![None; codes.len()];
        // Fresh code in batch order, once each, while the budget lasts.
        let mut ask: Vec<usize> = Vec::new();
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for (i, k) in keys.iter().enumerate() {
                if let Some(v) = cache.get(k) {
                    out[i] = Some(*v);
                    self.hits.fetch_add(1, Ordering::Relaxed);
                } else if !ask.iter().any(|&j| keys[j] == *k) {
                    let used = self.used.load(Ordering::Relaxed);
                    if self.per_step == 0 || used < self.per_step {
                        self.used.store(used + 1, Ordering::Relaxed);
                        ask.push(i);
                    }
                }
            }
        }
        if !ask.is_empty() {
            let fresh: Vec<&str> = ask.iter().map(|&i| codes[i]).collect();
            let scores = self.inner.score(aspect, &fresh)?;
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for (&i, s) in ask.iter().zip(scores) {
                cache.insert(keys[i].clone(), s);
            }
            for (i, k) in keys.iter().enumerate() {
                if out[i].is_none() {
                    out[i] = cache.get(k).copied();
                }
            }
        }
        let over = out.iter().filter(|o| o.is_none()).count();
        if over > 0 {
            self.over_budget.fetch_add(over, Ordering::Relaxed);
            self.warned.call_once(|| {
                eprintln!(
                    "warning: the LM judge's budget ([reward.lm_judge] max_requests_per_step = {}) \
                     was spent; code beyond it gets no style or complexity signal that step \
                     (shown once)",
                    self.per_step
                )
            });
        }
        Ok(out.into_iter().map(Option::flatten).collect())
    }

    fn stats(&self) -> JudgeStats {
        let mut s = self.inner.stats();
        s.over_budget += self.over_budget.load(Ordering::Relaxed);
        s
    }

    fn new_step(&self) {
        self.used.store(0, Ordering::Relaxed);
    }

    fn state(&self) -> Option<serde_json::Value> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        Some(serde_json::json!({ "format": 1, "cache": *cache }))
    }

    fn restore(&self, state: &serde_json::Value) -> Result<(), String> {
        if state["format"] != 1 {
            return Err("not a judge cache of format 1".into());
        }
        let cache: BTreeMap<String, Option<f64>> =
            serde_json::from_value(state["cache"].clone()).map_err(|e| e.to_string())?;
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = cache;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Scores each code by its length and counts what it was asked.
    struct Counting(AtomicUsize);
    impl Judge for Counting {
        fn score(&self, _: Aspect, codes: &[&str]) -> Result<Vec<Option<f64>>, RewardError> {
            self.0.fetch_add(codes.len(), Ordering::Relaxed);
            Ok(codes.iter().map(|c| Some(c.len() as f64)).collect())
        }
        fn stats(&self) -> JudgeStats {
            JudgeStats::default()
        }
    }

    #[test]
    fn repeats_are_free_and_the_budget_leaves_the_rest_without_signal() {
        let j = Budgeted::new(Box::new(Counting(AtomicUsize::new(0))), 2);
        let got = j.score(Aspect::Style, &["a", "bb", "a", "ccc"]).unwrap();
        // "a" twice is one answer; "ccc" is the third fresh code.
        assert_eq!(got, vec![Some(1.0), Some(2.0), Some(1.0), None]);
        assert_eq!(j.stats().over_budget, 1);
        // Same step: the budget is spent, but cached code still scores.
        let got = j.score(Aspect::Style, &["bb", "dddd"]).unwrap();
        assert_eq!(got, vec![Some(2.0), None]);
        // The other aspect is another key.
        assert_eq!(j.score(Aspect::Complexity, &["a"]).unwrap(), vec![None]);
        j.new_step();
        let got = j.score(Aspect::Style, &["ccc", "a"]).unwrap();
        assert_eq!(got, vec![Some(3.0), Some(1.0)]);
        assert_eq!(j.cache_hits(), 2);
    }

    #[test]
    fn the_cache_is_saved_and_restored() {
        let a = Budgeted::new(Box::new(Counting(AtomicUsize::new(0))), 0);
        a.score(Aspect::Style, &["x = 1", "y"]).unwrap();
        let state = a.state().unwrap();
        let b = Budgeted::new(Box::new(Counting(AtomicUsize::new(0))), 1);
        b.restore(&state).unwrap();
        // Both answered from the restored cache: no budget spent.
        assert_eq!(
            b.score(Aspect::Style, &["y", "x = 1", "zz"]).unwrap(),
            vec![Some(1.0), Some(5.0), Some(2.0)]
        );
        assert!(b.restore(&serde_json::json!({"format": 9})).is_err());
    }
}
