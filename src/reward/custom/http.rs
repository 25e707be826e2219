//! An http term: OpenRLHF's remote reward model protocol. A batch is
//! POSTed as `{"query": [prompt + completion, ...], "prompts": [...],
//! "labels": [...]}` and the server answers `{"rewards": [...]}` (newer
//! servers add `scores` and `extra_logs`, whose per-sample numbers are
//! logged beside the term). The
//! servers, failover, backoff and bearer token are the remote sandbox's
//! ([`crate::exec::servers`]).

use std::time::Duration;

use super::{values_of, Answer, CustomSample};
use crate::config::CustomTermConfig;
use crate::exec::servers::Servers;

pub(super) struct HttpTerm {
    servers: Servers,
    batch_size: usize,
    label_key: String,
    deadline: Duration,
}

impl HttpTerm {
    pub fn new(cfg: &CustomTermConfig) -> HttpTerm {
        HttpTerm {
            servers: Servers::new(&cfg.urls, cfg.concurrency, cfg.retries, &cfg.token_env),
            batch_size: cfg.batch_size,
            label_key: cfg.label_key.clone(),
            deadline: Duration::from_secs_f64(cfg.timeout_s),
        }
    }

    /// Values for `samples`, requests in parallel up to the servers'
    /// capacity; a request no server answered is no signal for its samples.
    pub fn score(&self, samples: &[CustomSample<'_>]) -> Answer {
        let per = if self.batch_size == 0 {
            samples.len()
        } else {
            self.batch_size
        };
        let chunks: Vec<&[CustomSample]> = samples.chunks(per.max(1)).collect();
        let mut out = Answer::default();
        for wave in chunks.chunks(self.servers.capacity().max(1)) {
            std::thread::scope(|s| {
                let handles: Vec<_> = wave
                    .iter()
                    .map(|chunk| s.spawn(move || self.request(chunk)))
                    .collect();
                for (chunk, h) in wave.iter().zip(handles) {
                    out.append(h.join().unwrap_or_else(|_| {
                        Answer::no_signal("the request's thread panicked".into(), chunk.len())
                    }));
                }
            });
        }
        out
    }

    fn request(&self, chunk: &[CustomSample<'_>]) -> Answer {
        let no = |why: String| Answer::no_signal(why, chunk.len());
        let labels: Vec<serde_json::Value> = chunk
            .iter()
            .map(|s| super::column(s.task, &self.label_key))
            .collect();
        let body = serde_json::json!({
            "query": chunk.iter().map(|s| format!("{}{}", s.prompt, s.completion.text)).collect::<Vec<_>>(),
            "prompts": chunk.iter().map(|s| s.prompt).collect::<Vec<_>>(),
            "labels": labels,
        });
        let text = match self.servers.post("", &body.to_string(), self.deadline) {
            Ok(t) => t,
            Err(e) => return no(format!("no reward server answered: {e}")),
        };
        let v: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                return no(format!(
                    "the reward server's answer is not JSON ({e}): {}",
                    crate::text::body_excerpt(&text, 120)
                ))
            }
        };
        match v.get("rewards").and_then(|r| r.as_array()) {
            Some(values) => Answer::logged(
                values_of(values, chunk.len(), "the reward server"),
                &v["extra_logs"],
            ),
            None => no(format!(
                "the reward server's answer has no \"rewards\" list: {}",
                crate::text::body_excerpt(&text, 120)
            )),
        }
    }
}
