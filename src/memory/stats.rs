//! Long-term error statistics: FALCON's `P_error` of Eq. 11,
//! `R_negative = -Σ_error N_error × P_error`, "the proportion of each error
//! type" over the run's history (§4.4). `N_error` is the current sample's
//! [`ExecReport::error_counts`]; this file owns only `P_error`.
//!
//! Our reading of "proportion of each error type": the share of each kind
//! among the failing tests seen so far, so `P_error` sums to 1 over the kinds
//! seen and passing tests are not in the denominator. A proportion over all
//! tests would shrink every penalty as the model improves, which is the
//! unit-test reward's job, not this one's. Counting is per failing test, the
//! same unit as `N_error`, so the two multiply consistently.
//!
//! Time is counted in samples that carry a signal: a no-signal report
//! (sandbox failure) is ignored entirely. A passing sample adds no count,
//! but it is a step of time: in [`StatsMode::Window`] it takes a slot (so
//! old errors age out), in [`StatsMode::Decay`] it decays every count (which
//! leaves the proportions unchanged).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::exec::{ErrorKind, ExecReport};

pub use crate::config::StatsMode;

/// A bad [`StatsMode`] or a stored state that does not fit its mode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("error statistics: {0}")]
pub struct StatsError(String);

/// Running `P_error`. Persist it with `put_record("stats", "error", ..)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StoredStats", into = "StoredStats")]
pub struct ErrorStats {
    mode: StatsMode,
    /// Samples with a signal ever observed (for logging).
    samples: u64,
    /// All / Window: exact integer counts over the covered samples.
    counts: BTreeMap<ErrorKind, u64>,
    /// Window: each covered sample's counts, oldest first (empty for a pass).
    recent: VecDeque<BTreeMap<ErrorKind, u32>>,
    /// Decay: the moving counts.
    decayed: BTreeMap<ErrorKind, f64>,
}

/// Where a run's error statistics live in the store: (kind, key).
pub const RECORD: (&str, &str) = ("stats", "error");

impl ErrorStats {
    /// The statistics saved in `store`, if any.
    pub fn load(store: &super::MemoryStore) -> Result<Option<Self>, super::StoreError> {
        store.get_record(RECORD.0, RECORD.1)
    }

    /// Save as one record (one transaction).
    pub fn save(&self, store: &mut super::MemoryStore, step: u64) -> Result<(), super::StoreError> {
        store.put_record(RECORD.0, RECORD.1, step, self)
    }

    /// Empty statistics; fails on an invalid mode.
    pub fn new(mode: StatsMode) -> Result<Self, StatsError> {
        mode.validate().map_err(StatsError)?;
        Ok(ErrorStats {
            mode,
            samples: 0,
            counts: BTreeMap::new(),
            recent: VecDeque::new(),
            decayed: BTreeMap::new(),
        })
    }

    pub fn mode(&self) -> StatsMode {
        self.mode
    }

    /// Samples with a signal observed since the start (not only those covered).
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Count one sample's report; returns false (and counts nothing) for a
    /// no-signal report.
    pub fn observe(&mut self, report: &ExecReport) -> bool {
        if report.outcome.is_none() {
            return false;
        }
        self.samples += 1;
        let n_error = report.error_counts();
        match self.mode {
            StatsMode::All => {
                for (&k, &n) in &n_error {
                    *self.counts.entry(k).or_insert(0) += n as u64;
                }
            }
            StatsMode::Window { samples } => {
                let sample: BTreeMap<ErrorKind, u32> = n_error
                    .iter()
                    .map(|(&k, &n)| (k, u32::try_from(n).unwrap_or(u32::MAX)))
                    .collect();
                for (&k, &n) in &sample {
                    *self.counts.entry(k).or_insert(0) += u64::from(n);
                }
                self.recent.push_back(sample);
                while self.recent.len() > samples {
                    let old = self.recent.pop_front().expect("longer than the window");
                    for (k, n) in old {
                        let c = self.counts.get_mut(&k).expect("counted when pushed");
                        *c -= u64::from(n);
                        if *c == 0 {
                            self.counts.remove(&k);
                        }
                    }
                }
            }
            StatsMode::Decay { lambda } => {
                for c in self.decayed.values_mut() {
                    *c *= lambda;
                }
                for (&k, &n) in &n_error {
                    *self.decayed.entry(k).or_insert(0.0) += n as f64;
                }
            }
        }
        true
    }

    /// `P_error` for each kind seen in the covered history; a kind that is
    /// absent has proportion 0. Empty before any error was seen.
    pub fn p_error(&self) -> BTreeMap<ErrorKind, f64> {
        let weights: Vec<(ErrorKind, f64)> = match self.mode {
            StatsMode::Decay { .. } => self.decayed.iter().map(|(&k, &c)| (k, c)).collect(),
            _ => self.counts.iter().map(|(&k, &c)| (k, c as f64)).collect(),
        };
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        if total <= 0.0 {
            return BTreeMap::new();
        }
        weights
            .into_iter()
            .filter(|(_, w)| *w > 0.0)
            .map(|(k, w)| (k, w / total))
            .collect()
    }
}

/// The persisted form: only what the mode needs; the window's totals are
/// recomputed on load, so they cannot disagree with the window.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredStats {
    mode: StatsMode,
    samples: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    counts: BTreeMap<ErrorKind, u64>,
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    recent: VecDeque<BTreeMap<ErrorKind, u32>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    decayed: BTreeMap<ErrorKind, f64>,
}

impl From<ErrorStats> for StoredStats {
    fn from(s: ErrorStats) -> Self {
        let counts = match s.mode {
            StatsMode::All => s.counts,
            _ => BTreeMap::new(),
        };
        StoredStats {
            mode: s.mode,
            samples: s.samples,
            counts,
            recent: s.recent,
            decayed: s.decayed,
        }
    }
}

impl TryFrom<StoredStats> for ErrorStats {
    type Error = StatsError;

    fn try_from(s: StoredStats) -> Result<Self, StatsError> {
        let mut out = ErrorStats::new(s.mode)?;
        out.samples = s.samples;
        let misfit =
            |what: &str| StatsError(format!("stored {what} do not fit mode {}", s.mode.name()));
        match s.mode {
            StatsMode::All => {
                if !s.recent.is_empty() || !s.decayed.is_empty() {
                    return Err(misfit("window or decayed counts"));
                }
                out.counts = s.counts;
            }
            StatsMode::Window { samples } => {
                if !s.counts.is_empty() || !s.decayed.is_empty() {
                    return Err(misfit("totals or decayed counts"));
                }
                if s.recent.len() > samples {
                    return Err(misfit("more recent samples than the window holds; they"));
                }
                for sample in &s.recent {
                    for (&k, &n) in sample {
                        *out.counts.entry(k).or_insert(0) += u64::from(n);
                    }
                }
                out.counts.retain(|_, c| *c > 0);
                out.recent = s.recent;
            }
            StatsMode::Decay { .. } => {
                if !s.counts.is_empty() || !s.recent.is_empty() {
                    return Err(misfit("totals or window"));
                }
                if s.decayed.values().any(|c| !(c.is_finite() && *c >= 0.0)) {
                    return Err(misfit("negative or non-finite decayed counts"));
                }
                out.decayed = s.decayed;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{TestResult, TestStatus};

    fn report(statuses: &[Option<ErrorKind>]) -> ExecReport {
        let tests = statuses
            .iter()
            .enumerate()
            .map(|(index, s)| TestResult {
                index,
                status: match s {
                    None => TestStatus::Pass,
                    Some(ErrorKind::WrongAnswer) => TestStatus::Fail,
                    Some(kind) => TestStatus::Error {
                        kind: *kind,
                        message: String::new(),
                    },
                },
                error_lines: vec![],
                seconds: 0.0,
            })
            .collect();
        ExecReport::from_tests(tests, String::new(), 0.0)
    }

    use ErrorKind::{TypeError as T, ValueError as V, WrongAnswer as W};

    /// A: 2 ValueError + 1 wrong answer + 1 pass; B: all pass; C: 1 TypeError.
    fn samples() -> [ExecReport; 3] {
        [
            report(&[Some(V), Some(W), Some(V), None]),
            report(&[None, None]),
            report(&[Some(T)]),
        ]
    }

    fn close(got: &BTreeMap<ErrorKind, f64>, want: &[(ErrorKind, f64)]) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (k, p) in want {
            assert!((got[k] - p).abs() < 1e-12, "{k:?}: {} vs {p}", got[k]);
        }
    }

    #[test]
    fn all_counts_failing_tests_and_ignores_no_signal() {
        let mut s = ErrorStats::new(StatsMode::All).unwrap();
        assert!(s.p_error().is_empty());
        for r in samples() {
            assert!(s.observe(&r));
        }
        assert!(!s.observe(&ExecReport::no_signal("sandbox died")));
        assert_eq!(s.samples(), 3);
        // 2 V, 1 W, 1 T of 4 failing tests; passes are not in the denominator.
        close(&s.p_error(), &[(V, 0.5), (W, 0.25), (T, 0.25)]);
        let sum: f64 = s.p_error().values().sum();
        assert!((sum - 1.0).abs() < 1e-12);
    }

    #[test]
    fn window_forgets_samples_beyond_its_size() {
        let mut s = ErrorStats::new(StatsMode::Window { samples: 2 }).unwrap();
        for r in samples() {
            s.observe(&r);
        }
        // The window holds B (pass) and C (1 T).
        close(&s.p_error(), &[(T, 1.0)]);
        s.observe(&report(&[Some(V), Some(V), Some(V)]));
        // C and the new sample: 1 T, 3 V.
        close(&s.p_error(), &[(T, 0.25), (V, 0.75)]);
        s.observe(&report(&[None]));
        s.observe(&report(&[None]));
        assert!(s.p_error().is_empty());
        assert_eq!(s.samples(), 6);
    }

    #[test]
    fn decay_weights_recent_samples_more() {
        let mut s = ErrorStats::new(StatsMode::Decay { lambda: 0.5 }).unwrap();
        for r in samples() {
            s.observe(&r);
        }
        // After A: V 2, W 1. After B: V 1, W 0.5. After C: V 0.5, W 0.25, T 1.
        let total = 1.75;
        close(
            &s.p_error(),
            &[(V, 0.5 / total), (W, 0.25 / total), (T, 1.0 / total)],
        );
        let mut one = ErrorStats::new(StatsMode::Decay { lambda: 1.0 }).unwrap();
        for r in samples() {
            one.observe(&r);
        }
        close(&one.p_error(), &[(V, 0.5), (W, 0.25), (T, 0.25)]);
    }

    #[test]
    fn window_round_trips_exactly_and_keeps_counting_the_same() {
        let mut s = ErrorStats::new(StatsMode::Window { samples: 3 }).unwrap();
        for r in samples().iter().chain(samples().iter()) {
            s.observe(r);
        }
        let json = serde_json::to_string(&s).unwrap();
        let mut back: ErrorStats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        let next = report(&[Some(W)]);
        s.observe(&next);
        back.observe(&next);
        assert_eq!(back, s);
        assert_eq!(back.p_error(), s.p_error());

        for mode in [StatsMode::All, StatsMode::Decay { lambda: 0.9 }] {
            let mut s = ErrorStats::new(mode).unwrap();
            for r in samples() {
                s.observe(&r);
            }
            let back: ErrorStats =
                serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn bad_modes_and_misfit_states_are_refused() {
        assert!(ErrorStats::new(StatsMode::Window { samples: 0 }).is_err());
        let e = ErrorStats::new(StatsMode::Decay { lambda: 1.5 }).unwrap_err();
        assert!(e.to_string().contains("(0, 1]"), "{e}");
        assert!(StatsMode::Decay { lambda: f64::NAN }.validate().is_err());
        let too_long = r#"{"mode":{"mode":"window","samples":1},"samples":2,
            "recent":[{"ValueError":1},{}]}"#;
        assert!(serde_json::from_str::<ErrorStats>(too_long).is_err());
        let mode: StatsMode = serde_json::from_str(r#"{"mode":"decay","lambda":0.99}"#).unwrap();
        assert_eq!(mode, StatsMode::Decay { lambda: 0.99 });
    }
}
