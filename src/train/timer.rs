//! [`Timer`]: where a step's seconds went, by phase (`generate`, `exec`,
//! `reward`, `sync`, `gather`, `update`), as the step's record reports them.

use std::collections::BTreeMap;
use std::time::Instant;

/// Seconds per phase of one step. Phases add up when timed more than once
/// (a meta-step generates with θ and again with each θ_i).
#[derive(Debug, Default)]
pub struct Timer {
    seconds: BTreeMap<String, f64>,
}

/// A span of the step whose own time excludes the phases timed inside it
/// ([`Timer::span`], [`Timer::end_span`]).
pub struct Span {
    start: Instant,
    timed_before: f64,
}

impl Timer {
    /// Run `f` and add its seconds to `phase`.
    pub fn time<T>(&mut self, phase: &str, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        self.add(phase, t0.elapsed().as_secs_f64());
        out
    }

    /// Add `secs` to `phase`.
    pub fn add(&mut self, phase: &str, secs: f64) {
        *self.seconds.entry(phase.to_owned()).or_insert(0.0) += secs;
    }

    /// Add the seconds since `t0` to `phase`.
    pub fn add_since(&mut self, phase: &str, t0: Instant) {
        self.add(phase, t0.elapsed().as_secs_f64());
    }

    /// Start a span (see [`Timer::end_span`]).
    pub fn span(&self) -> Span {
        Span {
            start: Instant::now(),
            timed_before: self.total(),
        }
    }

    /// Set `phase` to the span's seconds less those timed inside it: the
    /// meta-update's time without the query samples it waits for.
    pub fn end_span(&mut self, phase: &str, span: Span) {
        let inside = self.total() - span.timed_before;
        let own = (span.start.elapsed().as_secs_f64() - inside).max(0.0);
        self.seconds.insert(phase.to_owned(), own);
    }

    /// Seconds timed so far, over all phases.
    pub fn total(&self) -> f64 {
        self.seconds.values().sum()
    }

    /// The seconds by phase, for the step's record.
    pub fn into_seconds(self) -> BTreeMap<String, f64> {
        self.seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_a_span_excludes_what_was_timed_inside() {
        let mut t = Timer::default();
        t.add("generate", 1.0);
        t.time("generate", || ());
        assert!(t.total() >= 1.0);
        let span = t.span();
        t.add("exec", 100.0);
        t.end_span("update", span);
        let s = t.into_seconds();
        assert!(s["generate"] >= 1.0 && s["exec"] == 100.0);
        // The span's wall time is far below the 100 s timed inside it.
        assert_eq!(s["update"], 0.0);
    }
}
