//! The memory's entries: task-level `m_Task` (Eq. 1), API-level `m_API`
//! (Eq. 2) with their weighted usage guidelines, and the Eq. 5 weight
//! update of a guideline.

use serde::{Deserialize, Serialize};

use super::{ApiDoc, WeightParams};

/// A task-level entry `m_Task = ⟨r, c, f, A_used, g_Task⟩` (Eq. 1). The
/// requirement `r` is its index key; embedding it is done elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub requirement: String,
    pub code: String,
    /// Execution feedback `f` ([`feedback_text`]).
    pub feedback: String,
    /// Documented APIs the code uses, in order of first use.
    pub apis_used: Vec<String>,
    /// `g_Task`; empty when the reflector's answer was unparseable.
    pub guideline: String,
    pub passed: bool,
}

/// One usage guideline `g ∈ G_a` with its weight `w`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Guideline {
    /// Unique across the whole memory, assigned in creation order from 1.
    pub id: u64,
    pub text: String,
    pub weight: f64,
}

/// An API-level entry `m_API = ⟨a, D_a, C_a, G_a⟩` (Eq. 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiEntry {
    pub name: String,
    pub doc: ApiDoc,
    /// `C_a`: code of passing solutions that use this API, oldest first.
    pub snippets: Vec<String>,
    /// `G_a`: the active guidelines.
    pub guidelines: Vec<Guideline>,
    /// Guidelines removed by a `Delete` routing. §IV-D says the obsolete
    /// entry is "marked for deletion" (Fig. 3 still shows it), so it is kept
    /// here for inspection but never retrieved, reweighted or deletable again.
    #[serde(default)]
    pub retired: Vec<Guideline>,
}

impl ApiEntry {
    /// The `k` highest-weighted active guidelines; ties go to the older id.
    pub fn top_guidelines(&self, k: usize) -> Vec<&Guideline> {
        let mut g: Vec<&Guideline> = self.guidelines.iter().collect();
        g.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(a.id.cmp(&b.id)));
        g.truncate(k);
        g
    }
}

// ---------------------------------------------------------------------------
// Eq. 5.

impl WeightParams {
    /// Eq. 5: `w + Δw+` on success, `max(w_min, w − Δw−)` on failure.
    pub fn update(&self, w: f64, passed: bool) -> f64 {
        if passed {
            w + self.delta_plus
        } else {
            (w - self.delta_minus).max(self.w_min)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq5_sequence_hits_the_floor_and_stays() {
        // Binary-exact steps so the hand computation is exact.
        let p = WeightParams {
            w_init: 1.0,
            delta_plus: 0.5,
            delta_minus: 0.25,
            w_min: 0.5,
        };
        p.validate().unwrap();
        let outcomes = [
            true, true, false, false, false, false, false, false, false, true,
        ];
        let want = [1.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.5, 1.0];
        let mut w = p.w_init;
        for (pass, want) in outcomes.iter().zip(want) {
            w = p.update(w, *pass);
            assert_eq!(w, want);
        }
    }
}
