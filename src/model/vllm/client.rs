//! A client for vLLM servers at given URLs: `/v1/completions` with token-id
//! prompts, per-row seeds and models, LoRA adapters loaded and unloaded
//! at run time, and weights reloaded from a directory.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::*;
use crate::model::{Completion, GenerationParams, ModelError};

pub(super) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// A client for one or more vLLM servers (requests spread over them).
#[derive(Debug)]
pub struct VllmClient {
    urls: Vec<String>,
    agent: ureq::Agent,
    parallel: usize,
    next: AtomicUsize,
    /// Whether requests carry their seed ([`VllmClient::seeded`]).
    seeded: bool,
}

impl Clone for VllmClient {
    fn clone(&self) -> Self {
        VllmClient {
            urls: self.urls.clone(),
            agent: self.agent.clone(),
            parallel: self.parallel,
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
            seeded: self.seeded,
        }
    }
}

impl VllmClient {
    pub fn new(urls: &[String], request_timeout: Duration, parallel: usize) -> Self {
        VllmClient {
            urls: urls
                .iter()
                .map(|u| {
                    let u = u.trim_end_matches('/');
                    u.strip_suffix("/v1").unwrap_or(u).to_owned()
                })
                .collect(),
            agent: agent(request_timeout),
            parallel: parallel.max(1),
            next: AtomicUsize::new(0),
            seeded: true,
        }
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// With `false`, requests go without their seed (see
    /// `[rollout.vllm] seed_requests`).
    pub fn seeded(mut self, on: bool) -> Self {
        self.seeded = on;
        self
    }

    /// POST `body` to `path` on `url`; the JSON answer, or an error quoting it.
    fn post(&self, url: &str, path: &str, body: &Value) -> Result<Value, ModelError> {
        let at = format!("{url}{path}");
        let fail = |what: String| ModelError::Invalid(format!("POST {at}: {what}"));
        let mut resp = self
            .agent
            .post(&at)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| fail(format!("HTTP {status}, reading the body: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(fail(format!(
                "HTTP {status}: {}",
                crate::text::body_excerpt(&text, EXCERPT_CHARS)
            )));
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// The model names each server serves (`GET /v1/models`), first server's.
    pub fn models(&self) -> Result<Vec<String>, ModelError> {
        let url = format!("{}/v1/models", self.urls[0]);
        let mut resp = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| ModelError::Invalid(format!("GET {url}: {e}")))?;
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ModelError::Invalid(format!("GET {url}: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ModelError::Invalid(format!(
                "GET {url}: not JSON ({e}): {}",
                crate::text::body_excerpt(&text, EXCERPT_CHARS)
            ))
        })?;
        Ok(v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Load the PEFT adapter at `dir` as `name` on every server.
    pub fn load_adapter(&self, name: &str, dir: &Path) -> Result<(), ModelError> {
        let body = json!({"lora_name": name, "lora_path": dir.display().to_string()});
        for u in &self.urls {
            self.post(u, "/v1/load_lora_adapter", &body)?;
        }
        Ok(())
    }

    /// Unload adapter `name` from every server.
    pub fn unload_adapter(&self, name: &str) -> Result<(), ModelError> {
        let body = json!({"lora_name": name});
        for u in &self.urls {
            self.post(u, "/v1/unload_lora_adapter", &body)?;
        }
        Ok(())
    }

    /// Reload full weights from the HF directory `dir` on every server, then
    /// drop its prefix cache, whose blocks were computed with the old ones
    /// (vLLM does not drop them itself). Needs `VLLM_SERVER_DEV_MODE=1`.
    pub fn reload_weights(&self, dir: &Path) -> Result<(), ModelError> {
        let body = json!({"method": "reload_weights",
                          "kwargs": {"weights_path": dir.display().to_string()}});
        for u in &self.urls {
            self.post(u, "/collective_rpc", &body)?;
            self.post(u, "/reset_prefix_cache", &json!({}))?;
        }
        Ok(())
    }

    /// One completion of `prompt` (token ids) from `model`; `seed` when the
    /// sampling is seeded.
    pub fn complete(
        &self,
        url: &str,
        model: &str,
        prompt: &[i64],
        params: &GenerationParams,
        seed: Option<u64>,
    ) -> Result<Completion, ModelError> {
        let s = &params.sampler;
        let mut body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": s.temperature.max(0.0),
            "top_p": s.top_p,
            "top_k": if s.top_k > 0 { s.top_k } else { -1 },
            // The sampled token's log-prob only.
            "logprobs": 0,
            "return_token_ids": true,
            "ignore_eos": params.ignore_eos,
        });
        if !params.stop.is_empty() {
            body["stop"] = json!(params.stop);
        }
        if let Some(seed) = seed.filter(|_| self.seeded) {
            body["seed"] = json!(seed);
        }
        let v = self.post(url, "/v1/completions", &body)?;
        let bad = |what: &str| {
            ModelError::Invalid(format!(
                "POST {url}/v1/completions: {what}: {}",
                crate::text::body_excerpt(&v.to_string(), EXCERPT_CHARS)
            ))
        };
        let resp: CompletionResponse = serde_json::from_value(v.clone())
            .map_err(|e| bad(&format!("unexpected answer ({e})")))?;
        let c = resp
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| bad("no choices"))?;
        let token_ids = c
            .token_ids
            .ok_or_else(|| bad("no token_ids (a vLLM older than 0.10 does not return them)"))?;
        let logprobs: Vec<f32> = c
            .logprobs
            .map(|l| {
                l.token_logprobs
                    .into_iter()
                    .map(|x| x.unwrap_or(f64::NEG_INFINITY) as f32)
                    .collect()
            })
            .unwrap_or_default();
        if logprobs.len() != token_ids.len() {
            return Err(bad(&format!(
                "{} log-probs for {} tokens",
                logprobs.len(),
                token_ids.len()
            )));
        }
        let finish = crate::model::openai::finish_reason(
            c.finish_reason.as_deref(),
            c.stop_reason.as_ref(),
            &params.stop,
        );
        Ok(Completion {
            text: c.text,
            prompt_ids: prompt.to_vec(),
            token_ids,
            logprobs,
            finish,
        })
    }

    /// One completion per prompt from `model`, `parallel` requests in
    /// flight, spread over the servers; row i is seeded
    /// `row_seed(seed, row_offset + i)`.
    pub fn complete_all(
        &self,
        model: &str,
        prompts: &[Vec<i64>],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let rows: Vec<Row> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Row {
                model,
                prompt: p,
                seed: params
                    .seed
                    .map(|s| row_seed(s, params.row_offset + i as u64)),
            })
            .collect();
        self.complete_rows(&rows, params)
    }

    /// One completion per row, each from its own model (adapter) name and
    /// seed, all in flight together: K adapters' samples in one batch on
    /// the server.
    pub fn complete_rows(
        &self,
        rows: &[Row],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let n = rows.len();
        let out: Vec<Mutex<Option<Result<Completion, ModelError>>>> =
            (0..n).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..self.parallel.min(n) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let k = self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len();
                    let r = &rows[i];
                    let c = self.complete(&self.urls[k], r.model, r.prompt, params, r.seed);
                    *out[i].lock().expect("not poisoned") = Some(c);
                });
            }
        });
        out.into_iter()
            .map(|m| {
                m.into_inner()
                    .expect("not poisoned")
                    .expect("every row ran")
            })
            .collect()
    }
}

/// One request of [`VllmClient::complete_rows`].
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// The served name: the base model or a loaded adapter.
    pub model: &'a str,
    pub prompt: &'a [i64],
    pub seed: Option<u64>,
}

/// A failed request's error, naming a managed server's `log` (a vLLM 500
/// says no more than "see the stack trace above").
pub(super) fn with_log(e: ModelError, log: Option<&Path>) -> ModelError {
    match log {
        Some(l) => ModelError::Invalid(format!("{e} (the vLLM server's log: {})", l.display())),
        None => e,
    }
}

/// The seed of row `row` of a call seeded `seed`: rows differ, and a row
/// draws the same wherever it is sent (a data-parallel shard's rows).
pub fn row_seed(seed: u64, row: u64) -> u64 {
    let mut z = seed ^ row.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    // vLLM takes any int; below 2^63 for every JSON reader on the way.
    (z ^ (z >> 31)) >> 1
}

#[derive(Deserialize)]
struct CompletionResponse {
    choices: Vec<CompletionChoice>,
}

#[derive(Deserialize)]
struct CompletionChoice {
    text: String,
    #[serde(default)]
    token_ids: Option<Vec<i64>>,
    #[serde(default)]
    logprobs: Option<ChoiceLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    stop_reason: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceLogprobs {
    token_logprobs: Vec<Option<f64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_seeds_differ_by_row_and_fit_i64() {
        let a: Vec<u64> = (0..64).map(|r| row_seed(7, r)).collect();
        let mut b = a.clone();
        b.sort();
        b.dedup();
        assert_eq!(b.len(), a.len());
        assert!(a.iter().all(|&s| s < (1 << 63)));
        assert_ne!(row_seed(7, 0), row_seed(8, 0));
    }
}
