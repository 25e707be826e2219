//! The execution-feedback rewards of FALCON §4.4, each a small pure function
//! named as in the paper: `R_coarse` (Eq. 9, CodeRL's compiler feedback),
//! `R_error` (Eq. 10, adaptive feedback from the pass share of unit tests) and
//! `R_negative` (Eq. 11, long-term error-type feedback).

use std::collections::BTreeMap;

use crate::exec::outcome::{ErrorKind, RewardClass};

/// `R_coarse` (FALCON Eq. 9): 1.0 pass, −0.3 failure, −0.6 runtime error,
/// −1.0 syntax error. Its token span is the whole completion
/// (`S_coarse = 0`, `E_coarse = T`); see [`super::spans::coarse_span`].
pub fn r_coarse(outcome: RewardClass) -> f64 {
    match outcome {
        RewardClass::Pass => 1.0,
        RewardClass::Failure => -0.3,
        RewardClass::RuntimeError => -0.6,
        RewardClass::SyntaxError => -1.0,
    }
}

/// `R_error` (FALCON Eq. 10): `−0.3 + 1.3·N_pass / (N_pass + N_fail)`, from
/// −0.3 (no test passes) to 1.0 (all pass). `None` when there are no tests:
/// the ratio is undefined and no value would be honest.
pub fn r_error(n_pass: usize, n_fail: usize) -> Option<f64> {
    let n = n_pass + n_fail;
    (n > 0).then(|| -0.3 + 1.3 * n_pass as f64 / n as f64)
}

/// `R_negative` (FALCON Eq. 11): `−Σ_error N_error · P_error`.
///
/// `n_error` is the short-term recall: how many of this sample's tests ended
/// in each error kind ([`crate::exec::outcome::ExecReport::error_counts`]).
/// `p_error` is the long-term recall: the share of each error kind in past
/// samples, supplied by the caller from its long-term statistics. A kind
/// with no entry in `p_error` has no history yet and contributes 0.
pub fn r_negative(n_error: &BTreeMap<ErrorKind, usize>, p_error: &BTreeMap<ErrorKind, f64>) -> f64 {
    // `0.0 - x` rather than `-x`, so that no errors gives 0.0, not −0.0, in the logs.
    0.0 - n_error
        .iter()
        .map(|(kind, &n)| n as f64 * p_error.get(kind).copied().unwrap_or(0.0))
        .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn r_coarse_follows_eq_9() {
        assert_eq!(r_coarse(RewardClass::Pass), 1.0);
        assert_eq!(r_coarse(RewardClass::Failure), -0.3);
        assert_eq!(r_coarse(RewardClass::RuntimeError), -0.6);
        assert_eq!(r_coarse(RewardClass::SyntaxError), -1.0);
    }

    #[test]
    fn r_error_follows_eq_10() {
        assert!(close(r_error(0, 4).unwrap(), -0.3));
        assert!(close(r_error(4, 0).unwrap(), 1.0));
        // 1 of 4: −0.3 + 1.3/4 = 0.025
        assert!(close(r_error(1, 3).unwrap(), 0.025));
        // 2 of 5: −0.3 + 0.52 = 0.22
        assert!(close(r_error(2, 3).unwrap(), 0.22));
        assert_eq!(r_error(0, 0), None);
    }

    #[test]
    fn r_negative_follows_eq_11() {
        let n = BTreeMap::from([(ErrorKind::TypeError, 2), (ErrorKind::WrongAnswer, 1)]);
        let p = BTreeMap::from([
            (ErrorKind::TypeError, 0.25),
            (ErrorKind::WrongAnswer, 0.5),
            (ErrorKind::SyntaxError, 0.9),
        ]);
        // −(2·0.25 + 1·0.5) = −1.0; SyntaxError has no count here.
        assert!(close(r_negative(&n, &p), -1.0));
        // A kind without history contributes nothing.
        let n = BTreeMap::from([(ErrorKind::KeyError, 3)]);
        assert_eq!(r_negative(&n, &p), 0.0);
        assert_eq!(r_negative(&BTreeMap::new(), &p), 0.0);
    }
}
