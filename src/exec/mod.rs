//! Running untrusted Python: the sandbox, limits, per-test results and the
//! error taxonomy. (The sandbox itself is being built; only the outcome types are here.)

pub mod outcome;
